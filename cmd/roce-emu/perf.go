package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
)

type perfFlags struct {
	netFlags
	ccFlags
	op         string
	atomicType string // -A: CMP_AND_SWAP or FETCH_AND_ADD
	size       int
	iters      int
	port       int
	mtu        int
	txDepth    int
	rxDepth    int
	qps        int  // -q
	all        bool // -a
	duration   int  // -D, seconds; 0: -n iterations
	margin     int  // -f, seconds; -1: a quarter of -D
	noPeak     bool // -N
	bidir      bool // -b
	connType   string
	qpTimeout  int
	rdmaCM     bool // -R
	rdmaCMz    bool // -z
	infinite   bool // --run_infinitely
	gbits      bool
	outJSON    bool
	js         jsonOut // --json
	jsonFile   string
	timeout    time.Duration
	perftest   bool
	maxCycle   int      // the largest cycle buffer a peer may announce
	cpuProfile string   // --cpuprofile: a CPU profile of the run (pprof)
	procs      int      // --gomaxprocs
	noEffect   []string // perftest flags given that change nothing here, with why
}

// perftestNoEffect are perftest's flags that have no meaning for
// roce-emu: accepted, and each one given is named with the reason in one
// line on stderr.
var perftestNoEffect = []struct {
	name    string
	isBool  bool
	usage   string
	reasons string
}{
	{"d", false, "RDMA `device` (perftest's -d)", "roce-emu has no RDMA device: --bind picks the address it sends from"},
	{"ib-dev", false, "RDMA `device` (perftest's --ib-dev)", "roce-emu has no RDMA device: --bind picks the address it sends from"},
	{"i", false, "device `port` (perftest's -i)", "roce-emu has one port: --bind and --udp-port"},
	{"ib-port", false, "device `port` (perftest's --ib-port)", "roce-emu has one port: --bind and --udp-port"},
	{"x", false, "GID `index` (perftest's -x)", "roce-emu's GID is --bind's address"},
	{"gid-index", false, "GID `index` (perftest's --gid-index)", "roce-emu's GID is --bind's address"},
	{"F", true, "do not fail on CPU frequency differences (perftest's -F)", "roce-emu times with the monotonic clock, not CPU cycles"},
	{"CPU-freq", true, "perftest's --CPU-freq", "roce-emu times with the monotonic clock, not CPU cycles"},
	{"T", false, "traffic `class` (perftest's -T)", "roce-emu sends with traffic class 0 (no per-QP traffic class yet)"},
	{"tclass", false, "traffic `class` (perftest's --tclass)", "roce-emu sends with traffic class 0 (no per-QP traffic class yet)"},
	{"S", false, "service `level` (perftest's -S)", "RoCEv2 carries no service level on the wire"},
	{"e", true, "wait for completions with events (perftest's -e)", "roce-emu always waits for completions without spinning"},
	{"I", false, "inline `size` (perftest's -I)", "roce-emu has no inline sends: payloads are copied when posted either way"},
	{"Q", false, "CQ moderation (perftest's -Q)", "roce-emu signals every work request"},
	{"l", false, "post list (perftest's -l)", "roce-emu posts work requests one at a time"},
	{"ipv6", true, "perftest's --ipv6", "the IP version follows --bind"},
	{"use_hugepages", true, "perftest's --use_hugepages", "roce-emu's buffers are Go memory"},
	{"cpu_util", true, "perftest's --cpu_util", "roce-emu does not report CPU use"},
	{"mr_per_qp", true, "perftest's --mr_per_qp", "roce-emu registers one MR over every QP's region; the peer uses the keys it is sent either way"},
	{"dont_xchg_versions", true, "perftest's --dont_xchg_versions", "roce-emu always exchanges versions, as perftest 6.06 does unless told"},
}

// noEffectFlag records that one of perftestNoEffect was given.
type noEffectFlag struct {
	f      *perfFlags
	name   string
	isBool bool
	why    string
}

func (n *noEffectFlag) String() string   { return "" }
func (n *noEffectFlag) IsBoolFlag() bool { return n.isBool }
func (n *noEffectFlag) Set(v string) error {
	arg := " " + v
	if n.isBool {
		arg = ""
	}
	dash := "-"
	if len(n.name) > 1 {
		dash = "--" // as perftest's long options are typed
	}
	n.f.noEffect = append(n.f.noEffect, fmt.Sprintf("%s%s%s accepted, no effect: %s", dash, n.name, arg, n.why))
	return nil
}

