package qp

import (
	"strconv"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// QPType is the transport service of a QP, as ibv_qp_type (the values
// are rdma-core's).
type QPType uint8

// QP types. The zero value of InitAttr.QPType means IBV_QPT_RC.
const (
	IBV_QPT_RC QPType = 2 // Reliable Connected (IBTA 9.7)
	IBV_QPT_UC QPType = 3 // Unreliable Connected (IBTA 9.8.1): SEND and RDMA WRITE, no ACKs
	IBV_QPT_UD QPType = 4 // Unreliable Datagram (IBTA 9.8.2): one-packet SENDs with a DETH
)

// String returns "RC", "UC" or "UD".
func (t QPType) String() string {
	switch t {
	case IBV_QPT_RC:
		return "RC"
	case IBV_QPT_UC:
		return "UC"
	case IBV_QPT_UD:
		return "UD"
	}
	return "QPType(" + strconv.Itoa(int(t)) + ")"
}

// opcodeTable returns, indexed by opcode, the opcodes of class t bth knows.
func opcodeTable(t bth.Transport) *[256]*bth.OpInfo {
	var tab [256]*bth.OpInfo
	for op := range tab {
		if bth.Opcode(op).Transport() == t {
			tab[op] = bth.Opcode(op).Info()
		}
	}
	return &tab
}

var (
	ucOpcodeTable = opcodeTable(bth.TransportUC)
	udOpcodeTable = opcodeTable(bth.TransportUD)
)

// ucTransitions and udTransitions are Linux's ib_modify_qp_is_ok table
// for IB_QPT_UC and IB_QPT_UD (IBTA 11.2.4.2 Table 91): UC has no retry,
// timeout, RNR or read/atomic attributes; UD has no address vector, path
// MTU, destination QPN or RQ PSN, and needs a Q_Key. As for RC, the port
// and P_Key index are optional.
var (
	ucTransitions = map[[2]State]transition{
		{IBV_QPS_RESET, IBV_QPS_INIT}: {IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX | IBV_QP_PORT},
		{IBV_QPS_INIT, IBV_QPS_INIT}:  {0, IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT},
		{IBV_QPS_INIT, IBV_QPS_RTR}: {IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
			IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
		{IBV_QPS_RTR, IBV_QPS_RTS}: {IBV_QP_SQ_PSN, IBV_QP_ACCESS_FLAGS},
		{IBV_QPS_RTS, IBV_QPS_RTS}: {0, IBV_QP_ACCESS_FLAGS},
		{IBV_QPS_RTS, IBV_QPS_SQD}: {0, 0},
		{IBV_QPS_SQD, IBV_QPS_RTS}: {0, IBV_QP_ACCESS_FLAGS},
		{IBV_QPS_SQD, IBV_QPS_SQD}: {0, IBV_QP_AV | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
		{IBV_QPS_SQE, IBV_QPS_RTS}: {0, IBV_QP_ACCESS_FLAGS},
	}
	udTransitions = map[[2]State]transition{
		{IBV_QPS_RESET, IBV_QPS_INIT}: {IBV_QP_QKEY, IBV_QP_PKEY_INDEX | IBV_QP_PORT},
		{IBV_QPS_INIT, IBV_QPS_INIT}:  {0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
		{IBV_QPS_INIT, IBV_QPS_RTR}:   {0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
		{IBV_QPS_RTR, IBV_QPS_RTS}:    {IBV_QP_SQ_PSN, IBV_QP_QKEY},
		{IBV_QPS_RTS, IBV_QPS_RTS}:    {0, IBV_QP_QKEY},
		{IBV_QPS_RTS, IBV_QPS_SQD}:    {0, 0},
		{IBV_QPS_SQD, IBV_QPS_RTS}:    {0, IBV_QP_QKEY},
		{IBV_QPS_SQD, IBV_QPS_SQD}:    {0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
		{IBV_QPS_SQE, IBV_QPS_RTS}:    {0, IBV_QP_QKEY},
	}
)

// ucService is the Unreliable Connected service (IBTA 9.8.1, rxe's
// IB_QPT_UC paths): SEND and RDMA WRITE, with or without immediate, and
// nothing else. Nothing is acknowledged or retransmitted: a send WQE
// completes when its last packet leaves. The responder checks PSNs; on a
// gap, or on a request it cannot execute, it abandons the message in
// progress (its receive WQE goes back to the queue for the next message)
// and drops every packet up to the next First or Only, where it
// resynchronises on whatever PSN that packet carries (rxe's check_psn and
// drop_msg). A message with no receive WQE posted is dropped.
type ucService struct{}

func (ucService) name() string                         { return "UC" }
func (ucService) transitions() map[[2]State]transition { return ucTransitions }
func (ucService) opcodes() *[256]*bth.OpInfo           { return ucOpcodeTable }

func (ucService) postable(op WROpcode) bool {
	switch op {
	case IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM:
		return true
	}
	return false
}

func (ucService) outOfSequence(r *responder, p *bth.Packet, info *bth.OpInfo) bool {
	r.abandon()
	if info.Starts() {
		return true // a new message: resynchronise on its PSN
	}
	r.q.Counters.OutOfSequence++
	r.dropMsg = true
	return false
}

func (ucService) requestSent(now time.Time, r *requester, out *bth.Packet, last bool) {
	if last {
		r.q.comp.complete(r.sq[0])
	}
}

func (ucService) ackRequested(r *responder, psn bth.PSN) {}

func (ucService) noReceiveWQE(r *responder, psn bth.PSN) {
	r.q.Counters.OutOfBuffer++
	r.dropMsg = true
}

func (ucService) reject(r *responder, psn bth.PSN, s bth.Syndrome, status WCStatus) {
	if status == IBV_WC_LOC_PROT_ERR {
		// The receive WQE itself is bad: a local error, fatal to the QP
		// whatever the service (rxe's class A), but with no NAK to send.
		if c := r.cur; c != nil {
			r.q.rcq.push(WC{WRID: c.wr.WRID, Status: status, Opcode: IBV_WC_RECV, QPNum: r.q.QPN})
			r.cur = nil
		}
		r.q.toError(&QPError{Status: status, Responder: true, PSN: psn})
		return
	}
	r.q.Counters.DroppedMsgPkts++
	r.abandon()
	r.dropMsg = true
}

// udService is the Unreliable Datagram service (IBTA 9.8.2, rxe's
// IB_QPT_UD and IB_QPT_GSI): SEND Only, with or without immediate, each
// message one packet of at most the MTU, addressed per work request (an
// address vector, the remote QPN and Q_Key) and carrying a DETH with the
// Q_Key and the source QPN. PSNs increase on send and are not checked on
// receive. Receive completions carry the 40-byte GRH slot (see RecvInfo).
type udService struct{ ucService }

func (udService) name() string                         { return "UD" }
func (udService) transitions() map[[2]State]transition { return udTransitions }
func (udService) opcodes() *[256]*bth.OpInfo           { return udOpcodeTable }

func (udService) postable(op WROpcode) bool { return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM }

func (udService) outOfSequence(r *responder, p *bth.Packet, info *bth.OpInfo) bool { return true }

// requestSent completes the WQE, as UC. QP1's SENDs (the CM's MADs) carry
// AckReq set, as rxe sends them (the rxe rdma_cm capture: every MAD to
// QP1 has A=1; rxe's UD data packets do not); UD has no ACK, so a
// receiver ignores the bit.
func (udService) requestSent(now time.Time, r *requester, out *bth.Packet, last bool) {
	if r.q.QPN == 1 {
		out.BTH.AckReq = true
	}
	ucService{}.requestSent(now, r, out, last)
}

// abandon ends the message in progress without completing it (UC and UD):
// its receive WQE, if it took one, goes back to the head of its queue to
// receive the next message.
func (s *responder) abandon() {
	s.inMsg = bth.OpUnknown
	s.wbuf = nil
	if w := s.cur; w != nil {
		s.cur = nil
		if srq := s.q.srq; srq != nil {
			srq.giveBack(w)
		} else {
			s.rq = append(s.rq, nil)
			copy(s.rq[1:], s.rq)
			s.rq[0] = w
		}
	}
}
