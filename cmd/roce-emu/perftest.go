package main

// roce-emu bw/lat: perftest 6.06's tests (Debian 12's perftest
// 4.5+0.17), so that roce-emu runs against ib_{send,write,read}_{bw,lat}
// as client or server, and against another roce-emu. The out-of-band
// exchange is oob.Perftest's; this file holds the command's side of it
// (which steps each test takes, as perftest's *_bw.c and *_lat.c do) and
// the traffic. What perftest does was read in linux-rdma/perftest
// (src/perftest_resources.c, *_bw.c, *_lat.c) and checked against the
// real programs on rxe (oob/testdata/perftest-6.06-*-exchange.txt).
//
// The QP attributes are perftest's: RTR with the negotiated MTU, the
// peer's QPN and PSN, max_dest_rd_atomic = own out_reads, min_rnr_timer 12,
// hop limit 255; RTS with own PSN, timeout 14 (-u), retry_cnt 7, rnr_retry
// 7, max_rd_atomic = the peer's out_reads. Each side registers one buffer
// with, per QP, local slots and a region of INC(max(size, cycle buffer))
// bytes it advertises in that QP's key string; write, read and atomic
// bandwidth clients walk the remote address in steps of the size rounded
// up to the cache line, over one cycle buffer, when the size is at most
// half of it, tx depth operations per QP at a time, the QPs in turn (no
// warm-up by default). perftest's modes: -q (QPs), -a (all sizes), -D
// (duration), -b (duplex), atomics (-o atomic -A), as write_bw.c,
// send_bw.c, atomic_bw.c, *_lat.c and perftest_resources.c of perftest
// 4.5-0.17 run them.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// Values roce-emu offers in perftest's exchange.
const (
	perftestRxDepth = 512  // perftest's default rx depth
	perftestPoison  = 0xA5 // fills a READ's landing buffer before the READ
)

// perftestProgram names the perftest program a test corresponds to.
func perftestProgram(kind string, op qp.WROpcode) string {
	return "ib_" + map[qp.WROpcode]string{qp.IBV_WR_SEND: "send", qp.IBV_WR_RDMA_WRITE: "write", qp.IBV_WR_RDMA_READ: "read",
		qp.IBV_WR_ATOMIC_FETCH_AND_ADD: "atomic", qp.IBV_WR_ATOMIC_CMP_AND_SWP: "atomic"}[op] + "_" + kind
}

// perftestInc is perftest's INC(size, cache_line): the step between two
// operations' addresses within the cycle buffer.
func perftestInc(size, cacheLine int) int {
	if size > cacheLine {
		return (size + cacheLine - 1) / cacheLine * cacheLine
	}
	return cacheLine
}

// perftestOffset is where the k-th operation of a bandwidth test goes in
// the peer's buffer (increase_rem_addr): steps of INC over one cycle
// buffer when the size is at most half of it, else always the start.
func perftestOffset(k, size, cycle, cacheLine int) int {
	if size > cycle/2 {
		return 0
	}
	inc := perftestInc(size, cacheLine)
	return k % (cycle / inc) * inc
}

// perftestSources is how many distinct local buffers perftest's WRITEs
// and SENDs of size bytes come from (increase_loc_addr, as
// perftestOffset for the peer's side): the steps of INC that fit one
// cycle buffer when the size is at most half of it, else one, so that
// every 64 KiB WRITE of ib_write_bw leaves from the same 64 KiB. Sending
// from tx-depth buffers instead (128 of 64 KiB: 8 MiB) would have each
// message's payload read from beyond the processor's L2 cache, which
// measurably slows a run on loopback (docs/datapath.md).
func perftestSources(size, cycle, cacheLine int) int {
	if size > cycle/2 {
		return 1
	}
	return max(1, cycle/perftestInc(size, cacheLine))
}

// perftestGID prints a GID as perftest does ("%02d:" per byte).
func perftestGID(a netip.Addr) string {
	var g [16]byte
	if a.IsValid() {
		g = a.As16()
	}
	parts := make([]string, len(g))
	for i, x := range g {
		parts[i] = fmt.Sprintf("%02d", x)
	}
	return strings.Join(parts, ":")
}

// perftestDial connects to the server from bind (dialExchange), or waits
// for one client.
func perftestDial(ctx context.Context, bind netip.Addr, host string, port int, out io.Writer) (net.Conn, error) {
	if host != "" {
		c, err := dialExchange(ctx, bind, host, port)
		if err != nil {
			return nil, fmt.Errorf("cannot reach the server at %s port %d: %v", host, port, err)
		}
		return c, nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, addrInUseHint(fmt.Errorf("cannot listen on TCP port %d: %w", port, err), tcpInUse)
	}
	fmt.Fprintln(out, "\n************************************")
	fmt.Fprintln(out, "* Waiting for client to connect... *")
	fmt.Fprintln(out, "************************************")
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	c, err := l.Accept()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("no client came: %v", whyStopped(ctx, err))
	}
	return c, nil
}

