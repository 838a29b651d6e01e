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
// hop limit 255; RTS with own PSN, timeout 14, retry_cnt 7, rnr_retry 7,
// max_rd_atomic = the peer's out_reads. Each side registers a buffer of
// twice max(size, cycle buffer) and advertises its second half; write and
// read bandwidth clients walk the remote address in steps of the size
// rounded up to the cache line, over one cycle buffer, when the size is at
// most half of it, tx depth operations at a time (no warm-up by default).

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
	return "ib_" + map[qp.WROpcode]string{qp.IBV_WR_SEND: "send", qp.IBV_WR_RDMA_WRITE: "write", qp.IBV_WR_RDMA_READ: "read"}[op] + "_" + kind
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

// perftestDial connects to the server, or waits for one client.
func perftestDial(ctx context.Context, host string, port int, out io.Writer) (net.Conn, error) {
	if host != "" {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("cannot reach the server at %s port %d: %v", host, port, err)
		}
		return c, nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("cannot listen on TCP port %d: %v", port, err)
	}
	fmt.Fprintln(out, "\n************************************")
	fmt.Fprintln(out, "* Waiting for client to connect... *")
	fmt.Fprintln(out, "************************************")
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	c, err := l.Accept()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("no client came: %v", err)
	}
	return c, nil
}

// perftestRun is roce-emu bw/lat: perftest's steps for the test kind
// ("bw" or "lat") of op, as client (host given) or server.
func perftestRun(kind, host string, op qp.WROpcode, mtu qp.MTU, f *perfFlags, out io.Writer) error {
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
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()

	conn, err := perftestDial(ctx, host, f.port, out)
	if err != nil {
		return err
	}
	defer conn.Close()
	s := oob.NewPerftestServer(conn)
	if client {
		s = oob.NewPerftestClient(conn)
	}

	// Versions, system data and MTU, before the QP exists.
	peerVer, err := s.Versions(ctx)
	if err != nil {
		return err
	}
	sys, err := s.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine})
	if err != nil {
		return err
	}
	curMTU, err := s.MTU(ctx, mtu)
	if err != nil {
		return err
	}

	if r, err = newPerftestTraffic(ctx, ep, kind, op, client, f.size, f.iters, f.txDepth, sys); err != nil {
		return err
	}

	// perftest advertises its device's maximum for READ tests (128 on rxe)
	// and 1 otherwise; roce-emu's responder keeps 16 READs.
	outReads := uint16(1)
	if op == qp.IBV_WR_RDMA_READ {
		outReads = 16
	}
	local := oob.PerftestKey{OutReads: outReads, QPN: r.q.QPN(), PSN: randomPSN(), GID: ep.LocalAddr().Addr(),
		RKey: r.mr.RKey, VA: r.mr.VA + uint64(r.advOff)}
	remotes, err := s.Keys(ctx, []oob.PerftestKey{local})
	if err != nil {
		return err
	}
	r.remote = remotes[0]
	if err := perftestConnect(r.q, local, r.remote, curMTU, uint16(f.udpPort), r.access); err != nil {
		return err
	}
	if err := s.Barrier(ctx, "after connecting"); err != nil {
		return err
	}
	if err := s.Barrier(ctx, "addresses printed"); err != nil {
		return err
	}
	printPerftestHeader(out, kind, op, client, peerVer, curMTU, sys, r, local)

	// send_bw and every latency test: one more barrier once the receives
	// are posted, then traffic.
	if op == qp.IBV_WR_SEND || kind == "lat" {
		if err := s.Barrier(ctx, "before traffic"); err != nil {
			return err
		}
	}
	if err := r.test(ctx, s, kind, client, f.gbits, out); err != nil {
		return err
	}
	if r.checked > 0 {
		fmt.Fprintf(out, " data check: %d READs of %d bytes from %d offsets of the peer's buffer agree byte for byte (each landing buffer poisoned first)\n",
			r.checked, r.size, len(r.ref))
	}
	// ib_write_lat closes the socket without a last barrier or "done".
	if !(kind == "lat" && op == qp.IBV_WR_RDMA_WRITE) {
		if err := s.Done(ctx); err != nil {
			return err
		}
	}
	c := r.q.Counters()
	fmt.Fprintf(out, " counters: %s\n", describeCounters(c))
	fmt.Fprintf(out, " requests served: %d RDMA WRITE, %d RDMA READ, %d SEND\n", c.RxWriteRequests, c.RxReadRequests, c.RxSendRequests)
	return nil
}

