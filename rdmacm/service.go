package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// Defaults of Config fields left zero.
const (
	DefaultRecvWRs     = 64
	DefaultSendWRs     = 64
	DefaultBacklog     = 16
	DefaultCommEstPoll = time.Millisecond
)

// Config configures a Service. Zero fields take the defaults named.
type Config struct {
	// CM configures the communication manager (timeouts, retries,
	// bounds; see cm.Config).
	CM cm.Config
	// LocalAddr is this side's address in the REQs and QPs (its GID);
	// the zero Addr means the Endpoint's, which must then be a unicast
	// address.
	LocalAddr netip.Addr
	// UDPPort is the UDP port peers receive RoCEv2 on; 0 means 4791.
	UDPPort uint16
	// RecvWRs and SendWRs are QP1's receive WQEs kept posted and MADs in
	// flight at once: 0 means DefaultRecvWRs and DefaultSendWRs. A MAD
	// waits in the Manager's queue (bounded by CM.QueueLen) while all
	// send WQEs are out.
	RecvWRs, SendWRs int
	// Backlog is how many connect requests a Listener holds for Accept
	// (rdma_listen's backlog); a REQ beyond it is rejected with reason
	// no resources. 0 means DefaultBacklog.
	Backlog int
	// CommEstPoll is how often an accepted connection waiting for its
	// RTU looks for traffic from the peer (see the package doc); 0 means
	// DefaultCommEstPoll.
	CommEstPoll time.Duration
	// Clock is what the Manager's timers run on: nil means
	// transport.SystemClock (which testing/synctest fakes).
	Clock transport.Clock
}

// Errors. Test with errors.Is.
var (
	// ErrClosed: the Service, Listener or Conn is closed.
	ErrClosed = errors.New("rdmacm: closed")
	// ErrUnreachable: the peer never answered the REQ (or the RTU never
	// came for our REP) through all retries (RDMA_CM_EVENT_UNREACHABLE).
	ErrUnreachable = errors.New("rdmacm: peer unreachable: no answer after all CM retries")
	// ErrRejected: the peer answered with a REJ; the error is a
	// *RejectError carrying the reason.
	ErrRejected = errors.New("rdmacm: connection rejected")
	// ErrPeerDisconnected: the peer sent a DREQ for a connection Accept
	// had answered with a REP before its RTU came (a DREP went back);
	// Accept goes on to the next request.
	ErrPeerDisconnected = errors.New("rdmacm: the peer disconnected before the connection was established (a DREQ before the RTU)")
	// ErrConnectError: the peer's REP came with values the QP did not
	// take; the peer got a REJ (consumer defined) instead of the RTU
	// (RDMA_CM_EVENT_CONNECT_ERROR).
	ErrConnectError = errors.New("rdmacm: connect error")
)

// RejectError is a REJ received for a connection (RDMA_CM_EVENT_REJECTED).
type RejectError struct {
	Reason      cm.RejectReason
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("rdmacm: connection rejected by the peer: %v", e.Reason)
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *RejectError) Unwrap() error { return ErrRejected }

// Stats are a Service's counts.
type Stats struct {
	CM          cm.Counters
	Connections int    // connections the Manager holds, TIMEWAIT included
	QPs         int    // RC QPs the Service created and has not destroyed
	SendErrors  uint64 // MADs QP1 refused to send (dropped)
	RecvErrors  uint64 // QP1 receive completions in error
	// AcceptFailures counts connect requests Accept went past: the QP did
	// not take the REQ's values (a REJ went out), or the peer rejected or
	// never answered the REP.
	AcceptFailures uint64
	// Abandoned counts connection attempts whose Dial or Accept context
	// ended before the connection was established: each was withdrawn
	// with a REJ to the peer (reason timeout for a REQ, consumer defined
	// for a REP), as rdma_destroy_id does.
	Abandoned uint64
	// QP1 are the GSI QP's counters: QKeyViolations counts datagrams
	// to QP1 whose Q_Key is not 0x80010000 (dropped before the Manager).
	QP1 qp.Counters
}