// perftestRun is roce-emu bw/lat: perftest's steps for the test kind
// ("bw" or "lat") of op, as client (host given) or server.
//
// On SIGINT or SIGTERM the run stops: with -R or -z its rdma_cm
// connections are disconnected (DREQs, the DREPs awaited at most
// cmDisconnectWait) so that the peer's perftest ends too, the capture is
// closed whole, the counters are printed on stderr and the run ends with
// an *interruptedError (exit 128+signal).
func perftestRun(kind, host string, op qp.WROpcode, mtu qp.MTU, f *perfFlags, out io.Writer) (err error) {
	client := host != ""
	ep, closeAll, err := f.openEndpoint()
	if err != nil {
		return err
	}
	var r *perftestTraffic
	defer func() {
		closeAll() // before the buffer goes: the endpoint writes into it
		if r != nil {
			r.free()
		}
	}()
	if !f.noPeak && perftestPeakOff(kind, op, client, f) {
		fmt.Fprintln(out, perftestNoPeak)
	}
	ctx, cancel := runContext(f.timeout)
	defer cancel()
	ctx, intr, stopSignals := withSignals(ctx)
	defer stopSignals()
	var pcm *perftestCM // -R or -z: the exchange over rdma_cm
	cmDetail := "no rdma_cm connection was up"
	defer func() { // after the connections are closed, before the capture is
		sig := intr.caught()
		if sig == nil {
			return
		}
		if pcm != nil {
			fmt.Fprintf(f.stderr, "roce-emu %s: cm counters: %s\n", kind, cmCounters(pcm.svc.Stats()))
		}
		if r != nil {
			fmt.Fprintf(f.stderr, "roce-emu %s: qp counters: %s\n", kind, describeCounters(r.counters(nil)))
		}
		if !f.rdmaCM && !f.rdmaCMz {
			cmDetail = "stopped"
		}
		err = &interruptedError{sig: sig, detail: cmDetail, cause: err}
	}()

	var s *oob.Perftest
	var peerIP netip.Addr  // where the exchange came from: the GIDs are checked against it
	var xb *exchangeBound  // --exchange-timeout, from when the peer connected
	var exLocal netip.Addr // this side's address on the exchange's connection
	defer func() { err = xb.explain(err) }()
	if f.rdmaCM || f.rdmaCMz {
		if pcm, err = perftestCMConnect(ctx, ep, f, host, out); err != nil {
			return err
		}
		defer func() {
			if pcm != nil {
				cmDetail, _ = pcm.close()
			}
		}()
		peerIP = pcm.peer
		xb = f.exchangeBound(pcm.peer.String() + " (rdma_cm)")
		s = oob.NewPerftestCMServer(pcm)
		if client {
			s = oob.NewPerftestCMClient(pcm)
		}
	} else {
		bind, _ := netip.ParseAddr(f.bind)
		conn, err := perftestDial(ctx, bind, host, f.port, out)
		if err != nil {
			return err
		}
		defer conn.Close()
		peerIP = oob.RemoteIP(conn)
		xb = f.exchangeBound(conn.RemoteAddr().String())
		exLocal = oob.LocalIP(conn)
		s = oob.NewPerftestServer(conn)
		if client {
			s = oob.NewPerftestClient(conn)
		}
	}

	s.CycleBufferLimit = f.maxCycle
	// The set-up steps, up to the barrier before traffic, all within
	// --exchange-timeout of the peer's connection.
	xctx, xcancel := xb.under(ctx)
	defer xcancel()
	// Versions, system data and MTU, before the QPs exist.
	peerVer, err := s.Versions(xctx)
	if err != nil {
		return err
	}
	sys, err := s.SysData(xctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine})
	if errors.Is(err, oob.ErrCycleBuffer) {
		return fmt.Errorf("%w (--max-cycle-buffer %d; raise it to accept this peer)", err, f.maxCycle)
	}
	if err != nil {
		return err
	}
	curMTU, err := s.MTU(xctx, mtu)
	if err != nil {
		return err
	}

	size := f.size
	if f.all {
		size = perftestMaxSize // perftest sizes its buffer for the largest
	}
	iters := f.iters
	if f.duration > 0 {
		iters = 0
	}
	// perftest advertises its device's maximum for READ and atomic tests
	// (128 on rxe) and 1 otherwise; roce-emu's responder keeps 16.
	outReads := uint16(1)
	if op == qp.IBV_WR_RDMA_READ || isAtomic(op) {
		outReads = 16
	}
	var connect perftestQPConnect
	if f.rdmaCM {
		// create_rdma_cm_connection: a hand-shake, the data QPs'
		// rdma_cm connections (the server listening before the
		// hand-shake lets the client dial), another hand-shake.
		if !client {
			if err := pcm.listen(); err != nil {
				return err
			}
		}
		if err := s.Barrier(xctx, "before the rdma_cm connections"); err != nil {
			return err
		}
		cmReads := uint8(0)
		if outReads > 1 {
			cmReads = uint8(outReads)
		}
		connect = func(pd *transport.PD, cq *transport.CQ, init qp.InitAttr, access qp.Access, recvs []qp.RecvWR) (*transport.QP, error) {
			return pcm.connectQP(xctx, pd, cq, init, access, cmReads, curMTU, recvs)
		}
	}
	// The QPs and their memory (sized by the cycle buffer the peer
	// announced): over rdma_cm, before the data QPs' connections; over
	// TCP, a server makes them only once the peer's first key has come
	// and parsed (KeysAfter), so that a peer that announces a large cycle
	// buffer and sends nothing more costs nothing.
	var locals []oob.PerftestKey
	makeTraffic := func() ([]oob.PerftestKey, error) {
		var err error
		if r, err = newPerftestTraffic(ctx, ep, kind, op, client, f.bidir, size, iters, f.txDepth, f.rxDepth, f.qps, sys, &f.ccFlags, connect); err != nil {
			return nil, err
		}
		r.noPeak = f.noPeak || perftestPeakOff(kind, op, client, f)
		if connect != nil {
			if err := s.Barrier(xctx, "after the rdma_cm connections"); err != nil {
				return nil, err
			}
		}
		locals = make([]oob.PerftestKey, len(r.qps))
		for i, pq := range r.qps {
			locals[i] = oob.PerftestKey{OutReads: outReads, QPN: pq.q.QPN(), PSN: randomPSN(), GID: ep.LocalAddr().Addr(),
				RKey: r.mr.RKey, VA: r.mr.VA + uint64(r.advAt(i))}
			if connect != nil {
				// The PSN rdma_cm gave the QP (perftest sends and prints a
				// random one its QP does not use).
				locals[i].PSN = pcm.data[i].Params().SQPSN
			}
		}
		return locals, nil
	}
	var remotes []oob.PerftestKey
	if connect != nil {
		if _, err := makeTraffic(); err != nil {
			return err
		}
		remotes, err = s.Keys(xctx, locals)
	} else {
		remotes, err = s.KeysAfter(xctx, f.qps, makeTraffic)
	}
	if err != nil {
		if client && connect == nil {
			err = refusedHint(err, ep.LocalAddr().Addr(), exLocal)
		}
		return err
	}
	for i, pq := range r.qps {
		pq.local, pq.remote = locals[i], remotes[i]
		if connect != nil {
			continue // rdma_cm connected it
		}
		if err := f.checkPeerGID(pq.remote.GID, peerIP, pq.remote.QPN); err != nil {
			return fmt.Errorf("QP %d: %w", i, err)
		}
		if err := perftestConnect(pq.q, pq.local, pq.remote, f.peer, uint16(f.udpPort), curMTU, f.qpTimeout, r.access); err != nil {
			return fmt.Errorf("QP %d: %w", i, err)
		}
	}
	r.q, r.remote = r.qps[0].q, r.qps[0].remote
	qs := make([]*transport.QP, len(r.qps))
	for i, pq := range r.qps {
		qs[i] = pq.q
	}
	// A step that fails once the QPs are connected says why a QP went to
	// IBV_QPS_ERR, if one did: the peer may have left after its NAK.
	defer func() { err = explainQPErr(err, qs...) }()
	defer watchDeadPath(ctx, f.stderr, r.q)()
	defer watchProgress(ctx, f.progress, f.stderr, r.q)()
	ctx, stopMismatch := watchMismatch(ctx, f.stderr, kind, op, f, r.q)
	defer stopMismatch()
	ctx, stopSilence := watchPeerSilence(ctx, f.stderr, kind, f.peerTimeout, qs...)
	defer stopSilence()
	defer func() { err = saidAbove(ctx, err) }()
	r.ctx = ctx
	xcancel()
	xctx, xcancel = xb.under(ctx) // the same deadline, under the mismatch watcher
	defer xcancel()
	// The barriers after connecting: one per QP and one of QP 0, in the
	// order of the program (send_bw has QP 0's first).
	if kind == "bw" && op == qp.IBV_WR_SEND {
		err = s.Barrier(xctx, "after connecting")
		if err == nil {
			err = s.BarrierEach(xctx, "addresses printed")
		}
	} else {
		err = s.BarrierEach(xctx, "after connecting")
		if err == nil {
			err = s.Barrier(xctx, "addresses printed")
		}
	}
	if err != nil {
		if client && connect == nil {
			// A server that refused our GID closed after its keys.
			err = refusedHint(err, ep.LocalAddr().Addr(), exLocal)
		}
		return err
	}
	printPerftestHeader(out, kind, op, client, peerVer, curMTU, sys, r, f)

	// send_bw and every latency test: one more barrier once the receives
	// are posted, then traffic.
	if (op == qp.IBV_WR_SEND && !f.all) || (kind == "lat" && op != qp.IBV_WR_SEND) {
		if err := s.Barrier(xctx, "before traffic"); err != nil {
			return err
		}
	}
	// From here the exchange waits on the traffic: each step is bounded
	// by --exchange-timeout from its start and the last packet received.
	xb.finished = true
	xcancel()
	r.bound = &stepBound{timeout: f.exchangeTimeout, peer: xb.cause.peer, qps: qs}
	if err := r.test(ctx, s, kind, client, f, out); err != nil {
		return err
	}
	switch {
	case r.checked > 0 && isAtomic(op):
		fmt.Fprintf(out, " data check: %d %ss at %d offsets of the peer's buffer each found what the one before at the same offset left (each landing buffer poisoned first)\n",
			r.checked, atomicName(op), len(r.ref))
	case r.checked > 0 && f.all:
		fmt.Fprintf(out, " data check: %d READs of sizes 2 to %d bytes, each as the first READ of its size from the same offset of the peer's buffer, byte for byte (each landing buffer poisoned first)\n",
			r.checked, perftestMaxSize)
	case r.checked > 0:
		fmt.Fprintf(out, " data check: %d READs of %d bytes from %d offsets of the peer's buffer agree byte for byte (each landing buffer poisoned first)\n",
			r.checked, r.size, len(r.ref))
	}
	// The ACK held after the last completion (--reply-hold) and the CNPs
	// this side owes leave before the last exchange, after which the peer
	// counts what it received.
	r.ep.Flush()
	flushCNPs(ctx, qs...)
	// ib_write_lat closes the socket without a last barrier or "done".
	if !(kind == "lat" && op == qp.IBV_WR_RDMA_WRITE) {
		if err := r.bound.do(ctx, s.Done); err != nil {
			return err
		}
	}
	if f.outJSON || f.js.on {
		test := map[qp.WROpcode]string{qp.IBV_WR_SEND: "Send", qp.IBV_WR_RDMA_WRITE: "RDMA_Write", qp.IBV_WR_RDMA_READ: "RDMA_Read"}[op]
		if isAtomic(op) {
			test = "Atomic_" + atomicName(op)
		}
		if f.bidir {
			test += "_Bidirectional"
		}
		test += map[string]string{"bw": "_BW_Test", "lat": "_Latency_Test"}[kind]
		r.json.Info = perfJSONInfo{Test: test, DualPort: "OFF", Device: "roce-emu", NumberOfQPs: len(r.qps), TransportType: "IB",
			ConnectionType: "RC", UsingSRQ: "OFF", Mtu: curMTU.Bytes(), LinkType: "Ethernet", OutstandReads: int(outReads),
			RdmaCMQPs: "OFF", DataExMethod: "Ethernet"}
		if pcm != nil {
			r.json.Info.DataExMethod = "rdma_cm"
		}
		if connect != nil {
			r.json.Info.RdmaCMQPs = "ON"
		}
		if kind == "bw" {
			r.json.Info.TXDepth, r.json.Info.RXDepth = r.depth, r.rxDepth
		}
		if err := writePerfJSON(&r.json, f, kind, r.q.Counters()); err != nil {
			return err
		}
	}
	sum := r.counters(func(i int, c qp.Counters) {
		if len(r.qps) > 1 {
			fmt.Fprintf(out, " QP %d counters: %s\n", i, describeCounters(c))
		}
	})
	fmt.Fprintf(out, " counters: %s\n", describeCounters(sum))
	fmt.Fprintf(out, " congestion (%s): %s\n", f.ccFlags.describe(true), sumCC(qs))
	fmt.Fprintf(out, " requests served: %d RDMA WRITE, %d RDMA READ, %d SEND, %d atomic\n", sum.RxWriteRequests, sum.RxReadRequests, sum.RxSendRequests, sum.RxAtomicRequests)
	fmt.Fprintf(out, " drops and refusals: %s\n", describeDrops(sum, ep.Stats(), r.cq))
	// A QP a peer's NAK or a local error ended fails the run, even when
	// the exchange went on to the end (a server's QP is never polled).
	qpErr := qpErrors(qs...)
	if pcm != nil {
		_, err := pcm.close()
		pcm = nil
		if err != nil {
			return err
		}
		if connect != nil {
			fmt.Fprintf(out, " rdma_cm: %d data QPs disconnected\n", len(r.qps))
		}
	}
	return qpErr
}

