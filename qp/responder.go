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
	// counted: the first answer to a READ or atomic request (or what
	// replaced it), counted in responder.rdOut until handed out.
	counted bool
}

// responder is the receive side of a QP (IBTA 9.7.4 "responder", rxe's
// rxe_resp.c): the receive queue, the PSN the next request must carry,
// placement of SEND and RDMA WRITE data, execution of READ and atomic
// requests with the responder resources that answer their duplicates,
// and the queue of what it sends back (ACKs, NAKs, READ responses, atomic
// ACKs). What a service does with a request out of sequence and whether
// it acknowledges goes through the QP's service.
type responder struct {
	q       *QP
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
	// rdOut counts the first answers to READ and atomic requests in out
	// (outItem.counted): the responder resources in use (IBTA 9.7.5.1.x),
	// at most max_dest_rd_atomic. Answers to duplicates are not counted
	// (a requester retries what it has not seen answered, even if the
	// answer left already); there is at most one per remembered request,
	// so out holds at most twice max_dest_rd_atomic of them all.
	rdOut int
	// dropMsg (UC) drops every packet up to the next First or Only, the
	// message in progress having been abandoned.
	dropMsg bool
	grh     [GRHLen]byte // UD: the GRH slot being written
	// outBuf is the start of out's backing array: an emptied queue starts
	// over there, so that queueing an ACK per packet allocates nothing.
	outBuf []outItem
	// rqBuf is the start of rq's backing array and free the receive
	// WQEs retired, reused as the send queue's are (requester.free).
	rqBuf []*recvWQE
	free  []*recvWQE
}

// retireCur ends the receive WQE in progress and keeps it for reuse.
func (s *responder) retireCur() {
	s.free = append(s.free, s.cur)
	s.cur = nil
}

// post queues a receive work request for QP.PostRecv, the state having
// been checked.
func (s *responder) post(wr RecvWR) error {
	q := s.q
	if len(s.rq) >= q.maxRecv {
		return ErrQueueFull
	}
	if q.state == IBV_QPS_ERR {
		q.rcq.push(WC{WRID: wr.WRID, Status: IBV_WC_WR_FLUSH_ERR, Opcode: IBV_WC_RECV, QPNum: q.QPN})
		return nil
	}
	w := newRecvWQE(q.pd, wr, s.takeFree())
	if len(s.rq) == 0 {
		s.rq = s.rqBuf[:0]
	}
	s.rq = append(s.rq, w)
	if cap(s.rq) > cap(s.rqBuf) {
		s.rqBuf = s.rq[:0]
	}
	return nil
}

// takeFree returns a retired receive WQE to reuse, or nil.
func (s *responder) takeFree() *recvWQE {
	k := len(s.free)
	if k == 0 {
		return nil
	}
	w := s.free[k-1]
	s.free[k-1] = nil
	s.free = s.free[:k-1]
	return w
}

// newRecvWQE copies wr into w (a retired WQE whose slices it reuses, or
// nil for a new one) and resolves its SGEs in pd.
func newRecvWQE(pd *PD, wr RecvWR, w *recvWQE) *recvWQE {
	var sges []SGE
	var sgl0 sgList
	if w != nil {
		sges, sgl0 = w.wr.SGEs[:0], w.sgl[:0]
	} else {
		w = new(recvWQE)
	}
	*w = recvWQE{wr: RecvWR{WRID: wr.WRID, SGEs: append(sges, wr.SGEs...)}}
	sgl, ok := pd.local(w.wr.SGEs, true, sgl0)
	if !ok {
		w.status = IBV_WC_LOC_PROT_ERR
	}
	w.sgl = sgl
	return w
}

// queue appends a responder output item. A plain ACK replaces an ACK at
// the tail (coalescing: the later one acknowledges everything the earlier
// one did).
func (s *responder) queue(it outItem) {
	o := &s.out
	if it.op == bth.RCAcknowledge && it.syndrome.IsACK() && len(*o) > 0 {
		t := &(*o)[len(*o)-1]
		if t.op == bth.RCAcknowledge && t.syndrome.IsACK() {
			*t = it
			return
		}
	}
	if len(*o) >= maxOutQueue {
		s.q.Counters.RespQueueFull++
		return
	}
	if len(*o) == 0 {
		*o = s.outBuf[:0]
	}
	*o = append(*o, it)
	if cap(*o) > cap(s.outBuf) {
		s.outBuf = (*o)[:0]
	}
	if it.counted {
		s.rdOut++
	}
}

