package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/roce-emu/roce-emu/qp"
)

type perfFlags struct {
	netFlags
	op       string
	size     int
	iters    int
	port     int
	mtu      int
	txDepth  int
	gbits    bool
	timeout  time.Duration
	perftest bool
}

func (f *perfFlags) register(fs *flag.FlagSet, kind string) {
	f.netFlags.register(fs, "127.0.0.1")
	def := "write"
	if kind == "lat" {
		def = "send"
	}
	fs.StringVar(&f.op, "o", def, "operation: send, write or read")
	fs.IntVar(&f.size, "s", 65536, "message `size` in bytes")
	if kind == "lat" {
		fs.Lookup("s").DefValue = "2"
		f.size = 2
	}
	fs.IntVar(&f.iters, "n", 1000, "number of iterations")
	fs.IntVar(&f.port, "p", 18515, "TCP `port` of the address exchange")
	fs.IntVar(&f.mtu, "m", 1024, "path `MTU` (256, 512, 1024, 2048 or 4096)")
	fs.IntVar(&f.txDepth, "t", 128, "work requests kept outstanding (bw)")
	fs.BoolVar(&f.gbits, "report_gbits", false, "report bandwidth in Gb/sec instead of MB/sec")
	fs.DurationVar(&f.timeout, "timeout", 120*time.Second, "give up when the run takes longer than this")
	fs.BoolVar(&f.perftest, "perftest", true, "accepted for compatibility: bw and lat always speak perftest 6.06's out-of-band protocol")
}

func (f *perfFlags) check() (qp.WROpcode, qp.MTU, error) {
	var op qp.WROpcode
	switch f.op {
	case "send":
		op = qp.IBV_WR_SEND
	case "write":
		op = qp.IBV_WR_RDMA_WRITE
	case "read":
		op = qp.IBV_WR_RDMA_READ
	default:
		return 0, 0, fmt.Errorf("-o %q: operation must be send, write or read", f.op)
	}
	switch {
	case f.size < 1 || f.size > 1<<30:
		return 0, 0, fmt.Errorf("-s %d: size must be 1 byte to 1 GiB", f.size)
	case f.iters < 1 || f.iters > 100_000_000:
		return 0, 0, fmt.Errorf("-n %d: iterations must be 1 to 10^8", f.iters)
	case f.txDepth < 1 || f.txDepth > 4096:
		return 0, 0, fmt.Errorf("-t %d: tx depth must be 1 to 4096", f.txDepth)
	case f.port < 1 || f.port > 65535:
		return 0, 0, fmt.Errorf("-p %d: TCP port must be 1-65535", f.port)
	}
	m, err := mtuFlag(f.mtu)
	if err == nil {
		err = f.netFlags.check()
	}
	return op, m, err
}

func runBW(args []string, stdout, stderr io.Writer) int  { return runPerf("bw", args, stdout, stderr) }
func runLat(args []string, stdout, stderr io.Writer) int { return runPerf("lat", args, stdout, stderr) }

func runPerf(kind string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(kind, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f perfFlags
	f.register(fs, kind)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: roce-emu %s [flags] [HOST]\n\n", kind)
		if kind == "bw" {
			fmt.Fprintln(stderr, "perftest's bandwidth tests: without HOST, wait as the server; with HOST, connect")
			fmt.Fprintln(stderr, "to it and run -n operations of -s bytes, -t at a time.")
		} else {
			fmt.Fprintln(stderr, "perftest's latency tests: send ping-pongs SENDs, write ping-pongs RDMA WRITEs,")
			fmt.Fprintln(stderr, "polling memory for the peer's as ib_write_lat does, and both report half the round")
			fmt.Fprintln(stderr, "trip; read reports each READ's full time.")
		}
		fmt.Fprintln(stderr, "roce-emu speaks perftest 6.06's out-of-band protocol (Debian 12's perftest: version,")
		fmt.Fprintln(stderr, "cycle buffer, MTU, key strings, barriers, results) with another roce-emu or with")
		fmt.Fprintf(stderr, "ib_send_%s, ib_write_%s and ib_read_%s, as client or server (on RoCE perftest\n", kind, kind, kind)
		fmt.Fprintln(stderr, "needs -x GID_INDEX, e.g. ib_write_bw -d rxe0 -x 1 HOST). --perftest, once needed for")
		fmt.Fprintln(stderr, "that, is accepted and changes nothing.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "roce-emu %s: unexpected argument %q\n", kind, fs.Arg(1))
		return 2
	}
	op, mtu, err := f.check()
	if err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", kind, err)
		return 2
	}
	if err := perftestRun(kind, fs.Arg(0), op, mtu, &f, stdout); err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", kind, err)
		return 1
	}
	return 0
}

