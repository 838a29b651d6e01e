package qp

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// SendWR is a send work request, as ibv_send_wr.
type SendWR struct {
	WRID   uint64
	Opcode WROpcode
	Flags  SendFlags
	SGEs   []SGE // local data; for RDMA READ and atomics, where the result goes
	// ImmData is sent in the ImmDt header of *_WITH_IMM operations, as the
	// big-endian number on the wire.
	ImmData        uint32
	InvalidateRKey uint32 // SEND_WITH_INV
	RemoteAddr     uint64 // RDMA and atomics
	RKey           uint32
	CompareAdd     uint64 // compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD)
	Swap           uint64 // swap value (CMP_AND_SWP)
}

// sendWQE is a posted send work request and its progress.
type sendWQE struct {
	wr       SendWR
	sgl      sgList
	length   int
	status   WCStatus // non-zero: fails with this status when it reaches the head
	started  bool     // PSNs assigned
	firstPSN bth.PSN
	npkts    int // PSNs the message uses
}

func (w *sendWQE) lastPSN() bth.PSN { return w.firstPSN.Add(w.npkts - 1) }

func (w *sendWQE) readOrAtomic() bool {
	switch w.wr.Opcode {
	case IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
		return true
	}
	return false
}

func (w *sendWQE) wcOpcode() WCOpcode {
	switch w.wr.Opcode {
	case IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD
	}
	return IBV_WC_SEND
}

// requester is the send side: the send queue, what has been transmitted,
// and the completer's view of what has been acknowledged.
type requester struct {
	sq        []*sendWQE // oldest first; completed WQEs are removed
	cur       int        // index in sq of the WQE being transmitted; len(sq) when all are out
	curPkt    int        // packets of sq[cur] transmitted
	sendPSN   bth.PSN    // PSN of the next packet transmitted
	compPSN   bth.PSN    // oldest PSN not yet acknowledged
	rdAtomic  int        // READ/atomic WQEs started and not completed
	noAck     int        // packets sent since the last AckReq
	retryLeft uint8
	rnrLeft   uint8
	// respOpcode is the last READ response opcode accepted, to check the
	// First/Middle/Last order; 0 when none is in progress.
	respPos      bth.Position
	retransmitAt time.Time
	rnrUntil     time.Time
	rnrPSN       bth.PSN
	scratch      []byte
	sentHigh     bth.PSN // highest PSN ever transmitted + 1, to count retransmissions
	sentAny      bool
	// retrying is set when a NAK or a gap started go-back-N; until the
	// peer acknowledges something new, further NAKs and gaps (which the
	// retransmission itself provokes) do not start another (rxe's
	// comp.started_retry). A timeout always does.
	retrying bool
}

// PostSend queues a send work request, as ibv_post_send. The SGEs are
// checked now; a request whose SGEs name no valid local memory completes
// later with IBV_WC_LOC_PROT_ERR and moves the QP to ERR, as on a NIC. It
// returns an error, and queues nothing, when the QP is in RESET, the send
// queue is full, or the request is malformed (unknown opcode, atomic
// without an 8-byte aligned address and an 8-byte SGE, message over 2 GiB).
// In ERR the request completes at once with IBV_WC_WR_FLUSH_ERR.
func (q *QP) PostSend(wr SendWR) error {
	switch q.state {
	case IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_ERR:
	default:
		// rxe refuses a post before RTS (qp_state < IB_QPS_RTS: -EINVAL).
		return fmt.Errorf("%w: post send in %s", ErrBadState, q.state)
	}
	if wr.Opcode > IBV_WR_SEND_WITH_INV {
		return fmt.Errorf("%w: opcode %d", ErrBadWR, wr.Opcode)
	}
	if len(q.req.sq) >= q.maxSend {
		return ErrQueueFull
	}
	w := &sendWQE{wr: wr}
	w.wr.SGEs = append([]SGE(nil), wr.SGEs...)
	for _, s := range wr.SGEs {
		w.length += int(s.Length)
	}
	if w.length > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes is over 2^31", ErrBadWR, w.length)
	}
	if n := q.packets(w.length); n > MaxMessagePSNs {
		return fmt.Errorf("%w: a %d-byte message needs %d PSNs at path MTU %d, more than %d", ErrBadWR, w.length, n, q.attr.PathMTU.Bytes(), MaxMessagePSNs)
	}
	if wr.Flags&IBV_SEND_INLINE != 0 && (w.length > MaxInlineData || w.readOrAtomic()) {
		return fmt.Errorf("%w: inline data is for SEND and RDMA WRITE of at most %d bytes", ErrBadWR, MaxInlineData)
	}
	switch wr.Opcode {
	case IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
		if w.length != 8 || wr.RemoteAddr%8 != 0 {
			return fmt.Errorf("%w: an atomic needs one 8-byte result SGE and an 8-byte aligned remote address", ErrBadWR)
		}
	}
	if q.state == IBV_QPS_ERR {
		q.scq.push(WC{WRID: wr.WRID, Status: IBV_WC_WR_FLUSH_ERR, Opcode: w.wcOpcode(), QPNum: q.QPN})
		return nil
	}
	sgl, ok := q.pd.local(w.wr.SGEs, w.readOrAtomic(), nil)
	if !ok {
		w.status = IBV_WC_LOC_PROT_ERR
	}
	if ok && wr.Flags&IBV_SEND_INLINE != 0 {
		// Inline: the data is copied now; the buffer may change at once.
		data := make([]byte, w.length)
		sgl.copyOut(data, 0)
		sgl = sgList{{b: data}}
	}
	w.sgl = sgl
	q.req.sq = append(q.req.sq, w)
	return nil
}