// Service runs rdma_cm on one Endpoint's QP1. Its methods are safe for
// concurrent use.
type Service struct {
	ep      *transport.Endpoint
	cfg     Config
	clock   transport.Clock
	local   netip.Addr
	udpPort uint16

	mu        sync.Mutex
	mgr       *cm.Manager
	pd        *transport.PD
	cq        *transport.CQ
	qp1       *transport.QP
	mr        *qp.MR
	buf       []byte
	freeSend  []int
	listeners map[uint64]*Listener
	conns     map[uint32]*Conn
	timer     transport.Timer
	qps       int
	sendErrs  uint64
	recvErrs  uint64
	// acceptFailures: requests Accept gave up on and went past
	acceptFailures uint64
	abandoned      uint64
	// sent is signalled when QP1's send completions come (Drain)
	sent   chan struct{}
	closed bool
	cancel context.CancelFunc
	done   chan struct{}
}

const sendWRIDFlag = 1 << 32

// New starts rdma_cm on ep: it creates QP1 (the GSI QP), posts its
// receive WQEs and starts reading its completions. Errors: a local address
// that is not unicast, QP1 already existing on ep, or the QP's.
func New(ep *transport.Endpoint, cfg Config) (*Service, error) {
	s := &Service{ep: ep, cfg: cfg, clock: cfg.Clock, local: cfg.LocalAddr, udpPort: cfg.UDPPort,
		listeners: map[uint64]*Listener{}, conns: map[uint32]*Conn{}, done: make(chan struct{}),
		sent: make(chan struct{}, 1)}
	if s.clock == nil {
		s.clock = transport.SystemClock
	}
	if !s.local.IsValid() {
		s.local = ep.LocalAddr().Addr()
	}
	if u := s.local.Unmap(); !u.IsValid() || u.IsUnspecified() || u.IsMulticast() {
		return nil, fmt.Errorf("rdmacm: local address %s: give this host's unicast address (Config.LocalAddr)", s.local)
	}
	if s.udpPort == 0 {
		s.udpPort = bth.UDPPort
	}
	if s.cfg.RecvWRs <= 0 {
		s.cfg.RecvWRs = DefaultRecvWRs
	}
	if s.cfg.SendWRs <= 0 {
		s.cfg.SendWRs = DefaultSendWRs
	}
	if s.cfg.Backlog <= 0 {
		s.cfg.Backlog = DefaultBacklog
	}
	if s.cfg.CommEstPoll <= 0 {
		s.cfg.CommEstPoll = DefaultCommEstPoll
	}
	if len(s.cfg.CM.LocalGIDs) == 0 {
		// REQs for another address are rejected (invalid GID) before any
		// QP is made for them.
		s.cfg.CM.LocalGIDs = []netip.Addr{s.local.Unmap().WithZone("")}
	}
	if s.cfg.CM.CAGUID == 0 {
		// A GUID of our own, derived from the address as rxe derives it
		// from the MAC: peers tell CMs apart by it.
		var mac [6]byte
		a := s.local.Unmap().As16()
		copy(mac[:], a[10:])
		mac[0] = 0x02
		s.cfg.CM.CAGUID = cm.GUIDFromMAC(mac)
	}
	s.mgr = cm.NewManager(s.cfg.CM)
	s.pd = ep.NewPD()
	s.cq = ep.NewCQ(s.cfg.RecvWRs + s.cfg.SendWRs)
	q, err := ep.NewQP(s.pd, s.cq, s.cq, qp.InitAttr{QPType: qp.IBV_QPT_UD, QPN: 1,
		MaxSendWR: s.cfg.SendWRs, MaxRecvWR: s.cfg.RecvWRs, SQSigAll: true})
	if err != nil {
		return nil, fmt.Errorf("rdmacm: QP1: %w", err)
	}
	s.qp1 = q
	fail := func(err error) (*Service, error) {
		q.Destroy()
		return nil, fmt.Errorf("rdmacm: QP1: %w", err)
	}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, QKey: bth.GSIQKey}, qp.IBV_QP_STATE|qp.IBV_QP_QKEY|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT); err != nil {
		return fail(err)
	}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR}, qp.IBV_QP_STATE); err != nil {
		return fail(err)
	}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS}, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN); err != nil {
		return fail(err)
	}
	s.buf = make([]byte, s.cfg.RecvWRs*(qp.GRHLen+cm.MADLen)+s.cfg.SendWRs*cm.MADLen)
	s.mr, err = s.pd.RegMR(s.buf, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return fail(err)
	}
	for i := range s.cfg.RecvWRs {
		if err := s.postRecv(i); err != nil {
			return fail(err)
		}
	}
	for j := s.cfg.SendWRs - 1; j >= 0; j-- {
		s.freeSend = append(s.freeSend, j)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.run(ctx)
	return s, nil
}

