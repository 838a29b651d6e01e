package transport

import "github.com/roce-emu/roce-emu/qp"

// SRQ is a shared receive queue of an Endpoint (see qp.SRQ): QPs created
// with InitAttr.SRQ set to its SRQ() take their receive WQEs from it.
type SRQ struct {
	ep  *Endpoint
	srq *qp.SRQ
}

// NewSRQ creates a shared receive queue in pd (ibv_create_srq).
func (pd *PD) NewSRQ(attr qp.SRQInitAttr) (*SRQ, error) {
	pd.ep.mu.Lock()
	defer pd.ep.mu.Unlock()
	s, err := pd.pd.NewSRQ(attr)
	if err != nil {
		return nil, err
	}
	return &SRQ{ep: pd.ep, srq: s}, nil
}

// SRQ returns the queue to name in qp.InitAttr.SRQ.
func (s *SRQ) SRQ() *qp.SRQ { return s.srq }

// PostRecv posts a receive work request to the SRQ (ibv_post_srq_recv).
func (s *SRQ) PostRecv(wr qp.RecvWR) error {
	s.ep.mu.Lock()
	defer s.ep.mu.Unlock()
	return s.srq.PostRecv(wr)
}

// Modify changes the SRQ's limit or size (ibv_modify_srq).
func (s *SRQ) Modify(attr qp.SRQInitAttr, mask qp.SRQAttrMask) error {
	s.ep.mu.Lock()
	defer s.ep.mu.Unlock()
	return s.srq.Modify(attr, mask)
}

// Queued returns the receive WQEs the SRQ holds.
func (s *SRQ) Queued() int {
	s.ep.mu.Lock()
	defer s.ep.mu.Unlock()
	return s.srq.Queued()
}

// Destroy destroys the SRQ; it fails while QPs use it.
func (s *SRQ) Destroy() error {
	s.ep.mu.Lock()
	defer s.ep.mu.Unlock()
	return s.srq.Destroy()
}

// PollEvents moves up to len(out) of the device's unread asynchronous
// events (IBV_EVENT_SRQ_LIMIT_REACHED) into out and returns how many, as
// ibv_get_async_event without the wait.
func (ep *Endpoint) PollEvents(out []qp.AsyncEvent) int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.dev.PollEvents(out)
}
