package qp

import (
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
	// UD (ibv_send_wr.wr.ud): where the message goes. AH is the address
	// handle's address vector (copied at post time), RemoteQPN the
	// destination QP, RemoteQKey the Q_Key the DETH carries; one with the
	// high bit set means the QP's own Q_Key (IBTA 10.2.5 C10-15, as rxe).
	AH         *AddressVector
	RemoteQPN  uint32
	RemoteQKey uint32
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

// requester is the send side of a QP (IBTA 9.7.x "requester", rxe's
// rxe_req.c): the send queue, segmentation of messages into packets, PSN
// assignment, and where transmission resumes after a go-back-N restart.
// The completer (completer.go) retires what it sent. The driver reaches it
// through QP.PostSend and QP.NextPacket.
type requester struct {
	q        *QP
	sq       []*sendWQE // oldest first; completed WQEs are removed
	cur      int        // index in sq of the WQE being transmitted; len(sq) when all are out
	curPkt   int        // packets of sq[cur] transmitted
	sendPSN  bth.PSN    // PSN of the next packet transmitted
	rdAtomic int        // READ/atomic WQEs started and not completed
	noAck    int        // packets sent since the last AckReq
	// rnrUntil holds transmission after an RNR NAK; it then restarts at
	// rnrPSN.
	rnrUntil time.Time
	rnrPSN   bth.PSN
	scratch  []byte
	sentHigh bth.PSN // highest PSN ever transmitted + 1, to count retransmissions
	sentAny  bool
	last     *sendWQE // UD: the WQE of the packet last handed out, for QP.SentTo
	// sqBuf is the start of sq's backing array, where an emptied queue
	// starts over, and free the WQEs retired, for the next posts: posting
	// and completing a work request then allocates nothing.
	sqBuf []*sendWQE
	free  []*sendWQE
}

// post checks and queues a send work request for QP.PostSend, the state
// having been checked.
func (r *requester) post(wr SendWR) error {
	q := r.q
	if !q.svc.postable(wr.Opcode) {
		return fmt.Errorf("%w: opcode %d on an %s QP", ErrBadWR, wr.Opcode, q.svc.name())
	}
	if len(r.sq) >= q.maxSend {
		return ErrQueueFull
	}
	var w *sendWQE
	var sges []SGE
	var sgl0 sgList
	if k := len(r.free); k > 0 {
		w = r.free[k-1]
		r.free[k-1] = nil
		r.free = r.free[:k-1]
		sges, sgl0 = w.wr.SGEs[:0], w.sgl[:0]
	} else {
		w = new(sendWQE)
	}
	*w = sendWQE{wr: wr}
	w.wr.SGEs = append(sges, wr.SGEs...)
	for _, s := range wr.SGEs {
		w.length += int(s.Length)
	}
	if w.length > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes is over 2^31", ErrBadWR, w.length)
	}
	if q.ud {
		// IBTA C10-93.1.1 has a UD message over the MTU sent nowhere and
		// no error given (rxe completes it with success); refusing it at
		// post time tells the caller.
		if w.length > q.attr.PathMTU.Bytes() {
			return fmt.Errorf("%w: a UD message of %d bytes is over the MTU of %d", ErrBadWR, w.length, q.attr.PathMTU.Bytes())
		}
		if wr.AH == nil || !wr.AH.Remote.Addr().IsValid() || wr.RemoteQPN > 0xFFFFFF {
			return fmt.Errorf("%w: a UD work request needs an address handle and a 24-bit remote QPN", ErrBadWR)
		}
		ah := *wr.AH
		w.wr.AH = &ah
	}
	if n := packets(w.length, q.attr.PathMTU); n > MaxMessagePSNs {
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
	sgl, ok := q.pd.local(w.wr.SGEs, w.readOrAtomic(), sgl0)
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
	if len(r.sq) == 0 {
		r.sq = r.sqBuf[:0]
	}
	r.sq = append(r.sq, w)
	if cap(r.sq) > cap(r.sqBuf) {
		r.sqBuf = r.sq[:0]
	}
	return nil
}

// packets returns how many PSNs a message of n bytes uses at path MTU
// mtu: ceil(n/MTU), at least 1 (docs/wire-format.md section 4).
func packets(n int, mtu MTU) int {
	m := mtu.Bytes()
	if n <= m {
		return 1
	}
	return (n + m - 1) / m
}

// next builds the next request packet, if the state, the window and the
// RNR timer allow one.
func (r *requester) next(now time.Time, out *bth.Packet) bool {
	q := r.q
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
			q.comp.failHead(w.status)
		}
		return false
	}
	if !q.unrel && int(r.sendPSN.Diff(q.comp.psn)) >= q.window {
		return false
	}
	if !w.started {
		if w.readOrAtomic() && r.rdAtomic >= max(1, int(q.attr.MaxRdAtomic)) {
			return false
		}
		if w.wr.Flags&IBV_SEND_FENCE != 0 && r.rdAtomic > 0 {
			return false
		}
		if !q.pace(now, r.nextPayload(w)) {
			return false
		}
		w.started = true
		w.firstPSN = r.sendPSN
		w.npkts = 1
		switch w.wr.Opcode {
		case IBV_WR_RDMA_READ:
			w.npkts = packets(w.length, q.attr.PathMTU)
			r.rdAtomic++
		case IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
			r.rdAtomic++
		default:
			w.npkts = packets(w.length, q.attr.PathMTU)
		}
		r.curPkt = 0
	} else if !q.pace(now, r.nextPayload(w)) {
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
		out.BTH = q.header(sendOpcode(w, r.curPkt == 0, last)|q.opBase, psn)
		if q.ud {
			qkey := w.wr.RemoteQKey
			if qkey&0x80000000 != 0 {
				qkey = q.qkey()
			}
			out.BTH.DestQP = w.wr.RemoteQPN
			out.DETH = bth.DETH{QKey: qkey, SrcQP: q.QPN}
			r.last = w
		}
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
	// The call is per packet: a type switch lets the compiler inline RC's
	// (the devirtualisation profile-guided optimisation would make).
	switch svc := q.svc.(type) {
	case rcService:
		svc.requestSent(now, r, out, last)
	default:
		svc.requestSent(now, r, out, last)
	}
	return true
}