// printPerftestHeader prints the test's parameters and both sides'
// addresses, as perftest does before traffic.
func printPerftestHeader(out io.Writer, kind string, op qp.WROpcode, client bool, peerVer string, mtu qp.MTU, sys oob.SysData, r *perftestTraffic, local oob.PerftestKey) {
	title := map[qp.WROpcode]string{qp.IBV_WR_SEND: "Send", qp.IBV_WR_RDMA_WRITE: "RDMA_Write", qp.IBV_WR_RDMA_READ: "RDMA_Read"}[op]
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
	fmt.Fprintf(out, " Connection type : RC\t\tPeer version   : %s\n", peerVer)
	fmt.Fprintf(out, " Mtu             : %d[B]\t\tCycle buffer   : %d[B] (cache line %d)\n", mtu.Bytes(), sys.CycleBuffer, sys.CacheLine)
	if kind == "bw" {
		fmt.Fprintf(out, " TX depth        : %d\t\tRX depth       : %d\n", r.depth, r.rxDepth)
	}
	fmt.Fprintln(out, perfRule)
	for _, a := range []struct {
		side string
		k    oob.PerftestKey
	}{{"local", local}, {"remote", r.remote}} {
		// perftest's formats, "%#06x" and so on, count the 0x in the width.
		fmt.Fprintf(out, " %s address: LID %04x QPN 0x%04x PSN 0x%04x", a.side, a.k.LID, a.k.QPN, uint32(a.k.PSN))
		if op == qp.IBV_WR_RDMA_READ {
			fmt.Fprintf(out, " OUT 0x%02x", a.k.OutReads)
		}
		if op != qp.IBV_WR_SEND {
			fmt.Fprintf(out, " RKey 0x%06x VAddr 0x%014x", a.k.RKey, a.k.VA)
		}
		fmt.Fprintf(out, "\n GID: %s\n", perftestGID(a.k.GID))
	}
	fmt.Fprintln(out, perfRule)
}

// perftestConnect moves q to RTR and RTS as perftest's ctx_connect does.
func perftestConnect(q *transport.QP, local, rem oob.PerftestKey, mtu qp.MTU, udpPort uint16, access qp.Access) error {
	av := qp.AddressVector{Remote: netip.AddrPortFrom(gidAddr(rem.GID, local.GID), udpPort), HopLimit: routeHopLimit} // perftest asks 0xFF; see routeHopLimit
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: mtu, DestQPN: rem.QPN, RQPSN: rem.PSN,
		MaxDestRdAtomic: uint8(min(local.OutReads, 255)), MinRNRTimer: 12, AV: av, AccessFlags: access},
		qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|
			qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER|qp.IBV_QP_ACCESS_FLAGS); err != nil {
		return fmt.Errorf("cannot move the QP to RTR towards %s QPN %#x: %w", rem.GID, rem.QPN, err)
	}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: local.PSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MaxRdAtomic: uint8(min(max(int(rem.OutReads), 1), qp.MaxRdAtomicLimit))},
		qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC); err != nil {
		return fmt.Errorf("cannot move the QP to RTS: %w", err)
	}
	return nil
}