func (s *Service) recvOff(i int) int { return i * (qp.GRHLen + cm.MADLen) }
func (s *Service) sendOff(j int) int {
	return s.cfg.RecvWRs*(qp.GRHLen+cm.MADLen) + j*cm.MADLen
}

func (s *Service) postRecv(i int) error {
	return s.qp1.PostRecv(qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{s.mr.SGE(s.recvOff(i), qp.GRHLen+cm.MADLen)}})
}

// LocalAddr returns the address the Service connects from.
func (s *Service) LocalAddr() netip.Addr { return s.local }

// Stats returns a copy of the Service's counts.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{CM: s.mgr.Counters(), Connections: s.mgr.Len(), QPs: s.qps, SendErrors: s.sendErrs, RecvErrors: s.recvErrs,
		AcceptFailures: s.acceptFailures, Abandoned: s.abandoned, QP1: s.qp1.Counters()}
}

// run reads QP1's completions until ctx ends.
func (s *Service) run(ctx context.Context) {
	defer close(s.done)
	wcs := make([]qp.WC, 16)
	for {
		n, err := s.cq.Wait(ctx, wcs)
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		now := s.clock.Now()
		for _, wc := range wcs[:n] {
			if wc.WRID&sendWRIDFlag != 0 {
				s.freeSend = append(s.freeSend, int(wc.WRID&^sendWRIDFlag))
				if wc.Status != qp.IBV_WC_SUCCESS {
					s.sendErrs++
				}
				select {
				case s.sent <- struct{}{}:
				default:
				}
				continue
			}
			i := int(wc.WRID)
			if wc.Status == qp.IBV_WC_SUCCESS && wc.ByteLen >= qp.GRHLen {
				off := s.recvOff(i)
				// A MAD the Manager cannot use is dropped and counted
				// there (Counters.Drop*).
				_ = s.mgr.HandleMAD(now, wc.SrcAddr.Addr(), s.buf[off+qp.GRHLen:off+int(wc.ByteLen)])
			} else {
				s.recvErrs++
			}
			if err := s.postRecv(i); err != nil {
				s.recvErrs++
			}
		}
		s.pumpLocked(now)
		s.mu.Unlock()
	}
}

// pumpLocked sends the MADs the Manager queued, handles its events and
// re-arms the timer (s.mu held).
func (s *Service) pumpLocked(now time.Time) {
	for {
		progress := false
		for len(s.freeSend) > 0 {
			out, ok := s.mgr.PollMAD()
			if !ok {
				break
			}
			progress = true
			j := s.freeSend[len(s.freeSend)-1]
			s.freeSend = s.freeSend[:len(s.freeSend)-1]
			off := s.sendOff(j)
			copy(s.buf[off:off+cm.MADLen], out.MAD[:])
			err := s.qp1.PostSend(qp.SendWR{WRID: sendWRIDFlag | uint64(j), Opcode: qp.IBV_WR_SEND,
				SGEs: []qp.SGE{s.mr.SGE(off, cm.MADLen)},
				AH:   &qp.AddressVector{Remote: netip.AddrPortFrom(out.To, s.udpPort)}, RemoteQPN: 1, RemoteQKey: bth.GSIQKey})
			if err != nil {
				s.sendErrs++
				s.freeSend = append(s.freeSend, j)
			}
		}
		for {
			ev, ok := s.mgr.PollEvent()
			if !ok {
				break
			}
			progress = true
			s.handleEventLocked(now, ev)
		}
		if !progress {
			break
		}
	}
	s.armLocked(now)
}

// armLocked sets the timer to the Manager's deadline, or sooner when an
// accepted connection waits for its RTU.
func (s *Service) armLocked(now time.Time) {
	if s.closed {
		return
	}
	next := s.mgr.Deadline()
	for _, c := range s.conns {
		if c.awaitingRTU() {
			if t := now.Add(s.cfg.CommEstPoll); next.IsZero() || t.Before(next) {
				next = t
			}
			break
		}
	}
	if next.IsZero() {
		if s.timer != nil {
			s.timer.Stop()
		}
		return
	}
	d := max(next.Sub(now), 0)
	if s.timer == nil {
		s.timer = s.clock.AfterFunc(d, s.onTimer)
	} else {
		s.timer.Reset(d)
	}
}