// packets returns how many PSNs a message of n bytes uses at this MTU:
// ceil(n/MTU), at least 1 (ROCEV2.md section 4).
func (q *QP) packets(n int) int {
	mtu := q.attr.PathMTU.Bytes()
	if n <= mtu {
		return 1
	}
	return (n + mtu - 1) / mtu
}

// nextRequest builds the next request packet, if the state, the window and
// the RNR timer allow one.
func (q *QP) nextRequest(now time.Time, out *bth.Packet) bool {
	r := &q.req
	if (q.state != IBV_QPS_RTS && q.state != IBV_QPS_SQD) || r.cur >= len(r.sq) || !r.rnrUntil.IsZero() {
		return false
	}
	w := r.sq[r.cur]
	// SQD drains: messages already begun are finished, none is started.
	if q.state == IBV_QPS_SQD && !w.started {
		return false
	}
	if w.status == 0 && !w.sgl.valid() {
		w.status = IBV_WC_LOC_PROT_ERR // a region was deregistered after posting
	}
	if w.status != 0 {
		if r.cur == 0 {
			q.failHead(w.status)
		}
		return false
	}
	if r.sendPSN.Diff(r.compPSN) >= MaxUnackedPSNs {
		return false
	}
	if !w.started {
		if w.readOrAtomic() && r.rdAtomic >= max(1, int(q.attr.MaxRdAtomic)) {
			return false
		}
		if w.wr.Flags&IBV_SEND_FENCE != 0 && r.rdAtomic > 0 {
			return false
		}
		if !q.pace(now, q.nextPayload(w)) {
			return false
		}
		w.started = true
		w.firstPSN = r.sendPSN
		w.npkts = 1
		switch w.wr.Opcode {
		case IBV_WR_RDMA_READ:
			w.npkts = q.packets(w.length)
			r.rdAtomic++
		case IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
			r.rdAtomic++
		default:
			w.npkts = q.packets(w.length)
		}
		r.curPkt = 0
	} else if !q.pace(now, q.nextPayload(w)) {
		return false
	}
	psn := w.firstPSN.Add(r.curPkt)
	*out = bth.Packet{}
	mtu := q.attr.PathMTU.Bytes()
	last := false
	switch w.wr.Opcode {
	case IBV_WR_RDMA_READ:
		off := r.curPkt * mtu
		out.BTH = q.header(bth.RCReadRequest, psn)
		out.RETH = bth.RETH{VA: w.wr.RemoteAddr + uint64(off), RKey: w.wr.RKey, DMALength: uint32(w.length - off)}
		last = true
		r.sendPSN = w.firstPSN.Add(w.npkts)
	case IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
		op := bth.RCFetchAdd
		if w.wr.Opcode == IBV_WR_ATOMIC_CMP_AND_SWP {
			op = bth.RCCompareSwap
		}
		out.BTH = q.header(op, psn)
		out.AtomicETH = bth.AtomicETH{VA: w.wr.RemoteAddr, RKey: w.wr.RKey}
		if op == bth.RCCompareSwap {
			out.AtomicETH.SwapAdd, out.AtomicETH.Compare = w.wr.Swap, w.wr.CompareAdd
		} else {
			out.AtomicETH.SwapAdd = w.wr.CompareAdd
		}
		last = true
		r.sendPSN = psn.Next()
	default:
		off := r.curPkt * mtu
		n := min(mtu, w.length-off)
		last = r.curPkt == w.npkts-1
		out.BTH = q.header(q.sendOpcode(w, r.curPkt == 0, last), psn)
		info := out.BTH.Opcode.Info()
		if info.Ext&bth.ExtRETH != 0 {
			out.RETH = bth.RETH{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALength: uint32(w.length)}
		}
		out.ImmDt = bth.ImmDt(w.wr.ImmData)
		out.IETH = bth.IETH(w.wr.InvalidateRKey)
		if b, ok := w.sgl.contiguous(off, n); ok {
			out.Payload = b
		} else {
			if cap(r.scratch) < n {
				r.scratch = make([]byte, mtu)
			}
			out.Payload = r.scratch[:n]
			w.sgl.copyOut(out.Payload, off) // validity checked above
		}
		r.sendPSN = psn.Next()
		if last && w.wr.Flags&IBV_SEND_SOLICITED != 0 {
			out.BTH.SE = true
		}
	}
	r.noAck++
	if last || r.noAck >= AckReqInterval {
		out.BTH.AckReq = true
		r.noAck = 0
	}
	if last {
		r.cur++
		r.curPkt = 0
	} else {
		r.curPkt++
	}
	if !r.sentAny || !psn.Before(r.sentHigh) {
		r.sentHigh = r.sendPSN
		r.sentAny = true
	} else {
		q.Counters.RetransmittedPkts++
	}
	if r.retransmitAt.IsZero() {
		if d := LocalAckTimeout(q.attr.Timeout); d > 0 {
			r.retransmitAt = now.Add(d)
		}
	}
	return true
}

