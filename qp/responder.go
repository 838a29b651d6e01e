package qp

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// RecvWR is a receive work request, as ibv_recv_wr.
type RecvWR struct {
	WRID uint64
	SGEs []SGE
}

type recvWQE struct {
	wr     RecvWR
	sgl    sgList
	status WCStatus // LOC_PROT_ERR when an SGE was not valid at post time
}

// rdRes remembers a READ or atomic request the responder executed, so that
// a duplicate can be answered (IBTA 9.7.5.1.x "responder resources";
// rxe's struct resp_res).
type rdRes struct {
	id       uint64 // tells responder output items of this request apart
	atomic   bool
	firstPSN bth.PSN
	lastPSN  bth.PSN
	va       uint64
	rkey     uint32
	length   uint32
	orig     uint64 // atomic: the value before the operation
	msn      uint32
}

// outItem is one entry of the responder's output: an ACK or NAK, an atomic
// ACK, or a READ response still being sent.
type outItem struct {
	op       bth.Opcode // RCAcknowledge, RCAtomicAcknowledge or RCReadRequest for a READ response
	psn      bth.PSN
	syndrome bth.Syndrome
	msn      uint32
	orig     uint64
	// READ response progress.
	resID  uint64 // the rdRes the response answers
	data   []byte // the bytes still to send, in the responder's memory
	replay bool   // started in the middle: Middle/Last opcodes only
}

// responder is the receive side.
type responder struct {
	rq      []*recvWQE
	ePSN    bth.PSN // next PSN expected
	msn     uint32  // messages completed, 24 bits
	nakSent bool    // a PSN sequence NAK is outstanding
	// The message in progress: a SEND into cur, or an RDMA WRITE into wbuf.
	inMsg  bth.Operation // OpSend or OpWrite while a First was taken; 0 otherwise
	cur    *recvWQE
	curOff int
	wbuf   []byte // the rest of the WRITE's target
	wlen   int    // the WRITE's DMA length
	res    []rdRes
	resPos int
	resSeq uint64
	out    []outItem
}

// PostRecv queues a receive work request, as ibv_post_recv. It fails in
// RESET or when the receive queue is full; in ERR the request completes at
// once with IBV_WC_WR_FLUSH_ERR. SGEs must name memory with LOCAL_WRITE
// access; one that does not fails the message it would receive with
// IBV_WC_LOC_PROT_ERR.
func (q *QP) PostRecv(wr RecvWR) error {
	if q.state == IBV_QPS_RESET {
		return fmt.Errorf("%w: post receive in %s", ErrBadState, q.state)
	}
	if len(q.resp.rq) >= q.maxRecv {
		return ErrQueueFull
	}
	if q.state == IBV_QPS_ERR {
		q.rcq.push(WC{WRID: wr.WRID, Status: IBV_WC_WR_FLUSH_ERR, Opcode: IBV_WC_RECV, QPNum: q.QPN})
		return nil
	}
	w := &recvWQE{wr: RecvWR{WRID: wr.WRID, SGEs: append([]SGE(nil), wr.SGEs...)}}
	sgl, ok := q.pd.local(w.wr.SGEs, true, nil)
	if !ok {
		w.status = IBV_WC_LOC_PROT_ERR
	}
	w.sgl = sgl
	q.resp.rq = append(q.resp.rq, w)
	return nil
}

// RecvQueued returns the number of receive WQEs waiting.
func (q *QP) RecvQueued() int { return len(q.resp.rq) }

// SendQueued returns the number of send WQEs not yet completed.
func (q *QP) SendQueued() int { return len(q.req.sq) }