func (s *Service) onTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	now := s.clock.Now()
	if dl := s.mgr.Deadline(); !dl.IsZero() && !now.Before(dl) {
		s.mgr.HandleTimeout(now)
	}
	for id, c := range s.conns {
		if c.awaitingRTU() && c.qp.Counters().ReceivedPackets > 0 {
			s.mgr.CommEstablished(now, id)
		}
	}
	s.pumpLocked(now)
}

func (s *Service) handleEventLocked(now time.Time, ev cm.Event) {
	switch ev.Type {
	case cm.EventConnectRequest:
		l := s.listeners[ev.ServiceID]
		if l == nil || l.closed || len(l.reqs) >= s.cfg.Backlog {
			_ = s.mgr.Reject(now, ev.ID, cm.RejNoResources, nil)
			return
		}
		l.reqs = append(l.reqs, ev)
		select {
		case l.notify <- struct{}{}:
		default:
		}
		return
	}
	c := s.conns[ev.ID]
	if c == nil {
		// A connect request that failed before Accept took it.
		for _, l := range s.listeners {
			for i, r := range l.reqs {
				if r.ID == ev.ID {
					l.reqs = append(l.reqs[:i], l.reqs[i+1:]...)
					return
				}
			}
		}
		return
	}
	switch ev.Type {
	case cm.EventEstablished:
		if c.active && !c.qpDestroyed {
			// The QP is in RTS: the Manager's Apply moved it.
			c.params = ev.Params
			c.privateData = append([]byte(nil), ev.PrivateData...)
		}
		if c.abandoned {
			_ = s.mgr.Disconnect(now, c.id, nil)
			s.toErrLocked(c)
		}
		c.established = true
		c.finishLocked(nil)
	case cm.EventRejected:
		c.finishLocked(&RejectError{Reason: ev.Reason, PrivateData: append([]byte(nil), ev.PrivateData...)})
		s.dropAttemptLocked(c)
	case cm.EventUnreachable:
		c.finishLocked(ErrUnreachable)
		s.dropAttemptLocked(c)
	case cm.EventConnectError:
		err := c.applyErr
		if err == nil {
			err = ErrClosed
		}
		c.finishLocked(fmt.Errorf("%w: the REP's values do not suit the QP (a REJ went to the peer): %w", ErrConnectError, err))
		s.dropAttemptLocked(c)
	case cm.EventDisconnected:
		if !c.finished {
			// A DREQ before the RTU: the attempt failed, the Service
			// did not close (Accept takes the next request).
			c.finishLocked(ErrPeerDisconnected)
			if !c.disconnected {
				c.disconnected = true
				close(c.disc)
			}
			s.destroyQPLocked(c)
			return
		}
		// Disconnected first: whoever sees a flushed completion of the
		// QP's move to ERR finds the channel closed.
		if !c.disconnected {
			c.disconnected = true
			close(c.disc)
		}
		s.toErrLocked(c)
	case cm.EventTimeWaitExit:
		delete(s.conns, c.id)
	}
}

// applyLocked moves q from INIT to RTS with the negotiated values; the
// peer's RoCEv2 UDP port is the Service's, and ackTimeout, when not 0,
// the local ACK timeout (ConnParams.ACKTimeout).
func (s *Service) applyLocked(q *transport.QP, p *cm.QPParams, ackTimeout uint8) error {
	a, m := p.RTRAttr()
	a.AV.Remote = netip.AddrPortFrom(a.AV.Remote.Addr(), s.udpPort)
	if err := q.Modify(&a, m); err != nil {
		return err
	}
	a, m = p.RTSAttr()
	if ackTimeout != 0 && m&qp.IBV_QP_TIMEOUT != 0 {
		a.Timeout = ackTimeout
	}
	return q.Modify(&a, m)
}

// dropAttemptLocked ends a connection attempt that failed before Dial or
// Accept handed its QP out: the QP is destroyed, not moved to ERR, so its
// posted WQEs go without completions (ibv_destroy_qp) and nothing of the
// failed attempt reaches the CQs the caller shares with its next
// connection (s.mu held).
func (s *Service) dropAttemptLocked(c *Conn) {
	s.destroyQPLocked(c)
	delete(s.conns, c.id)
}

