package qp

import (
	"errors"
	"fmt"
)

// SRQInitAttr describes a shared receive queue at creation, as
// ibv_srq_init_attr's ibv_srq_attr.
type SRQInitAttr struct {
	MaxWR  int // receive WQEs the SRQ holds (1 or more)
	MaxSGE int // SGEs per receive WQE; 0 means 1
	// SRQLimit arms the limit event at creation, as rxe takes srq_limit
	// from the init attributes (0: not armed).
	SRQLimit int
}

// SRQAttrMask selects what SRQ.Modify changes, as ibv_srq_attr_mask.
type SRQAttrMask uint8

// SRQ attribute mask bits.
const (
	IBV_SRQ_MAX_WR SRQAttrMask = 1 << 0 // resize
	IBV_SRQ_LIMIT  SRQAttrMask = 1 << 1 // arm the limit event
)

// Errors of shared receive queues.
var (
	ErrSRQInUse = errors.New("qp: SRQ still has QPs attached")
)

// SRQ is a shared receive queue (IBTA 10.2.9.x, ibv_create_srq): receive
// WQEs that every QP created with it takes its messages into, in posting
// order, whichever QP the message arrives at. Its limit, once armed, makes
// the device report IBV_EVENT_SRQ_LIMIT_REACHED once, the first time a QP
// takes a WQE that leaves fewer than the limit queued; the limit is then
// disarmed (0) until SRQ.Modify arms it again (IBTA 11.2.3.x, rxe's
// get_srq_wqe). WQEs stay in the SRQ when a QP using it goes to ERR or is
// destroyed; the one a QP had begun is flushed to that QP's receive CQ.
// Like the rest of the package, an SRQ is not safe for concurrent use.
type SRQ struct {
	pd        *PD
	maxWR     int
	maxSGE    int
	limit     int
	wqes      []*recvWQE
	qps       int
	destroyed bool
}

// NewSRQ creates a shared receive queue on pd, as ibv_create_srq. MaxWR
// must be 1..16384 (rxe's RXE_MAX_SRQ_WR), MaxSGE 0..32 (rxe's
// RXE_MAX_SRQ_SGE), SRQLimit 0..MaxWR.
func (pd *PD) NewSRQ(attr SRQInitAttr) (*SRQ, error) {
	if pd.dev == nil {
		return nil, ErrNoDevice
	}
	if attr.MaxSGE == 0 {
		attr.MaxSGE = 1
	}
	switch {
	case attr.MaxWR < 1 || attr.MaxWR > MaxSRQWR:
		return nil, fmt.Errorf("%w: SRQ max_wr %d (1-%d)", ErrBadAttr, attr.MaxWR, MaxSRQWR)
	case attr.MaxSGE < 1 || attr.MaxSGE > MaxSRQSGE:
		return nil, fmt.Errorf("%w: SRQ max_sge %d (1-%d)", ErrBadAttr, attr.MaxSGE, MaxSRQSGE)
	case attr.SRQLimit < 0 || attr.SRQLimit > attr.MaxWR:
		return nil, fmt.Errorf("%w: SRQ limit %d (0-max_wr %d)", ErrBadAttr, attr.SRQLimit, attr.MaxWR)
	}
	return &SRQ{pd: pd, maxWR: attr.MaxWR, maxSGE: attr.MaxSGE, limit: attr.SRQLimit}, nil
}

// Limits of shared receive queues (rxe's).
const (
	MaxSRQWR  = 16384
	MaxSRQSGE = 32
)

// PD returns the SRQ's protection domain; its receive WQEs' SGEs name
// memory regions of this PD.
func (s *SRQ) PD() *PD { return s.pd }

// Query returns the SRQ's attributes, as ibv_query_srq: SRQLimit is 0
// when the limit is not armed.
func (s *SRQ) Query() SRQInitAttr {
	return SRQInitAttr{MaxWR: s.maxWR, MaxSGE: s.maxSGE, SRQLimit: s.limit}
}

