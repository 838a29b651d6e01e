package rdmacm

import (
	"context"
	"errors"
	"net/netip"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/transport"
)

// Conn is one rdma_cm connection (an rdma_cm_id with its QP). Its methods
// are safe for concurrent use.
type Conn struct {
	s      *Service
	id     uint32
	qp     *transport.QP
	active bool
	peer   netip.Addr

	// Under s.mu.
	params       cm.QPParams
	privateData  []byte
	accepted     bool // passive: REP sent
	established  bool
	abandoned    bool // Dial or Accept gave up waiting
	finished     bool
	err          error
	disconnected bool
	qpDestroyed  bool
	applyErr     error         // active: why the REP's values did not apply
	ready        chan struct{} // closed when established or failed
	disc         chan struct{} // closed at EventDisconnected
}

func newConn(s *Service, id uint32, q *transport.QP, active bool, peer netip.Addr) *Conn {
	return &Conn{s: s, id: id, qp: q, active: active, peer: peer, ready: make(chan struct{}), disc: make(chan struct{})}
}

// awaitingRTU: a passive connection whose REP is out and whose RTU has not
// come (s.mu held).
func (c *Conn) awaitingRTU() bool {
	return !c.active && c.accepted && !c.finished && !c.qpDestroyed
}

func (c *Conn) finishLocked(err error) {
	if c.finished {
		return
	}
	c.finished = true
	c.err = err
	close(c.ready)
}

// wait blocks until the connection is established or failed; when ctx
// ends first the connection is abandoned: the peer gets a REJ (see
// cm.Manager.Abandon; Service.Drain waits until it is sent) and the QP is
// destroyed.
func (c *Conn) wait(ctx context.Context) error {
	select {
	case <-c.ready:
	case <-ctx.Done():
		s := c.s
		s.mu.Lock()
		if !c.finished {
			c.abandoned = true
			c.finishLocked(ctx.Err())
			// The peer is told, as by rdma_destroy_id: a REJ withdraws
			// our REQ (reason timeout) or our REP (consumer defined).
			if !s.closed {
				now := s.clock.Now()
				if s.mgr.Abandon(now, c.id) == nil {
					s.abandoned++
				}
				s.pumpLocked(now)
			}
			// Destroyed, not moved to ERR: its WQEs go without
			// completions (see dropAttemptLocked).
			s.dropAttemptLocked(c)
			s.mu.Unlock()
			return ctx.Err()
		}
		s.mu.Unlock()
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.err != nil {
		if !c.established {
			s.destroyQPLocked(c)
		}
		return c.err
	}
	return nil
}

// QP returns the connection's RC QP, in RTS once Dial or Accept returned.
func (c *Conn) QP() *transport.QP { return c.qp }

// ID returns the connection's local communication ID.
func (c *Conn) ID() uint32 { return c.id }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() netip.Addr { return c.peer }

// PrivateData returns the peer's private data: the REQ's after its IP CM
// header (passive side) or the REP's (active side).
func (c *Conn) PrivateData() []byte {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.privateData
}

// Params returns the values the connection negotiated (QPNs, PSNs, MTU,
// READ depths, retry counts).
func (c *Conn) Params() cm.QPParams {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.params
}

// Disconnected returns a channel closed when the connection is
// disconnected: the peer's DREQ came, or the DREP to ours, or our DREQ's
// retries ran out (RDMA_CM_EVENT_DISCONNECTED). The QP is then in ERR.
func (c *Conn) Disconnected() <-chan struct{} { return c.disc }

// Disconnect is rdma_disconnect: the QP goes to ERR (its outstanding work
// requests complete with IBV_WC_WR_FLUSH_ERR) and a DREQ goes to the peer;
// it waits for the DREP (or the DREQ's last retry) or ctx. Disconnecting a
// connection the peer already disconnected returns nil at once.
func (c *Conn) Disconnect(ctx context.Context) error {
	s := c.s
	s.mu.Lock()
	if c.disconnected {
		s.mu.Unlock()
		return nil
	}
	if s.closed || c.qpDestroyed {
		s.mu.Unlock()
		return ErrClosed
	}
	now := s.clock.Now()
	err := s.mgr.Disconnect(now, c.id, nil)
	s.toErrLocked(c)
	s.pumpLocked(now)
	s.mu.Unlock()
	if err != nil && !errors.Is(err, cm.ErrState) {
		return err
	}
	select {
	case <-c.disc:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close destroys the connection's QP (rdma_destroy_qp + rdma_destroy_id).
// A connection still up is disconnected first without waiting: the DREQ
// and its retries go on in the Service. Deregister the memory regions the
// QP used after Close.
func (c *Conn) Close() error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.qpDestroyed {
		return nil
	}
	if !c.disconnected && !s.closed {
		now := s.clock.Now()
		_ = s.mgr.Disconnect(now, c.id, nil)
		s.toErrLocked(c)
		s.pumpLocked(now)
	}
	s.destroyQPLocked(c)
	return nil
}
