package qp

import (
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// service is what a QP does differently per transport service (IBTA 9.8
// "transport services", Table 41 for the operations each carries). The
// QP's requester, completer and responder hold the mechanics the services
// share (segmentation, placement, the receive queue, completions); a QP
// asks its service, at the points below, what its service type makes of
// an event. rcService implements Reliable Connected, ucService
// Unreliable Connected and udService Unreliable Datagram (unreliable.go).
type service interface {
	// name is the service's short name, "RC", "UC" or "UD", for errors.
	name() string
	// transitions lists, per state change, the attributes it requires
	// and allows (ib_modify_qp_is_ok's table for the QP type).
	transitions() map[[2]State]transition

	// Which opcodes are valid.

	// opcodes returns, indexed by opcode, the description of each inbound
	// opcode the service carries, and nil for an opcode of another
	// service class or one the service does not have (IBTA 9.2.1 Table
	// 38; C9-43: a packet of another class is dropped). A QP reads the
	// table once, at New, so that no packet pays for a call.
	opcodes() *[256]*bth.OpInfo
	// postable reports whether the service carries a send work request
	// of opcode op (ibv_post_send's EINVAL otherwise).
	postable(op WROpcode) bool

	// PSN checking.

	// outOfSequence is asked about a request whose PSN is not the one
	// the responder expects (IBTA 9.7.4.1.x for RC); a request in
	// sequence goes on without asking. It reports whether the responder
	// executes the request anyway; otherwise it has answered or dropped
	// it and counted it. RC never does: it NAKs the first request ahead
	// of a gap and answers duplicates. UC resynchronises on it.
	outOfSequence(r *responder, p *bth.Packet, info *bth.OpInfo) bool

	// Acknowledgement, NAKs and retransmission.

	// requestSent is told of each request packet the requester hands out,
	// last when it ends its message. RC asks for an ACK at message ends,
	// every AckReqInterval packets and on the packet that fills the
	// requester's window (InitAttr.MaxUnackedPSNs; rxe's 128 never comes
	// before its 64-packet interval), and arms the local ACK timer, so
	// that the completer retires the WQE when the ACK comes.
	requestSent(now time.Time, r *requester, out *bth.Packet, last bool)
	// ackRequested is told of each SEND or RDMA WRITE packet with AckReq
	// set that the responder placed in sequence: RC acknowledges it.
	ackRequested(r *responder, psn bth.PSN)
	// noReceiveWQE is told that a message needs a receive WQE and none is
	// posted: RC sends an RNR NAK (IBTA 9.7.5.2.8).
	noReceiveWQE(r *responder, psn bth.PSN)
	// reject ends a request the responder cannot execute (IBTA 9.7.5.2.x
	// class B-D errors): RC sends the NAK with syndrome s, completes the
	// receive WQE in progress with status and moves the QP to ERR.
	reject(r *responder, psn bth.PSN, s bth.Syndrome, status WCStatus)
}

// rcService is the Reliable Connected service (IBTA 9.7): every request
// is acknowledged, PSNs are checked strictly (one sequence NAK per gap,
// duplicates answered again), and the requester retransmits go-back-N.
type rcService struct{}

func (rcService) name() string { return "RC" }

// rcOpcodeTable are the RC opcodes (0x00-0x1F) bth knows.
var rcOpcodeTable = func() *[256]*bth.OpInfo {
	var t [256]*bth.OpInfo
	for op := range t {
		if bth.Opcode(op).Transport() == bth.TransportRC {
			t[op] = bth.Opcode(op).Info()
		}
	}
	return &t
}()

func (rcService) opcodes() *[256]*bth.OpInfo { return rcOpcodeTable }

func (rcService) transitions() map[[2]State]transition { return rcTransitions }

func (rcService) postable(op WROpcode) bool { return op <= IBV_WR_SEND_WITH_INV }

func (rcService) outOfSequence(r *responder, p *bth.Packet, info *bth.OpInfo) bool {
	if p.BTH.PSN.After(r.ePSN) {
		// Ahead of what we expect: one NAK, then silence until the
		// expected PSN arrives.
		r.q.Counters.OutOfSequence++
		if !r.nakSent {
			r.nakSent = true
			r.nak(r.ePSN, bth.SyndromePSNSeqErr)
		}
		return false
	}
	r.q.Counters.DuplicateRequest++
	r.duplicate(p, info)
	return false
}

func (rcService) requestSent(now time.Time, r *requester, out *bth.Packet, last bool) {
	r.noAck++
	if last || r.noAck >= AckReqInterval || int(out.BTH.PSN.Diff(r.q.comp.psn))+1 >= r.q.window {
		out.BTH.AckReq = true
		r.noAck = 0
	}
	if c := &r.q.comp; c.retransmitAt.IsZero() {
		c.armTimer(now)
	}
}

func (rcService) ackRequested(r *responder, psn bth.PSN) { r.ack(psn) }

func (rcService) noReceiveWQE(r *responder, psn bth.PSN) {
	r.q.Counters.SendRNRErr++
	r.queue(outItem{op: bth.RCAcknowledge, psn: psn, syndrome: bth.RNRNAKSyndrome(r.q.attr.MinRNRTimer), msn: r.msn})
}

func (rcService) reject(r *responder, psn bth.PSN, s bth.Syndrome, status WCStatus) {
	r.nak(psn, s)
	if c := r.cur; c != nil {
		r.q.rcq.push(WC{WRID: c.wr.WRID, Status: status, Opcode: IBV_WC_RECV, QPNum: r.q.QPN})
		r.cur = nil
	}
	r.q.toError(&QPError{Status: status, Responder: true, Syndrome: s, PSN: psn})
}
