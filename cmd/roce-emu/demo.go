package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addrA := fs.String("a", "127.0.0.1", "`address` of peer A (the requester)")
	addrB := fs.String("b", "127.0.0.2", "`address` of peer B (the responder)")
	port := fs.Uint("udp-port", bth.UDPPort, "UDP `port` both peers use for RoCEv2")
	pcapFile := fs.String("pcap", "demo.pcap", "capture `file` of everything A sends and receives (\"\" for none)")
	pcapLimit := fs.Int("pcap-limit", 64, "stop the capture before it passes this many `MiB` (0 for no limit; a whole run with the defaults is about 400 MB)")
	loss := fs.Float64("loss", 0.02, "packet loss `probability` of the lossy round, in both directions")
	mtuBytes := fs.Int("m", 1024, "path `MTU`")
	count := fs.Int("n", 16, "messages per operation and size")
	seed := fs.Uint64("seed", 1, "random `seed` of the loss")
	var faultSpecs multiFlag
	var js jsonOut
	js.register(fs, "the table and the counters")
	fs.Var(&faultSpecs, "fault", "inject a fault in both rounds, as ACTION[:KEY=VALUE,...] (repeatable; see README)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu demo [flags]")
		fmt.Fprintln(stderr, "\nTwo roce-emu peers on loopback addresses run RC SEND, RDMA WRITE, RDMA READ and")
		fmt.Fprintln(stderr, "atomics of several sizes, once on a clean link and once with injected loss, check")
		fmt.Fprintln(stderr, "every byte, print what happened and write a capture that tshark can read.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "roce-emu demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	mtu, err := mtuFlag(*mtuBytes)
	if err == nil && !(*loss >= 0 && *loss < 1) { // also refuses NaN
		err = fmt.Errorf("--loss %g: must be at least 0 and below 1", *loss)
	}
	if err == nil && (*count < 1 || *count > 1000) {
		err = fmt.Errorf("-n %d: must be 1-1000", *count)
	}
	if err == nil && (*pcapLimit < 0 || *pcapLimit > 1<<20) {
		err = fmt.Errorf("--pcap-limit %d: give MiB, 0 (no limit) to %d", *pcapLimit, 1<<20)
	}
	if err == nil && (*port == 0 || *port > 65535) {
		err = fmt.Errorf("--udp-port %d: must be 1-65535", *port)
	}
	var rules []*transport.FaultRule
	for _, s := range faultSpecs {
		if err != nil {
			break
		}
		var r *transport.FaultRule
		if r, err = transport.ParseFault(s); err == nil {
			rules = append(rules, r)
		} else {
			err = fmt.Errorf("--fault: %v", err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "roce-emu demo: %v\n", err)
		return 2
	}
	for _, s := range []string{*addrA, *addrB} {
		if _, err := netip.ParseAddr(s); err != nil {
			fmt.Fprintf(stderr, "roce-emu demo: %q is not an IP address\n", s)
			return 2
		}
	}
	var rec *demoRecord
	if js.on {
		rec = &demoRecord{}
	}
	if err := demo(*addrA, *addrB, uint16(*port), *pcapFile, int64(*pcapLimit)<<20, *loss, rules, mtu, *count, *seed, js.text(stdout, stderr), rec); err != nil {
		fmt.Fprintf(stderr, "roce-emu demo: %v\n", err)
		return 1
	}
	if err := js.emit(rec); err != nil {
		fmt.Fprintf(stderr, "roce-emu demo: %v\n", err)
		return 1
	}
	return 0
}

type demoPeer struct {
	ep  *transport.Endpoint
	pd  *transport.PD
	cq  *transport.CQ
	qp  *transport.QP
	buf []byte
	mr  *qp.MR
}

func demo(a, b string, port uint16, pcapFile string, pcapLimit int64, loss float64, rules []*transport.FaultRule, mtu qp.MTU, count int, seed uint64, out io.Writer, rec *demoRecord) error {
	sizes := []int{1, mtu.Bytes() - 1, mtu.Bytes(), mtu.Bytes() + 1, 64 << 10, 1 << 20}
	maxSize := sizes[len(sizes)-1]
	faults := transport.NewFaults(seed)
	var capture *pcap.Writer
	bounded := &boundedCapture{limit: pcapLimit}
	var peers [2]*demoPeer
	var conns [2]transport.Conn
	for i, s := range []string{a, b} {
		addr, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("%q is not an IP address", s)
		}
		conns[i], err = transport.ListenUDP(netip.AddrPortFrom(addr, port), transport.UDPOptions{})
		if err != nil {
			if i == 1 {
				conns[0].Close()
			}
			return fmt.Errorf("cannot listen on %s UDP port %d (is another RoCEv2 peer using it? try --udp-port): %v", addr, port, err)
		}
	}
	// The capture file is created only now, so that a failed start leaves
	// an earlier capture alone.
	if pcapFile != "" {
		var err error
		if capture, err = pcap.Create(pcapFile); err != nil {
			conns[0].Close()
			conns[1].Close()
			return fmt.Errorf("--pcap: %v", err)
		}
		defer capture.Close()
	}
	for i := range conns {
		conn := conns[i]
		opts := transport.Options{ICRC: transport.ICRCAssumeID0, DSCP: 26}
		if i == 0 {
			// A's capture sees what crosses A's socket: its packets after
			// the faults, B's before.
			if capture != nil {
				conn = transport.WithObserver(conn, nil, bounded.observer(transport.CaptureObserver(capture,
					[6]byte{2, 0, 0, 0, 0, byte(0xa + i)}, [6]byte{2, 0, 0, 0, 0, byte(0xb - i)})))
			}
			conn = transport.WithFaults(conn, faults, nil)
		}
		ep := transport.NewEndpoint(conn, opts)
		defer ep.Close()
		pd := ep.NewPD()
		buf := make([]byte, maxSize*count)
		mr, err := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE|qp.IBV_ACCESS_REMOTE_READ|qp.IBV_ACCESS_REMOTE_ATOMIC)
		if err != nil {
			return err
		}
		cq := ep.NewCQ(4 * count)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 2 * count, MaxRecvWR: 2 * count, SQSigAll: true})
		if err != nil {
			return err
		}
		peers[i] = &demoPeer{ep, pd, cq, q, buf, mr}
	}
	for i, p := range peers {
		o := peers[1-i]
		localPSN := bth.PSN(0xFFFF00 + 0x40*i)
		remote := transport.Remote{Addr: netip.AddrPortFrom(o.ep.LocalAddr().Addr(), port), QPN: o.qp.QPN(), PSN: bth.PSN(0xFFFF00 + 0x40*(1-i))}
		attrs := transport.ConnectAttr{PathMTU: mtu, Timeout: 10, MinRNRTimer: 1,
			Access: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ | qp.IBV_ACCESS_REMOTE_ATOMIC}
		if err := p.qp.Connect(remote, localPSN, attrs); err != nil {
			return err
		}
	}
	A, B := peers[0], peers[1]
	fmt.Fprintf(out, "roce-emu demo: A %s QPN %#06x <-> B %s QPN %#06x, UDP port %d, path MTU %d, PSNs start at 0xffff00/0xffff40 so they wrap\n",
		A.ep.LocalAddr().Addr(), A.qp.QPN(), B.ep.LocalAddr().Addr(), B.qp.QPN(), port, mtu.Bytes())
	fmt.Fprintf(out, "\n%-6s %-16s %8s %5s %10s %9s %8s %8s %8s %8s  %s\n", "loss", "operation", "bytes", "msgs", "time", "Gb/s", "retrans", "seqNAK", "timeout", "implied", "data")
	totalMsgs, totalBytes := 0, 0
	for round, l := range []float64{0, loss} {
		bounded.startRound(round)
		if l > 0 {
			faults.SetRules(append([]*transport.FaultRule{transport.LossRule(l)}, rules...)...)
		} else {
			faults.SetRules(rules...)
		}
		for _, op := range []qp.WROpcode{qp.IBV_WR_SEND, qp.IBV_WR_RDMA_WRITE, qp.IBV_WR_RDMA_READ} {
			for _, n := range sizes {
				before := A.qp.Counters()
				start := time.Now()
				if err := demoRound(A, B, op, n, count); err != nil {
					return fmt.Errorf("%s of %d bytes with loss %g: %v", op, n, l, err)
				}
				el := time.Since(start)
				c := A.qp.Counters()
				fmt.Fprintf(out, "%-6g %-16s %8d %5d %8.2fms %9.3f %8d %8d %8d %8d  verified\n", l, op, n, count, float64(el.Microseconds())/1000,
					float64(n*count)*8/el.Seconds()/1e9, c.RetransmittedPkts-before.RetransmittedPkts, c.PacketSeqErr-before.PacketSeqErr,
					c.LocalAckTimeoutErr-before.LocalAckTimeoutErr, c.ImpliedNakSeqErr-before.ImpliedNakSeqErr)
				rec.row(l, op.String(), n, count, el, true, before, c)
				bounded.noteStop(out)
				totalMsgs += count
				totalBytes += n * count
			}
		}
		before := A.qp.Counters()
		start := time.Now()
		if err := demoAtomics(A, B, count); err != nil {
			return fmt.Errorf("atomics with loss %g: %v", l, err)
		}
		el := time.Since(start)
		c := A.qp.Counters()
		fmt.Fprintf(out, "%-6g %-16s %8d %5d %8.2fms %9s %8d %8d %8d %8d  verified\n", l, "FETCH_ADD+CMP_SWP", 8, 2*count, float64(el.Microseconds())/1000, "-",
			c.RetransmittedPkts-before.RetransmittedPkts, c.PacketSeqErr-before.PacketSeqErr, c.LocalAckTimeoutErr-before.LocalAckTimeoutErr, c.ImpliedNakSeqErr-before.ImpliedNakSeqErr)
		rec.row(l, "FETCH_ADD+CMP_SWP", 8, 2*count, el, false, before, c)
		bounded.noteStop(out)
		totalMsgs += 2 * count
	}
	printDemoLegend(out, loss)
	ca, cb := A.qp.Counters(), B.qp.Counters()
	fmt.Fprintf(out, "\n%d messages, %d bytes, every byte and every completion checked.\n", totalMsgs, totalBytes)
	fmt.Fprintf(out, "A (requester): %s\n", describeCounters(ca))
	fmt.Fprintf(out, "B (responder): %s\n", describeCounters(cb))
	sa := A.ep.Stats()
	fmt.Fprintf(out, "A's ICRC checks: %d datagrams received, %d bad ICRC; injected loss dropped %d packets\n", sa.Received, sa.BadICRC, faults.Dropped[transport.Out]+faults.Dropped[transport.In])
	if err := rec.finish(totalMsgs, totalBytes, ca, cb, sa, faults.Dropped[transport.Out]+faults.Dropped[transport.In], map[bool]string{true: pcapFile}[capture != nil]); err != nil {
		return err
	}
	if capture != nil {
		if err := capture.Flush(); err != nil {
			return fmt.Errorf("writing %s: %v", pcapFile, err)
		}
		portFlag, tsharkPort := "", ""
		if port != bth.UDPPort {
			portFlag = fmt.Sprintf("--udp-port %d ", port)
			tsharkPort = fmt.Sprintf(" -o infiniband.rroce.port:%d", port)
		}
		fmt.Fprintf(out, "capture: %s (read it with: roce-emu decode %s%s, or tshark%s -r %s); it shows packets as they\n", pcapFile, portFlag, pcapFile, tsharkPort, pcapFile)
		fmt.Fprintln(out, "arrived, so it also holds the ones the injected loss then dropped on the way in.")
		fmt.Fprintln(out, bounded.describe())
	}
	return nil
}