// nextPayload is the payload size of w's next packet, for the pacer.
func (r *requester) nextPayload(w *sendWQE) int {
	switch w.wr.Opcode {
	case IBV_WR_RDMA_READ:
		return bth.RETHLen
	case IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD:
		return bth.AtomicETHLen
	}
	mtu := r.q.attr.PathMTU.Bytes()
	if !w.started {
		return min(mtu, w.length)
	}
	return min(mtu, w.length-r.curPkt*mtu)
}

// sendOpcode picks the SEND or RDMA WRITE opcode for a packet's place in
// its message.
func sendOpcode(w *sendWQE, first, last bool) bth.Opcode {
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

// rewind moves transmission back to PSN psn (go-back-N, IBTA 9.7.6.1.x):
// the WQE holding it is sent again from that packet, and every WQE after
// it. A READ restarts with a request for the part not yet received.
func (r *requester) rewind(psn bth.PSN) {
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

// skipAcked keeps transmission at or after compPSN, the oldest
// unacknowledged PSN: when an ACK or response acknowledges packets that
// are being sent again, or the WQE being sent again completes, the next
// packet is the first one not yet acknowledged (and a WQE not yet started
// gets the next free PSN).
func (r *requester) skipAcked(compPSN bth.PSN) {
	if !r.sendPSN.Before(compPSN) {
		return
	}
	r.sendPSN = compPSN
	if r.cur == 0 && len(r.sq) > 0 && r.sq[0].started {
		w := r.sq[0]
		if compPSN.InRange(w.firstPSN, w.npkts) {
			r.curPkt = int(compPSN.Diff(w.firstPSN))
		}
	}
}

// pop removes the oldest send WQE, which has completed or failed. The
// caller may read it until the next post, which may reuse it.
func (r *requester) pop() *sendWQE {
	w := r.sq[0]
	r.sq[0] = nil
	r.sq = r.sq[1:]
	r.free = append(r.free, w)
	if r.cur > 0 {
		r.cur--
	} else {
		r.curPkt = 0
	}
	return w
}

// onTimeout ends an RNR wait that is over: transmission resumes at the
// PSN the RNR NAK named.
func (r *requester) onTimeout(now time.Time) {
	if !r.rnrUntil.IsZero() && !now.Before(r.rnrUntil) {
		r.rnrUntil = time.Time{}
		r.q.comp.restart(r.rnrPSN)
	}
}

// flush completes every send WQE with IBV_WC_WR_FLUSH_ERR, or discards
// them when complete is false.
func (r *requester) flush(complete bool) {
	q := r.q
	for _, w := range r.sq {
		if complete {
			q.scq.push(WC{WRID: w.wr.WRID, Status: IBV_WC_WR_FLUSH_ERR, Opcode: w.wcOpcode(), QPNum: q.QPN})
		}
	}
	r.sq = r.sq[:0]
	r.cur = 0
	r.rdAtomic = 0
}