// test runs the traffic of the test and, for write_bw and read_bw, the
// results exchange, printing what perftest prints.
func (r *perftestTraffic) test(ctx context.Context, s *oob.Perftest, kind string, client, gbits bool, out io.Writer) error {
	fail := func(err error) error {
		return fmt.Errorf("%v (QP %s; %s)", err, r.q.State(), describeCounters(r.q.Counters()))
	}
	program := perftestProgram(kind, r.op)
	switch {
	case kind == "bw" && r.op != qp.IBV_WR_SEND:
		var res bwResult
		if client {
			var err error
			if res, err = r.bwClient(gbits); err != nil {
				return fail(err)
			}
			printBW(out, r.size, r.iters, gbits, res)
		} else {
			fmt.Fprintf(out, " (the server of %s only serves its memory; the client reports)\n", program)
		}
		// The client says it is done; then the results go across.
		if err := s.Barrier(ctx, "traffic done"); err != nil {
			return err
		}
		rem, err := s.BWReports(ctx, oob.BWReport{Size: uint64(r.size), Iters: uint64(r.iters), PeakBW: res.peak, AvgBW: res.avg, MsgRate: res.mpps})
		if err != nil {
			return err
		}
		if !client {
			fmt.Fprintln(out, " the client's results:")
			printBW(out, int(rem.Size), int(rem.Iters), gbits, bwResult{peak: rem.PeakBW, avg: rem.AvgBW, mpps: rem.MsgRate})
		}
	case kind == "bw":
		var res bwResult
		var err error
		if client {
			res, err = r.bwClient(gbits)
		} else {
			res, err = r.sendBWServer(gbits)
		}
		if err != nil {
			return fail(err)
		}
		printBW(out, r.size, r.iters, gbits, res)
	case r.op == qp.IBV_WR_RDMA_READ:
		if !client {
			fmt.Fprintf(out, " (the server of %s only serves its memory; the client reports)\n", program)
			return nil
		}
		samples, err := r.readLat()
		if err != nil {
			return fail(err)
		}
		printLat(out, r.size, r.iters, samples)
	case r.op == qp.IBV_WR_SEND:
		samples, err := r.sendLat(client)
		if err != nil {
			return fail(err)
		}
		printLat(out, r.size, r.iters, samples)
	default:
		samples, err := r.writeLat(!client)
		if err != nil {
			return fail(err)
		}
		printLat(out, r.size, r.iters, samples)
	}
	return nil
}

// newPerftestTraffic makes the resources of a test as perftest does: one
// buffer with the local slots (sources of WRITEs and SENDs, landing places
// of READs), the receive slots, and the region advertised to the peer,
// max(size, cycle buffer) bytes, as perftest's second half; its MR, a CQ,
// and a QP in INIT with its receives posted.
func newPerftestTraffic(ctx context.Context, ep *transport.Endpoint, kind string, op qp.WROpcode, client bool, size, iters, txDepth int, sys oob.SysData) (*perftestTraffic, error) {
	depth := min(txDepth, iters)
	if kind == "lat" {
		depth = 1
	}
	advLen := max(size, sys.CycleBuffer)
	txSlots := min(depth, max(1, (256<<20)/size))
	rxDepth := 0 // receives: both sides of ib_send_lat, ib_send_bw's server
	if op == qp.IBV_WR_SEND && (kind == "lat" || !client) {
		rxDepth = min(perftestRxDepth, iters)
	}
	rxSlots := min(rxDepth, max(1, (256<<20)/size))
	txOff, rxOff := 0, txSlots*size
	advOff := (rxOff + rxSlots*size + 4095) &^ 4095
	total := advOff + advLen
	r := &perftestTraffic{ep: ep, op: op, size: size, iters: iters, depth: depth, rxDepth: rxDepth,
		txOff: txOff, rxOff: rxOff, advOff: advOff, txSlots: txSlots, rxSlots: max(rxSlots, 1),
		cycle: sys.CycleBuffer, cacheLine: sys.CacheLine, ctx: ctx, wc: make([]qp.WC, 64),
		access: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ}
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
	pd := ep.NewPD()
	var err error
	if r.mr, err = pd.RegMR(r.buf, r.access); err != nil {
		r.free()
		return nil, err
	}
	r.cq = ep.NewCQ(2*max(depth, rxDepth) + 64)
	if r.q, err = ep.NewQP(pd, r.cq, r.cq, qp.InitAttr{MaxSendWR: depth + 8, MaxRecvWR: max(rxDepth, 1)}); err != nil {
		r.free()
		return nil, err
	}
	if err := r.q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: r.access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS); err != nil {
		r.free()
		return nil, err
	}
	// Receives go first: a SEND must not find the queue empty.
	for ; r.rxPosted < rxDepth; r.rxPosted++ {
		if err := r.q.PostRecv(r.recvWR(r.rxPosted)); err != nil {
			r.free()
			return nil, err
		}
	}
	return r, nil
}