// demoRound runs count operations of n bytes from A to B and checks them.
func demoRound(A, B *demoPeer, op qp.WROpcode, n, count int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Fresh contents for each round, so a stale byte cannot pass.
	stamp := byte(time.Now().UnixNano())
	src, dst := A, B
	if op == qp.IBV_WR_RDMA_READ {
		src, dst = B, A
	}
	// Both endpoints are held while the buffers change: a peer may still
	// answer a late duplicate READ from them.
	src.ep.Locked(func() {
		dst.ep.Locked(func() {
			for i := range count * n {
				src.buf[i] = byte(i*7) ^ byte(i>>10) ^ stamp
				dst.buf[i] = ^src.buf[i]
			}
		})
	})
	for i := range count {
		off := i * n
		switch op {
		case qp.IBV_WR_SEND:
			if err := B.qp.PostRecv(qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{B.mr.SGE(off, n)}}); err != nil {
				return err
			}
			if err := A.qp.PostSend(qp.SendWR{WRID: uint64(i), Opcode: op, SGEs: []qp.SGE{A.mr.SGE(off, n)}}); err != nil {
				return err
			}
		default:
			if err := A.qp.PostSend(qp.SendWR{WRID: uint64(i), Opcode: op, SGEs: []qp.SGE{A.mr.SGE(off, n)},
				RemoteAddr: B.mr.VA + uint64(off), RKey: B.mr.RKey}); err != nil {
				return err
			}
		}
	}
	if err := expect(ctx, A.cq, count); err != nil {
		return err
	}
	if op == qp.IBV_WR_SEND {
		if err := expect(ctx, B.cq, count); err != nil {
			return fmt.Errorf("B: %v", err)
		}
	}
	var same bool
	src.ep.Locked(func() {
		dst.ep.Locked(func() { same = bytes.Equal(src.buf[:count*n], dst.buf[:count*n]) })
	})
	if !same {
		return fmt.Errorf("data differs after %s", op)
	}
	return nil
}