func (s *Service) toErrLocked(c *Conn) {
	if !c.qpDestroyed && c.qp.State() != qp.IBV_QPS_ERR {
		_ = c.qp.Modify(&qp.Attr{State: qp.IBV_QPS_ERR}, qp.IBV_QP_STATE)
	}
}

func (s *Service) destroyQPLocked(c *Conn) {
	if !c.qpDestroyed {
		c.qpDestroyed = true
		c.qp.Destroy()
		s.qps--
	}
}

// Drain waits until QP1 has sent every MAD the Manager queued (each send
// WQE completed), so that a REJ or DREQ just queued leaves before Close;
// a program that gives up a connection attempt calls it, bounded by ctx,
// before it exits. Errors: ctx's (MADs still unsent), ErrClosed.
func (s *Service) Drain(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		s.pumpLocked(s.clock.Now())
		// pumpLocked stops with free send WQEs only when the Manager's
		// queue is empty: all free means nothing is queued or in flight.
		idle := len(s.freeSend) == s.cfg.SendWRs
		s.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-s.sent:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close stops the Service: listeners close, connections' QPs go to ERR and
// are destroyed (their peers are not told: a DREQ may still be unsent),
// QP1 is destroyed and the goroutine ends before Close returns. The
// Endpoint stays open.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	for _, l := range s.listeners {
		l.closeLocked()
	}
	for _, c := range s.conns {
		c.finishLocked(ErrClosed)
		s.destroyQPLocked(c)
	}
	s.cancel()
	s.mu.Unlock()
	<-s.done
	s.qp1.Destroy()
	return s.pd.DeregMR(s.mr)
}

// ConnParams describe the RC QP of a connection and what this side offers
// (rdma_create_qp's ibv_qp_init_attr and rdma_conn_param).
type ConnParams struct {
	PD             *transport.PD
	SendCQ, RecvCQ *transport.CQ
	// MaxSendWR, MaxRecvWR and SQSigAll are ibv_qp_init_attr's (0 means
	// 256 WQEs).
	MaxSendWR, MaxRecvWR int
	SQSigAll             bool
	SRQ                  *transport.SRQ
	// Access is what the peer may do to this side's memory; 0 means
	// local write, remote read and remote write (as rdma_cm sets up a
	// QP: IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE for RC).
	Access qp.Access
	// ResponderResources and InitiatorDepth are rdma_conn_param's: READs
	// this side accepts as responder and issues at once (lowered to the
	// peer's on the passive side).
	ResponderResources, InitiatorDepth uint8
	// ACKTimeout is rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT): the QP's
	// local ACK timeout exponent (4.096 us * 2^ACKTimeout, 1-31) instead
	// of the one rdma_cm derives from the path's packet lifetime
	// (PacketLifeTime+1 and the peer's ACK delay, IBTA 12.7.34; about 2 s
	// with rdma_cm's default lifetime); 0 keeps the path's. Linux applies
	// it to this side's QP only (rdma_init_qp_attr), as here.
	ACKTimeout uint8
	// RetryCount and RNRRetryCount are rdma_conn_param's (0-7): on Dial,
	// the transport retries of both sides and the RNR retries the peer
	// makes; on Accept, the RNR retries the active side makes.
	RetryCount, RNRRetryCount uint8
	// PathMTU is the path MTU a Dial asks for; 0 means IBV_MTU_1024.
	PathMTU qp.MTU
	// CC, NP and RPOnly are the congestion control of the QP, as
	// qp.InitAttr's fields of those names (DCQCN's reaction and
	// notification points).
	CC, NP *cc.Params
	RPOnly bool
	// PrivateData goes in the REQ (at most 56 bytes after the IP CM
	// header) or the REP (at most 196).
	PrivateData []byte
	// RecvWRs are posted on the QP in INIT, before the REQ or REP leaves,
	// as rping posts its receive between rdma_create_qp and
	// rdma_connect or rdma_accept: the peer's first SEND finds them.
	RecvWRs []qp.RecvWR
}