func (f *perfFlags) register(fs *flag.FlagSet, kind string) {
	f.netFlags.register(fs, "127.0.0.1")
	f.netFlags.registerExchange(fs)
	f.ccFlags.register(fs)
	def := "write"
	if kind == "lat" {
		def = "send"
	}
	fs.StringVar(&f.op, "o", def, "operation: send, write, read or atomic (ib_atomic_"+kind+")")
	fs.StringVar(&f.atomicType, "A", "FETCH_AND_ADD", "atomic `type` for -o atomic: CMP_AND_SWAP or FETCH_AND_ADD")
	fs.StringVar(&f.atomicType, "atomic_type", "FETCH_AND_ADD", "atomic `type` for -o atomic (as -A)")
	fs.IntVar(&f.size, "s", 65536, "message `size` in bytes")
	if kind == "lat" {
		fs.Lookup("s").DefValue = "2"
		f.size = 2
	}
	fs.IntVar(&f.iters, "n", 1000, "number of iterations (per QP)")
	fs.IntVar(&f.port, "p", 18515, "TCP `port` of the address exchange")
	fs.IntVar(&f.mtu, "m", 1024, "path `MTU` (256, 512, 1024, 2048 or 4096)")
	fs.IntVar(&f.txDepth, "t", 128, "work requests kept outstanding per QP (bw)")
	fs.IntVar(&f.rxDepth, "r", perftestRxDepth, "receives kept posted per QP (SEND tests)")
	fs.IntVar(&f.qps, "q", 1, "number of QPs (bw); each runs -n iterations")
	fs.BoolVar(&f.all, "a", false, "run sizes 2 to 2^23 bytes (give it to both sides: the server sizes its buffer for 8 MiB)")
	fs.IntVar(&f.duration, "D", 0, "run for this many `seconds` instead of -n iterations (bw write, read, atomic)")
	fs.IntVar(&f.margin, "f", -1, "with -D, `seconds` at each end left out of the measurement (default a quarter of -D)")
	fs.BoolVar(&f.noPeak, "N", false, "do not compute the peak bandwidth (prints 0.00, as perftest)")
	fs.BoolVar(&f.bidir, "b", false, "bidirectional: both sides run the traffic and print the sum (bw write, read, atomic; give it to both sides)")
	fs.StringVar(&f.connType, "c", "RC", "connection `type`: RC (UC, UD, XRC, DC are not supported)")
	fs.IntVar(&f.qpTimeout, "u", 14, "QP timeout `exponent` (4.096 us * 2^N)")
	fs.BoolVar(&f.rdmaCM, "R", false, "connect with rdma_cm: the exchange and every QP, no TCP (perftest's -R)")
	fs.BoolVar(&f.rdmaCMz, "z", false, "rdma_cm for the exchange alone, the QPs connected as without it (perftest's -z); with -R it changes nothing")
	fs.BoolVar(&f.infinite, "run_infinitely", false, "run until stopped, reporting every few seconds (not supported yet)")
	fs.BoolVar(&f.gbits, "report_gbits", false, "report bandwidth in Gb/sec instead of MB/sec")
	fs.BoolVar(&f.outJSON, "out_json", false, "also write the test's parameters and last result to --out_json_file, with perftest's keys")
	fs.StringVar(&f.jsonFile, "out_json_file", "perftest_out.json", "the `file` --out_json writes (perftest's default name)")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up when the run, the wait for a client included, takes longer than this (0: never; perftest waits for ever)")
	fs.IntVar(&f.maxCycle, "max-cycle-buffer", oob.DefaultCycleBufferLimit, "the largest cycle buffer in `bytes` the peer may ask for (perftest sends its page size; each QP's advertised region is at least this large); up to 1073741824")
	fs.IntVar(&f.procs, "gomaxprocs", perfProcs, "Go processors (GOMAXPROCS) the run uses; 0: Go's default (the GOMAXPROCS environment variable, else one per CPU). The default 1 hands each packet, ACK and completion between the run's goroutines on one thread instead of waking another (see docs/datapath.md); without this flag a GOMAXPROCS environment variable is kept")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "debugging: write a CPU profile of the run to `file` (go tool pprof reads it)")
	fs.BoolVar(&f.perftest, "perftest", true, "accepted for compatibility: bw and lat always speak perftest 6.06's out-of-band protocol")
	for _, ne := range perftestNoEffect {
		fs.Var(&noEffectFlag{f: f, name: ne.name, isBool: ne.isBool, why: ne.reasons}, ne.name, ne.usage+" (accepted, no effect)")
	}
}

