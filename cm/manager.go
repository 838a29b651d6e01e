package cm

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// GUIDFromMAC returns the EUI-64 GUID of a port with this MAC address,
// as rxe makes its node GUID (ff:fe in the middle, the universal/local
// bit flipped): 52:54:00:0a:aa:ba gives 0x505400fffe0aaaba, the Local CA
// GUID of the rxe capture's REQ.
func GUIDFromMAC(mac [6]byte) uint64 {
	return uint64(mac[0]^0x02)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
}

// Defaults of Config fields left zero.
const (
	DefaultMRAServiceTimeout = 24 // rdma_cm's CMA_CM_MRA_SETTING: 4.096 us * 2^24, about 69 s
	DefaultTargetACKDelay    = 15 // what rxe's CM puts in its REPs (the rxe capture)
	DefaultMaxConnections    = 1024
	DefaultQueueLen          = 4096
)

// Config is a Manager's configuration. Zero fields take the defaults named.
type Config struct {
	// CAGUID is the local channel adapter's GUID (the REQ's and REP's
	// Local CA GUID, the ARI of a timeout REJ); peers tell CMs apart by it
	// and the communication ID, so give each device its own. rxe derives
	// it from the MAC address (GUIDFromMAC). 0 is sent as 0.
	CAGUID uint64
	// CMResponseTimeout is how long this CM may take to answer, as an IBTA
	// exponent (4.096 us * 2^x); 0 means DefaultCMResponseTimeout (20).
	CMResponseTimeout uint8
	// MaxCMRetries is how many times a REQ, REP or DREQ is resent; 0 means
	// DefaultMaxCMRetries (15). Over 15 is 15 (a 4-bit field of the REQ).
	MaxCMRetries uint8
	// PacketLifeTime is the path's packet lifetime exponent; 0 means
	// DefaultPacketLifeTime (18).
	PacketLifeTime uint8
	// MRAServiceTimeout is what an MRA this CM sends asks the peer to wait
	// (exponent); 0 means DefaultMRAServiceTimeout (24).
	MRAServiceTimeout uint8
	// TargetACKDelay is this CA's ACK delay exponent, sent in REPs and
	// used for the REQ's local ACK timeout; 0 means DefaultTargetACKDelay.
	TargetACKDelay uint8
	// MinRNRTimer goes to QPParams.MinRNRTimer (Linux's CM sets 0).
	MinRNRTimer uint8
	// MaxConnections bounds the connections held, TIMEWAIT included; a REQ
	// beyond it is rejected with RejNoResources and Dial fails. 0 means
	// DefaultMaxConnections.
	MaxConnections int
	// QueueLen bounds the queues of MADs to send and events not yet
	// polled; what does not fit is dropped and counted (DropQueueFull).
	// 0 means DefaultQueueLen.
	QueueLen int
	// LocalGIDs are this device's addresses (its GIDs). A REQ whose
	// primary path names another as this side's GID (its Primary Remote
	// Port GID) is rejected with RejInvalidGID and LocalGIDs[0] as ARI, and
	// a REQ for an RDMA IP CM service ID whose IP CM header names another
	// destination with RejConsumer, as Linux does. Empty: every address is
	// taken as this device's.
	LocalGIDs []netip.Addr
	// Rand draws communication IDs and starting PSNs; nil means a
	// generator seeded at random.
	Rand *rand.Rand
}

func (c *Config) fill() {
	def := func(v *uint8, d uint8) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.CMResponseTimeout, DefaultCMResponseTimeout)
	def(&c.MaxCMRetries, DefaultMaxCMRetries)
	c.MaxCMRetries = min(c.MaxCMRetries, 15)
	c.CMResponseTimeout = min(c.CMResponseTimeout, 31)
	def(&c.PacketLifeTime, DefaultPacketLifeTime)
	def(&c.MRAServiceTimeout, DefaultMRAServiceTimeout)
	def(&c.TargetACKDelay, DefaultTargetACKDelay)
	// IBTA time exponents are 5-bit fields.
	c.PacketLifeTime = min(c.PacketLifeTime, 30)
	c.MRAServiceTimeout = min(c.MRAServiceTimeout, 31)
	c.TargetACKDelay = min(c.TargetACKDelay, 31)
	if c.MaxConnections <= 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.QueueLen <= 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
}

// State is a connection's CM state (IBTA 12.9.6, Figures 158-160; the
// names of Linux's enum ib_cm_state). IDLE is a connection the Manager
// no longer holds.
type State uint8

