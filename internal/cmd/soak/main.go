// Command soak runs RC traffic between two Endpoints for a long time on an
// impaired path and checks that nothing leaks or goes wrong: QPs (4 by
// default) each doing RDMA WRITE, RDMA READ and SEND in turn, random
// sizes, every byte of every message checked, every completion
// IBV_WC_SUCCESS within -op-timeout; each side's outgoing packets lost
// with probability -loss, duplicated with -dup and delayed by -reorder-delay
// with -reorder (which reorders them). Every -every it logs the process's
// RSS, the Go heap in use, the live heap (after a forced collection),
// goroutines and the traffic so far; at the end it checks that they were
// flat after -warmup: RSS within -rss-slack (or 10%) of its value at the
// end of the warm-up, the live heap within -live-slack (or 20%), and the
// fewest goroutines seen in the last -warmup no more than 1 above the
// fewest seen in the warm-up (a leaked goroutine stays; a timer fires on a
// goroutine of its own for a moment, so single samples vary), and never
// more than 8 above. -heapprofile writes a heap profile at the end.
// Exit status 1 on a wrong byte, a failed or missing completion, or
// growth. Not run by CI: scripts/soak.sh runs it for 10 minutes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

type config struct {
	duration, warmup, every, opTimeout time.Duration
	qps                                int
	maxSize                            int
	loss, dup, reorder                 float64
	reorderDelay                       time.Duration
	mem                                bool
	rssSlack, liveSlack                int64
	heapProfile                        string
	seed                               uint64
}

func main() {
	var c config
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "how long to run")
	flag.DurationVar(&c.warmup, "warmup", time.Minute, "growth is checked after this")
	flag.DurationVar(&c.every, "every", 10*time.Second, "log interval")
	flag.DurationVar(&c.opTimeout, "op-timeout", 30*time.Second, "longest wait for one completion")
	flag.IntVar(&c.qps, "qps", 4, "QP pairs")
	flag.IntVar(&c.maxSize, "max-size", 64<<10, "largest message in `bytes` (sizes are uniform in 1..max)")
	flag.Float64Var(&c.loss, "loss", 0.05, "probability each packet is lost (each side's outgoing packets)")
	flag.Float64Var(&c.dup, "dup", 0.02, "probability a packet is duplicated")
	flag.Float64Var(&c.reorder, "reorder", 0.05, "probability a packet is delayed by -reorder-delay (reordering it)")
	flag.DurationVar(&c.reorderDelay, "reorder-delay", 2*time.Millisecond, "delay of reordered packets")
	flag.BoolVar(&c.mem, "mem", false, "use the in-memory network instead of UDP on 127.0.0.1 and 127.0.0.2")
	flag.Int64Var(&c.rssSlack, "rss-slack", 16<<20, "RSS growth in `bytes` allowed after the warm-up (or 10%, whichever is larger)")
	flag.Int64Var(&c.liveSlack, "live-slack", 4<<20, "live heap growth in `bytes` allowed after the warm-up (or 20%, whichever is larger)")
	flag.StringVar(&c.heapProfile, "heapprofile", "", "write a heap profile to `file` at the end")
	flag.Uint64Var(&c.seed, "seed", 1, "random seed")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "soak: FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("soak: PASS")
}

// stats are the traffic so far, updated by the workers.
type stats struct {
	ops   [3]atomic.Uint64 // WRITE, READ, SEND
	bytes atomic.Uint64
}

var opNames = [3]string{"WRITE", "READ", "SEND"}