// queue appends a responder output item. A plain ACK replaces an ACK at
// the tail (coalescing: the later one acknowledges everything the earlier
// one did).
func (q *QP) queue(it outItem) {
	o := &q.resp.out
	if it.op == bth.RCAcknowledge && it.syndrome.IsACK() && len(*o) > 0 {
		t := &(*o)[len(*o)-1]
		if t.op == bth.RCAcknowledge && t.syndrome.IsACK() {
			*t = it
			return
		}
	}
	if len(*o) >= maxOutQueue {
		q.Counters.Dropped++
		return
	}
	*o = append(*o, it)
}

func (q *QP) ack(psn bth.PSN) {
	q.queue(outItem{op: bth.RCAcknowledge, psn: psn, syndrome: bth.SyndromeACKNoCredits, msn: q.resp.msn})
}

func (q *QP) nak(psn bth.PSN, s bth.Syndrome) {
	q.Counters.NAKsSent++
	q.queue(outItem{op: bth.RCAcknowledge, psn: psn, syndrome: s, msn: q.resp.msn})
}

// fatal ends the responder with a NAK (IBTA class A/C errors, rxe's
// do_class_ac_error): the receive WQE in progress completes with status,
// and the QP moves to ERR. The NAK still goes out.
func (q *QP) fatal(psn bth.PSN, s bth.Syndrome, status WCStatus) {
	q.nak(psn, s)
	if c := q.resp.cur; c != nil {
		q.rcq.push(WC{WRID: c.wr.WRID, Status: status, Opcode: IBV_WC_RECV, QPNum: q.QPN})
		q.resp.cur = nil
	}
	q.toError()
}

// handleRequest is the responder (IBTA 9.7.4.x, rxe_resp.c).
func (q *QP) handleRequest(p *bth.Packet, info *bth.OpInfo) {
	s := &q.resp
	psn := p.BTH.PSN
	switch d := psn.Diff(s.ePSN); {
	case d > 0:
		// Ahead of what we expect: one NAK, then silence until the
		// expected PSN arrives.
		q.Counters.OutOfSequence++
		if !s.nakSent {
			s.nakSent = true
			q.nak(s.ePSN, bth.SyndromePSNSeqErr)
		}
		return
	case d < 0:
		q.Counters.DuplicateRequest++
		q.duplicate(p, info)
		return
	}
	s.nakSent = false

	// Opcode sequence: inside a SEND or WRITE only its Middle/Last may come.
	if s.inMsg != bth.OpUnknown {
		if info.Op != s.inMsg || (info.Pos != bth.PosMiddle && info.Pos != bth.PosLast) {
			q.Counters.RespInvalidRequest++
			q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
			return
		}
	} else if info.Pos == bth.PosMiddle || info.Pos == bth.PosLast {
		q.Counters.RespInvalidRequest++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	// Packet length: First and Middle carry exactly the MTU, Last and Only
	// at most the MTU (ROCEV2.md section 4).
	mtu := q.attr.PathMTU.Bytes()
	n := len(p.Payload)
	if ((info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle) && n != mtu) || n > mtu {
		q.Counters.RespInvalidRequest++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}

	switch info.Op {
	case bth.OpSend:
		q.recvSend(p, info)
	case bth.OpWrite:
		q.recvWrite(p, info)
	case bth.OpReadRequest:
		q.recvRead(p)
	case bth.OpCompareSwap, bth.OpFetchAdd:
		q.recvAtomic(p, info)
	default:
		q.Counters.RespInvalidRequest++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
	}
}

// takeRecv starts a message that consumes a receive WQE; when there is
// none it sends an RNR NAK and returns false (IBTA 9.7.5.2.8).
func (q *QP) takeRecv(psn bth.PSN) bool {
	s := &q.resp
	if len(s.rq) == 0 {
		q.Counters.SendRNRErr++
		q.queue(outItem{op: bth.RCAcknowledge, psn: psn, syndrome: bth.RNRNAKSyndrome(q.attr.MinRNRTimer), msn: s.msn})
		return false
	}
	s.cur = s.rq[0]
	s.rq = s.rq[1:]
	s.curOff = 0
	if s.cur.status != 0 {
		q.fatal(psn, bth.SyndromeRemoteOp, s.cur.status)
		return false
	}
	return true
}

func (q *QP) recvSend(p *bth.Packet, info *bth.OpInfo) {
	s := &q.resp
	psn := p.BTH.PSN
	if info.Starts() {
		q.Counters.RxSendRequests++
		if !q.takeRecv(psn) {
			return
		}
	}
	if !s.cur.sgl.copyIn(p.Payload, s.curOff) {
		if !s.cur.sgl.valid() {
			// A receive buffer was deregistered after posting.
			q.fatal(psn, bth.SyndromeRemoteOp, IBV_WC_LOC_PROT_ERR)
			return
		}
		// The message is longer than the receive buffers.
		q.Counters.RespLocalLengthErr++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_LOC_LEN_ERR)
		return
	}
	s.curOff += len(p.Payload)
	s.ePSN = psn.Next()
	if !info.Ends() {
		s.inMsg = bth.OpSend
		if p.BTH.AckReq {
			q.ack(psn)
		}
		return
	}
	s.inMsg = bth.OpUnknown
	s.msn = (s.msn + 1) & 0xFFFFFF
	wc := WC{WRID: s.cur.wr.WRID, Status: IBV_WC_SUCCESS, Opcode: IBV_WC_RECV, ByteLen: uint32(s.curOff), QPNum: q.QPN, SrcQP: q.attr.DestQPN}
	if info.Immediate {
		wc.Flags |= IBV_WC_WITH_IMM
		wc.ImmData = uint32(p.ImmDt)
	}
	if info.Invalidate {
		wc.Flags |= IBV_WC_WITH_INV
		wc.InvalidatedRKey = uint32(p.IETH)
	}
	s.cur = nil
	q.rcq.push(wc)
	if p.BTH.AckReq {
		q.ack(psn)
	}
}