// free unmaps ib_write_lat's buffer. The endpoint must be closed first:
// it may write into the buffer until then.
func (r *perftestTraffic) free() {
	if r.mapped {
		unmapBuffer(r.buf)
		r.buf, r.mapped = nil, false
	}
}

// perftestTraffic is the traffic of one perftest-compatible test.
type perftestTraffic struct {
	ep                   *transport.Endpoint
	q                    *transport.QP
	cq                   *transport.CQ
	mr                   *qp.MR
	buf                  []byte
	op                   qp.WROpcode
	size, iters, depth   int
	txOff, rxOff, advOff int
	txSlots, rxSlots     int
	cycle, cacheLine     int
	remote               oob.PerftestKey
	rxDepth              int
	access               qp.Access
	mapped               bool // buf is mapped outside Go's heap
	ctx                  context.Context
	wc                   []qp.WC
	rxPosted             int
	sends, recvs         int // completions seen
	// READ data check: the first READ from each remote offset, and how many
	// READs were compared.
	ref     map[int][]byte
	checked int
}

func (r *perftestTraffic) recvWR(i int) qp.RecvWR {
	return qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{r.mr.SGE(r.rxOff+(i%r.rxSlots)*r.size, r.size)}}
}

// bwWR is the k-th operation of a bandwidth client: local slot k mod the
// slots, remote offset perftest's.
func (r *perftestTraffic) bwWR(k int) qp.SendWR {
	off := perftestOffset(k, r.size, r.cycle, r.cacheLine)
	id := uint64(k)
	slot := r.txOff + k%r.txSlots*r.size
	wr := qp.SendWR{WRID: id, Opcode: r.op, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(slot, r.size)}}
	if r.op != qp.IBV_WR_SEND {
		wr.RemoteAddr, wr.RKey = r.remote.VA+uint64(off), r.remote.RKey
	}
	if r.op == qp.IBV_WR_RDMA_READ {
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
			return nil, fmt.Errorf("work completion %s (%s, wr_id %d)", c.Status, c.Opcode, c.WRID)
		}
	}
	return r.wc[:n], nil
}