// rdAtomicFull reports whether a new READ or atomic request finds every
// responder resource in use, and if so refuses it: a NAK Invalid Request
// and the QP to ERR (a class C error, IBTA 9.7.5.2.x; rxe's
// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, which rxe reaches with
// max_dest_rd_atomic 0). A resource is in use from the request until its
// first answer (or the replay that replaced it while queued) has been
// handed out in full: a requester that keeps to its max_rd_atomic, no
// more than this QP's max_dest_rd_atomic, never finds them all in use,
// since it sends a request beyond that number only after an answer came
// back whole. So a peer cannot make the responder queue more READ
// responses than max_dest_rd_atomic new ones and as many replays,
// however many it asks for (rxe, which serves one READ at a time from its
// packet queue, has the bound at 1).
func (s *responder) rdAtomicFull(psn bth.PSN) bool {
	if s.rdOut < int(s.q.attr.MaxDestRdAtomic) {
		return false
	}
	s.q.Counters.RespRdAtomicExceeded++
	s.q.Counters.RespInvalidRequest++
	s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
	if e := s.q.errCause; e != nil && e.Responder && e.PSN == psn {
		e.Reason = fmt.Sprintf("a READ or atomic request beyond max_dest_rd_atomic %d", s.q.attr.MaxDestRdAtomic)
	}
	return true
}

func (s *responder) ack(psn bth.PSN) {
	s.queue(outItem{op: bth.RCAcknowledge, psn: psn, syndrome: bth.SyndromeACKNoCredits, msn: s.msn})
}

func (s *responder) nak(psn bth.PSN, syn bth.Syndrome) {
	s.q.Counters.NAKsSent++
	s.queue(outItem{op: bth.RCAcknowledge, psn: psn, syndrome: syn, msn: s.msn})
}

// fatal ends a request the responder cannot execute (IBTA class B-D
// errors, rxe's do_class_ac_error), as the service says: on RC the NAK
// goes out, the receive WQE in progress completes with status, and the QP
// moves to ERR.
func (s *responder) fatal(psn bth.PSN, syn bth.Syndrome, status WCStatus) {
	s.q.svc.reject(s, psn, syn, status)
}