// nextPayload is the payload size of w's next packet, for the pacer.
func (q *QP) nextPayload(w *sendWQE) int {
	switch w.wr.Opcode {
	case IBV_WR_RDMA_READ:
		return bth.RETHLen
	case IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
		return bth.AtomicETHLen
	}
	mtu := q.attr.PathMTU.Bytes()
	if !w.started {
		return min(mtu, w.length)
	}
	return min(mtu, w.length-q.req.curPkt*mtu)
}

// sendOpcode picks the SEND or RDMA WRITE opcode for a packet's place in
// its message.
func (q *QP) sendOpcode(w *sendWQE, first, last bool) bth.Opcode {
	only := first && last
	switch w.wr.Opcode {
	case IBV_WR_RDMA_WRITE:
		return pick(only, first, last, bth.RCWriteOnly, bth.RCWriteFirst, bth.RCWriteLast, bth.RCWriteMiddle)
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return pick(only, first, last, bth.RCWriteOnlyImm, bth.RCWriteFirst, bth.RCWriteLastImm, bth.RCWriteMiddle)
	case IBV_WR_SEND_WITH_IMM:
		return pick(only, first, last, bth.RCSendOnlyImm, bth.RCSendFirst, bth.RCSendLastImm, bth.RCSendMiddle)
	case IBV_WR_SEND_WITH_INV:
		return pick(only, first, last, bth.RCSendOnlyInvalidate, bth.RCSendFirst, bth.RCSendLastInvalidate, bth.RCSendMiddle)
	}
	return pick(only, first, last, bth.RCSendOnly, bth.RCSendFirst, bth.RCSendLast, bth.RCSendMiddle)
}

func pick(only, first, last bool, o, f, l, m bth.Opcode) bth.Opcode {
	switch {
	case only:
		return o
	case first:
		return f
	case last:
		return l
	}
	return m
}

// nakRetry starts go-back-N from psn after a NAK or a gap in the
// responses, unless one such retry is already under way (see
// requester.retrying). It reports whether it started one.
func (q *QP) nakRetry(psn bth.PSN) bool {
	r := &q.req
	if r.retrying {
		return false
	}
	if q.retryOrFail(IBV_WC_RETRY_EXC_ERR) {
		r.retrying = true
		q.restart(psn)
		return true
	}
	return false
}

// restart rewinds transmission to PSN psn (go-back-N, IBTA 9.7.6.1.x): the
// WQE holding it is sent again from that packet, and every WQE after it.
// A READ restarts with a request for the part not yet received.
func (q *QP) restart(psn bth.PSN) {
	r := &q.req
	q.Counters.CompleterRetry++
	r.respPos = bth.PosNone
	for i, w := range r.sq {
		if !w.started {
			break
		}
		if psn.InRange(w.firstPSN, w.npkts) {
			r.cur = i
			r.curPkt = int(psn.Diff(w.firstPSN))
			r.sendPSN = psn
			return
		}
	}
	// Nothing holds psn: resend from the oldest WQE.
	r.cur, r.curPkt = 0, 0
	if len(r.sq) > 0 && r.sq[0].started {
		r.sendPSN = r.sq[0].firstPSN
	}
}