// perftestPeakOff reports whether perftest turns the BW peak off for this
// run (force_dependencies, with perftestNoPeak): -D, a SEND bandwidth
// server without -b, more than perftestPeakMaxIters iterations.
func perftestPeakOff(kind string, op qp.WROpcode, client bool, f *perfFlags) bool {
	if kind != "bw" {
		return false
	}
	return f.duration > 0 || (op == qp.IBV_WR_SEND && !client && !f.bidir) || f.iters > perftestPeakMaxIters
}

// counters sums the counters of the run's QPs, handing each QP's to each
// first when it is not nil.
func (r *perftestTraffic) counters(each func(i int, c qp.Counters)) qp.Counters {
	cs := make([]qp.Counters, 0, len(r.qps))
	for i, pq := range r.qps {
		c := pq.q.Counters()
		if each != nil {
			each(i, c)
		}
		cs = append(cs, c)
	}
	return sumCounters(cs...)
}

// atomicName is perftest's name of an atomic operation (-A).
func atomicName(op qp.WROpcode) string {
	if op == qp.IBV_WR_ATOMIC_CMP_AND_SWP {
		return "CMP_AND_SWAP"
	}
	return "FETCH_AND_ADD"
}

func isAtomic(op qp.WROpcode) bool {
	return op == qp.IBV_WR_ATOMIC_FETCH_AND_ADD || op == qp.IBV_WR_ATOMIC_CMP_AND_SWP
}

// printPerftestHeader prints the test's parameters and both sides'
// addresses, as perftest does before traffic: every local QP, then every
// remote one.
func printPerftestHeader(out io.Writer, kind string, op qp.WROpcode, client bool, peerVer string, mtu qp.MTU, sys oob.SysData, r *perftestTraffic, f *perfFlags) {
	title := map[qp.WROpcode]string{qp.IBV_WR_SEND: "Send", qp.IBV_WR_RDMA_WRITE: "RDMA_Write", qp.IBV_WR_RDMA_READ: "RDMA_Read",
		qp.IBV_WR_ATOMIC_FETCH_AND_ADD: "Atomic FETCH_AND_ADD", qp.IBV_WR_ATOMIC_CMP_AND_SWP: "Atomic CMP_AND_SWAP"}[op]
	test := "BW"
	if kind == "lat" {
		test = "Latency"
	}
	role := "server"
	if client {
		role = "client"
	}
	fmt.Fprintln(out, perfRule)
	fmt.Fprintf(out, "                    %s %s Test (roce-emu, perftest %s protocol, %s of %s)\n", title, test, oob.PerftestVersion, role, perftestProgram(kind, op))
	fmt.Fprintf(out, " Number of qps   : %d\t\tConnection type : RC\n", len(r.qps))
	fmt.Fprintf(out, " Peer version    : %s\n", peerVer)
	fmt.Fprintf(out, " Mtu             : %d[B]\t\tCycle buffer   : %d[B] (cache line %d)\n", mtu.Bytes(), sys.CycleBuffer, sys.CacheLine)
	if kind == "bw" {
		fmt.Fprintf(out, " TX depth        : %d\t\tRX depth       : %d\n", r.depth, r.rxDepth)
	}
	switch {
	case f.duration > 0:
		fmt.Fprintf(out, " Duration        : %d[sec] (margin %d[sec] at each end)\n", f.duration, f.margin)
	case f.all:
		fmt.Fprintf(out, " Sizes           : 2 to %d[B], %d iterations each\n", perftestMaxSize, f.iters)
	}
	fmt.Fprintln(out, perfRule)
	for _, side := range []string{"local", "remote"} {
		for _, pq := range r.qps {
			k := pq.local
			if side == "remote" {
				k = pq.remote
			}
			// perftest's formats, "%#06x" and so on, count the 0x in the width.
			fmt.Fprintf(out, " %s address: LID %04x QPN 0x%04x PSN 0x%04x", side, k.LID, k.QPN, uint32(k.PSN))
			if op == qp.IBV_WR_RDMA_READ || isAtomic(op) {
				fmt.Fprintf(out, " OUT 0x%02x", k.OutReads)
			}
			if op != qp.IBV_WR_SEND {
				fmt.Fprintf(out, " RKey 0x%06x VAddr 0x%014x", k.RKey, k.VA)
			}
			fmt.Fprintf(out, "\n GID: %s\n", perftestGID(k.GID))
		}
	}
	fmt.Fprintln(out, perfRule)
}