func run(c config) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()

	eps, faults, err := endpoints(c)
	if err != nil {
		return err
	}
	defer eps[0].Close()
	defer eps[1].Close()
	var pairs []*pair
	for i := range c.qps {
		p, err := newPair(eps, i, c)
		if err != nil {
			return err
		}
		pairs = append(pairs, p)
	}

	var st stats
	var wg sync.WaitGroup
	errs := make(chan error, len(pairs))
	for i, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.loop(ctx, rand.New(rand.NewPCG(c.seed, uint64(i))), &st); err != nil {
				errs <- fmt.Errorf("QP pair %d: %w", i, err)
				cancel()
			}
		}()
	}

	start := time.Now()
	var samples []sample
	tick := time.NewTicker(c.every)
	defer tick.Stop()
	fmt.Printf("soak: %d QP pairs, %s, loss %.3g, dup %.3g, reorder %.3g (+%v), messages 1..%d bytes, %s\n",
		c.qps, c.duration, c.loss, c.dup, c.reorder, c.reorderDelay, c.maxSize, map[bool]string{true: "in-memory network", false: "UDP loopback"}[c.mem])
	fmt.Println("   time    rss_MiB  heap_MiB  live_MiB  goroutines      WRITEs       READs       SENDs       MiB  retransmitted  dropped  duplicated  delayed")
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			s := takeSample(time.Since(start))
			if ctx.Err() != nil {
				break loop // the workers are stopping: not a steady-state sample
			}
			samples = append(samples, s)
			var retr uint64
			for _, p := range pairs {
				retr += p.a.Counters().RetransmittedPkts + p.b.Counters().RetransmittedPkts
			}
			fmt.Printf("%7.0fs %9.1f %9.1f %9.1f %11d %11d %11d %11d %9.0f %14d %8s %11s %8s\n", s.at.Seconds(), mib(s.rss), mib(s.heap), mib(s.live), s.goroutines,
				st.ops[0].Load(), st.ops[1].Load(), st.ops[2].Load(), float64(st.bytes.Load())/(1<<20), retr,
				faults.count(transport.FaultDrop), faults.count(transport.FaultDuplicate), faults.count(transport.FaultDelay))
		}
	}
	wg.Wait()
	close(errs)
	if c.heapProfile != "" {
		if err := writeHeapProfile(c.heapProfile); err != nil {
			return err
		}
	}
	for err := range errs {
		return err // the first failure; the others followed from the cancel
	}
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ctx.Err()
	}
	return flat(samples, c)
}

// faultSet are both sides' fault rules (one Faults per side).
type faultSet [2]*transport.Faults

// count is how many packets the rules of one kind acted on so far, both
// sides together, as text.
func (f faultSet) count(kind transport.FaultKind) string {
	var n int
	for _, fs := range f {
		for _, r := range fs.Rules() {
			if r.Kind == kind {
				n += r.Acted()
			}
		}
	}
	return strconv.Itoa(n)
}

func endpoints(c config) ([2]*transport.Endpoint, faultSet, error) {
	var eps [2]*transport.Endpoint
	var fs faultSet
	var network *transport.Network
	if c.mem {
		network = transport.NewNetwork(transport.Impairments{Delay: 10 * time.Microsecond}, c.seed)
	}
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		var conn transport.Conn
		var err error
		if c.mem {
			conn, err = network.Listen(netip.AddrPortFrom(netip.MustParseAddr(a), bth.UDPPort))
		} else {
			conn, err = transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), transport.UDPOptions{EphemeralPort: true})
		}
		if err != nil {
			return eps, fs, err
		}
		var rules []*transport.FaultRule
		for _, spec := range []string{
			fmt.Sprintf("drop:dir=out,prob=%g", c.loss),
			fmt.Sprintf("dup:dir=out,prob=%g", c.dup),
			fmt.Sprintf("delay=%s:dir=out,prob=%g", c.reorderDelay, c.reorder),
		} {
			r, err := transport.ParseFault(spec)
			if err != nil {
				return eps, fs, err
			}
			if r.Prob > 0 {
				rules = append(rules, r)
			}
		}
		fs[i] = transport.NewFaults(c.seed+uint64(i), rules...)
		eps[i] = transport.NewEndpoint(transport.WithFaults(conn, fs[i], nil), transport.Options{})
	}
	return eps, fs, nil
}

// pair is one RC connection: A posts every operation, B is the responder.
type pair struct {
	eps        [2]*transport.Endpoint
	a, b       *transport.QP
	acq, bcq   *transport.CQ
	src, back  *qp.MR // A: what it sends and writes; where READs land
	wdst, rsrc *qp.MR // B: where WRITEs land; what READs read
	rdst       *qp.MR // B: where SENDs land
	opTimeout  time.Duration
	maxSize    int
	wcs        []qp.WC
}