// handle takes one request (IBTA 9.7.4.x, rxe_resp.c). ri, which may be
// nil, is what the packet's IP and UDP headers said (UD uses it).
func (s *responder) handle(p *bth.Packet, info *bth.OpInfo, ri *RecvInfo) {
	q := s.q
	psn := p.BTH.PSN
	if info.Ext&bth.ExtDETH != 0 && p.DETH.QKey != q.qkey() {
		// UD: the Q_Key must be the QP's (IBTA 10.2.5, C9-49 check 11;
		// rxe's check_keys, GSI_QKEY for QP1).
		q.Counters.QKeyViolations++
		return
	}
	if s.dropMsg {
		// UC: the rest of an abandoned message is dropped; the next
		// First or Only starts again, whatever its PSN.
		if !info.Starts() {
			q.Counters.DroppedMsgPkts++
			return
		}
		s.dropMsg = false
	} else if psn.Diff(s.ePSN) != 0 && !q.svc.outOfSequence(s, p, info) {
		return
	}
	s.nakSent = false

	// Opcode sequence: inside a SEND or WRITE only its Middle/Last may come.
	if s.inMsg != bth.OpUnknown {
		if q.unrel && info.Starts() {
			// UC: a new message ends the one in progress (rxe drops the
			// old one, as for a gap).
			s.abandon()
		} else if info.Op != s.inMsg || (info.Pos != bth.PosMiddle && info.Pos != bth.PosLast) {
			q.Counters.RespInvalidRequest++
			s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
			return
		}
	} else if info.Pos == bth.PosMiddle || info.Pos == bth.PosLast {
		q.Counters.RespInvalidRequest++
		s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	// Packet length: First and Middle carry exactly the MTU, Last and Only
	// at most the MTU (docs/wire-format.md section 4).
	mtu := q.attr.PathMTU.Bytes()
	n := len(p.Payload)
	if ((info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle) && n != mtu) || n > mtu {
		q.Counters.RespInvalidRequest++
		s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}

	switch info.Op {
	case bth.OpSend:
		s.recvSend(p, info, ri)
	case bth.OpWrite:
		s.recvWrite(p, info)
	case bth.OpReadRequest:
		s.recvRead(p)
	case bth.OpCompareSwap, bth.OpFetchAdd:
		s.recvAtomic(p, info)
	default:
		q.Counters.RespInvalidRequest++
		s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
	}
}

// takeRecv starts a message that consumes a receive WQE; when there is
// none the service answers (RC: an RNR NAK, IBTA 9.7.5.2.8) and it
// returns false.
func (s *responder) takeRecv(psn bth.PSN) bool {
	if srq := s.q.srq; srq != nil {
		s.cur = srq.take()
	} else if len(s.rq) > 0 {
		s.cur = s.rq[0]
		s.rq[0] = nil
		s.rq = s.rq[1:]
	}
	if s.cur == nil {
		s.q.svc.noReceiveWQE(s, psn)
		return false
	}
	s.curOff = 0
	if s.cur.status != 0 {
		s.fatal(psn, bth.SyndromeRemoteOp, s.cur.status)
		return false
	}
	return true
}

func (s *responder) recvSend(p *bth.Packet, info *bth.OpInfo, ri *RecvInfo) {
	q := s.q
	psn := p.BTH.PSN
	var flags WCFlags
	if info.Starts() {
		q.Counters.RxSendRequests++
		if !s.takeRecv(psn) {
			return
		}
		if q.ud {
			// UD: the GRH slot comes first (rxe_resp.c execute).
			if grh(&s.grh, ri, p.Len()) {
				flags = IBV_WC_GRH
			}
			if !s.cur.sgl.copyIn(s.grh[:], 0) {
				s.placeFailed(psn)
				return
			}
			s.curOff = GRHLen
		}
	}
	if !s.cur.sgl.copyIn(p.Payload, s.curOff) {
		s.placeFailed(psn)
		return
	}
	s.curOff += len(p.Payload)
	s.ePSN = psn.Next()
	if !info.Ends() {
		s.inMsg = bth.OpSend
		if p.BTH.AckReq {
			q.svc.ackRequested(s, psn)
		}
		return
	}
	s.inMsg = bth.OpUnknown
	s.msn = (s.msn + 1) & 0xFFFFFF
	wc := WC{WRID: s.cur.wr.WRID, Status: IBV_WC_SUCCESS, Opcode: IBV_WC_RECV, ByteLen: uint32(s.curOff), QPNum: q.QPN, SrcQP: q.attr.DestQPN, Flags: flags}
	if q.ud {
		wc.SrcQP = p.DETH.SrcQP
		if ri != nil {
			wc.SrcAddr = ri.Src
		}
	}
	if info.Immediate {
		wc.Flags |= IBV_WC_WITH_IMM
		wc.ImmData = uint32(p.ImmDt)
	}
	if info.Invalidate {
		wc.Flags |= IBV_WC_WITH_INV
		wc.InvalidatedRKey = uint32(p.IETH)
	}
	s.retireCur()
	q.rcq.push(wc)
	if p.BTH.AckReq {
		q.svc.ackRequested(s, psn)
	}
}

// placeFailed fails a SEND whose data did not fit the receive WQE: a
// buffer deregistered after posting is a local protection error (the WQE
// completes with IBV_WC_LOC_PROT_ERR and the QP moves to ERR); a message
// longer than the buffers is a length error (RC: a NAK and
// IBV_WC_LOC_LEN_ERR; UC and UD: the message is dropped and the WQE kept,
// as rxe does without an SRQ).
func (s *responder) placeFailed(psn bth.PSN) {
	if !s.cur.sgl.valid() {
		s.fatal(psn, bth.SyndromeRemoteOp, IBV_WC_LOC_PROT_ERR)
		return
	}
	s.q.Counters.RespLocalLengthErr++
	s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_LOC_LEN_ERR)
}