// perftestConnect moves q to RTR and RTS as perftest's ctx_connect does.
func perftestConnect(q *transport.QP, local, rem oob.PerftestKey, peer func(netip.AddrPort) netip.AddrPort, udpPort uint16, mtu qp.MTU, timeout int, access qp.Access) error {
	av := qp.AddressVector{Remote: peer(netip.AddrPortFrom(gidAddr(rem.GID, local.GID), udpPort)), HopLimit: routeHopLimit} // perftest asks 0xFF; see routeHopLimit
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: mtu, DestQPN: rem.QPN, RQPSN: rem.PSN,
		MaxDestRdAtomic: uint8(min(local.OutReads, 255)), MinRNRTimer: 12, AV: av, AccessFlags: access},
		qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|
			qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER|qp.IBV_QP_ACCESS_FLAGS); err != nil {
		return fmt.Errorf("cannot move the QP to RTR towards %s QPN %#x: %w", rem.GID, rem.QPN, err)
	}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: local.PSN, Timeout: uint8(timeout), RetryCnt: 7, RNRRetry: 7,
		MaxRdAtomic: uint8(min(max(int(rem.OutReads), 1), qp.MaxRdAtomicLimit))},
		qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC); err != nil {
		return fmt.Errorf("cannot move the QP to RTS: %w", err)
	}
	return nil
}

// test runs the traffic of the test and, for the bandwidth tests but
// send_bw, the results exchange, printing what perftest prints.
func (r *perftestTraffic) test(ctx context.Context, s *oob.Perftest, kind string, client bool, f *perfFlags, out io.Writer) error {
	gbits := f.gbits
	fail := func(err error) error {
		return qpTold(fmt.Errorf("%v (QP %s; %s; drops and refusals: %s)%s", whyStopped(ctx, err), qpStateWhy(r.q), describeCounters(r.q.Counters()), describeDrops(r.q.Counters(), r.ep.Stats(), r.cq), remoteAccessLine(r.failed, f)))
	}
	program := perftestProgram(kind, r.op)
	switch {
	case kind == "bw" && f.bidir:
		return r.bidirBW(ctx, s, f, out)
	case kind == "bw" && r.op != qp.IBV_WR_SEND:
		var res bwResult
		n := r.iters * len(r.qps)
		if client {
			var err error
			switch {
			case f.duration > 0:
				if res, n, err = r.bwDuration(gbits, time.Duration(f.duration)*time.Second, time.Duration(f.margin)*time.Second); err != nil {
					return fail(err)
				}
				printBW(out, r.size, n, gbits, res)
				r.json.noteBW(r.size, n, gbits, res)
			case f.all:
				// write_bw and read_bw with -a: each size in turn, one
				// table; only the last size's results go to the server.
				printBWHeader(out, gbits)
				for sz := 2; sz <= perftestMaxSize; sz *= 2 {
					r.size, r.ref = sz, nil
					if res, err = r.bwClient(gbits); err != nil {
						return fail(fmt.Errorf("size %d: %v%s", sz, err, r.remoteAccessHint()))
					}
					printBWLine(out, sz, n, gbits, res)
					r.json.noteBW(sz, n, gbits, res)
				}
				fmt.Fprintln(out, perfRule)
			default:
				if res, err = r.bwClient(gbits); err != nil {
					return fail(err)
				}
				printBW(out, r.size, n, gbits, res)
				r.json.noteBW(r.size, n, gbits, res)
			}
		} else {
			fmt.Fprintf(out, " (the server of %s only serves its memory; the client reports)\n", program)
		}
		// The client says it is done; then the results go across.
		if err := r.bound.do(ctx, func(ctx context.Context) error { return s.Barrier(ctx, "traffic done") }); err != nil {
			if !client && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
				return fmt.Errorf("%v (the client stopped before reporting; if it runs -a, start this server with -a too: its buffer is sized for -s %d)", err, f.size)
			}
			return err
		}
		var rem oob.BWReport
		err := r.bound.do(ctx, func(ctx context.Context) (err error) {
			rem, err = s.BWReports(ctx, oob.BWReport{Size: uint64(r.size), Iters: uint64(n), PeakBW: res.peak, AvgBW: res.avg, MsgRate: res.mpps})
			return err
		})
		if err != nil {
			return err
		}
		if !client {
			theirs, note := inUnit(rem, gbits)
			fmt.Fprintln(out, " the client's results:"+note)
			printBW(out, int(rem.Size), int(rem.Iters), gbits, theirs)
			r.json.noteBW(int(rem.Size), int(rem.Iters), gbits, theirs)
			if isAtomic(r.op) {
				if err := r.checkAtomicRegion(rem.Iters, f.duration > 0, out); err != nil {
					return err
				}
			}
		}
	default:
		// send_bw and the latency tests: each size in turn with -a (SEND
		// tests with a barrier before each, once the receives are
		// posted, and send_bw with one after), one table.
		sizes := []int{r.size}
		if f.all {
			sizes = nil
			for sz := 2; sz <= perftestMaxSize; sz *= 2 {
				sizes = append(sizes, sz)
			}
		}
		if kind == "lat" && (r.op == qp.IBV_WR_RDMA_READ || isAtomic(r.op)) && !client {
			fmt.Fprintf(out, " (the server of %s only serves its memory; the client reports)\n", program)
			return nil
		}
		if kind == "bw" {
			printBWHeader(out, gbits)
		} else {
			printLatHeader(out)
		}
		for i, sz := range sizes {
			r.size, r.ref = sz, nil
			r.sends, r.recvs = 0, 0 // the latency tests count from 0 each size
			if f.all && r.op == qp.IBV_WR_SEND {
				if i > 0 {
					if err := r.repostAll(); err != nil {
						return err
					}
				}
				if err := r.bound.do(ctx, func(ctx context.Context) error { return s.Barrier(ctx, fmt.Sprintf("before SENDs of %d bytes", sz)) }); err != nil {
					return err
				}
			}
			if kind == "bw" {
				var res bwResult
				var err error
				if client {
					res, err = r.bwClient(gbits)
				} else {
					res, err = r.sendBWServer(gbits)
				}
				if err != nil {
					return fail(fmt.Errorf("size %d: %v", sz, err))
				}
				printBWLine(out, sz, r.iters*len(r.qps), gbits, res)
				r.json.noteBW(sz, r.iters*len(r.qps), gbits, res)
				if f.all {
					if err := r.bound.do(ctx, func(ctx context.Context) error { return s.Barrier(ctx, fmt.Sprintf("after SENDs of %d bytes", sz)) }); err != nil {
						return err
					}
				}
				continue
			}
			var samples []time.Duration
			var err error
			switch r.op {
			case qp.IBV_WR_SEND:
				samples, err = r.sendLat(client)
			case qp.IBV_WR_RDMA_WRITE:
				samples, err = r.writeLat(!client)
			default:
				samples, err = r.readLat()
			}
			if err != nil {
				return fail(fmt.Errorf("size %d: %v%s", sz, err, r.remoteAccessHint()))
			}
			printLatLine(out, sz, r.iters, samples)
			r.json.noteLat(sz, r.iters, samples)
		}
		fmt.Fprintln(out, perfRule)
	}
	return nil
}