func newPair(eps [2]*transport.Endpoint, i int, c config) (*pair, error) {
	p := &pair{eps: eps, opTimeout: c.opTimeout, maxSize: c.maxSize, wcs: make([]qp.WC, 4)}
	apd, bpd := eps[0].NewPD(), eps[1].NewPD()
	p.acq, p.bcq = eps[0].NewCQ(64), eps[1].NewCQ(64)
	var err error
	if p.a, err = eps[0].NewQP(apd, p.acq, p.acq, qp.InitAttr{SQSigAll: true}); err != nil {
		return nil, err
	}
	if p.b, err = eps[1].NewQP(bpd, p.bcq, p.bcq, qp.InitAttr{SQSigAll: true}); err != nil {
		return nil, err
	}
	reg := func(pd *transport.PD, access qp.Access) (*qp.MR, error) {
		return pd.RegMR(make([]byte, c.maxSize), access|qp.IBV_ACCESS_LOCAL_WRITE)
	}
	all := qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ
	for _, m := range []struct {
		mr  **qp.MR
		pd  *transport.PD
		acc qp.Access
	}{{&p.src, apd, 0}, {&p.back, apd, 0}, {&p.wdst, bpd, all}, {&p.rsrc, bpd, all}, {&p.rdst, bpd, 0}} {
		if *m.mr, err = reg(m.pd, m.acc); err != nil {
			return nil, err
		}
	}
	psnA, psnB := bth.PSN(0x100000*uint32(i)+1), bth.PSN(0xFFFF00-uint32(i)) // B's PSNs wrap early
	attr := transport.ConnectAttr{PathMTU: qp.IBV_MTU_1024, Access: qp.IBV_ACCESS_LOCAL_WRITE | all, Timeout: 12}
	if err := p.a.Connect(transport.Remote{Addr: eps[1].LocalAddr(), QPN: p.b.QPN(), PSN: psnB}, psnA, attr); err != nil {
		return nil, err
	}
	if err := p.b.Connect(transport.Remote{Addr: eps[0].LocalAddr(), QPN: p.a.QPN(), PSN: psnA}, psnB, attr); err != nil {
		return nil, err
	}
	return p, nil
}

// fill writes a pattern that differs per operation into b.
func fill(b []byte, seq uint64) {
	x := seq*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// wait waits for one completion on cq and checks it.
func (p *pair) wait(ctx context.Context, cq *transport.CQ, what string, wantLen int, recv bool) error {
	wctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	n, err := cq.Wait(wctx, p.wcs[:1])
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: no completion within %v: %w", what, p.opTimeout, err)
	}
	wc := p.wcs[0]
	if n != 1 || wc.Status != qp.IBV_WC_SUCCESS {
		return fmt.Errorf("%s: completion %s (wr_id %d)", what, wc.Status, wc.WRID)
	}
	if recv && int(wc.ByteLen) != wantLen {
		return fmt.Errorf("%s: received %d bytes, sent %d", what, wc.ByteLen, wantLen)
	}
	return nil
}

func (p *pair) loop(ctx context.Context, rng *rand.Rand, st *stats) error {
	for seq := uint64(1); ctx.Err() == nil; seq++ {
		op := int(seq % 3)
		n := 1 + rng.IntN(p.maxSize)
		var err error
		switch op {
		case 0: // RDMA WRITE from A's src into B's wdst
			p.eps[0].Locked(func() { fill(p.src.Buf[:n], seq) })
			if err = p.a.PostSend(qp.SendWR{WRID: seq, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{p.src.SGE(0, n)}, RemoteAddr: p.wdst.VA, RKey: p.wdst.RKey}); err != nil {
				return err
			}
			if err = p.wait(ctx, p.acq, "WRITE", n, false); err != nil {
				break
			}
			var same bool
			p.eps[1].Locked(func() { same = bytes.Equal(p.wdst.Buf[:n], p.src.Buf[:n]) })
			if !same {
				return fmt.Errorf("WRITE %d of %d bytes: the responder's memory differs", seq, n)
			}
		case 1: // RDMA READ of B's rsrc into A's back
			p.eps[1].Locked(func() { fill(p.rsrc.Buf[:n], seq) })
			p.eps[0].Locked(func() { clear(p.back.Buf[:n]) })
			if err = p.a.PostSend(qp.SendWR{WRID: seq, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{p.back.SGE(0, n)}, RemoteAddr: p.rsrc.VA, RKey: p.rsrc.RKey}); err != nil {
				return err
			}
			if err = p.wait(ctx, p.acq, "READ", n, false); err != nil {
				break
			}
			var same bool
			p.eps[0].Locked(func() { same = bytes.Equal(p.back.Buf[:n], p.rsrc.Buf[:n]) })
			if !same {
				return fmt.Errorf("READ %d of %d bytes: the data read differs", seq, n)
			}
		case 2: // SEND from A's src into B's rdst
			p.eps[0].Locked(func() { fill(p.src.Buf[:n], seq) })
			if err = p.b.PostRecv(qp.RecvWR{WRID: seq, SGEs: []qp.SGE{p.rdst.SGE(0, p.maxSize)}}); err != nil {
				return err
			}
			if err = p.a.PostSend(qp.SendWR{WRID: seq, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{p.src.SGE(0, n)}}); err != nil {
				return err
			}
			if err = p.wait(ctx, p.acq, "SEND", n, false); err != nil {
				break
			}
			if err = p.wait(ctx, p.bcq, "SEND receive", n, true); err != nil {
				break
			}
			var same bool
			p.eps[1].Locked(func() { same = bytes.Equal(p.rdst.Buf[:n], p.src.Buf[:n]) })
			if !same {
				return fmt.Errorf("SEND %d of %d bytes: the received bytes differ", seq, n)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil // the run ended during the operation
			}
			return fmt.Errorf("operation %d (%s, %d bytes): %w", seq, opNames[op], n, err)
		}
		st.ops[op].Add(1)
		st.bytes.Add(uint64(n))
	}
	return nil
}