func (s *Service) newQPLocked(p *ConnParams) (*transport.QP, error) {
	if p.PD == nil || p.SendCQ == nil || p.RecvCQ == nil {
		return nil, errors.New("rdmacm: ConnParams need a PD, a send CQ and a receive CQ")
	}
	init := qp.InitAttr{QPType: qp.IBV_QPT_RC, MaxSendWR: p.MaxSendWR, MaxRecvWR: p.MaxRecvWR, SQSigAll: p.SQSigAll,
		CC: p.CC, NP: p.NP, RPOnly: p.RPOnly}
	if p.SRQ != nil {
		init.SRQ = p.SRQ.SRQ()
	}
	q, err := s.ep.NewQP(p.PD, p.SendCQ, p.RecvCQ, init)
	if err != nil {
		return nil, err
	}
	access := p.Access
	if access == 0 {
		access = qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_READ | qp.IBV_ACCESS_REMOTE_WRITE
	}
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT); err != nil {
		q.Destroy()
		return nil, err
	}
	for _, wr := range p.RecvWRs {
		if err := q.PostRecv(wr); err != nil {
			q.Destroy()
			return nil, err
		}
	}
	s.qps++
	return q, nil
}

// Dial connects to the rdma_cm TCP port port at addr (rdma_resolve_addr,
// rdma_resolve_route, rdma_create_qp and rdma_connect): it returns once the
// REP came, the QP is in RTS and the RTU is on its way. Errors: a
// *RejectError (errors.Is ErrRejected) when the peer refused, at once when
// nobody listens on the port (reason invalid service ID); ErrUnreachable
// when the peer never answered; ctx's error; the QP's or the Manager's.
func (s *Service) Dial(ctx context.Context, addr netip.Addr, port uint16, p ConnParams) (*Conn, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	q, err := s.newQPLocked(&p)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("rdmacm: dial %s port %d: %w", addr, port, err)
	}
	now := s.clock.Now()
	var c *Conn
	// The QP goes to RTS when the REP comes, before the RTU is queued: a
	// REP whose values the QP does not take gets the peer a REJ, not an
	// RTU (cma_rep_recv).
	apply := func(pp *cm.QPParams) error {
		if c == nil || c.abandoned || c.qpDestroyed {
			return ErrClosed
		}
		err := s.applyLocked(c.qp, pp, p.ACKTimeout)
		if err != nil {
			c.applyErr = err
		}
		return err
	}
	id, err := s.mgr.Dial(now, cm.DialParams{Local: s.local, Remote: addr, ServiceID: cm.ServiceID(cm.PortSpaceTCP, port),
		SrcPort: uint16(32768 + rand.IntN(28232)), QPN: q.QPN(), PathMTU: p.PathMTU,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RetryCount: p.RetryCount, RNRRetryCount: p.RNRRetryCount, SRQ: p.SRQ != nil, PrivateData: p.PrivateData,
		Apply: apply})
	if err != nil {
		q.Destroy()
		s.qps--
		s.mu.Unlock()
		return nil, fmt.Errorf("rdmacm: dial %s port %d: %w", addr, port, err)
	}
	c = newConn(s, id, q, true, addr)
	s.conns[id] = c
	s.pumpLocked(now)
	s.mu.Unlock()
	if err := c.wait(ctx); err != nil {
		return nil, fmt.Errorf("rdmacm: dial %s port %d: %w", addr, port, err)
	}
	return c, nil
}

// Listener takes connect requests for one rdma_cm TCP port.
type Listener struct {
	s      *Service
	port   uint16
	sid    uint64
	reqs   []cm.Event
	notify chan struct{}
	closed bool
}

// Listen makes the Service accept REQs for the rdma_cm TCP port port
// (rdma_bind_addr + rdma_listen). Errors: the port already has a listener;
// ErrClosed.
func (s *Service) Listen(port uint16) (*Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	sid := cm.ServiceID(cm.PortSpaceTCP, port)
	if err := s.mgr.Listen(sid); err != nil {
		return nil, fmt.Errorf("rdmacm: listen on port %d: %w", port, err)
	}
	l := &Listener{s: s, port: port, sid: sid, notify: make(chan struct{}, 1)}
	s.listeners[sid] = l
	return l, nil
}

// Port returns the port listened on.
func (l *Listener) Port() uint16 { return l.port }