// repostAll starts a new size of a SEND test with -a: each QP's receives
// posted again (ctx_set_recv_wqes).
func (r *perftestTraffic) repostAll() error {
	for qi, pq := range r.qps {
		pq.rxPosted = 0
		for ; pq.rxPosted < r.rxDepth; pq.rxPosted++ {
			if err := pq.q.PostRecv(r.recvWR(qi, pq.rxPosted)); err != nil {
				return err
			}
		}
	}
	return nil
}

// bidirBW is -b, perftest's duplex write_bw, read_bw and atomic_bw: both
// sides run the client's traffic at once, after a barrier; each size's
// results then go across and both sides print the sum of both (peaks,
// averages and message rates added; its own iterations). With -a there
// is a barrier after each size too (perftest 4.6 and later).
func (r *perftestTraffic) bidirBW(ctx context.Context, s *oob.Perftest, f *perfFlags, out io.Writer) error {
	fail := func(err error) error {
		return qpTold(fmt.Errorf("%v (QP %s; %s; drops and refusals: %s)%s", whyStopped(ctx, err), qpStateWhy(r.q), describeCounters(r.q.Counters()), describeDrops(r.q.Counters(), r.ep.Stats(), r.cq), remoteAccessLine(r.failed, f)))
	}
	sizes := []int{r.size}
	if f.all {
		sizes = nil
		for sz := 2; sz <= perftestMaxSize; sz *= 2 {
			sizes = append(sizes, sz)
		}
	}
	printBWHeader(out, f.gbits)
	var rem oob.BWReport
	noted := false // the peer's unit, said once
	for _, sz := range sizes {
		r.size, r.ref = sz, nil
		for _, pq := range r.qps {
			pq.last = nil
		}
		if err := r.bound.do(ctx, func(ctx context.Context) error { return s.Barrier(ctx, fmt.Sprintf("before traffic of %d bytes", sz)) }); err != nil {
			return err
		}
		var res bwResult
		var err error
		n := r.iters * len(r.qps)
		if f.duration > 0 {
			res, n, err = r.bwDuration(f.gbits, time.Duration(f.duration)*time.Second, time.Duration(f.margin)*time.Second)
		} else {
			res, err = r.bwClient(f.gbits)
		}
		if err != nil {
			return fail(fmt.Errorf("size %d: %v%s", sz, err, r.remoteAccessHint()))
		}
		if f.all {
			if err := r.bound.do(ctx, func(ctx context.Context) error { return s.Barrier(ctx, fmt.Sprintf("after traffic of %d bytes", sz)) }); err != nil {
				return err
			}
		}
		if err = r.bound.do(ctx, func(ctx context.Context) (err error) {
			rem, err = s.BWReports(ctx, oob.BWReport{Size: uint64(sz), Iters: uint64(n), PeakBW: res.peak, AvgBW: res.avg, MsgRate: res.mpps})
			return err
		}); err != nil {
			return err
		}
		theirs, note := inUnit(rem, f.gbits)
		if note != "" && !noted {
			fmt.Fprintln(out, note)
			noted = true
		}
		printBWLine(out, sz, n, f.gbits, bwResult{peak: res.peak + theirs.peak, avg: res.avg + theirs.avg, mpps: res.mpps + theirs.mpps})
		r.json.noteBW(sz, n, f.gbits, bwResult{peak: res.peak + theirs.peak, avg: res.avg + theirs.avg, mpps: res.mpps + theirs.mpps})
	}
	fmt.Fprintln(out, perfRule)
	if isAtomic(r.op) {
		return r.checkAtomicRegion(rem.Iters, f.duration > 0, out)
	}
	return nil
}

// remoteAccessHint explains a remote access error of -a: the peer's
// buffer is too small for the size.
func (r *perftestTraffic) remoteAccessHint() string {
	if r.failed == qp.IBV_WC_REM_ACCESS_ERR {
		return " (the server's buffer is smaller than this size: start it with -a too)"
	}
	return ""
}

// perftestMaxQPs bounds -q.
const perftestMaxQPs = 64

// perftestSlotBytes bounds the local slots (landing buffers of READs and
// atomics, sources of WRITEs and SENDs, receive buffers) per QP and kind.
const perftestSlotBytes = 64 << 20

// newPerftestTraffic makes the resources of a test as perftest does: one
// buffer with, per QP, the local slots (sources of WRITEs and SENDs,
// landing places of READs and atomics), the receive slots, and the region
// advertised to the peer, INC(max(size, cycle buffer)) bytes, as
// perftest's second half; one MR over it all, one CQ, and nq QPs in INIT
// with their receives posted. iters 0 is duration mode. With connect
// (-R), each QP is connect's, connected and with its receives posted.
func newPerftestTraffic(ctx context.Context, ep *transport.Endpoint, kind string, op qp.WROpcode, client, bidir bool, size, iters, txDepth, rxDepthFlag, nq int, sys oob.SysData, ccf *ccFlags, connect perftestQPConnect) (*perftestTraffic, error) {
	depth := txDepth
	if iters > 0 {
		depth = min(txDepth, iters)
	}
	if kind == "lat" {
		depth = 1
	}
	advLen := perftestInc(max(size, sys.CycleBuffer), sys.CacheLine)
	txSlots := min(depth, max(1, perftestSlotBytes/size))
	if op == qp.IBV_WR_SEND || op == qp.IBV_WR_RDMA_WRITE {
		// Sources only, never written during the run: as many as
		// perftest's sends use (perftestSources).
		txSlots = min(txSlots, perftestSources(size, sys.CycleBuffer, sys.CacheLine))
	}
	rxDepth := 0 // receives: both sides of ib_send_lat, ib_send_bw's server
	if op == qp.IBV_WR_SEND && (kind == "lat" || !client) {
		rxDepth = min(rxDepthFlag, iters)
	}
	rxSlots := max(1, min(rxDepth, max(1, perftestSlotBytes/size)))
	txOff := 0
	rxOff := nq * txSlots * size
	advOff := (rxOff + nq*rxSlots*size + 4095) &^ 4095
	total := advOff + nq*advLen
	r := &perftestTraffic{ep: ep, op: op, size: size, iters: iters, depth: depth, rxDepth: rxDepth,
		txOff: txOff, rxOff: rxOff, advOff: advOff, advLen: advLen, slotSize: size, txSlots: txSlots, rxSlots: rxSlots,
		cycle: sys.CycleBuffer, cacheLine: sys.CacheLine, ctx: ctx, wc: make([]qp.WC, 64),
		// Every region takes atomics, 8-byte aligned as the advertised
		// regions and their cache-line steps are: perftest's atomic
		// server registers REMOTE_ATOMIC, and a write server that NAKs an
		// atomic client helps nobody.
		access: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ | qp.IBV_ACCESS_REMOTE_ATOMIC}
	if kind == "lat" && op == qp.IBV_WR_RDMA_WRITE {
		// ib_write_lat spins on the last byte of the region the peer
		// writes, a volatile read of memory its NIC writes at any moment.
		// So does pollByte, with Endpoint.Sync between reads so that what
		// the Endpoint wrote before is seen; the Endpoint may be copying
		// the next packet in while it reads, a race by design, so the
		// buffer is mapped outside Go's heap, where the race detector does
		// not look. perftest zeroes this buffer; so does mmap.
		m, err := mapBuffer(total)
		if err != nil {
			return nil, fmt.Errorf("cannot map %d bytes: %v", total, err)
		}
		r.buf, r.mapped = m, true
	} else {
		// perftest fills its buffer with rand().
		r.buf = make([]byte, total)
		rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		for i := 0; i+8 <= len(r.buf); i += 8 {
			binary.LittleEndian.PutUint64(r.buf[i:], rng.Uint64())
		}
	}
	if isAtomic(op) && (!client || bidir) {
		r.atomicInit = bytes.Clone(r.buf[advOff:])
	}
	pd := ep.NewPD()
	var err error
	if r.mr, err = pd.RegMR(r.buf, r.access); err != nil {
		r.free()
		return nil, err
	}
	r.cq = ep.NewCQ(nq*(2*max(depth, rxDepth)) + 64)
	init := qp.InitAttr{MaxSendWR: depth + 8, MaxRecvWR: max(rxDepth, 1)}
	ccf.apply(&init)
	for i := range nq {
		if connect != nil {
			// rdma_cm (-R): the QP comes connected, its receives posted.
			recvs := make([]qp.RecvWR, rxDepth)
			for k := range recvs {
				recvs[k] = r.recvWR(i, k)
			}
			q, err := connect(pd, r.cq, init, r.access, recvs)
			if err != nil {
				r.free()
				return nil, err
			}
			r.qps = append(r.qps, &perftestQP{q: q, rxPosted: rxDepth})
			continue
		}
		q, err := ep.NewQP(pd, r.cq, r.cq, init)
		if err != nil {
			r.free()
			return nil, err
		}
		if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: r.access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS); err != nil {
			r.free()
			return nil, err
		}
		pq := &perftestQP{q: q}
		r.qps = append(r.qps, pq)
		// Receives go first: a SEND must not find the queue empty.
		for ; pq.rxPosted < rxDepth; pq.rxPosted++ {
			if err := q.PostRecv(r.recvWR(i, pq.rxPosted)); err != nil {
				r.free()
				return nil, err
			}
		}
	}
	r.q = r.qps[0].q
	return r, nil
}