type sample struct {
	at              time.Duration
	rss, heap, live int64
	goroutines      int
}

// takeSample reads RSS and the heap in use, then collects garbage and
// reads the live heap.
func takeSample(at time.Duration) sample {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := sample{at: at, rss: rss(), heap: int64(m.HeapInuse), goroutines: runtime.NumGoroutine()}
	runtime.GC()
	runtime.ReadMemStats(&m)
	s.live = int64(m.HeapAlloc)
	return s
}

func writeHeapProfile(name string) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rss is the process's resident set from /proc/self/status (Linux), or
// the Go runtime's memory from the system elsewhere.
func rss() int64 {
	if f, err := os.Open("/proc/self/status"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.Sys)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// flat checks the samples after the warm-up against the last one of it.
func flat(samples []sample, c config) error {
	var base *sample
	var after []sample
	minFirst, minLast, maxG := int(^uint(0)>>1), int(^uint(0)>>1), 0
	end := samples[len(samples)-1].at
	for i, s := range samples {
		if s.at <= c.warmup {
			base = &samples[i]
			minFirst = min(minFirst, s.goroutines)
		} else {
			after = append(after, s)
			maxG = max(maxG, s.goroutines)
		}
		if s.at > end-c.warmup {
			minLast = min(minLast, s.goroutines)
		}
	}
	if base == nil || len(after) == 0 {
		fmt.Printf("soak: too short to check growth (warm-up %v, %d samples)\n", c.warmup, len(samples))
		return nil
	}
	maxRSS, maxLive := base.rss, base.live
	for _, s := range after {
		maxRSS, maxLive = max(maxRSS, s.rss), max(maxLive, s.live)
	}
	allowed, allowedLive := max(c.rssSlack, base.rss/10), max(c.liveSlack, base.live/5)
	fmt.Printf("soak: after the warm-up (%v): RSS %.1f MiB at its end, at most %.1f MiB later (+%.1f MiB, allowed +%.1f); live heap %.1f MiB, at most %.1f MiB later (+%.1f MiB, allowed +%.1f); goroutines: fewest %d in the warm-up, fewest %d in the last %v, most %d after the warm-up\n",
		c.warmup, mib(base.rss), mib(maxRSS), mib(maxRSS-base.rss), mib(allowed), mib(base.live), mib(maxLive), mib(maxLive-base.live), mib(allowedLive), minFirst, minLast, c.warmup, maxG)
	if maxRSS-base.rss > allowed {
		return fmt.Errorf("RSS grew by %.1f MiB after the warm-up", mib(maxRSS-base.rss))
	}
	if maxLive-base.live > allowedLive {
		return fmt.Errorf("the live heap grew by %.1f MiB after the warm-up", mib(maxLive-base.live))
	}
	if minLast > minFirst+1 || maxG > minFirst+8 {
		return fmt.Errorf("goroutines grew: fewest %d in the warm-up, fewest %d at the end, most %d", minFirst, minLast, maxG)
	}
	return nil
}