// Connection states.
const (
	StateIdle State = iota
	StateREQSent
	StateMRAREQRcvd // active: the passive side sent an MRA for our REQ; waiting for the REP
	StateREQRcvd    // passive: REQ reported, waiting for Accept or Reject
	StateMRAREQSent // passive: a duplicate REQ came before Accept; we answered with an MRA
	StateREPSent
	StateMRAREPRcvd // passive: the active side sent an MRA for our REP
	StateEstablished
	StateDREQSent
	StateTimeWait
)

var stateNames = [...]string{"IDLE", "REQ_SENT", "MRA_REQ_RCVD", "REQ_RCVD", "MRA_REQ_SENT", "REP_SENT",
	"MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// EventType says what an Event reports.
type EventType uint8

// Events, named as rdma_cm's where one matches.
const (
	// EventConnectRequest (passive): a REQ for a listened service ID. The
	// caller answers with Accept or Reject (RDMA_CM_EVENT_CONNECT_REQUEST).
	EventConnectRequest EventType = iota + 1
	// EventEstablished: the connection is up. On the active side it comes
	// with the REP (an RTU is queued); on the passive side with the RTU or
	// CommEstablished (RDMA_CM_EVENT_ESTABLISHED). Params are final.
	EventEstablished
	// EventRejected: the peer sent a REJ (RDMA_CM_EVENT_REJECTED); Reason,
	// ARI and PrivateData say why.
	EventRejected
	// EventUnreachable: the REQ's or REP's retries ran out; a REJ with
	// reason timeout went to the peer (RDMA_CM_EVENT_UNREACHABLE).
	EventUnreachable
	// EventDisconnected: a DREQ came (a DREP was sent), the DREP to our
	// DREQ came, or our DREQ's retries ran out (Timeout set); the QP should
	// go to ERR (RDMA_CM_EVENT_DISCONNECTED). TIMEWAIT follows.
	EventDisconnected
	// EventTimeWaitExit: TIMEWAIT is over and the Manager has forgotten the
	// connection (RDMA_CM_EVENT_TIMEWAIT_EXIT).
	EventTimeWaitExit
	// EventConnectError (active): the REP came but DialParams.Apply
	// refused its values; a REJ (consumer defined) went to the peer
	// instead of the RTU and the connection is forgotten
	// (RDMA_CM_EVENT_CONNECT_ERROR, as cma.c's cma_rep_recv).
	EventConnectError
)

var eventNames = [...]string{"", "CONNECT_REQUEST", "ESTABLISHED", "REJECTED", "UNREACHABLE", "DISCONNECTED", "TIMEWAIT_EXIT", "CONNECT_ERROR"}

func (e EventType) String() string {
	if int(e) < len(eventNames) && e != 0 {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", uint8(e))
}

// Event is what the Manager reports to its caller (PollEvent).
type Event struct {
	Type      EventType
	ID        uint32     // the connection's local communication ID
	Peer      netip.Addr // the peer's address
	ServiceID uint64
	// Params are the connection's negotiated values (EventEstablished; on
	// EventConnectRequest what the REQ asks for, with LocalQPN, SQPSN... of
	// this side still unset).
	Params QPParams
	// Request is the REQ as received (EventConnectRequest).
	Request *REQ
	// IP is the REQ's IP CM header (EventConnectRequest, when HasIP).
	IP    IPHeader
	HasIP bool
	// PrivateData is the message's private data: the REQ's after the IP
	// CM header, the REP's (active EventEstablished), the REJ's, the
	// DREQ's or DREP's.
	PrivateData []byte
	Reason      RejectReason // EventRejected
	ARI         []byte       // EventRejected
	Timeout     bool         // EventDisconnected: our DREQ was never answered
}

// Outgoing is one MAD to send: a UD SEND to QP1 of To with Q_Key
// bth.GSIQKey (0x80010000), P_Key 0xFFFF.
type Outgoing struct {
	To  netip.Addr
	MAD [MADLen]byte
}

// Counters count what a Manager did and every MAD it dropped, one counter
// per cause.
type Counters struct {
	MADsReceived     uint64
	MADsSent         uint64 // queued for sending
	Retransmits      uint64 // REQ, REP or DREQ resent after its timeout
	DuplicateREQs    uint64 // answered with the REP or an MRA again
	DuplicateREPs    uint64 // answered with the RTU again
	RejectsSent      uint64
	RejectsReceived  uint64
	NoListener       uint64 // REQs rejected with RejInvalidServiceID
	Timeouts         uint64 // REQ, REP or DREQ retries exhausted
	CommEstablished  uint64 // passive sides established by traffic before the RTU
	UnknownDREQs     uint64 // DREQs for no connection, answered with a DREP
	DropMalformed    uint64 // truncated, or not a CM Send MAD
	DropUnknownAttr  uint64 // LAP, APR, SIDR, ClassPortInfo and unknown attribute IDs
	DropUnknownConn  uint64 // a message for no connection this Manager holds
	DropBadState     uint64 // a message the connection's state does not take
	DropBadQPN       uint64 // a DREQ naming a QPN that is not the connection's
	DropQueueFull    uint64 // a MAD or event that did not fit its queue
	DropNoResources  uint64 // REQs rejected because MaxConnections are held
	DropBadTransport uint64 // REQs for RD or a reserved service type, or a type the rdma_cm port space has not (UC to RDMA_PS_TCP), rejected
	DropBadGID       uint64 // REQs whose primary path names a GID not in Config.LocalGIDs, rejected (invalid GID)
	// DropBadPrivateData counts REQs for an RDMA IP CM service ID whose
	// IP CM header is malformed or names another destination, rejected
	// (consumer defined).
	DropBadPrivateData uint64
	// AcceptFailures counts connect requests Accept rejected because
	// AcceptParams.Apply failed (consumer defined).
	AcceptFailures uint64
	// REPsRefused counts REPs answered with a REJ (consumer defined)
	// instead of an RTU because DialParams.Apply failed.
	REPsRefused uint64
}

type remoteKey struct {
	peer netip.Addr
	id   uint32
}

// conn is one connection's state.
type conn struct {
	state     State
	active    bool
	localID   uint32
	remoteID  uint32
	peer      netip.Addr
	serviceID uint64
	tid       uint64
	req       REQ // sent (active) or received (passive)
	rep       REP // received (active) or sent (passive)
	params    QPParams
	// what a timer resends, and how often it still may
	resend   [MADLen]byte
	retries  int
	deadline time.Time // zero: no timer
	// apply moves the active side's QP on the REP (DialParams.Apply)
	apply func(*QPParams) error
}

// Manager is the CM of one device: listeners by service ID, connections
// by local communication ID. It is sans-IO: HandleMAD takes what QP1
// received, PollMAD hands out what to send, PollEvent reports what
// happened, Deadline and HandleTimeout run the timers. It is not safe for
// concurrent use.
type Manager struct {
	cfg       Config
	listeners map[uint64]struct{}
	conns     map[uint32]*conn
	remote    map[remoteKey]*conn
	out       []Outgoing
	events    []Event
	counters  Counters
}

// NewManager returns a Manager with no listeners or connections.
func NewManager(cfg Config) *Manager {
	cfg.fill()
	return &Manager{cfg: cfg, listeners: map[uint64]struct{}{}, conns: map[uint32]*conn{},
		remote: map[remoteKey]*conn{}}
}

// Counters returns a copy of the counters.
func (m *Manager) Counters() Counters { return m.counters }

// Len returns how many connections the Manager holds (every state but IDLE).
func (m *Manager) Len() int { return len(m.conns) }

// State returns a connection's state, StateIdle when the Manager does not
// hold it.
func (m *Manager) State(id uint32) State {
	if c := m.conns[id]; c != nil {
		return c.state
	}
	return StateIdle
}

// Params returns a connection's negotiated values (final once
// EventEstablished was reported).
func (m *Manager) Params(id uint32) (QPParams, bool) {
	c := m.conns[id]
	if c == nil {
		return QPParams{}, false
	}
	return c.params, true
}

// Listen makes the Manager accept REQs for serviceID (LISTEN). It returns
// ErrListening when the service ID already has a listener.
func (m *Manager) Listen(serviceID uint64) error {
	if _, ok := m.listeners[serviceID]; ok {
		return fmt.Errorf("%w: %#016x", ErrListening, serviceID)
	}
	m.listeners[serviceID] = struct{}{}
	return nil
}

// Unlisten stops accepting REQs for serviceID; connections already made
// stay.
func (m *Manager) Unlisten(serviceID uint64) { delete(m.listeners, serviceID) }

// PollMAD returns the next MAD to send, oldest first.
func (m *Manager) PollMAD() (Outgoing, bool) {
	if len(m.out) == 0 {
		return Outgoing{}, false
	}
	o := m.out[0]
	m.out = m.out[1:]
	if len(m.out) == 0 {
		m.out = nil
	}
	return o, true
}

// PollEvent returns the next event, oldest first.
func (m *Manager) PollEvent() (Event, bool) {
	if len(m.events) == 0 {
		return Event{}, false
	}
	e := m.events[0]
	m.events = m.events[1:]
	if len(m.events) == 0 {
		m.events = nil
	}
	return e, true
}

func (m *Manager) event(e Event) {
	if len(m.events) >= m.cfg.QueueLen {
		m.counters.DropQueueFull++
		return
	}
	m.events = append(m.events, e)
}

// send queues a MAD to peer; it returns the encoded MAD.
func (m *Manager) send(to netip.Addr, tid uint64, msg Message) [MADLen]byte {
	var o Outgoing
	o.To = to
	b, err := AppendMAD(o.MAD[:0], tid, msg)
	if err != nil || len(b) != MADLen {
		// The Manager builds its messages from checked values; an error
		// here is a bug, not input.
		panic(fmt.Sprintf("cm: encoding %v: %v", msg.Attr(), err))
	}
	m.queue(o)
	return o.MAD
}

func (m *Manager) queue(o Outgoing) {
	if len(m.out) >= m.cfg.QueueLen {
		m.counters.DropQueueFull++
		return
	}
	m.counters.MADsSent++
	m.out = append(m.out, o)
}

func (m *Manager) newLocalID() uint32 {
	for {
		id := m.cfg.Rand.Uint32()
		if _, used := m.conns[id]; id != 0 && !used {
			return id
		}
	}
}

// formTID makes the transaction ID of a transaction this side starts (a
// REQ, or the passive side's DREQ): a random high half and the local
// communication ID, as Linux's cm_form_tid puts its MAD agent's hi_tid
// above the ID.
func (m *Manager) formTID(localID uint32) uint64 {
	return uint64(m.cfg.Rand.Uint32())<<32 | uint64(localID)
}

func (m *Manager) randomPSN() bth.PSN { return bth.PSN(m.cfg.Rand.Uint32() & bth.PSNMask) }

// arm sets c's one timer (a resend of c.resend while c.retries last, or
// the end of TIMEWAIT) to now + wait.
func (c *conn) arm(now time.Time, wait time.Duration) { c.deadline = now.Add(wait) }

func (m *Manager) plt() time.Duration { return IBTime(m.cfg.PacketLifeTime) }

// peerResponse is how long the peer may take to answer a message of ours,
// plus a round trip (IBTA 12.7.27, 12.7.33).
func (m *Manager) peerResponse(c *conn) time.Duration {
	return IBTime(c.params.PeerResponseTime) + 2*m.plt()
}

// timeWait is how long TIMEWAIT lasts: long enough for the connection's
// packets to leave the fabric. Linux waits 4.096 us * 2^(PacketLifeTime+1)
// (cm_enter_timewait); so does this.
func (m *Manager) timeWait() time.Duration { return IBTime(m.cfg.PacketLifeTime + 1) }

func (m *Manager) remove(c *conn) {
	delete(m.conns, c.localID)
	if c.remoteID != 0 {
		if r := m.remote[remoteKey{c.peer, c.remoteID}]; r == c {
			delete(m.remote, remoteKey{c.peer, c.remoteID})
		}
	}
}

func (m *Manager) enterTimeWait(now time.Time, c *conn) {
	c.state = StateTimeWait
	c.retries = 0
	c.arm(now, m.timeWait())
}

// DialParams describe a connection to make (ib_cm_req_param and the
// rdma_conn_param of rdma_connect).
type DialParams struct {
	Local, Remote netip.Addr // this side's and the peer's address
	ServiceID     uint64     // ServiceID(PortSpaceTCP, port) for rdma_cm peers
	// SrcPort is the source port of the IP CM header that a REQ for an
	// RDMA IP CM service ID carries first in its private data.
	SrcPort uint16
	// QPN is this side's QP (RC or UC, in INIT).
	QPN uint32
	// UC asks for an Unreliable Connected connection; RC otherwise.
	UC bool
	// StartingPSN is the first PSN this side expects to receive (the
	// peer's SQ PSN, this side's RQ PSN); 0 draws a random one.
	StartingPSN        bth.PSN
	PathMTU            qp.MTU // 0 means IBV_MTU_1024
	ResponderResources uint8  // READ/atomics this side accepts as responder
	InitiatorDepth     uint8  // READ/atomics this side issues at once
	RetryCount         uint8  // transport retries, 0-7
	RNRRetryCount      uint8  // RNR retries the peer's sender makes, 0-7
	SRQ                bool   // this side's QP receives from an SRQ
	TrafficClass       uint8
	HopLimit           uint8 // 0 means 64
	FlowLabel          uint32
	// PrivateData follows the IP CM header (at most 56 bytes) or fills the
	// REQ's private data (92 bytes).
	PrivateData []byte
	// Apply, when set, is called with the negotiated values when the REP
	// comes, before the RTU is queued: it moves the caller's QP to RTR and
	// RTS. When it fails, no RTU goes out: a REJ with reason consumer
	// defined does, the connection is forgotten and EventConnectError is
	// reported, as Linux's rdma_cm does when the REP's values cannot be
	// applied (cma.c cma_rep_recv: the QP to ERR, IB_CM_REJ_CONSUMER_DEFINED,
	// RDMA_CM_EVENT_CONNECT_ERROR).
	Apply func(*QPParams) error
}

// Dial starts a connection (active side, IDLE -> REQ_SENT): it queues a
// REQ and returns the connection's local communication ID. The REQ is
// resent every RemoteCMResponseTimeout + 2 * PacketLifeTime up to
// MaxCMRetries times; then a REJ with reason timeout goes out and
// EventUnreachable is reported. Errors: ErrFieldRange for values that do
// not fit, ErrTooManyConnections.
func (m *Manager) Dial(now time.Time, p DialParams) (uint32, error) {
	if len(m.conns) >= m.cfg.MaxConnections {
		return 0, ErrTooManyConnections
	}
	if p.PathMTU == 0 {
		p.PathMTU = qp.IBV_MTU_1024
	}
	if p.HopLimit == 0 {
		p.HopLimit = 64
	}
	if p.PathMTU.Bytes() == 0 || p.RetryCount > 7 || p.RNRRetryCount > 7 || p.QPN == 0 || p.QPN > 0xFFFFFF ||
		!p.StartingPSN.Valid() || p.FlowLabel > 0xFFFFF || !p.Remote.IsValid() || !p.Local.IsValid() {
		return 0, fmt.Errorf("%w: dial parameters (QPN %#x, PSN %#x, MTU %d, retry %d, RNR retry %d, flow label %#x, %v -> %v)",
			ErrFieldRange, p.QPN, uint32(p.StartingPSN), p.PathMTU, p.RetryCount, p.RNRRetryCount, p.FlowLabel, p.Local, p.Remote)
	}
	c := &conn{state: StateREQSent, active: true, localID: m.newLocalID(), peer: p.Remote.Unmap(), serviceID: p.ServiceID,
		apply: p.Apply}
	if p.StartingPSN == 0 {
		p.StartingPSN = m.randomPSN()
	}
	c.tid = m.formTID(c.localID)
	r := &c.req
	*r = REQ{LocalCommID: c.localID, ServiceID: p.ServiceID, LocalCAGUID: m.cfg.CAGUID, LocalQPN: p.QPN,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RemoteCMResponseTimeout: DefaultCMResponseTimeout, StartingPSN: p.StartingPSN,
		LocalCMResponseTimeout: m.cfg.CMResponseTimeout, RetryCount: p.RetryCount, PKey: 0xFFFF,
		PathMTU: uint8(p.PathMTU), RNRRetryCount: p.RNRRetryCount, MaxCMRetries: m.cfg.MaxCMRetries, SRQ: p.SRQ,
		Primary: Path{LocalLID: 0xFFFF, RemoteLID: 0xFFFF, LocalGID: p.Local.Unmap(), RemoteGID: c.peer,
			FlowLabel: p.FlowLabel, TrafficClass: p.TrafficClass, HopLimit: p.HopLimit,
			LocalACKTimeout: ackTimeout(m.cfg.TargetACKDelay, m.cfg.PacketLifeTime)}}
	if p.UC {
		r.TransportServiceType = ServiceUC
	}
	pd := r.PrivateData[:0]
	if _, _, ok := ParseServiceID(p.ServiceID); ok {
		h := IPHeader{Src: netip.AddrPortFrom(p.Local, p.SrcPort), Dst: p.Remote}
		var err error
		if pd, err = h.Append(pd); err != nil {
			return 0, err
		}
	}
	if len(pd)+len(p.PrivateData) > REQPrivateDataLen {
		return 0, fmt.Errorf("%w: %d bytes of private data, the REQ has room for %d", ErrFieldRange,
			len(p.PrivateData), REQPrivateDataLen-len(pd))
	}
	copy(r.PrivateData[len(pd):], p.PrivateData)
	c.params = QPParams{Local: p.Local.Unmap(), Remote: c.peer, LocalQPN: p.QPN, RQPSN: p.StartingPSN,
		PathMTU: p.PathMTU, RetryCnt: p.RetryCount, MinRNRTimer: m.cfg.MinRNRTimer,
		TrafficClass: p.TrafficClass, HopLimit: p.HopLimit, FlowLabel: p.FlowLabel,
		TransportService: r.TransportServiceType, PeerResponseTime: r.RemoteCMResponseTimeout,
		LocalResponseTime: m.cfg.CMResponseTimeout}
	m.conns[c.localID] = c
	c.resend = m.send(c.peer, c.tid, r)
	c.retries = int(r.MaxCMRetries)
	c.arm(now, REQTimeout(r, m.cfg.PacketLifeTime))
	return c.localID, nil
}

// AcceptParams are the passive side's answer to a REQ (ib_cm_rep_param).
type AcceptParams struct {
	QPN uint32 // this side's QP (RC or UC as the REQ asks, in INIT)
	// StartingPSN is the first PSN this side expects to receive (the
	// active side's SQ PSN); 0 draws a random one.
	StartingPSN bth.PSN
	// ResponderResources and InitiatorDepth are this side's; each is
	// lowered to what the REQ offers (its InitiatorDepth and
	// ResponderResources).
	ResponderResources uint8
	InitiatorDepth     uint8
	RNRRetryCount      uint8 // RNR retries the active side's sender makes, 0-7
	SRQ                bool
	PrivateData        []byte // at most 196 bytes
	// Apply, when set, is called with the negotiated values before the
	// REP is queued: it moves the caller's QP to RTR and RTS (as
	// QPParams.Apply). When it fails, no REP goes out: Accept sends a REJ
	// with reason consumer defined instead, forgets the connection and
	// returns the error, as Linux's rdma_accept rejects a request whose QP
	// cannot be moved (cma.c: cma_modify_qp_rtr/rts fail, then
	// rdma_reject with IB_CM_REJ_CONSUMER_DEFINED).
	Apply func(*QPParams) error
}

func (m *Manager) lookup(id uint32) (*conn, error) {
	c := m.conns[id]
	if c == nil {
		return nil, fmt.Errorf("%w: %#08x", ErrNoConnection, id)
	}
	return c, nil
}

// Accept answers a connect request (REQ_RCVD or MRA_REQ_SENT -> REP_SENT):
// it queues a REP and returns the negotiated values, which the caller
// applies to its QP before the REP leaves: give AcceptParams.Apply, so
// that a QP that cannot take them gets the peer a REJ (consumer defined)
// instead of a REP. The REP is
// resent every LocalCMResponseTimeout (the REQ's) + 2 * PacketLifeTime up
// to the REQ's MaxCMRetries; EventEstablished follows the RTU (or
// CommEstablished). Errors: ErrNoConnection, ErrState, ErrFieldRange.
func (m *Manager) Accept(now time.Time, id uint32, p AcceptParams) (QPParams, error) {
	c, err := m.lookup(id)
	if err != nil {
		return QPParams{}, err
	}
	if c.state != StateREQRcvd && c.state != StateMRAREQSent {
		return QPParams{}, fmt.Errorf("%w: Accept in %v", ErrState, c.state)
	}
	if p.QPN == 0 || p.QPN > 0xFFFFFF || p.RNRRetryCount > 7 || !p.StartingPSN.Valid() || len(p.PrivateData) > REPPrivateDataLen {
		return QPParams{}, fmt.Errorf("%w: accept parameters (QPN %#x, PSN %#x, RNR retry %d, %d bytes of private data)",
			ErrFieldRange, p.QPN, uint32(p.StartingPSN), p.RNRRetryCount, len(p.PrivateData))
	}
	if p.StartingPSN == 0 {
		p.StartingPSN = m.randomPSN()
	}
	rep := &c.rep
	*rep = REP{LocalCommID: c.localID, RemoteCommID: c.remoteID, LocalQPN: p.QPN, StartingPSN: p.StartingPSN,
		ResponderResources: min(p.ResponderResources, c.req.InitiatorDepth),
		InitiatorDepth:     min(p.InitiatorDepth, c.req.ResponderResources),
		TargetACKDelay:     m.cfg.TargetACKDelay, RNRRetryCount: p.RNRRetryCount, SRQ: p.SRQ, LocalCAGUID: m.cfg.CAGUID}
	copy(rep.PrivateData[:], p.PrivateData)
	pp := &c.params
	pp.LocalQPN, pp.RQPSN = p.QPN, p.StartingPSN
	pp.MaxRdAtomic, pp.MaxDestRdAtomic = rep.InitiatorDepth, rep.ResponderResources
	if p.Apply != nil {
		// c is forgotten if Apply refuses: it may see c.params itself.
		if err := p.Apply(&c.params); err != nil {
			m.counters.AcceptFailures++
			m.counters.RejectsSent++
			m.send(c.peer, c.tid, &REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: MsgREQ, Reason: RejConsumer})
			m.remove(c)
			return QPParams{}, fmt.Errorf("cm: accept %#08x: %w (rejected)", id, err)
		}
	}
	c.state = StateREPSent
	c.resend = m.send(c.peer, c.tid, rep)
	c.retries = int(c.req.MaxCMRetries)
	c.arm(now, m.peerResponse(c))
	return c.params, nil
}

// Reject refuses a connect request (REQ_RCVD or MRA_REQ_SENT -> IDLE) with
// a REJ of the reason given (RejConsumer for rdma_reject) and private data
// (at most 148 bytes). Errors: ErrNoConnection, ErrState, ErrFieldRange.
func (m *Manager) Reject(now time.Time, id uint32, reason RejectReason, privateData []byte) error {
	c, err := m.lookup(id)
	if err != nil {
		return err
	}
	if c.state != StateREQRcvd && c.state != StateMRAREQSent {
		return fmt.Errorf("%w: Reject in %v", ErrState, c.state)
	}
	if len(privateData) > REJPrivateDataLen {
		return fmt.Errorf("%w: %d bytes of REJ private data, room for %d", ErrFieldRange, len(privateData), REJPrivateDataLen)
	}
	rej := &REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: MsgREQ, Reason: reason}
	copy(rej.PrivateData[:], privateData)
	m.counters.RejectsSent++
	m.send(c.peer, c.tid, rej)
	m.remove(c)
	return nil
}