// perftestQPConnect makes a test's QP connected, with recvs posted
// (rdma_cm, -R).
type perftestQPConnect func(pd *transport.PD, cq *transport.CQ, init qp.InitAttr, access qp.Access, recvs []qp.RecvWR) (*transport.QP, error)

// free unmaps ib_write_lat's buffer. The endpoint must be closed first:
// it may write into the buffer until then.
func (r *perftestTraffic) free() {
	if r.mapped {
		unmapBuffer(r.buf)
		r.buf, r.mapped = nil, false
	}
}

// perftestQP is one of a test's QPs and its counts.
type perftestQP struct {
	q              *transport.QP
	local, remote  oob.PerftestKey
	posted, done   int // bandwidth client: operations posted, completed
	rxPosted, recv int // receives posted, completed
	// atomics: the value the last atomic at each remote offset returned
	last map[int]uint64
}

// perftestTraffic is the traffic of one perftest-compatible test.
type perftestTraffic struct {
	ep                   *transport.Endpoint
	qps                  []*perftestQP
	q                    *transport.QP // QP 0's, for the latency tests
	cq                   *transport.CQ
	mr                   *qp.MR
	buf                  []byte
	op                   qp.WROpcode
	size, iters, depth   int // iters is per QP; 0 in duration mode
	txOff, rxOff, advOff int
	advLen, slotSize     int // per QP: the advertised region, one slot (the largest size)
	txSlots, rxSlots     int // per QP
	cycle, cacheLine     int
	remote               oob.PerftestKey // QP 0's peer, for the latency tests
	rxDepth              int
	access               qp.Access
	mapped               bool // buf is mapped outside Go's heap
	noPeak               bool
	ctx                  context.Context
	bound                *stepBound // the exchange's steps once traffic runs
	wc                   []qp.WC
	sends, recvs         int         // completions seen (latency tests)
	atomicInit           []byte      // an atomic server's advertised regions before the test
	failed               qp.WCStatus // the status of the first failed completion
	json                 perfJSON    // --out_json's file
	// READ data check: the first READ from each remote offset, and how many
	// READs were compared.
	ref     map[int][]byte
	checked int
}

// advAt is where QP i's advertised region starts in buf.
func (r *perftestTraffic) advAt(i int) int { return r.advOff + i*r.advLen }

// wrid packs a QP index and an operation count in a work request ID.
func wrid(qi, k int) uint64            { return uint64(qi)<<40 | uint64(k) }
func unWRID(id uint64) (qi int, k int) { return int(id >> 40), int(id & (1<<40 - 1)) }

func (r *perftestTraffic) recvWR(qi, i int) qp.RecvWR {
	return qp.RecvWR{WRID: wrid(qi, i), SGEs: []qp.SGE{r.mr.SGE(r.rxOff+(qi*r.rxSlots+i%r.rxSlots)*r.slotSize, r.size)}}
}

// txSlot is where the k-th operation of QP qi takes its data from or puts
// it.
func (r *perftestTraffic) txSlot(qi, k int) int {
	return r.txOff + (qi*r.txSlots+k%r.txSlots)*r.slotSize
}

// bwWR is the k-th operation of QP qi in a bandwidth client: local slot k
// mod the slots, remote offset perftest's.
func (r *perftestTraffic) bwWR(qi, k int) qp.SendWR {
	pq := r.qps[qi]
	off := perftestOffset(k, r.size, r.cycle, r.cacheLine)
	slot := r.txSlot(qi, k)
	wr := qp.SendWR{WRID: wrid(qi, k), Opcode: r.op, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(slot, r.size)}}
	if r.op != qp.IBV_WR_SEND {
		wr.RemoteAddr, wr.RKey = pq.remote.VA+uint64(off), pq.remote.RKey
	}
	if r.op == qp.IBV_WR_ATOMIC_FETCH_AND_ADD {
		wr.CompareAdd = 1 // perftest's ATOMIC_ADD_VALUE
	} // CMP_AND_SWAP: compare 0, swap 0 (ATOMIC_SWAP_VALUE), as perftest
	if r.op == qp.IBV_WR_RDMA_READ || isAtomic(r.op) {
		// Poison the landing buffer: a READ that completes without all its
		// data shows.
		land := r.buf[slot : slot+r.size]
		for i := range land {
			land[i] = perftestPoison
		}
	}
	return wr
}

// poll waits for completions and checks their status.
func (r *perftestTraffic) poll() ([]qp.WC, error) {
	n, err := r.cq.Wait(r.ctx, r.wc)
	if err != nil {
		return nil, err
	}
	for _, c := range r.wc[:n] {
		if c.Status != qp.IBV_WC_SUCCESS {
			r.failed = c.Status
			qi, k := unWRID(c.WRID)
			return nil, fmt.Errorf("work completion %s (%s, QP %d, operation %d)", c.Status, c.Opcode, qi, k)
		}
	}
	return r.wc[:n], nil
}

