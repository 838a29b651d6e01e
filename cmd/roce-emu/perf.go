package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// perftest's per-QP key string (perftest src/perftest_communication.c;
// ROCEV2.md section 6): "%04x:%04x:%06x:%06x:%08x:%016llx:" (LID,
// out_reads, QPN, PSN, R_Key, VA), then the 16 GID bytes as "%02x:" each
// and "%08x:" (SRQ number), 108 bytes with the NUL.
const perfKeyLen = 108

func formatPerfKey(p peer, outReads int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", p.LID, outReads, p.QPN, uint32(p.PSN), p.RKey, p.VA)
	g := gidOf(p.GID)
	for _, x := range g {
		fmt.Fprintf(&b, "%02x:", x)
	}
	fmt.Fprintf(&b, "%08x:", 0)
	out := make([]byte, perfKeyLen)
	copy(out, b.String())
	return out
}

func parsePerfKey(b []byte) (peer, int, error) {
	s := strings.TrimRight(string(b), "\x00")
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return peer{}, 0, fmt.Errorf("not a perftest key string: %q", s)
	}
	num := func(i, bits int) uint64 {
		v, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			panic(fmt.Errorf("field %d %q: %v", i+1, f[i], err))
		}
		return v
	}
	var p peer
	var reads int
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = r.(error)
			}
		}()
		p.LID = uint16(num(0, 16))
		reads = int(num(1, 16))
		p.QPN = uint32(num(2, 24))
		p.PSN = bth.PSN(num(3, 24))
		p.RKey = uint32(num(4, 32))
		p.VA = num(5, 64)
		var g [16]byte
		for i := range g {
			g[i] = byte(num(6+i, 8))
		}
		p.GID = netip.AddrFrom16(g).Unmap()
		return nil
	}()
	if err != nil {
		return peer{}, 0, fmt.Errorf("bad perftest key string %q: %v", s, err)
	}
	return p, reads, nil
}

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
	fs.BoolVar(&f.perftest, "perftest", false, "speak perftest 6.06's whole out-of-band protocol, to run against ib_"+def+"_"+kind+" and the other perftest programs")
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
			fmt.Fprintln(stderr, "perftest-style bandwidth, between two roce-emu peers or (--perftest) with perftest:")
			fmt.Fprintln(stderr, "without HOST, wait as the server; with HOST, connect to it and run -n operations")
			fmt.Fprintln(stderr, "of -s bytes, -t at a time.")
		} else {
			fmt.Fprintln(stderr, "perftest-style latency, between two roce-emu peers or (--perftest) with perftest:")
			fmt.Fprintln(stderr, "send and write ping-pong and report half the round trip, as ib_send_lat does; read")
			fmt.Fprintln(stderr, "reports each READ's full time. Between roce-emu peers write uses RDMA WRITE with")
			fmt.Fprintln(stderr, "immediate so the peer sees each one; with --perftest it polls memory as")
			fmt.Fprintln(stderr, "ib_write_lat does.")
		}
		fmt.Fprintln(stderr, "Without --perftest the address exchange uses perftest's key strings over TCP but")
		fmt.Fprintln(stderr, "not the rest of perftest's protocol: run roce-emu on both sides. With --perftest")
		fmt.Fprintln(stderr, "roce-emu speaks perftest 6.06's protocol (Debian 12's perftest) and runs against")
		fmt.Fprintf(stderr, "ib_send_%s, ib_write_%s and ib_read_%s as client or server (on RoCE perftest\n", kind, kind, kind)
		fmt.Fprintln(stderr, "needs -x GID_INDEX, e.g. ib_write_bw -d rxe0 -x 1 HOST).")
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
	run := perf
	if f.perftest {
		run = perftestRun
	}
	if err := run(kind, fs.Arg(0), op, mtu, &f, stdout); err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", kind, err)
		return 1
	}
	return 0
}

const perfRule = "---------------------------------------------------------------------------------------"