// atomicSize is the only size of perftest's atomic tests (DEF_SIZE_ATOMIC).
const atomicSize = 8

// perftestMaxSize is the largest size of -a (perftest's MAX_SIZE).
const perftestMaxSize = 1 << 23

func (f *perfFlags) check(kind string, sizeSet bool) (qp.WROpcode, qp.MTU, error) {
	var op qp.WROpcode
	switch f.op {
	case "send":
		op = qp.IBV_WR_SEND
	case "write":
		op = qp.IBV_WR_RDMA_WRITE
	case "read":
		op = qp.IBV_WR_RDMA_READ
	case "atomic":
		switch strings.ToUpper(f.atomicType) {
		case "FETCH_AND_ADD":
			op = qp.IBV_WR_ATOMIC_FETCH_AND_ADD
		case "CMP_AND_SWAP":
			op = qp.IBV_WR_ATOMIC_CMP_AND_SWP
		default:
			return 0, 0, fmt.Errorf("-A %q: atomic type must be CMP_AND_SWAP or FETCH_AND_ADD", f.atomicType)
		}
		if sizeSet && f.size != atomicSize {
			return 0, 0, fmt.Errorf("-s %d: the size of atomic tests is %d bytes, as perftest's (\"Message size cannot be changed for Atomic tests\")", f.size, atomicSize)
		}
		f.size = atomicSize
	default:
		return 0, 0, fmt.Errorf("-o %q: operation must be send, write, read or atomic", f.op)
	}
	switch {
	case f.bidir && (kind == "lat" || op == qp.IBV_WR_SEND):
		return 0, 0, fmt.Errorf("-b: bidirectional is built for bw with write, read and atomic (not %s %s yet)", kind, f.op)
	case f.infinite:
		return 0, 0, errors.New("--run_infinitely is not supported yet; -D SECONDS runs for a given time")
	case !strings.EqualFold(f.connType, "RC"):
		return 0, 0, fmt.Errorf("-c %s: roce-emu runs RC only (UC, UD, XRC and DC are not supported yet)", f.connType)
	case f.size < 1 || f.size > 1<<30:
		return 0, 0, fmt.Errorf("-s %d: size must be 1 byte to 1 GiB", f.size)
	case f.iters < 1 || f.iters > 100_000_000:
		return 0, 0, fmt.Errorf("-n %d: iterations must be 1 to 10^8", f.iters)
	case f.txDepth < 1 || f.txDepth > 4096:
		return 0, 0, fmt.Errorf("-t %d: tx depth must be 1 to 4096", f.txDepth)
	case f.rxDepth < 1 || f.rxDepth > 4096:
		return 0, 0, fmt.Errorf("-r %d: rx depth must be 1 to 4096", f.rxDepth)
	case f.qps < 1 || f.qps > perftestMaxQPs:
		return 0, 0, fmt.Errorf("-q %d: QPs must be 1 to %d", f.qps, perftestMaxQPs)
	case f.iters*f.qps > 100_000_000:
		return 0, 0, fmt.Errorf("-n %d -q %d: iterations times QPs must be at most 10^8", f.iters, f.qps)
	case f.qps > 1 && kind == "lat":
		return 0, 0, fmt.Errorf("-q %d: perftest's latency tests run one QP; -q is for bw", f.qps)
	case f.port < 1 || f.port > 65535:
		return 0, 0, fmt.Errorf("-p %d: TCP port must be 1-65535", f.port)
	case f.maxCycle < oob.DefaultCycleBuffer || f.maxCycle > oob.MaxCycleBuffer:
		return 0, 0, fmt.Errorf("--max-cycle-buffer %d: must be %d (a page) to %d bytes", f.maxCycle, oob.DefaultCycleBuffer, oob.MaxCycleBuffer)
	case f.procs < 0 || f.procs > 1024:
		return 0, 0, fmt.Errorf("--gomaxprocs %d: must be 0 (Go's default) to 1024", f.procs)
	case f.qpTimeout < 0 || f.qpTimeout > 31:
		return 0, 0, fmt.Errorf("-u %d: QP timeout must be 0 to 31", f.qpTimeout)
	case f.duration < 0 || f.duration > 24*3600:
		return 0, 0, fmt.Errorf("-D %d: duration must be 1 second to a day", f.duration)
	case f.duration > 0 && (kind == "lat" || op == qp.IBV_WR_SEND):
		return 0, 0, fmt.Errorf("-D: duration mode is built for bw with write, read and atomic (not %s %s yet)", kind, f.op)
	case f.duration > 0 && f.all:
		return 0, 0, errors.New("-D with -a: perftest's \"Duration mode currently doesn't support running on all sizes\"")
	case f.all && f.op == "atomic":
		return 0, 0, errors.New("-a: atomic tests have one size (8 bytes), as perftest's")
	}
	if f.duration > 0 {
		if f.margin < 0 {
			f.margin = f.duration / 4
		}
		if f.duration <= 2*f.margin {
			return 0, 0, fmt.Errorf("-D %d -f %d: the duration must be more than twice the margin", f.duration, f.margin)
		}
	}
	if f.via != "" && f.rdmaCM {
		return 0, 0, errors.New("--roce-via with -R: rdma_cm resolves the peer's address itself (not supported; -z connects the QPs as without rdma_cm)")
	}
	m, err := mtuFlag(f.mtu)
	if err == nil {
		err = f.netFlags.check()
	}
	if err == nil {
		err = f.ccFlags.check()
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
	f.js.register(fs, "perftest's --out_json object, the bandwidth unit and the counters")
	usage := func() {
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
		fmt.Fprintf(stderr, "ib_send_%s, ib_write_%s, ib_read_%s and ib_atomic_%s (-o atomic), as client or server (on RoCE perftest\n", kind, kind, kind, kind)
		fmt.Fprintln(stderr, "needs -x GID_INDEX, e.g. ib_write_bw -d rxe0 -x 1 HOST). --perftest, once needed for")
		fmt.Fprintln(stderr, "that, is accepted and changes nothing.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	// A bad flag gets the flag package's line and one more, not the
	// whole list; -h gets the list.
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: roce-emu %s [flags] [HOST]; roce-emu %s -h lists the flags\n", kind, kind)
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			usage()
			return 0
		}
	}
	// Flags may come before and after the host, as perftest's getopt
	// takes them.
	var pos []string
	for {
		if code, ok := parseFlags(fs, args); !ok {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "roce-emu %s: unexpected argument %q\n", kind, pos[1])
		return 2
	}
	host := ""
	if len(pos) == 1 {
		host = pos[0]
	}
	sizeSet := false
	fs.Visit(func(fl *flag.Flag) { sizeSet = sizeSet || fl.Name == "s" })
	op, mtu, err := f.check(kind, sizeSet)
	if err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", kind, err)
		return 2
	}
	for _, l := range f.noEffect {
		fmt.Fprintf(stderr, "roce-emu %s: %s\n", kind, l)
	}
	f.progress = isTerminal(stdout) && isTerminal(stderr)
	procsSet := false
	fs.Visit(func(fl *flag.Flag) { procsSet = procsSet || fl.Name == "gomaxprocs" })
	if n := perfGOMAXPROCS(procsSet, f.procs, os.Getenv("GOMAXPROCS")); n > 0 && ownProcess {
		runtime.GOMAXPROCS(n)
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "roce-emu %s: --cpuprofile: %v\n", kind, err)
			return 1
		}
		defer stop()
	}
	if err := perftestRun(kind, host, op, mtu, &f, f.js.text(stdout, stderr)); err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", kind, err)
		var intr *interruptedError
		if errors.As(err, &intr) {
			return intr.exitCode()
		}
		return 1
	}
	return 0
}