// Modify changes the SRQ, as ibv_modify_srq: IBV_SRQ_LIMIT arms the limit
// event with attr.SRQLimit (0..max_wr; 0 disarms); IBV_SRQ_MAX_WR resizes
// to attr.MaxWR, which must hold the WQEs queued. On error nothing changes.
func (s *SRQ) Modify(attr SRQInitAttr, mask SRQAttrMask) error {
	if s.destroyed {
		return fmt.Errorf("%w: the SRQ is destroyed", ErrBadState)
	}
	maxWR := s.maxWR
	if mask&IBV_SRQ_MAX_WR != 0 {
		if attr.MaxWR < 1 || attr.MaxWR > MaxSRQWR || attr.MaxWR < len(s.wqes) {
			return fmt.Errorf("%w: SRQ max_wr %d (1-%d, and at least the %d queued)", ErrBadAttr, attr.MaxWR, MaxSRQWR, len(s.wqes))
		}
		maxWR = attr.MaxWR
	}
	if mask&IBV_SRQ_LIMIT != 0 && (attr.SRQLimit < 0 || attr.SRQLimit > maxWR) {
		return fmt.Errorf("%w: SRQ limit %d (0-max_wr %d)", ErrBadAttr, attr.SRQLimit, maxWR)
	}
	if mask&^(IBV_SRQ_MAX_WR|IBV_SRQ_LIMIT) != 0 {
		return fmt.Errorf("%w: SRQ attribute mask %#x", ErrBadAttr, uint8(mask))
	}
	s.maxWR = maxWR
	if mask&IBV_SRQ_LIMIT != 0 {
		s.limit = attr.SRQLimit
	}
	return nil
}

// PostRecv queues a receive work request, as ibv_post_srq_recv. It fails
// when the SRQ is full or destroyed, or the request has more SGEs than
// max_sge. SGEs must name memory of the SRQ's PD with LOCAL_WRITE access;
// one that does not fails the message it would receive with
// IBV_WC_LOC_PROT_ERR at the QP that takes it.
func (s *SRQ) PostRecv(wr RecvWR) error {
	if s.destroyed {
		return fmt.Errorf("%w: the SRQ is destroyed", ErrBadState)
	}
	if len(wr.SGEs) > s.maxSGE {
		return fmt.Errorf("%w: %d SGEs, the SRQ's max_sge is %d", ErrBadWR, len(wr.SGEs), s.maxSGE)
	}
	if len(s.wqes) >= s.maxWR {
		return ErrQueueFull
	}
	s.wqes = append(s.wqes, newRecvWQE(s.pd, wr, nil))
	return nil
}

// Queued returns the number of receive WQEs waiting in the SRQ.
func (s *SRQ) Queued() int { return len(s.wqes) }

// Destroy releases the SRQ, as ibv_destroy_srq: its WQEs are discarded. It
// fails with ErrSRQInUse while a QP created with it exists (EBUSY).
func (s *SRQ) Destroy() error {
	if s.qps > 0 {
		return fmt.Errorf("%w: %d QPs", ErrSRQInUse, s.qps)
	}
	s.destroyed = true
	s.wqes = nil
	return nil
}

// take removes the oldest WQE, or returns nil when there is none, and
// raises the limit event when the WQEs left drop below an armed limit.
func (s *SRQ) take() *recvWQE {
	if len(s.wqes) == 0 {
		return nil
	}
	w := s.wqes[0]
	s.wqes[0] = nil
	s.wqes = s.wqes[1:]
	if s.limit > 0 && len(s.wqes) < s.limit {
		s.limit = 0
		s.pd.dev.raise(AsyncEvent{Type: IBV_EVENT_SRQ_LIMIT_REACHED, SRQ: s})
	}
	return w
}

// giveBack returns a WQE a QP took but did not use to the head.
func (s *SRQ) giveBack(w *recvWQE) {
	s.wqes = append(s.wqes, nil)
	copy(s.wqes[1:], s.wqes)
	s.wqes[0] = w
}