// Abandon gives up a connection that is not yet established, as Linux's
// cm_destroy_id does when the consumer destroys its ID (rdma_destroy_id
// after a signal or a timeout of its own): a REQ still unanswered
// (REQ_SENT, MRA_REQ_RCVD) is withdrawn with a REJ of reason timeout whose
// ARI is this CA's GUID, the connection forgotten; a connect request not
// yet answered (REQ_RCVD, MRA_REQ_SENT) is refused as by Reject with
// reason consumer defined; a REP whose RTU has not come (REP_SENT,
// MRA_REP_RCVD) is withdrawn with a REJ of reason consumer defined, the
// connection kept in TIMEWAIT (its QP may have sent packets). No event
// follows. Errors: ErrNoConnection, ErrState (the connection is
// established or closing: use Disconnect).
func (m *Manager) Abandon(now time.Time, id uint32) error {
	c, err := m.lookup(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
		rej := &REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: MsgOther,
			Reason: RejTimeout, ARILength: 8}
		binary.BigEndian.PutUint64(rej.ARI[:], m.cfg.CAGUID)
		m.counters.RejectsSent++
		m.send(c.peer, c.tid, rej)
		m.remove(c)
	case StateREQRcvd, StateMRAREQSent:
		return m.Reject(now, id, RejConsumer, nil)
	case StateREPSent, StateMRAREPRcvd:
		m.counters.RejectsSent++
		m.send(c.peer, c.tid, &REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: MsgOther, Reason: RejConsumer})
		m.enterTimeWait(now, c)
	default:
		return fmt.Errorf("%w: Abandon in %v", ErrState, c.state)
	}
	return nil
}