// checkRead compares the data of a completed READ with the first READ
// from the same offset of the peer's buffer, which perftest never changes;
// for atomics, see checkAtomic.
func (r *perftestTraffic) checkRead(id uint64) error {
	qi, k := unWRID(id)
	if isAtomic(r.op) {
		return r.checkAtomic(qi, k)
	}
	off := perftestOffset(k, r.size, r.cycle, r.cacheLine)
	slot := r.txSlot(qi, k)
	got := r.buf[slot : slot+r.size]
	if r.ref == nil {
		r.ref = map[int][]byte{}
	}
	r.checked++
	key := qi*r.advLen + off
	want, ok := r.ref[key]
	if !ok {
		r.ref[key] = bytes.Clone(got)
		return nil
	}
	if i := mismatch(got, want); i >= 0 {
		return fmt.Errorf("data check: READ %d of QP %d from offset %d differs from an earlier READ of the same bytes at byte %d (%#02x, not %#02x; the poison is %#02x)",
			k, qi, off, i, got[i], want[i], perftestPoison)
	}
	return nil
}

// checkAtomic checks the original value a completed atomic brought back:
// a FETCH_AND_ADD of 1 finds what the previous one at the same offset
// found plus 1 (the QP's operations execute in order, and only this QP
// touches its region); a CMP_AND_SWAP of 0 with 0 finds what the previous
// one found.
func (r *perftestTraffic) checkAtomic(qi, k int) error {
	pq := r.qps[qi]
	off := perftestOffset(k, r.size, r.cycle, r.cacheLine)
	slot := r.txSlot(qi, k)
	got := binary.LittleEndian.Uint64(r.buf[slot:])
	if pq.last == nil {
		pq.last = map[int]uint64{}
	}
	if r.ref == nil {
		r.ref = map[int][]byte{}
	}
	r.ref[qi*r.advLen+off] = nil
	r.checked++
	prev, ok := pq.last[off]
	pq.last[off] = got
	if !ok {
		return nil
	}
	want := prev
	if r.op == qp.IBV_WR_ATOMIC_FETCH_AND_ADD {
		want++
	}
	if got != want {
		return fmt.Errorf("data check: %s %d of QP %d at offset %d found %#x, not %#x", atomicName(r.op), k, qi, off, got, want)
	}
	return nil
}

// checkAtomicRegion is an atomic server's check once the client is done:
// its FETCH_AND_ADDs of 1 added to the advertised regions' 8-byte words
// as many as it reports, in iterations mode (in duration mode it counts
// only the measured ones, so the total is printed); CMP_AND_SWAPs of 0
// with 0 changed nothing.
func (r *perftestTraffic) checkAtomicRegion(iters uint64, duration bool, out io.Writer) error {
	r.ep.Sync() // what the Endpoint wrote is seen from here
	var added uint64
	words := 0
	for i := 0; i+8 <= len(r.atomicInit); i += 8 {
		a, b := binary.LittleEndian.Uint64(r.atomicInit[i:]), binary.LittleEndian.Uint64(r.buf[r.advOff+i:])
		if a != b {
			added += b - a
			words++
		}
	}
	if r.op == qp.IBV_WR_ATOMIC_CMP_AND_SWP {
		if words != 0 {
			return fmt.Errorf("data check: the client's CMP_AND_SWAPs of 0 with 0 changed %d words of the region", words)
		}
		fmt.Fprintf(out, " data check: the client's CMP_AND_SWAPs (compare 0, swap 0) left the region as it was\n")
		return nil
	}
	if !duration && added != iters {
		return fmt.Errorf("data check: the client reports %d FETCH_AND_ADDs of 1, but the region's words grew by %d", iters, added)
	}
	fmt.Fprintf(out, " data check: the client's FETCH_AND_ADDs of 1 added %d to %d words of the region\n", added, words)
	return nil
}