// perfProcs is --gomaxprocs's default. A bw or lat run moves each packet
// through a few goroutines (the Endpoint's read loop, the goroutine
// waiting on the CQ, the sender) that hand work to each other; with more
// than one Go processor, each hand-off wakes another thread (a futex),
// and idle processors spin looking for work, on cores that the peer's
// process needs too when both run on one host. With one, the goroutine
// made runnable runs next on the same thread. perftest itself is one
// thread. docs/datapath.md has the figures.
const perfProcs = 1

// perfGOMAXPROCS is the GOMAXPROCS a run sets, 0 for none: --gomaxprocs
// when given (0 leaves Go's default), else none when the GOMAXPROCS
// environment variable (env) holds a number of processors, which the Go
// runtime has applied, else perfProcs: a value the runtime ignores (not
// a positive integer) is ignored here too.
func perfGOMAXPROCS(flagSet bool, flagVal int, env string) int {
	if flagSet {
		return flagVal
	}
	if n, err := strconv.Atoi(env); err == nil && n > 0 {
		return 0
	}
	return perfProcs
}

// ownProcess is set by main: the command runs as its own process, and
// may set process-wide state such as GOMAXPROCS. Tests that call run in
// their own process leave it false.
var ownProcess bool

// startCPUProfile starts a CPU profile (runtime/pprof) written to name;
// stop ends it and closes the file.
func startCPUProfile(name string) (stop func(), err error) {
	fh, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(fh); err != nil {
		fh.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		fh.Close()
	}, nil
}