// Disconnect starts closing an established connection (ESTABLISHED ->
// DREQ_SENT; also from REP_SENT, when the RTU was lost): it queues a DREQ,
// resent every peer response timeout + 2 * PacketLifeTime up to
// MaxCMRetries times. EventDisconnected follows the DREP or the last
// timeout. Errors: ErrNoConnection, ErrState, ErrFieldRange.
func (m *Manager) Disconnect(now time.Time, id uint32, privateData []byte) error {
	c, err := m.lookup(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateEstablished, StateREPSent, StateMRAREPRcvd:
	default:
		return fmt.Errorf("%w: Disconnect in %v", ErrState, c.state)
	}
	if len(privateData) > DREQPrivateDataLen {
		return fmt.Errorf("%w: %d bytes of DREQ private data, room for %d", ErrFieldRange, len(privateData), DREQPrivateDataLen)
	}
	d := &DREQ{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.params.RemoteQPN}
	copy(d.PrivateData[:], privateData)
	c.state = StateDREQSent
	// A DREQ starts a transaction of this side's: the passive side forms a
	// transaction ID of its own (Linux cm_form_tid); the DREP answers with it.
	tid := c.tid
	if !c.active {
		tid = m.formTID(c.localID)
	}
	c.resend = m.send(c.peer, tid, d)
	c.retries = int(c.req.MaxCMRetries)
	c.arm(now, m.peerResponse(c))
	return nil
}