func perf(kind, host string, op qp.WROpcode, mtu qp.MTU, f *perfFlags, out io.Writer) error {
	client := host != ""
	ep, closeAll, err := f.openEndpoint()
	if err != nil {
		return err
	}
	defer closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()

	pd := ep.NewPD()
	depth := f.txDepth
	if kind == "lat" {
		depth = 1
	}
	// One slot per outstanding operation, so concurrent operations never
	// share bytes; perftest does the same with its cycle buffer.
	slots := min(depth, max(1, (256<<20)/f.size))
	buf := make([]byte, f.size*slots)
	for i := range buf {
		buf[i] = byte(i)
	}
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ
	mr, err := pd.RegMR(buf, access)
	if err != nil {
		return err
	}
	const rxDepth = 512
	cq := ep.NewCQ(2*max(depth, rxDepth) + 16)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: depth + 1, MaxRecvWR: rxDepth})
	if err != nil {
		return err
	}
	attrs := transport.ConnectAttr{PathMTU: mtu, Access: access}
	local := peer{QPN: q.QPN(), PSN: randomPSN(), GID: ep.LocalAddr().Addr(), RKey: mr.RKey, VA: mr.VA}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS); err != nil {
		return err
	}
	// Receives first: a SEND must not find the queue empty.
	needRecv := op == qp.IBV_WR_SEND || kind == "lat" && op == qp.IBV_WR_RDMA_WRITE
	recvWR := func(i int) qp.RecvWR {
		return qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{mr.SGE((i%slots)*f.size, f.size)}}
	}
	posted := 0
	if needRecv && (kind == "lat" || !client) {
		for ; posted < min(rxDepth, f.iters); posted++ {
			if err := q.PostRecv(recvWR(posted)); err != nil {
				return err
			}
		}
	}

	var remote peer
	var conn net.Conn
	if client {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(f.port)))
		if err != nil {
			return fmt.Errorf("cannot reach the server at %s port %d: %v", host, f.port, err)
		}
	} else {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(f.port))
		if err != nil {
			return fmt.Errorf("cannot listen on TCP port %d: %v", f.port, err)
		}
		go func() { <-ctx.Done(); l.Close() }()
		conn, err = l.Accept()
		l.Close()
		if err != nil {
			return fmt.Errorf("no client came: %v", err)
		}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	key := make([]byte, perfKeyLen)
	if client {
		_, err = conn.Write(formatPerfKey(local, 16))
		if err == nil {
			_, err = io.ReadFull(conn, key)
		}
	} else {
		_, err = io.ReadFull(conn, key)
		if err == nil {
			_, err = conn.Write(formatPerfKey(local, 16))
		}
	}
	if err != nil {
		return fmt.Errorf("address exchange: %v", err)
	}
	if remote, _, err = parsePerfKey(key); err != nil {
		return err
	}
	if err := q.Connect(remoteOf(remote, uint16(f.udpPort)), local.PSN, attrs); err != nil {
		return err
	}
	// Barrier: both QPs are in RTS before anything is sent.
	if _, err := conn.Write([]byte{'R'}); err != nil {
		return fmt.Errorf("barrier: %v", err)
	}
	if _, err := io.ReadFull(conn, key[:1]); err != nil {
		return fmt.Errorf("barrier: %v", err)
	}

	title := map[qp.WROpcode]string{qp.IBV_WR_SEND: "Send", qp.IBV_WR_RDMA_WRITE: "RDMA_Write", qp.IBV_WR_RDMA_READ: "RDMA_Read"}[op]
	fmt.Fprintln(out, perfRule)
	if kind == "bw" {
		fmt.Fprintf(out, "                    %s BW Test (roce-emu)\n", title)
	} else {
		fmt.Fprintf(out, "                    %s Latency Test (roce-emu)\n", title)
	}
	fmt.Fprintf(out, " Connection type : RC\t\tMTU            : %d[B]\n", mtu.Bytes())
	fmt.Fprintf(out, " local address: QPN %#06x PSN %#06x RKey %#08x VAddr %#016x GID %s\n", local.QPN, uint32(local.PSN), local.RKey, local.VA, gidString(local.GID))
	fmt.Fprintf(out, " remote address: QPN %#06x PSN %#06x RKey %#08x VAddr %#016x GID %s\n", remote.QPN, uint32(remote.PSN), remote.RKey, remote.VA, gidString(remote.GID))
	fmt.Fprintln(out, perfRule)

	r := &perfRun{q: q, cq: cq, mr: mr, op: op, size: f.size, iters: f.iters, slots: slots, remote: remote, ctx: ctx, posted: posted, recvWR: recvWR, rxDepth: rxDepth}
	if kind == "bw" {
		err = r.bw(client, depth, f.gbits, out)
	} else {
		err = r.lat(client, out)
	}
	if err != nil {
		return fmt.Errorf("%v (QP %s; %s)", err, q.State(), describeCounters(q.Counters()))
	}
	// Final barrier: the server stays until the client is done with it.
	if client {
		_, err = conn.Write([]byte("done\x00"))
	} else {
		_, err = io.ReadFull(conn, key[:5])
	}
	if err != nil {
		return fmt.Errorf("closing handshake: %v", err)
	}
	fmt.Fprintf(out, " counters: %s\n", describeCounters(q.Counters()))
	return nil
}