// complete finishes the oldest send WQE successfully.
func (q *QP) complete(w *sendWQE) {
	r := &q.req
	r.sq = r.sq[1:]
	if r.cur > 0 {
		r.cur--
	} else {
		r.curPkt = 0
	}
	if w.readOrAtomic() {
		r.rdAtomic--
	}
	r.compPSN = w.lastPSN().Next()
	q.skipAcked()
	if q.sigAll || w.wr.Flags&IBV_SEND_SIGNALED != 0 {
		q.scq.push(WC{WRID: w.wr.WRID, Status: IBV_WC_SUCCESS, Opcode: w.wcOpcode(), ByteLen: uint32(w.length), QPNum: q.QPN})
	}
}

// skipAcked keeps transmission at or after the oldest unacknowledged PSN:
// when an ACK or response acknowledges packets that are being sent again,
// or the WQE being sent again completes, the next packet is the first one
// not yet acknowledged (and a WQE not yet started gets the next free PSN).
func (q *QP) skipAcked() {
	r := &q.req
	if !r.sendPSN.Before(r.compPSN) {
		return
	}
	r.sendPSN = r.compPSN
	if r.cur == 0 && len(r.sq) > 0 && r.sq[0].started {
		w := r.sq[0]
		if r.compPSN.InRange(w.firstPSN, w.npkts) {
			r.curPkt = int(r.compPSN.Diff(w.firstPSN))
		}
	}
}

// progress records that the remote side acknowledged something new: the
// retry counters reset and the ACK timer restarts (rxe reset_retry_counters).
func (q *QP) progress(now time.Time) {
	r := &q.req
	r.retryLeft = q.attr.RetryCnt
	r.rnrLeft = q.attr.RNRRetry
	r.retrying = false
	r.retransmitAt = time.Time{}
	if r.sendPSN != r.compPSN && len(r.sq) > 0 {
		if d := LocalAckTimeout(q.attr.Timeout); d > 0 {
			r.retransmitAt = now.Add(d)
		}
	}
}

// handleResponse is the completer: ACKs, NAKs, READ responses and atomic
// ACKs for this QP's requests (IBTA 9.7.5.1, rxe_comp.c).
func (q *QP) handleResponse(now time.Time, p *bth.Packet, info *bth.OpInfo) {
	r := &q.req
	psn := p.BTH.PSN
	// Nothing outstanding, or a PSN never sent: stale or bogus.
	if len(r.sq) == 0 || !r.sq[0].started || !r.sentAny || !psn.Before(r.sentHigh) {
		q.Counters.Dropped++
		return
	}
	if psn.Before(r.compPSN) {
		q.Counters.DuplicateResponse++
		return
	}
	progressed := false
	// A response past a SEND/WRITE acknowledges it; past a READ or atomic
	// whose response did not come, it means the response was lost.
	for len(r.sq) > 0 && r.sq[0].started && psn.After(r.sq[0].lastPSN()) {
		w := r.sq[0]
		if w.readOrAtomic() {
			if q.nakRetry(r.compPSN) {
				q.Counters.ImpliedNakSeqErr++
			}
			return
		}
		q.complete(w)
		progressed = true
	}
	if len(r.sq) == 0 || !r.sq[0].started {
		if progressed {
			q.progress(now)
		}
		return
	}
	w := r.sq[0]
	if info.Ext&bth.ExtAETH != 0 && p.AETH.Syndrome.Kind() != bth.KindACK {
		q.handleNAK(now, p, w, progressed)
		return
	}
	switch info.Op {
	case bth.OpAcknowledge:
		if w.readOrAtomic() {
			break // an ACK does not answer a READ or atomic; wait for its response
		}
		if psn == w.lastPSN() {
			q.complete(w)
		} else {
			r.compPSN = psn.Next()
			q.skipAcked()
		}
		progressed = true
	case bth.OpAtomicAcknowledge:
		if psn != w.firstPSN || (w.wr.Opcode != IBV_WR_ATOMIC_CMP_AND_SWP && w.wr.Opcode != IBV_WR_ATOMIC_FETCH_AND_ADD) {
			q.Counters.Dropped++
			break
		}
		var v [8]byte
		binary.LittleEndian.PutUint64(v[:], uint64(p.AtomicAckETH))
		if !w.sgl.copyIn(v[:], 0) {
			q.failHead(IBV_WC_LOC_PROT_ERR)
			return
		}
		q.complete(w)
		progressed = true
	case bth.OpReadResponse:
		if w.wr.Opcode != IBV_WR_RDMA_READ {
			q.Counters.Dropped++
			break
		}
		if psn != r.compPSN {
			// A response packet is missing: ask again for the rest.
			if q.nakRetry(r.compPSN) {
				q.Counters.ImpliedNakSeqErr++
			}
			break
		}
		if !q.acceptReadResponse(p, info, w) {
			break
		}
		progressed = true
	}
	if progressed {
		q.progress(now)
	}
}