// CommEstablished tells the Manager that the connection's QP received a
// packet from the peer before the RTU came (IBTA 12.9.6: the
// communication established event, IBV_EVENT_COMM_EST; Linux ib_cm_notify).
// In REP_SENT or MRA_REP_RCVD the connection becomes ESTABLISHED and
// EventEstablished is reported; in other states nothing changes. It
// reports whether the state changed.
func (m *Manager) CommEstablished(now time.Time, id uint32) bool {
	c := m.conns[id]
	if c == nil || (c.state != StateREPSent && c.state != StateMRAREPRcvd) {
		return false
	}
	m.counters.CommEstablished++
	m.establishPassive(c)
	return true
}

func (m *Manager) establishPassive(c *conn) {
	c.state = StateEstablished
	c.deadline = time.Time{}
	m.event(Event{Type: EventEstablished, ID: c.localID, Peer: c.peer, ServiceID: c.serviceID, Params: c.params})
}

// Deadline returns when HandleTimeout must next run; the zero time when no
// timer is armed.
func (m *Manager) Deadline() time.Time {
	var d time.Time
	for _, c := range m.conns {
		if !c.deadline.IsZero() && (d.IsZero() || c.deadline.Before(d)) {
			d = c.deadline
		}
	}
	return d
}

// HandleTimeout runs every timer due at now: resends REQs, REPs and DREQs
// whose response did not come, gives up after MaxCMRetries (REQ, REP: a
// REJ with reason timeout and EventUnreachable; DREQ: TIMEWAIT and
// EventDisconnected), and ends TIMEWAIT (EventTimeWaitExit).
// Connections whose timers are due are handled in the order of their
// deadlines (then of their IDs), so that the MADs and events come out in
// the same order on every run.
func (m *Manager) HandleTimeout(now time.Time) {
	var due []*conn
	for _, c := range m.conns {
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			due = append(due, c)
		}
	}
	slices.SortFunc(due, func(a, b *conn) int {
		if c := a.deadline.Compare(b.deadline); c != 0 {
			return c
		}
		return cmp.Compare(a.localID, b.localID)
	})
	for _, c := range due {
		c.deadline = time.Time{}
		switch c.state {
		case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateDREQSent:
			if c.retries > 0 {
				c.retries--
				m.counters.Retransmits++
				m.queue(Outgoing{To: c.peer, MAD: c.resend})
				switch c.state {
				case StateMRAREQRcvd:
					c.state = StateREQSent
				case StateMRAREPRcvd:
					c.state = StateREPSent
				}
				if c.state == StateREQSent {
					c.arm(now, REQTimeout(&c.req, m.cfg.PacketLifeTime))
				} else {
					c.arm(now, m.peerResponse(c))
				}
				continue
			}
			m.counters.Timeouts++
			if c.state == StateDREQSent {
				m.enterTimeWait(now, c)
				m.event(Event{Type: EventDisconnected, ID: c.localID, Peer: c.peer, ServiceID: c.serviceID, Timeout: true})
				continue
			}
			// IBTA 12.9.6: REQ or REP unanswered; tell the peer with a REJ
			// (reason timeout, ARI our CA GUID), as Linux does.
			rej := &REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: MsgOther,
				Reason: RejTimeout, ARILength: 8}
			binary.BigEndian.PutUint64(rej.ARI[:], m.cfg.CAGUID)
			m.counters.RejectsSent++
			m.send(c.peer, c.tid, rej)
			m.event(Event{Type: EventUnreachable, ID: c.localID, Peer: c.peer, ServiceID: c.serviceID})
			if c.active {
				m.remove(c)
			} else {
				// The QP may have sent packets: keep the IDs out of use.
				m.enterTimeWait(now, c)
			}
		case StateTimeWait:
			m.remove(c)
			m.event(Event{Type: EventTimeWaitExit, ID: c.localID, Peer: c.peer, ServiceID: c.serviceID})
		}
	}
}