type perfRun struct {
	q       *transport.QP
	cq      *transport.CQ
	mr      *qp.MR
	op      qp.WROpcode
	size    int
	iters   int
	slots   int
	remote  peer
	ctx     context.Context
	posted  int
	rxDepth int
	recvWR  func(int) qp.RecvWR
}

func (r *perfRun) wr(i int, op qp.WROpcode) qp.SendWR {
	off := (i % r.slots) * r.size
	return qp.SendWR{WRID: uint64(i), Opcode: op, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(off, r.size)},
		RemoteAddr: r.remote.VA + uint64(off), RKey: r.remote.RKey}
}

// poll waits for completions and checks their status.
func (r *perfRun) poll(wc []qp.WC) ([]qp.WC, error) {
	n, err := r.cq.Wait(r.ctx, wc)
	if err != nil {
		return nil, err
	}
	for _, c := range wc[:n] {
		if c.Status != qp.IBV_WC_SUCCESS {
			return nil, fmt.Errorf("work completion %s (%s, wr_id %d)", c.Status, c.Opcode, c.WRID)
		}
	}
	return wc[:n], nil
}

// bw runs the bandwidth test. The side that initiates (the client, or for
// SEND also the server counting receives) times from the first post to the
// last completion. Peak is the best rate over any run of a tenth of the
// iterations (perftest's peak is over single completions, which on a
// software peer says little).
func (r *perfRun) bw(client bool, depth int, gbits bool, out io.Writer) error {
	wc := make([]qp.WC, 64)
	stamps := make([]time.Time, 0, r.iters)
	var start time.Time
	switch {
	case client:
		start = time.Now()
		posted, done := 0, 0
		for done < r.iters {
			for posted < r.iters && posted-done < depth {
				if err := r.q.PostSend(r.wr(posted, r.op)); err != nil {
					return err
				}
				posted++
			}
			cs, err := r.poll(wc)
			if err != nil {
				return fmt.Errorf("after %d of %d completions: %v", done, r.iters, err)
			}
			for range cs {
				stamps = append(stamps, time.Now())
			}
			done += len(cs)
		}
	case r.op == qp.IBV_WR_SEND:
		got := 0
		for got < r.iters {
			cs, err := r.poll(wc)
			if err != nil {
				return fmt.Errorf("after %d of %d receives: %v", got, r.iters, err)
			}
			for range cs {
				if got == 0 {
					start = time.Now()
				}
				stamps = append(stamps, time.Now())
				got++
				if r.posted < r.iters {
					if err := r.q.PostRecv(r.recvWR(r.posted)); err != nil {
						return err
					}
					r.posted++
				}
			}
		}
	default:
		fmt.Fprintln(out, " (the server of a one-sided test only serves memory; the client reports)")
		return nil
	}
	printBW(out, r.size, r.iters, gbits, bwStats(r.size, start, stamps, gbits))
	return nil
}

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