// checkRead compares the data of a completed READ with the first READ
// from the same offset of the peer's buffer, which perftest never changes.
func (r *perftestTraffic) checkRead(wrid uint64) error {
	k := int(wrid)
	off := perftestOffset(k, r.size, r.cycle, r.cacheLine)
	slot := r.txOff + k%r.txSlots*r.size
	got := r.buf[slot : slot+r.size]
	if r.ref == nil {
		r.ref = map[int][]byte{}
	}
	r.checked++
	want, ok := r.ref[off]
	if !ok {
		r.ref[off] = bytes.Clone(got)
		return nil
	}
	if i := mismatch(got, want); i >= 0 {
		return fmt.Errorf("data check: READ %d from offset %d differs from an earlier READ of the same bytes at byte %d (%#02x, not %#02x; the poison is %#02x)",
			k, off, i, got[i], want[i], perftestPoison)
	}
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

// bwClient runs a bandwidth client: tx depth operations in flight, timed
// from the first post to the last completion. (perftest 6.06 does no
// warm-up by default: rxe serves exactly -n WRITEs or READs.)
func (r *perftestTraffic) bwClient(gbits bool) (bwResult, error) {
	depth := r.depth
	if r.op == qp.IBV_WR_RDMA_READ {
		depth = min(depth, r.txSlots) // one landing buffer per READ in flight
	}
	stamps := make([]time.Time, 0, r.iters)
	start := time.Now()
	posted, done := 0, 0
	for done < r.iters {
		for posted < r.iters && posted-done < depth {
			if err := r.q.PostSend(r.bwWR(posted)); err != nil {
				return bwResult{}, err
			}
			posted++
		}
		cs, err := r.poll()
		if err != nil {
			return bwResult{}, fmt.Errorf("after %d of %d completions: %v", done, r.iters, err)
		}
		now := time.Now()
		for _, c := range cs {
			stamps = append(stamps, now)
			if r.op == qp.IBV_WR_RDMA_READ {
				if err := r.checkRead(c.WRID); err != nil {
					return bwResult{}, err
				}
			}
		}
		done += len(cs)
	}
	return bwStats(r.size, start, stamps, gbits), nil
}

// sendBWServer counts the client's SENDs, reposting receives, and times
// them from the first (run_iter_bw_server).
func (r *perftestTraffic) sendBWServer(gbits bool) (bwResult, error) {
	stamps := make([]time.Time, 0, r.iters)
	var start time.Time
	for len(stamps) < r.iters {
		cs, err := r.poll()
		if err != nil {
			return bwResult{}, fmt.Errorf("after %d of %d receives: %v", len(stamps), r.iters, err)
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
			if err := r.repost(); err != nil {
				return bwResult{}, err
			}
		}
	}
	return bwStats(r.size, start, stamps, gbits), nil
}

func (r *perftestTraffic) repost() error {
	if r.rxPosted >= r.iters {
		return nil
	}
	if err := r.q.PostRecv(r.recvWR(r.rxPosted)); err != nil {
		return err
	}
	r.rxPosted++
	return nil
}

// count waits until at least sends SEND completions and recvs receive
// completions have come, reposting receives.
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
				if err := r.repost(); err != nil {
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
	posts := make([]time.Time, 0, r.iters+1)
	for i := range r.iters {
		if !client || i > 0 {
			if err := r.count(i, i+1-b2i(client)); err != nil {
				return nil, fmt.Errorf("iteration %d: %v", i, err)
			}
		}
		posts = append(posts, time.Now())
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
func halfRTTs(posts []time.Time) []time.Duration {
	s := make([]time.Duration, 0, len(posts)-1)
	for i := 1; i < len(posts); i++ {
		s = append(s, posts[i].Sub(posts[i-1])/2)
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
	posts := make([]time.Time, 0, r.iters+1)
	rcnt := 0
	for scnt := 0; scnt < r.iters; scnt++ {
		if !(scnt == 0 && first) {
			rcnt++
			if err := r.pollByte(pollAt, byte(rcnt)); err != nil {
				return nil, fmt.Errorf("waiting for the peer's write %d: %v", rcnt, err)
			}
		}
		posts = append(posts, time.Now())
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

// readLat is ib_read_lat's client (run_iter_lat): one READ of size bytes
// from the start of the peer's region at a time; each sample is a whole
// READ. Each READ lands on the poisoned first slot and must bring the
// bytes the first one brought.
func (r *perftestTraffic) readLat() ([]time.Duration, error) {
	samples := make([]time.Duration, 0, r.iters)
	wr := qp.SendWR{Opcode: qp.IBV_WR_RDMA_READ, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(r.txOff, r.size)},
		RemoteAddr: r.remote.VA, RKey: r.remote.RKey}
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