const perfRule = "---------------------------------------------------------------------------------------"

// bwResult is what a bandwidth test reports, in the unit asked for (MB/sec
// of 2^20 bytes, as perftest, or Gb/sec).
type bwResult struct{ peak, avg, mpps float64 }

// bwStats computes the results of messages of size bytes posted from start
// and completed at stamps; posted are the times of each post, in the order
// of posting (nil: no peak, 0, as perftest's -N). The peak is perftest's
// (perftestPeakDelta).
func bwStats(size int, start time.Time, posted, stamps []time.Time, gbits bool) bwResult {
	el := stamps[len(stamps)-1].Sub(start).Seconds()
	if el <= 0 {
		el = 1e-9
	}
	n := len(stamps)
	avg := float64(size) * float64(n) / el
	peak := 0.0
	if len(posted) == n {
		peak = float64(size) / perftestPeakDelta(posted, stamps)
	}
	scale := 1.0 / (1 << 20)
	if gbits {
		scale = 8.0 / 1e9
	}
	return bwResult{peak: peak * scale, avg: avg * scale, mpps: float64(n) / el / 1e6}
}

// perftestPeakMaxIters is the most iterations per QP a bandwidth test
// measures its peak over: past it perftest turns the peak off (-N), with
// perftestNoPeak (perftest_parameters.c, force_dependencies).
const perftestPeakMaxIters = 20000

// perftestNoPeak is what perftest prints when it turns the peak off: on
// -D, on a SEND bandwidth server (not -b), past perftestPeakMaxIters.
const perftestNoPeak = " WARNING: BW peak won't be measured in this run."