func mismatch(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// bwDepth is how many operations each QP keeps in flight: the tx depth,
// and for READs and atomics no more than the landing buffers.
func (r *perftestTraffic) bwDepth() int {
	if r.op == qp.IBV_WR_RDMA_READ || isAtomic(r.op) {
		return min(r.depth, r.txSlots)
	}
	return r.depth
}

// complete takes a bandwidth client's completions: counts, data checks.
func (r *perftestTraffic) complete(cs []qp.WC) error {
	for _, c := range cs {
		qi, _ := unWRID(c.WRID)
		if qi >= len(r.qps) {
			return fmt.Errorf("a completion for QP %d of %d", qi, len(r.qps))
		}
		r.qps[qi].done++
		if r.op == qp.IBV_WR_RDMA_READ || isAtomic(r.op) {
			if err := r.checkRead(c.WRID); err != nil {
				return err
			}
		}
	}
	return nil
}

// bwClient runs a bandwidth client (run_iter_bw): each QP runs -n
// operations, tx depth in flight, the QPs served in turn; timed from the
// first post to the last completion. (perftest 6.06 does no warm-up by
// default: rxe serves exactly -n WRITEs or READs per QP.)
func (r *perftestTraffic) bwClient(gbits bool) (bwResult, error) {
	depth := r.bwDepth()
	total := r.iters * len(r.qps)
	stamps := make([]time.Time, 0, total)
	var posted []time.Time // each post's time, for the peak
	if !r.noPeak {
		posted = make([]time.Time, 0, total)
	}
	for _, pq := range r.qps {
		pq.posted, pq.done = 0, 0
	}
	start := time.Now()
	for len(stamps) < total {
		for i, pq := range r.qps {
			for pq.posted < r.iters && pq.posted-pq.done < depth {
				if posted != nil {
					posted = append(posted, time.Now())
				}
				if err := pq.q.PostSend(r.bwWR(i, pq.posted)); err != nil {
					return bwResult{}, err
				}
				pq.posted++
			}
		}
		cs, err := r.poll()
		if err != nil {
			return bwResult{}, fmt.Errorf("after %d of %d completions: %v", len(stamps), total, err)
		}
		now := time.Now()
		if err := r.complete(cs); err != nil {
			return bwResult{}, err
		}
		for range cs {
			stamps = append(stamps, now)
		}
	}
	return bwStats(r.size, start, posted, stamps, gbits), nil
}

// bwDuration runs a bandwidth client for d (perftest's -D): operations
// are posted for d; only those completed between margin after the start
// and margin before the end count, over that time; the peak is not
// computed (0, as perftest prints it). Operations still in flight at the
// end are waited for. It returns the result and the count.
func (r *perftestTraffic) bwDuration(gbits bool, d, margin time.Duration) (bwResult, int, error) {
	depth := r.bwDepth()
	start := time.Now()
	from, to, end := start.Add(margin), start.Add(d-margin), start.Add(d)
	counted, posted, done := 0, 0, 0
	for {
		now := time.Now()
		if now.Before(end) {
			for i, pq := range r.qps {
				for pq.posted-pq.done < depth {
					if err := pq.q.PostSend(r.bwWR(i, pq.posted)); err != nil {
						return bwResult{}, 0, err
					}
					pq.posted++
					posted++
				}
			}
		} else if done == posted {
			break
		}
		cs, err := r.poll()
		if err != nil {
			return bwResult{}, 0, fmt.Errorf("after %d completions: %v", done, err)
		}
		now = time.Now()
		if err := r.complete(cs); err != nil {
			return bwResult{}, 0, err
		}
		done += len(cs)
		if !now.Before(from) && now.Before(to) {
			counted += len(cs)
		}
	}
	el := to.Sub(from).Seconds()
	scale := 1.0 / (1 << 20)
	if gbits {
		scale = 8.0 / 1e9
	}
	return bwResult{avg: float64(r.size) * float64(counted) / el * scale, mpps: float64(counted) / el / 1e6}, counted, nil
}

// sendBWServer counts the client's SENDs on every QP, reposting receives,
// and times them from the first (run_iter_bw_server).
func (r *perftestTraffic) sendBWServer(gbits bool) (bwResult, error) {
	total := r.iters * len(r.qps)
	stamps := make([]time.Time, 0, total)
	var start time.Time
	for len(stamps) < total {
		cs, err := r.poll()
		if err != nil {
			return bwResult{}, fmt.Errorf("after %d of %d receives: %v", len(stamps), total, err)
		}
		now := time.Now()
		for _, c := range cs {
			if c.Opcode != qp.IBV_WC_RECV {
				continue
			}
			if len(stamps) == 0 {
				start = now
			}
			stamps = append(stamps, now)
			qi, _ := unWRID(c.WRID)
			if err := r.repost(qi); err != nil {
				return bwResult{}, err
			}
		}
	}
	// perftest measures no peak on a SEND server (perftestNoPeak).
	return bwStats(r.size, start, nil, stamps, gbits), nil
}

func (r *perftestTraffic) repost(qi int) error {
	if qi >= len(r.qps) {
		return fmt.Errorf("a receive completion for QP %d of %d", qi, len(r.qps))
	}
	pq := r.qps[qi]
	if pq.rxPosted >= r.iters {
		return nil
	}
	if err := pq.q.PostRecv(r.recvWR(qi, pq.rxPosted)); err != nil {
		return err
	}
	pq.rxPosted++
	return nil
}

// count waits until at least sends SEND completions and recvs receive
// completions have come, reposting receives (latency tests: QP 0).
func (r *perftestTraffic) count(sends, recvs int) error {
	for r.sends < sends || r.recvs < recvs {
		cs, err := r.poll()
		if err != nil {
			return err
		}
		for _, c := range cs {
			switch c.Opcode {
			case qp.IBV_WC_RECV:
				r.recvs++
				if err := r.repost(0); err != nil {
					return err
				}
			default:
				r.sends++
			}
		}
	}
	return nil
}

// sendLat is ib_send_lat: the client sends first; each side sends when
// it has received (run_iter_lat_send). The samples are half the time
// between two of this side's sends, as perftest reports.
func (r *perftestTraffic) sendLat(client bool) ([]time.Duration, error) {
	wr := qp.SendWR{Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(r.txOff, r.size)}}
	// Each send's time since base: time.Since reads the monotonic
	// clock only, one clock read per round trip where time.Now takes
	// two (perftest reads the cycle counter).
	base := time.Now()
	posts := make([]time.Duration, 0, r.iters+1)
	for i := range r.iters {
		if !client || i > 0 {
			if err := r.count(i, i+1-b2i(client)); err != nil {
				return nil, fmt.Errorf("iteration %d: %v", i, err)
			}
		}
		posts = append(posts, time.Since(base))
		wr.WRID = uint64(i)
		if err := r.q.PostSend(wr); err != nil {
			return nil, err
		}
	}
	if err := r.count(r.iters, r.iters); err != nil {
		return nil, fmt.Errorf("last iteration: %v", err)
	}
	return halfRTTs(posts), nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// halfRTTs turns the times of consecutive sends into latency samples:
// iterations-1 of them, as perftest takes them from tposted.
func halfRTTs(posts []time.Duration) []time.Duration {
	s := make([]time.Duration, 0, len(posts)-1)
	for i := 1; i < len(posts); i++ {
		s = append(s, (posts[i]-posts[i-1])/2)
	}
	return s
}

// writeLat is ib_write_lat (run_iter_lat_write): each side RDMA WRITEs
// size bytes to the start of the peer's region, the last byte holding its
// count of writes, and polls the last byte of its own region for the
// peer's count. The server writes first.
func (r *perftestTraffic) writeLat(first bool) ([]time.Duration, error) {
	post := r.txOff + r.size - 1
	pollAt := r.advOff + r.size - 1
	wr := qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(r.txOff, r.size)},
		RemoteAddr: r.remote.VA, RKey: r.remote.RKey}
	// Each send's time since base: time.Since reads the monotonic
	// clock only, one clock read per round trip where time.Now takes
	// two (perftest reads the cycle counter).
	base := time.Now()
	posts := make([]time.Duration, 0, r.iters+1)
	rcnt := 0
	for scnt := 0; scnt < r.iters; scnt++ {
		if !(scnt == 0 && first) {
			rcnt++
			if err := r.pollByte(pollAt, byte(rcnt)); err != nil {
				return nil, fmt.Errorf("waiting for the peer's write %d: %v", rcnt, err)
			}
		}
		posts = append(posts, time.Since(base))
		r.buf[post] = byte(scnt + 1)
		wr.WRID = uint64(scnt)
		if err := r.q.PostSend(wr); err != nil {
			return nil, err
		}
		if err := r.count(scnt+1, 0); err != nil {
			return nil, fmt.Errorf("write %d: %v", scnt+1, err)
		}
	}
	for rcnt < r.iters {
		rcnt++
		if err := r.pollByte(pollAt, byte(rcnt)); err != nil {
			return nil, fmt.Errorf("waiting for the peer's write %d: %v", rcnt, err)
		}
	}
	return halfRTTs(posts), nil
}

// pollByte waits until buf[at] holds want, as perftest spins on a
// volatile byte, with Endpoint.Sync between reads.
func (r *perftestTraffic) pollByte(at int, want byte) error {
	for spin := 0; ; spin++ {
		r.ep.Sync()
		if r.buf[at] == want {
			return nil
		}
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if spin%256 == 255 {
			if st := r.q.State(); st == qp.IBV_QPS_ERR {
				if n := r.cq.Poll(r.wc); n > 0 && r.wc[0].Status != qp.IBV_WC_SUCCESS {
					return fmt.Errorf("work completion %s", r.wc[0].Status)
				}
				return errors.New("the QP went to the error state")
			}
		}
		if spin < 1000 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// readLat is ib_read_lat's and ib_atomic_lat's client (run_iter_lat):
// one READ of size bytes, or one atomic, at the start of the peer's region
// at a time; each sample is a whole operation. Each lands on the poisoned
// first slot; a READ must bring the bytes the first one brought, a
// FETCH_AND_ADD of 1 what the previous one found plus 1, a CMP_AND_SWAP
// of 0 with 0 what the previous one found.
func (r *perftestTraffic) readLat() ([]time.Duration, error) {
	samples := make([]time.Duration, 0, r.iters)
	wr := qp.SendWR{Opcode: r.op, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(r.txOff, r.size)},
		RemoteAddr: r.remote.VA, RKey: r.remote.RKey}
	if r.op == qp.IBV_WR_ATOMIC_FETCH_AND_ADD {
		wr.CompareAdd = 1
	}
	land := r.buf[r.txOff : r.txOff+r.size]
	for i := range r.iters {
		for j := range land {
			land[j] = perftestPoison
		}
		t0 := time.Now()
		wr.WRID = uint64(i)
		if err := r.q.PostSend(wr); err != nil {
			return nil, err
		}
		if err := r.count(i+1, 0); err != nil {
			return nil, fmt.Errorf("read %d: %v", i, err)
		}
		samples = append(samples, time.Since(t0))
		if err := r.checkRead(0); err != nil {
			return nil, err
		}
	}
	return samples, nil
}