// expect waits for n successful completions in order of wr_id 0..n-1.
func expect(ctx context.Context, cq *transport.CQ, n int) error {
	wc := make([]qp.WC, 64)
	got := 0
	for got < n {
		k, err := cq.Wait(ctx, wc)
		if err != nil {
			return fmt.Errorf("after %d of %d completions: %v", got, n, err)
		}
		for _, c := range wc[:k] {
			if c.Status != qp.IBV_WC_SUCCESS {
				return fmt.Errorf("completion %d: %s", c.WRID, c.Status)
			}
			if c.WRID != uint64(got) {
				return fmt.Errorf("completion for wr_id %d came where %d was due", c.WRID, got)
			}
			got++
		}
	}
	return nil
}

// demoAtomics runs count fetch-and-adds and count compare-and-swaps on one
// word of B and checks every returned value and the final word.
func demoAtomics(A, B *demoPeer, count int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	B.ep.Locked(func() { binary.LittleEndian.PutUint64(B.buf[0:8], 1000) })
	for i := range count {
		if err := A.qp.PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_ATOMIC_FETCH_AND_ADD, SGEs: []qp.SGE{A.mr.SGE(8*i, 8)},
			RemoteAddr: B.mr.VA, RKey: B.mr.RKey, CompareAdd: 3}); err != nil {
			return err
		}
	}
	if err := expect(ctx, A.cq, count); err != nil {
		return err
	}
	A.ep.Sync()
	for i := range count {
		if v := binary.LittleEndian.Uint64(A.buf[8*i:]); v != uint64(1000+3*i) {
			return fmt.Errorf("fetch-and-add %d returned %d, want %d", i, v, 1000+3*i)
		}
	}
	// Each compare-and-swap expects the value the previous one wrote.
	base := uint64(1000 + 3*count)
	for i := range count {
		if err := A.qp.PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_ATOMIC_CMP_AND_SWP, SGEs: []qp.SGE{A.mr.SGE(8*i, 8)},
			RemoteAddr: B.mr.VA, RKey: B.mr.RKey, CompareAdd: base + uint64(i), Swap: base + uint64(i) + 1}); err != nil {
			return err
		}
	}
	if err := expect(ctx, A.cq, count); err != nil {
		return err
	}
	A.ep.Sync()
	B.ep.Sync()
	for i := range count {
		if v := binary.LittleEndian.Uint64(A.buf[8*i:]); v != base+uint64(i) {
			return fmt.Errorf("compare-and-swap %d returned %d, want %d", i, v, base+uint64(i))
		}
	}
	if v := binary.LittleEndian.Uint64(B.buf[0:8]); v != base+uint64(count) {
		return fmt.Errorf("the word is %d after the atomics, want %d", v, base+uint64(count))
	}
	return nil
}