// acceptReadResponse places one in-sequence READ response packet into the
// WQE's local memory. It checks the packet's place in the response
// (First/Middle/Last or Only) and its length against the MTU and the
// request; a packet that fails is dropped and the read is retried.
func (q *QP) acceptReadResponse(p *bth.Packet, info *bth.OpInfo, w *sendWQE) bool {
	r := &q.req
	mtu := q.attr.PathMTU.Bytes()
	k := int(p.BTH.PSN.Diff(w.firstPSN))
	off := k * mtu
	want := min(mtu, w.length-off)
	pos := info.Pos
	okPos := false
	switch r.respPos {
	case bth.PosNone, bth.PosLast, bth.PosOnly:
		// A new response starts with First/Only, or, after a restart in
		// the middle, with Middle/Last (rxe replays that way).
		okPos = pos == bth.PosFirst || pos == bth.PosOnly || k > 0
	default:
		okPos = pos == bth.PosMiddle || pos == bth.PosLast
	}
	lastPkt := k == w.npkts-1
	if !okPos || len(p.Payload) != want || (pos == bth.PosLast || pos == bth.PosOnly) != lastPkt {
		q.Counters.Dropped++
		return false
	}
	if !w.sgl.copyIn(p.Payload, off) {
		q.failHead(IBV_WC_LOC_PROT_ERR) // the destination was deregistered
		return false
	}
	r.respPos = pos
	r.compPSN = p.BTH.PSN.Next()
	q.skipAcked()
	if lastPkt {
		r.respPos = bth.PosNone
		q.complete(w)
	}
	return true
}

// handleNAK acts on a NAK or RNR NAK for PSN psn (IBTA 9.7.5.2.x): a NAK
// implicitly acknowledges every PSN before it.
func (q *QP) handleNAK(now time.Time, p *bth.Packet, w *sendWQE, progressed bool) {
	r := &q.req
	psn := p.BTH.PSN
	syn := p.AETH.Syndrome
	// Everything before psn is acknowledged; whole SEND/WRITE WQEs before
	// it complete.
	for len(r.sq) > 0 && r.sq[0].started && !r.sq[0].readOrAtomic() && r.sq[0].lastPSN().Before(psn) {
		q.complete(r.sq[0])
		progressed = true
	}
	if len(r.sq) > 0 && r.sq[0].started && psn.After(r.compPSN) && !r.sq[0].readOrAtomic() {
		r.compPSN = psn
		q.skipAcked()
		progressed = true
	}
	if progressed {
		q.progress(now)
	}
	switch syn.Kind() {
	case bth.KindRNRNAK:
		q.Counters.RNRNakRetryErr++
		if r.rnrLeft == 0 {
			q.Counters.RetryRNRExceeded++
			q.failHead(IBV_WC_RNR_RETRY_EXC_ERR)
			return
		}
		if r.rnrLeft != 7 {
			r.rnrLeft--
		}
		r.rnrPSN = psn
		r.rnrUntil = now.Add(bth.RNRTimer(syn.Value()))
		r.retransmitAt = time.Time{}
	case bth.KindNAK:
		switch syn.NAKCode() {
		case bth.NAKPSNSequenceError:
			q.Counters.PacketSeqErr++
			q.nakRetry(psn)
		case bth.NAKInvalidRequest:
			q.Counters.ReqRemoteInvalidReq++
			q.failHead(IBV_WC_REM_INV_REQ_ERR)
		case bth.NAKRemoteAccessError:
			q.Counters.ReqRemoteAccessErr++
			q.failHead(IBV_WC_REM_ACCESS_ERR)
		case bth.NAKRemoteOperationalErr:
			q.Counters.ReqRemoteOpErr++
			q.failHead(IBV_WC_REM_OP_ERR)
		default:
			q.Counters.ReqRemoteInvalidReq++
			q.failHead(IBV_WC_REM_INV_RD_REQ_ERR)
		}
	default:
		q.Counters.Dropped++
	}
}