const perfRule = "---------------------------------------------------------------------------------------"

// bwResult is what a bandwidth test reports, in the unit asked for (MB/sec
// of 2^20 bytes, as perftest, or Gb/sec).
type bwResult struct{ peak, avg, mpps float64 }

// bwStats computes the results of messages of size bytes posted from start
// and completed at stamps.
func bwStats(size int, start time.Time, stamps []time.Time, gbits bool) bwResult {
	el := stamps[len(stamps)-1].Sub(start).Seconds()
	if el <= 0 {
		el = 1e-9
	}
	n := len(stamps)
	avg := float64(size) * float64(n) / el
	win := max(1, n/10)
	peak := avg
	for i := win; i < n; i++ {
		if d := stamps[i].Sub(stamps[i-win]).Seconds(); d > 0 {
			peak = max(peak, float64(size)*float64(win)/d)
		}
	}
	scale := 1.0 / (1 << 20)
	if gbits {
		scale = 8.0 / 1e9
	}
	return bwResult{peak: peak * scale, avg: avg * scale, mpps: float64(n) / el / 1e6}
}

// printBW prints a bandwidth result as perftest's table.
func printBW(out io.Writer, size, iters int, gbits bool, r bwResult) {
	unit := "MB/sec"
	if gbits {
		unit = "Gb/sec"
	}
	fmt.Fprintf(out, " #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit)
	fmt.Fprintf(out, " %-10d %-10d       %-18.2f %-20.2f %.6f\n", size, iters, r.peak, r.avg, r.mpps)
	fmt.Fprintln(out, perfRule)
}

// latMeasureTail is how many of the largest samples perftest leaves out
// of its latency report (LAT_MEASURE_TAIL in perftest_resources.c).
const latMeasureTail = 2

// printLat prints latency samples as perftest's print_report_lat does:
// sorted, without the latMeasureTail largest, the median of what is left
// as t_typical. The first exchange usually carries the peer's start-up, so
// it is among the samples dropped.
func printLat(out io.Writer, size, iters int, samples []time.Duration) {
	if len(samples) == 0 {
		// perftest's latency samples are the gaps between iterations.
		fmt.Fprintf(out, " %d iteration(s) give no latency sample between them; use -n 2 or more\n", iters)
		return
	}
	samples = slices.Clone(samples)
	slices.Sort(samples)
	if len(samples) > 2*latMeasureTail {
		samples = samples[:len(samples)-latMeasureTail]
	}
	median := samples[len(samples)/2]
	if len(samples)%2 == 0 {
		median = (samples[len(samples)/2-1] + samples[len(samples)/2]) / 2
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	var sum, sq float64
	for _, s := range samples {
		sum += us(s)
	}
	mean := sum / float64(len(samples))
	for _, s := range samples {
		sq += (us(s) - mean) * (us(s) - mean)
	}
	pct := func(p float64) float64 {
		return us(samples[max(0, min(len(samples)-1, int(math.Ceil(p*float64(len(samples))))-1))])
	}
	fmt.Fprintln(out, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")
	fmt.Fprintf(out, " %-7d %-10d      %-14.2f %-12.2f %-18.2f %-14.2f %-15.2f %-22.2f %.2f\n", size, iters,
		us(samples[0]), us(samples[len(samples)-1]), us(median), mean, math.Sqrt(sq/float64(len(samples))), pct(0.99), pct(0.999))
	fmt.Fprintln(out, perfRule)
}