// printDemoLegend explains the table's columns under it.
func printDemoLegend(out io.Writer, loss float64) {
	fmt.Fprintf(out, `
loss       the probability that each packet is dropped, in both directions, during the round: 0 is the
           clean round, %g the lossy one (--loss); the drops are injected at A's socket. On loopback
           the kernel may also drop a datagram when a socket's buffer is full: a retrans in a 0 row.
operation  the work request A posts (RDMA_READ reads from B); FETCH_ADD+CMP_SWP is -n fetch-and-adds,
           then -n compare-and-swaps, on one 8-byte word of B.
bytes      the size of each message; msgs: messages in the row, -n per size.
time       from the first post to the last completion; Gb/s: message bytes over that time.
retrans    request packets A sent again (retransmitted_pkts). RC recovers by go-back-N, as rxe and
           ConnectX do: after a loss A resends every packet from the first unacknowledged PSN on,
           also those that had arrived, so one lost packet of a 1 MiB message can cost hundreds of
           resends; compare "injected loss dropped" below.
seqNAK     PSN sequence error NAKs A received (packet_seq_err): B saw a gap and asked for the packet
           at its expected PSN; each starts a go-back-N.
timeout    expiries of A's ACK timer (local_ack_timeout_err, timeout 10: 4.2 ms): nothing acknowledged
           the oldest packet in time (a lost last packet or a lost ACK); each starts a go-back-N.
implied    implied NAKs (implied_nak_seq_err): a READ or atomic response arrived past one that was
           lost (responders never NAK responses), so A goes back to the missing PSN by itself.
data       what was checked before the row was printed: every byte, source against destination,
           and every completion (status IBV_WC_SUCCESS, in order); a failed check ends the demo.
`, loss)
}