func (q *QP) recvWrite(p *bth.Packet, info *bth.OpInfo) {
	s := &q.resp
	psn := p.BTH.PSN
	if info.Starts() {
		q.Counters.RxWriteRequests++
		reth := p.RETH
		if reth.DMALength > MaxMessage || (info.Pos == bth.PosOnly && len(p.Payload) != int(reth.DMALength)) {
			q.Counters.RespInvalidRequest++
			q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
			return
		}
		s.wbuf = nil
		if reth.DMALength > 0 {
			s.wbuf = q.remote(reth.RKey, reth.VA, uint64(reth.DMALength), IBV_ACCESS_REMOTE_WRITE)
			if s.wbuf == nil {
				q.Counters.RespRemoteAccessErr++
				q.fatal(psn, bth.SyndromeRemoteAccess, IBV_WC_REM_ACCESS_ERR)
				return
			}
		}
		s.wlen = int(reth.DMALength)
	}
	if len(p.Payload) > len(s.wbuf) || (info.Ends() && len(p.Payload) != len(s.wbuf)) {
		// More or fewer bytes than the RETH announced.
		q.Counters.RespInvalidRequest++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	if info.Immediate && !q.takeRecv(psn) {
		return // RNR NAK sent; nothing written by this packet
	}
	copy(s.wbuf, p.Payload)
	s.wbuf = s.wbuf[len(p.Payload):]
	s.ePSN = psn.Next()
	if !info.Ends() {
		s.inMsg = bth.OpWrite
		if p.BTH.AckReq {
			q.ack(psn)
		}
		return
	}
	s.inMsg = bth.OpUnknown
	s.msn = (s.msn + 1) & 0xFFFFFF
	if info.Immediate {
		q.rcq.push(WC{WRID: s.cur.wr.WRID, Status: IBV_WC_SUCCESS, Opcode: IBV_WC_RECV_RDMA_WITH_IMM,
			ByteLen: uint32(s.wlen), ImmData: uint32(p.ImmDt), Flags: IBV_WC_WITH_IMM, QPNum: q.QPN, SrcQP: q.attr.DestQPN})
		s.cur = nil
	}
	if p.BTH.AckReq {
		q.ack(psn)
	}
}

// remote checks a remote access against both the QP's access flags and
// the memory region (IBTA C9-88, C10-xx).
func (q *QP) remote(rkey uint32, va, n uint64, need Access) []byte {
	if q.attr.AccessFlags&need != need {
		return nil
	}
	return q.pd.remote(rkey, va, n, need)
}

func (q *QP) remember(r rdRes) uint64 {
	s := &q.resp
	s.resSeq++
	r.id = s.resSeq
	depth := max(1, int(q.attr.MaxDestRdAtomic))
	if len(s.res) < depth {
		s.res = append(s.res, r)
		return r.id
	}
	s.res[s.resPos%len(s.res)] = r
	s.resPos++
	return r.id
}

func (q *QP) recvRead(p *bth.Packet) {
	s := &q.resp
	psn := p.BTH.PSN
	q.Counters.RxReadRequests++
	reth := p.RETH
	if reth.DMALength > MaxMessage {
		q.Counters.RespInvalidRequest++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	var data []byte
	if reth.DMALength > 0 {
		data = q.remote(reth.RKey, reth.VA, uint64(reth.DMALength), IBV_ACCESS_REMOTE_READ)
		if data == nil {
			q.Counters.RespRemoteAccessErr++
			q.fatal(psn, bth.SyndromeRemoteAccess, IBV_WC_REM_ACCESS_ERR)
			return
		}
	}
	npkts := q.packets(int(reth.DMALength))
	s.msn = (s.msn + 1) & 0xFFFFFF
	id := q.remember(rdRes{firstPSN: psn, lastPSN: psn.Add(npkts - 1), va: reth.VA, rkey: reth.RKey, length: reth.DMALength, msn: s.msn})
	s.ePSN = psn.Add(npkts)
	q.queue(outItem{op: bth.RCReadRequest, psn: psn, msn: s.msn, data: data, resID: id})
}

func (q *QP) recvAtomic(p *bth.Packet, info *bth.OpInfo) {
	s := &q.resp
	psn := p.BTH.PSN
	q.Counters.RxAtomicRequests++
	a := p.AtomicETH
	if a.VA%8 != 0 {
		q.Counters.RespInvalidRequest++
		q.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	b := q.remote(a.RKey, a.VA, 8, IBV_ACCESS_REMOTE_ATOMIC)
	if b == nil {
		q.Counters.RespRemoteAccessErr++
		q.fatal(psn, bth.SyndromeRemoteAccess, IBV_WC_REM_ACCESS_ERR)
		return
	}
	// Memory holds 64-bit values in the byte order of a little-endian
	// host, as on x86-64 and arm64 Linux.
	orig := binary.LittleEndian.Uint64(b)
	if info.Op == bth.OpFetchAdd {
		binary.LittleEndian.PutUint64(b, orig+a.SwapAdd)
	} else if orig == a.Compare {
		binary.LittleEndian.PutUint64(b, a.SwapAdd)
	}
	s.msn = (s.msn + 1) & 0xFFFFFF
	_ = q.remember(rdRes{atomic: true, firstPSN: psn, lastPSN: psn, va: a.VA, rkey: a.RKey, length: 8, orig: orig, msn: s.msn})
	s.ePSN = psn.Next()
	q.queue(outItem{op: bth.RCAtomicAcknowledge, psn: psn, syndrome: bth.SyndromeACKNoCredits, msn: s.msn, orig: orig})
}

// duplicate answers a request whose PSN is before the expected one
// (IBTA 9.7.5.1.2, rxe's duplicate_request): SEND and WRITE are ACKed
// again with the last PSN, a READ is executed again from the PSN asked for
// if it matches a remembered request, an atomic's saved result is sent
// again without executing it twice.
func (q *QP) duplicate(p *bth.Packet, info *bth.OpInfo) {
	s := &q.resp
	psn := p.BTH.PSN
	switch info.Op {
	case bth.OpSend, bth.OpWrite:
		q.ack(s.ePSN.Add(-1))
	case bth.OpReadRequest:
		for i := range s.res {
			r := &s.res[i]
			if r.atomic || !psn.InRange(r.firstPSN, int(r.lastPSN.Diff(r.firstPSN))+1) {
				continue
			}
			reth := p.RETH
			if reth.RKey != r.rkey || reth.VA < r.va || uint64(reth.VA)+uint64(reth.DMALength) > r.va+uint64(r.length) {
				break
			}
			var data []byte
			if reth.DMALength > 0 {
				data = q.remote(reth.RKey, reth.VA, uint64(reth.DMALength), IBV_ACCESS_REMOTE_READ)
				if data == nil {
					break
				}
			}
			// Like rxe, a duplicate restarts the response from the PSN
			// asked for: a response to the same request still being sent
			// is replaced, not doubled.
			it := outItem{op: bth.RCReadRequest, psn: psn, msn: r.msn, data: data, replay: psn != r.firstPSN, resID: r.id}
			for k := range s.out {
				if s.out[k].op == bth.RCReadRequest && s.out[k].resID == r.id {
					s.out[k] = it
					return
				}
			}
			q.queue(it)
			return
		}
		q.Counters.Dropped++
	case bth.OpCompareSwap, bth.OpFetchAdd:
		for i := range s.res {
			r := &s.res[i]
			if r.atomic && r.firstPSN == psn {
				q.queue(outItem{op: bth.RCAtomicAcknowledge, psn: psn, syndrome: bth.SyndromeACKNoCredits, msn: r.msn, orig: r.orig})
				return
			}
		}
		q.Counters.Dropped++
	default:
		q.Counters.Dropped++
	}
}

// nextResponse hands out the responder's next packet.
func (q *QP) nextResponse(now time.Time, out *bth.Packet) bool {
	s := &q.resp
	if len(s.out) == 0 || q.state == IBV_QPS_RESET || q.state == IBV_QPS_INIT {
		return false
	}
	it := &s.out[0]
	// READ response data is paced like requests (the responder is the
	// reaction point of a READ); ACKs are not.
	if it.op == bth.RCReadRequest && !q.pace(now, min(q.attr.PathMTU.Bytes(), len(it.data))) {
		return false
	}
	*out = bth.Packet{}
	switch it.op {
	case bth.RCAcknowledge:
		out.BTH = q.header(bth.RCAcknowledge, it.psn)
		out.AETH = bth.AETH{Syndrome: it.syndrome, MSN: it.msn}
	case bth.RCAtomicAcknowledge:
		out.BTH = q.header(bth.RCAtomicAcknowledge, it.psn)
		out.AETH = bth.AETH{Syndrome: it.syndrome, MSN: it.msn}
		out.AtomicAckETH = bth.AtomicAckETH(it.orig)
	default: // READ response
		mtu := q.attr.PathMTU.Bytes()
		n := min(mtu, len(it.data))
		last := len(it.data) <= mtu
		var op bth.Opcode
		switch {
		case !it.replay && last:
			op = bth.RCReadResponseOnly
		case !it.replay:
			op = bth.RCReadResponseFirst
		case last:
			op = bth.RCReadResponseLast
		default:
			op = bth.RCReadResponseMiddle
		}
		out.BTH = q.header(op, it.psn)
		out.AETH = bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: it.msn}
		out.Payload = it.data[:n]
		if !last {
			it.data = it.data[n:]
			it.psn = it.psn.Next()
			it.replay = true
			return true
		}
	}
	s.out = s.out[1:]
	if len(s.out) == 0 {
		s.out = nil
	}
	return true
}