func (s *responder) recvWrite(p *bth.Packet, info *bth.OpInfo) {
	q := s.q
	psn := p.BTH.PSN
	if info.Starts() {
		q.Counters.RxWriteRequests++
		reth := p.RETH
		if reth.DMALength > MaxMessage || (info.Pos == bth.PosOnly && len(p.Payload) != int(reth.DMALength)) {
			q.Counters.RespInvalidRequest++
			s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
			return
		}
		s.wbuf = nil
		if reth.DMALength > 0 {
			s.wbuf = s.remote(reth.RKey, reth.VA, uint64(reth.DMALength), IBV_ACCESS_REMOTE_WRITE)
			if s.wbuf == nil {
				q.Counters.RespRemoteAccessErr++
				s.fatal(psn, bth.SyndromeRemoteAccess, IBV_WC_REM_ACCESS_ERR)
				return
			}
		}
		s.wlen = int(reth.DMALength)
	}
	if len(p.Payload) > len(s.wbuf) || (info.Ends() && len(p.Payload) != len(s.wbuf)) {
		// More or fewer bytes than the RETH announced.
		q.Counters.RespInvalidRequest++
		s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	if info.Immediate && !s.takeRecv(psn) {
		return // RNR NAK sent; nothing written by this packet
	}
	copy(s.wbuf, p.Payload)
	s.wbuf = s.wbuf[len(p.Payload):]
	s.ePSN = psn.Next()
	if !info.Ends() {
		s.inMsg = bth.OpWrite
		if p.BTH.AckReq {
			q.svc.ackRequested(s, psn)
		}
		return
	}
	s.inMsg = bth.OpUnknown
	s.msn = (s.msn + 1) & 0xFFFFFF
	if info.Immediate {
		q.rcq.push(WC{WRID: s.cur.wr.WRID, Status: IBV_WC_SUCCESS, Opcode: IBV_WC_RECV_RDMA_WITH_IMM,
			ByteLen: uint32(s.wlen), ImmData: uint32(p.ImmDt), Flags: IBV_WC_WITH_IMM, QPNum: q.QPN, SrcQP: q.attr.DestQPN})
		s.retireCur()
	}
	if p.BTH.AckReq {
		q.svc.ackRequested(s, psn)
	}
}

// remote checks a remote access against both the QP's access flags and
// the memory region (IBTA C9-88, C10-xx).
func (s *responder) remote(rkey uint32, va, n uint64, need Access) []byte {
	q := s.q
	if q.attr.AccessFlags&need != need {
		return nil
	}
	return q.pd.remote(rkey, va, n, need)
}

func (s *responder) remember(r rdRes) uint64 {
	s.resSeq++
	r.id = s.resSeq
	depth := int(s.q.attr.MaxDestRdAtomic)
	if len(s.res) < depth {
		s.res = append(s.res, r)
		return r.id
	}
	s.res[s.resPos%len(s.res)] = r
	s.resPos++
	return r.id
}

func (s *responder) recvRead(p *bth.Packet) {
	q := s.q
	psn := p.BTH.PSN
	q.Counters.RxReadRequests++
	if s.rdAtomicFull(psn) {
		return
	}
	reth := p.RETH
	if reth.DMALength > MaxMessage {
		q.Counters.RespInvalidRequest++
		s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	var data []byte
	if reth.DMALength > 0 {
		data = s.remote(reth.RKey, reth.VA, uint64(reth.DMALength), IBV_ACCESS_REMOTE_READ)
		if data == nil {
			q.Counters.RespRemoteAccessErr++
			s.fatal(psn, bth.SyndromeRemoteAccess, IBV_WC_REM_ACCESS_ERR)
			return
		}
	}
	npkts := packets(int(reth.DMALength), q.attr.PathMTU)
	s.msn = (s.msn + 1) & 0xFFFFFF
	id := s.remember(rdRes{firstPSN: psn, lastPSN: psn.Add(npkts - 1), va: reth.VA, rkey: reth.RKey, length: reth.DMALength, msn: s.msn})
	s.ePSN = psn.Add(npkts)
	s.queue(outItem{op: bth.RCReadRequest, psn: psn, msn: s.msn, data: data, resID: id, counted: true})
}

func (s *responder) recvAtomic(p *bth.Packet, info *bth.OpInfo) {
	q := s.q
	psn := p.BTH.PSN
	q.Counters.RxAtomicRequests++
	if s.rdAtomicFull(psn) {
		return
	}
	a := p.AtomicETH
	if a.VA%8 != 0 {
		q.Counters.RespInvalidRequest++
		s.fatal(psn, bth.SyndromeInvalidReq, IBV_WC_REM_INV_REQ_ERR)
		return
	}
	b := s.remote(a.RKey, a.VA, 8, IBV_ACCESS_REMOTE_ATOMIC)
	if b == nil {
		q.Counters.RespRemoteAccessErr++
		s.fatal(psn, bth.SyndromeRemoteAccess, IBV_WC_REM_ACCESS_ERR)
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
	id := s.remember(rdRes{atomic: true, firstPSN: psn, lastPSN: psn, va: a.VA, rkey: a.RKey, length: 8, orig: orig, msn: s.msn})
	s.ePSN = psn.Next()
	s.queue(outItem{op: bth.RCAtomicAcknowledge, psn: psn, syndrome: bth.SyndromeACKNoCredits, msn: s.msn, orig: orig, resID: id, counted: true})
}

// duplicate answers a request whose PSN is before the expected one
// (IBTA 9.7.5.1.2, rxe's duplicate_request): SEND and WRITE are ACKed
// again with the last PSN, a READ is executed again from the PSN asked for
// if it matches a remembered request, an atomic's saved result is sent
// again without executing it twice.
func (s *responder) duplicate(p *bth.Packet, info *bth.OpInfo) {
	q := s.q
	psn := p.BTH.PSN
	switch info.Op {
	case bth.OpSend, bth.OpWrite:
		s.ack(s.ePSN.Add(-1))
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
				data = s.remote(reth.RKey, reth.VA, uint64(reth.DMALength), IBV_ACCESS_REMOTE_READ)
				if data == nil {
					break
				}
			}
			// Like rxe, a duplicate restarts the response from the PSN
			// asked for: a response to the same request still being sent
			// is replaced, not doubled.
			s.requeue(outItem{op: bth.RCReadRequest, psn: psn, msn: r.msn, data: data, replay: psn != r.firstPSN, resID: r.id})
			return
		}
		// Not a request this responder remembers (or its memory is no
		// longer readable): a class D error, dropped (rxe's
		// duplicate_request).
		q.Counters.DuplicateNoResource++
	case bth.OpCompareSwap, bth.OpFetchAdd:
		for i := range s.res {
			r := &s.res[i]
			if r.atomic && r.firstPSN == psn {
				s.requeue(outItem{op: bth.RCAtomicAcknowledge, psn: psn, syndrome: bth.SyndromeACKNoCredits, msn: r.msn, orig: r.orig, resID: r.id})
				return
			}
		}
		q.Counters.DuplicateNoResource++
	default:
		q.Counters.DuplicateNoResource++
	}
}

// requeue queues the answer to a duplicate READ or atomic request, in
// place of an answer to the same request still queued (taking its place in
// rdOut too): each remembered request has at most one answer queued, so
// duplicates cannot grow the queue past max_dest_rd_atomic answers.
func (s *responder) requeue(it outItem) {
	for k := range s.out {
		if s.out[k].op == it.op && s.out[k].resID == it.resID {
			it.counted = s.out[k].counted
			s.out[k] = it
			return
		}
	}
	s.queue(it)
}

// next hands out the responder's next packet.
func (s *responder) next(now time.Time, out *bth.Packet) bool {
	q := s.q
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
	if it.counted {
		s.rdOut--
	}
	s.out[0] = outItem{}
	s.out = s.out[1:]
	return true
}

// flush completes the receive WQE in progress and every queued one with
// IBV_WC_WR_FLUSH_ERR, or discards them when complete is false.
func (s *responder) flush(complete bool) {
	q := s.q
	if s.cur != nil {
		if complete {
			q.rcq.push(WC{WRID: s.cur.wr.WRID, Status: IBV_WC_WR_FLUSH_ERR, Opcode: IBV_WC_RECV, QPNum: q.QPN})
		}
		s.cur = nil
	}
	for _, w := range s.rq {
		if complete {
			q.rcq.push(WC{WRID: w.wr.WRID, Status: IBV_WC_WR_FLUSH_ERR, Opcode: IBV_WC_RECV, QPNum: q.QPN})
		}
	}
	s.rq = s.rq[:0]
}

// keepAcksOnly trims the output queue when the QP enters ERR other than
// by the responder's own NAK (a requester error, or the consumer's move
// to ERR): only ACKs and NAKs already queued still go out; READ responses
// and atomic ACKs do not. When the responder's NAK ends the QP, the
// answers queued before it, to requests executed before the one refused,
// go out first and then the NAK, in PSN order as a responder that
// answers each request before taking the next sends them (rxe's
// read_reply, which transmits a READ's response before rxe_resp takes
// the next packet): a NAK ahead of them would leave those valid READs
// and atomics unanswered at the requester.
func (s *responder) keepAcksOnly() {
	keep := s.out[:0]
	for _, it := range s.out {
		if it.op == bth.RCAcknowledge {
			keep = append(keep, it)
		}
	}
	clear(s.out[len(keep):])
	s.out = keep
	s.rdOut = 0
}