// boundedCapture keeps the demo's capture under a size, half of it for
// each round so that the lossy round's NAKs and resends are in it too:
// events go to the capture until the next record would take the file past
// the round's share of limit bytes (0: no limit); then the round's capture
// stops and the rest of its packets are counted.
type boundedCapture struct {
	limit   int64
	end     atomic.Int64 // the current round's end: the file may grow to it
	stopped atomic.Bool  // the current round's capture stopped
	size    atomic.Int64 // bytes of the file so far, its header included
	written atomic.Uint64
	skipped atomic.Uint64
	noted   bool // noteStop said so this round (the demo's goroutine only)
}

// pcapFileHeader and pcapRecordHeader are the sizes of libpcap's file and
// record headers; ethernetHeader the frames' link header.
const pcapFileHeader, pcapRecordHeader, ethernetHeader = 24, 16, 14

// startRound gives round (0 the clean one, 1 the lossy one) its half of
// the limit, and what the round before left unused.
func (b *boundedCapture) startRound(round int) {
	b.end.Store(b.limit * int64(round+1) / 2)
	b.stopped.Store(false)
	b.noted = false
}

func (b *boundedCapture) observer(capture transport.Observer) transport.Observer {
	b.size.Store(pcapFileHeader)
	return func(e *transport.Event) {
		ip := 20
		if !e.Datagram.Src.Addr().Unmap().Is4() || !e.Datagram.Dst.Addr().Unmap().Is4() {
			ip = 40
		}
		n := int64(pcapRecordHeader + ethernetHeader + ip + 8 + len(e.Datagram.Data))
		if b.stopped.Load() || (b.limit > 0 && b.size.Load()+n > b.end.Load()) {
			b.stopped.Store(true)
			b.skipped.Add(1)
			return
		}
		b.size.Add(n)
		b.written.Add(1)
		capture(e)
	}
}

// noteStop prints, under the table row during which the round's capture
// stopped, that it did.
func (b *boundedCapture) noteStop(out io.Writer) {
	if b.noted || !b.stopped.Load() {
		return
	}
	b.noted = true
	fmt.Fprintf(out, "       ^ the capture of this round stopped at %.1f MiB during this row (--pcap-limit %d MiB, half per round; 0 for none)\n",
		float64(b.end.Load())/(1<<20), b.limit>>20)
}

// describe says how much of the run the capture holds.
func (b *boundedCapture) describe() string {
	mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	w, s := b.written.Load(), b.skipped.Load()
	switch {
	case s > 0:
		return fmt.Sprintf("The capture stopped at its %s limit (--pcap-limit, half for each round; 0 for none): it holds %d of the %d packets\nA's socket saw (%s), each round's first ones; the rest of each round is not in it.",
			mib(b.limit), w, w+s, mib(b.size.Load()))
	case b.limit > 0:
		return fmt.Sprintf("It holds all %d packets (%s, under its %s limit, --pcap-limit).", w, mib(b.size.Load()), mib(b.limit))
	}
	return fmt.Sprintf("It holds all %d packets (%s; no limit).", w, mib(b.size.Load()))
}