// perftestPeakDelta is perftest's BW peak as the time per message it
// divides the size by (print_report_bw's opt_delta, in seconds): the
// least, over every run of consecutive messages i..j, of the time from
// the post of message i to the completion of message j, divided by the
// j-i+1 messages. posted[i] is the time of the i-th post and completed[j]
// of the j-th completion (every work request signalled: perftest's -Q 1;
// roce-emu has no CQ moderation). The run i = 0, j = n-1 is the average,
// so the peak is never below it, and each run holds at least the time of
// one message from post to completion, so a short run (-n 5) cannot give
// a peak out of proportion, as windows between completions polled
// together did. perftest tries every pair (quadratic, bounded by its
// 20000 iterations); this finds the same least value by bisection on t,
// a run with time per message at most t existing when, for some i <= j,
// completed[j] - t(j+1) <= posted[i] - t*i: linear per step.
func perftestPeakDelta(posted, completed []time.Time) float64 {
	n := len(completed)
	t0 := posted[0]
	p := make([]float64, n)
	c := make([]float64, n)
	for i := range n {
		p[i] = posted[i].Sub(t0).Seconds()
		c[i] = completed[i].Sub(t0).Seconds()
	}
	feasible := func(t float64) bool {
		best := math.Inf(-1)
		for j := range n {
			best = max(best, p[j]-t*float64(j))
			if c[j]-t*float64(j+1) <= best {
				return true
			}
		}
		return false
	}
	lo, hi := 0.0, c[n-1]/float64(n) // the whole run: always feasible
	for range 64 {
		mid := (lo + hi) / 2
		if feasible(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return max(hi, 1e-9)
}

// printBW prints a bandwidth result as perftest's table.
func printBW(out io.Writer, size, iters int, gbits bool, r bwResult) {
	printBWHeader(out, gbits)
	printBWLine(out, size, iters, gbits, r)
	fmt.Fprintln(out, perfRule)
}

func printBWHeader(out io.Writer, gbits bool) {
	unit := "MB/sec"
	if gbits {
		unit = "Gb/sec"
	}
	fmt.Fprintf(out, " #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit)
}

// printBWLine prints one result line. Below 0.1 Gb/sec perftest prints
// six decimals (its inc_accuracy, REPORT_FMT_EXT); so does this.
func printBWLine(out io.Writer, size, iters int, gbits bool, r bwResult) {
	if gbits && r.avg < 0.1 {
		fmt.Fprintf(out, " %-10d %-10d       %-18.6f %-20.6f %.6f\n", size, iters, r.peak, r.avg, r.mpps)
		return
	}
	fmt.Fprintf(out, " %-10d %-10d       %-18.2f %-20.2f %.6f\n", size, iters, r.peak, r.avg, r.mpps)
}

// latMeasureTail is how many of the largest samples perftest leaves out
// of its latency report (LAT_MEASURE_TAIL in perftest_resources.c).
const latMeasureTail = 2

// printLat prints latency samples as perftest's print_report_lat does:
// sorted, without the latMeasureTail largest, the median of what is left
// as t_typical. The first exchange usually carries the peer's start-up, so
// it is among the samples dropped.
func printLat(out io.Writer, size, iters int, samples []time.Duration) {
	printLatHeader(out)
	printLatLine(out, size, iters, samples)
	fmt.Fprintln(out, perfRule)
}

func printLatHeader(out io.Writer) {
	fmt.Fprintln(out, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")
}

// latStats are a latency report's figures in microseconds, as perftest's
// print_report_lat computes them: sorted samples without the
// latMeasureTail largest, the median of what is left as t_typical.
type latStats struct {
	Min     float64 `json:"t_min"`
	Max     float64 `json:"t_max"`
	Typical float64 `json:"t_typical"`
	Avg     float64 `json:"t_avg"`
	Stdev   float64 `json:"t_stdev"`
	P99     float64 `json:"percentile_99"`
	P999    float64 `json:"percentile_99.9"`
}

func newLatStats(samples []time.Duration) latStats {
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
	return latStats{Min: us(samples[0]), Max: us(samples[len(samples)-1]), Typical: us(median), Avg: mean,
		Stdev: math.Sqrt(sq / float64(len(samples))), P99: pct(0.99), P999: pct(0.999)}
}

// printLatLine prints the line of printLat.
func printLatLine(out io.Writer, size, iters int, samples []time.Duration) {
	if len(samples) == 0 {
		// perftest's latency samples are the gaps between iterations.
		fmt.Fprintf(out, " %d iteration(s) give no latency sample between them; use -n 2 or more\n", iters)
		return
	}
	l := newLatStats(samples)
	fmt.Fprintf(out, " %-7d %-10d      %-14.2f %-12.2f %-18.2f %-14.2f %-15.2f %-22.2f %.2f\n", size, iters,
		l.Min, l.Max, l.Typical, l.Avg, l.Stdev, l.P99, l.P999)
}

// perfJSON is --out_json's file: perftest's test_info and results keys
// (write_test_info_to_file, REPORT_FMT_JSON, REPORT_FMT_LAT_JSON in
// perftest_parameters.c), written as valid JSON (perftest leaves its keys
// unquoted). Like perftest's, it holds the last result of the run.
type perfJSON struct {
	Info    perfJSONInfo `json:"test_info"`
	Results any          `json:"results,omitempty"`
}

type perfJSONInfo struct {
	Test           string `json:"test"`
	DualPort       string `json:"Dual_port"`
	Device         string `json:"Device"`
	NumberOfQPs    int    `json:"Number_of_qps"`
	TransportType  string `json:"Transport_type"`
	ConnectionType string `json:"Connection_type"`
	UsingSRQ       string `json:"Using_SRQ"`
	TXDepth        int    `json:"TX_depth,omitempty"`
	RXDepth        int    `json:"RX_depth,omitempty"`
	Mtu            int    `json:"Mtu"`
	LinkType       string `json:"Link_type"`
	OutstandReads  int    `json:"Outstand_reads,omitempty"`
	RdmaCMQPs      string `json:"rdma_cm_QPs"`
	DataExMethod   string `json:"Data_ex_method"`
}

type perfJSONBW struct {
	MsgSize int     `json:"MsgSize"`
	Iters   int     `json:"n_iterations"`
	Peak    float64 `json:"BW_peak"`
	Avg     float64 `json:"BW_average"`
	MsgRate float64 `json:"MsgRate"`
}

type perfJSONLat struct {
	MsgSize int `json:"MsgSize"`
	Iters   int `json:"n_iterations"`
	latStats
}

// round is %.Nf's rounding, for JSON numbers that say what the table
// says: the number the table prints, read back (math.Round(x*100)/100
// differs from %.2f where x*100 is not exact, 77.425 being 77.42499...).
func round(x float64, decimals int) float64 {
	v, err := strconv.ParseFloat(strconv.FormatFloat(x, 'f', decimals, 64), 64)
	if err != nil {
		return x // NaN or ±Inf: as they are
	}
	return v
}

// peerReportUnit tells the unit of a peer's bandwidth report: perftest's
// report carries none, and each side prints in its own (MB/sec, or Gb/sec
// with --report_gbits), so a server of write_bw or read_bw, which prints
// the client's figures, and a side of -b, which adds them to its own,
// would give the peer's figures under its own unit. Its message rate has
// no unit, and BW_average is size x MsgRate x 10^6 bytes a second in the
// peer's unit (print_report_bw: tsize x format_factor apart), so the
// ratio tells MB/sec from Gb/sec (a factor of 119 apart). ok is false
// when the report cannot tell (no message rate or average).
func peerReportUnit(rep oob.BWReport) (gbits, ok bool) {
	if !(rep.MsgRate > 0) || !(rep.AvgBW > 0) || rep.Size == 0 {
		return false, false
	}
	bps := float64(rep.Size) * rep.MsgRate * 1e6
	mb, gb := math.Abs(math.Log(rep.AvgBW/(bps/(1<<20)))), math.Abs(math.Log(rep.AvgBW/(bps*8/1e9)))
	if min(mb, gb) > math.Ln2 {
		return false, false // neither within a factor of 2
	}
	return gb < mb, true
}

// inUnit is a peer's report rep in this side's unit (gbits), and the line
// that says so when it came in the other (peerReportUnit), "" otherwise.
func inUnit(rep oob.BWReport, gbits bool) (bwResult, string) {
	r := bwResult{peak: rep.PeakBW, avg: rep.AvgBW, mpps: rep.MsgRate}
	theirs, ok := peerReportUnit(rep)
	if !ok || theirs == gbits {
		return r, ""
	}
	f := float64(1<<20) * 8 / 1e9 // MB/sec to Gb/sec
	from, to := "MB/sec", "Gb/sec"
	if theirs {
		f, from, to = 1/f, "Gb/sec", "MB/sec"
	}
	r.peak, r.avg = r.peak*f, r.avg*f
	return r, fmt.Sprintf(" (the peer reported in %s, --report_gbits on one side only: its figures converted to %s)", from, to)
}

func (j *perfJSON) noteBW(size, iters int, gbits bool, r bwResult) {
	d := 2
	if gbits && r.avg < 0.1 {
		d = 6
	}
	j.Results = perfJSONBW{MsgSize: size, Iters: iters, Peak: round(r.peak, d), Avg: round(r.avg, d), MsgRate: round(r.mpps, 6)}
}

func (j *perfJSON) noteLat(size, iters int, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	l := newLatStats(samples)
	for _, v := range []*float64{&l.Min, &l.Max, &l.Typical, &l.Avg, &l.Stdev, &l.P99, &l.P999} {
		*v = round(*v, 2)
	}
	j.Results = perfJSONLat{MsgSize: size, Iters: iters, latStats: l}
}

// write writes the file; a run with nothing to report (ib_read_lat's
// server) writes test_info only, as perftest writes nothing there. It
// writes a temporary file beside name and renames it, so that a reader,
// or the other side of a run on one host given the same name, never
// sees a partial or interleaved file (two writers of one name leave one
// of the two, whole).
func (j *perfJSON) write(name string) error {
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return fmt.Errorf("--out_json_file: %v", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), name)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("--out_json_file: %v", err)
	}
	return nil
}