// lat runs the latency test.
func (r *perfRun) lat(client bool, out io.Writer) error {
	wc := make([]qp.WC, 4)
	samples := make([]time.Duration, 0, r.iters)
	// Ping-pong op: SEND, or RDMA WRITE with immediate for write.
	pp := qp.IBV_WR_SEND
	if r.op == qp.IBV_WR_RDMA_WRITE {
		pp = qp.IBV_WR_RDMA_WRITE_WITH_IMM
	}
	repost := func() error {
		if r.posted < r.iters+1 {
			if err := r.q.PostRecv(r.recvWR(r.posted)); err != nil {
				return err
			}
			r.posted++
		}
		return nil
	}
	// Completions of a ping-pong can come in either order: when an ACK is
	// lost, the peer's reply may arrive before our send completes. sends
	// and recvs count completions not yet consumed.
	sends, recvs := 0, 0
	await := func(wantSend, wantRecv bool) error {
		for (wantSend && sends == 0) || (wantRecv && recvs == 0) {
			cs, err := r.poll(wc)
			if err != nil {
				return err
			}
			for _, c := range cs {
				switch c.Opcode {
				case qp.IBV_WC_RECV, qp.IBV_WC_RECV_RDMA_WITH_IMM:
					recvs++
					if err := repost(); err != nil {
						return err
					}
				default:
					sends++
				}
			}
		}
		if wantSend {
			sends--
		}
		if wantRecv {
			recvs--
		}
		return nil
	}
	waitFor := func(want qp.WCOpcode) error {
		recv := want == qp.IBV_WC_RECV
		return await(!recv, recv)
	}
	if r.op == qp.IBV_WR_RDMA_READ {
		if !client {
			fmt.Fprintln(out, " (the server of a one-sided test only serves memory; the client reports)")
			return nil
		}
		for i := range r.iters {
			t0 := time.Now()
			if err := r.q.PostSend(r.wr(i, qp.IBV_WR_RDMA_READ)); err != nil {
				return err
			}
			if err := waitFor(qp.IBV_WC_RDMA_READ); err != nil {
				return fmt.Errorf("read %d: %v", i, err)
			}
			samples = append(samples, time.Since(t0))
		}
	} else {
		sendDone := map[qp.WROpcode]qp.WCOpcode{qp.IBV_WR_SEND: qp.IBV_WC_SEND, qp.IBV_WR_RDMA_WRITE_WITH_IMM: qp.IBV_WC_RDMA_WRITE}[pp]
		for i := range r.iters {
			t0 := time.Now()
			if client {
				if err := r.q.PostSend(r.wr(i, pp)); err != nil {
					return err
				}
				if err := waitFor(sendDone); err != nil {
					return fmt.Errorf("iteration %d: %v", i, err)
				}
				if err := waitFor(qp.IBV_WC_RECV); err != nil {
					return fmt.Errorf("iteration %d: %v", i, err)
				}
				samples = append(samples, time.Since(t0)/2)
			} else {
				if err := waitFor(qp.IBV_WC_RECV); err != nil {
					return fmt.Errorf("iteration %d: %v", i, err)
				}
				if err := r.q.PostSend(r.wr(i, pp)); err != nil {
					return err
				}
				if err := waitFor(sendDone); err != nil {
					return fmt.Errorf("iteration %d: %v", i, err)
				}
			}
		}
		if !client {
			fmt.Fprintln(out, " (the server answers; the client reports)")
			return nil
		}
	}
	printLat(out, r.size, r.iters, samples)
	return nil
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