// Accept waits for a connect request, creates its QP with p, moves the QP
// to RTS with the negotiated values, answers with a REP and waits until
// the connection is established (the RTU came, or the peer's traffic
// did): rdma_get_request, rdma_create_qp and rdma_accept. The Conn's
// PrivateData is the REQ's (after the IP CM header).
//
// One bad request does not end Accept: a REQ that fails the CM's checks
// never reaches it (see cm.Manager: a REJ went out), a request whose
// values the QP does not take is rejected (consumer defined, as
// rdma_accept) and one whose REP the peer rejects or never answers, or
// whose peer sends a DREQ before the RTU (ErrPeerDisconnected), is
// dropped; each is counted (Stats.AcceptFailures) and Accept waits for
// the next. The QP of a request that failed is destroyed without
// completions (see the package doc): p's CQs hold nothing of it. Errors:
// ErrClosed, ctx's, the QP's creation, and p's values (too much private
// data) after rejecting the request.
func (l *Listener) Accept(ctx context.Context, p ConnParams) (*Conn, error) {
	s := l.s
	for {
		s.mu.Lock()
		if l.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if len(l.reqs) == 0 {
			s.mu.Unlock()
			select {
			case <-l.notify:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ev := l.reqs[0]
		l.reqs = l.reqs[1:]
		if len(l.reqs) > 0 {
			select {
			case l.notify <- struct{}{}:
			default:
			}
		}
		if st := s.mgr.State(ev.ID); st != cm.StateREQRcvd && st != cm.StateMRAREQSent {
			s.mu.Unlock()
			continue // the peer gave up meanwhile
		}
		now := s.clock.Now()
		q, err := s.newQPLocked(&p)
		if err != nil {
			_ = s.mgr.Reject(now, ev.ID, cm.RejNoQP, nil)
			s.pumpLocked(now)
			s.mu.Unlock()
			return nil, fmt.Errorf("rdmacm: accept: %w", err)
		}
		c := newConn(s, ev.ID, q, false, ev.Peer)
		c.privateData = append([]byte(nil), ev.PrivateData...)
		// The QP goes to RTS before the REP is queued: a QP that cannot
		// take the REQ's values gets the peer a REJ, never a REP.
		var applyErr error
		params, err := s.mgr.Accept(now, ev.ID, cm.AcceptParams{QPN: q.QPN(), ResponderResources: p.ResponderResources,
			InitiatorDepth: p.InitiatorDepth, RNRRetryCount: p.RNRRetryCount, SRQ: p.SRQ != nil, PrivateData: p.PrivateData,
			Apply: func(pp *cm.QPParams) error { applyErr = s.applyLocked(q, pp, p.ACKTimeout); return applyErr }})
		if err != nil {
			if applyErr == nil {
				// Our parameters are wrong (too much private data, say):
				// the request is refused and the caller told.
				_ = s.mgr.Reject(now, ev.ID, cm.RejConsumer, nil)
			}
			s.destroyQPLocked(c)
			s.pumpLocked(now)
			if applyErr != nil {
				// This request's values do not suit the QP: it was
				// rejected; wait for the next.
				s.acceptFailures++
				s.mu.Unlock()
				continue
			}
			s.mu.Unlock()
			return nil, fmt.Errorf("rdmacm: accept: %w", err)
		}
		c.params = params
		c.accepted = true
		s.conns[ev.ID] = c
		s.pumpLocked(now)
		s.mu.Unlock()
		if err := c.wait(ctx); err != nil {
			if ctx.Err() == nil && (errors.Is(err, ErrRejected) || errors.Is(err, ErrUnreachable) || errors.Is(err, ErrPeerDisconnected)) {
				// The peer refused our REP, never answered it or
				// disconnected before its RTU: that request is over;
				// wait for the next.
				s.mu.Lock()
				s.acceptFailures++
				s.mu.Unlock()
				continue
			}
			return nil, fmt.Errorf("rdmacm: accept: %w", err)
		}
		return c, nil
	}
}

// Close stops listening; requests not yet accepted are rejected.
func (l *Listener) Close() error {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.closed {
		return nil
	}
	now := s.clock.Now()
	for _, r := range l.reqs {
		_ = s.mgr.Reject(now, r.ID, cm.RejConsumer, nil)
	}
	l.closeLocked()
	if !s.closed {
		s.pumpLocked(now)
	}
	return nil
}

func (l *Listener) closeLocked() {
	if l.closed {
		return
	}
	l.closed = true
	l.reqs = nil
	l.s.mgr.Unlisten(l.sid)
	delete(l.s.listeners, l.sid)
	close(l.notify)
}
