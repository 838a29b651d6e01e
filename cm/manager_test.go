package cm

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/require"
)

var (
	addrA = netip.MustParseAddr("192.0.2.1")
	addrB = netip.MustParseAddr("192.0.2.2")
	svc   = ServiceID(PortSpaceTCP, 7174)
)

// pair is two Managers joined by hand: active A at 192.0.2.1, passive B
// at 192.0.2.2, with a clock and a filter that may drop MADs.
type pair struct {
	t      testing.TB
	now    time.Time
	a, b   *Manager
	drop   func(fromA bool, attr AttrID) bool
	sent   []AttrID // every MAD handed over (dropped ones too), in order
	events [2][]Event
}

func newPair(t testing.TB, cfgA, cfgB Config) *pair {
	if cfgA.CAGUID == 0 {
		cfgA.CAGUID = 0x505400fffe000001
	}
	if cfgB.CAGUID == 0 {
		cfgB.CAGUID = 0x505400fffe000002
	}
	cfgA.Rand = rand.New(rand.NewPCG(1, 2))
	cfgB.Rand = rand.New(rand.NewPCG(3, 4))
	p := &pair{t: t, now: time.Unix(1000, 0), a: NewManager(cfgA), b: NewManager(cfgB)}
	require.NoError(t, p.b.Listen(svc))
	return p
}

// deliver hands MADs both ways until none is left and collects events.
func (p *pair) deliver() {
	for moved := true; moved; {
		moved = false
		for i, m := range []*Manager{p.a, p.b} {
			other, from := p.b, addrA
			if i == 1 {
				other, from = p.a, addrB
			}
			for {
				o, ok := m.PollMAD()
				if !ok {
					break
				}
				moved = true
				var h Header
				require.NoError(p.t, h.Decode(o.MAD[:]))
				require.True(p.t, h.IsCM())
				p.sent = append(p.sent, h.AttrID)
				want := addrB
				if i == 1 {
					want = addrA
				}
				require.Equal(p.t, want, o.To)
				if p.drop != nil && p.drop(i == 0, h.AttrID) {
					continue
				}
				_ = other.HandleMAD(p.now, from, o.MAD[:])
			}
		}
	}
	for i, m := range []*Manager{p.a, p.b} {
		for {
			e, ok := m.PollEvent()
			if !ok {
				break
			}
			p.events[i] = append(p.events[i], e)
		}
	}
}

// advance moves the clock to the earliest deadline and runs the timers.
func (p *pair) advance() {
	p.t.Helper()
	d := p.a.Deadline()
	if db := p.b.Deadline(); d.IsZero() || (!db.IsZero() && db.Before(d)) {
		d = db
	}
	require.False(p.t, d.IsZero(), "no timer armed")
	require.False(p.t, d.Before(p.now))
	p.now = d
	p.a.HandleTimeout(p.now)
	p.b.HandleTimeout(p.now)
	p.deliver()
}

func (p *pair) takeEvents(i int) []EventType {
	var ts []EventType
	for _, e := range p.events[i] {
		ts = append(ts, e.Type)
	}
	p.events[i] = nil
	return ts
}

func (p *pair) lastEvent(i int, typ EventType) Event {
	p.t.Helper()
	for j := len(p.events[i]) - 1; j >= 0; j-- {
		if p.events[i][j].Type == typ {
			return p.events[i][j]
		}
	}
	p.t.Fatalf("side %d: no %v in %v", i, typ, p.events[i])
	return Event{}
}

// withIPHeader gives a hand-made REQ for an rdma_cm service ID the IP CM
// header rdma_cm puts first in its private data (A at port 0xc725 to B).
func withIPHeader(r *REQ) {
	h := IPHeader{Src: netip.AddrPortFrom(addrA, 0xc725), Dst: addrB}
	if _, err := h.Append(r.PrivateData[:0]); err != nil {
		panic(err)
	}
}

func dialParams() DialParams {
	return DialParams{Local: addrA, Remote: addrB, ServiceID: svc, SrcPort: 0xc725, QPN: 0x11, StartingPSN: 0xe1a47d,
		PathMTU: qp.IBV_MTU_1024, ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7,
		PrivateData: []byte("hello")}
}

func acceptParams() AcceptParams {
	return AcceptParams{QPN: 0x12, StartingPSN: 0x8c84dd, ResponderResources: 4, InitiatorDepth: 4, RNRRetryCount: 6,
		PrivateData: []byte("welcome")}
}

// connect runs Dial, the REQ, Accept and what follows; it returns both IDs.
func (p *pair) connect() (idA, idB uint32) {
	p.t.Helper()
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(p.t, err)
	require.Equal(p.t, StateREQSent, p.a.State(idA))
	p.deliver()
	req := p.lastEvent(1, EventConnectRequest)
	idB = req.ID
	_, err = p.b.Accept(p.now, idB, acceptParams())
	require.NoError(p.t, err)
	p.deliver()
	return idA, idB
}

func TestConnectDisconnect(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	require.Equal(t, []AttrID{AttrREQ}, p.sent)
	require.Equal(t, []EventType{EventConnectRequest}, []EventType{p.events[1][0].Type})
	req := p.events[1][0]
	require.Equal(t, addrA, req.Peer)
	require.Equal(t, svc, req.ServiceID)
	require.True(t, req.HasIP)
	require.Equal(t, netip.AddrPortFrom(addrA, 0xc725), req.IP.Src)
	require.Equal(t, addrB, req.IP.Dst)
	require.Equal(t, "hello", string(req.PrivateData[:5]))
	require.Len(t, req.PrivateData, REQPrivateDataLen-IPHeaderLen)
	require.Equal(t, uint32(0x11), req.Request.LocalQPN)
	require.Equal(t, uint64(0x505400fffe000001), req.Request.LocalCAGUID)
	require.Equal(t, uint8(19), req.Request.Primary.LocalACKTimeout) // PacketLifeTime 18 + 1, as rxe's REQs
	require.Equal(t, StateREQRcvd, p.b.State(req.ID))

	pb, err := p.b.Accept(p.now, req.ID, acceptParams())
	require.NoError(t, err)
	// Responder resources and initiator depth are lowered to what the REQ offers.
	require.Equal(t, uint8(1), pb.MaxRdAtomic)
	require.Equal(t, uint8(1), pb.MaxDestRdAtomic)
	require.Equal(t, StateREPSent, p.b.State(req.ID))
	p.deliver()
	require.Equal(t, []AttrID{AttrREQ, AttrREP, AttrRTU}, p.sent)
	estA, estB := p.lastEvent(0, EventEstablished), p.lastEvent(1, EventEstablished)
	require.Equal(t, "welcome", string(estA.PrivateData[:7]))
	require.Equal(t, StateEstablished, p.a.State(idA))
	require.Equal(t, StateEstablished, p.b.State(req.ID))
	require.True(t, p.a.Deadline().IsZero())
	require.True(t, p.b.Deadline().IsZero())

	a, b := estA.Params, estB.Params
	require.Equal(t, QPParams{Local: addrA, Remote: addrB, LocalQPN: 0x11, RemoteQPN: 0x12, SQPSN: 0x8c84dd, RQPSN: 0xe1a47d,
		PathMTU: qp.IBV_MTU_1024, MaxRdAtomic: 1, MaxDestRdAtomic: 1, Timeout: 19, RetryCnt: 7, RNRRetry: 6,
		HopLimit: 64, PeerResponseTime: 20, LocalResponseTime: 20}, a)
	require.Equal(t, QPParams{Local: addrB, Remote: addrA, LocalQPN: 0x12, RemoteQPN: 0x11, SQPSN: 0xe1a47d, RQPSN: 0x8c84dd,
		PathMTU: qp.IBV_MTU_1024, MaxRdAtomic: 1, MaxDestRdAtomic: 1, Timeout: 19, RetryCnt: 7, RNRRetry: 7,
		HopLimit: 64, PeerResponseTime: 20, LocalResponseTime: 20}, b)

	// The negotiated values make two QPs that talk to each other.
	sendBothWays(t, a, b)

	require.NoError(t, p.a.Disconnect(p.now, idA, nil))
	require.Equal(t, StateDREQSent, p.a.State(idA))
	p.deliver()
	require.Equal(t, []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP}, p.sent)
	require.Equal(t, []EventType{EventEstablished, EventDisconnected}, p.takeEvents(0))
	require.Equal(t, []EventType{EventConnectRequest, EventEstablished, EventDisconnected}, p.takeEvents(1))
	require.Equal(t, StateTimeWait, p.a.State(idA))
	require.Equal(t, StateTimeWait, p.b.State(req.ID))
	require.Equal(t, p.now.Add(IBTime(19)), p.a.Deadline())
	p.advance()
	require.Equal(t, []EventType{EventTimeWaitExit}, p.takeEvents(0))
	require.Equal(t, []EventType{EventTimeWaitExit}, p.takeEvents(1))
	require.Zero(t, p.a.Len())
	require.Zero(t, p.b.Len())
	require.True(t, p.a.Deadline().IsZero())
	ca, cb := p.a.Counters(), p.b.Counters()
	require.Equal(t, uint64(3), ca.MADsSent)
	require.Equal(t, uint64(2), cb.MADsSent)
	require.Equal(t, Counters{MADsReceived: 2, MADsSent: 3}, ca)
	require.Equal(t, Counters{MADsReceived: 3, MADsSent: 2}, cb)
}

// sendBothWays builds an RC QP on each side from its QPParams and passes
// one 3000-byte SEND (three packets at MTU 1024) each way, checking both
// complete: wrong PSNs, QPNs or MTUs would leave them unanswered.
func sendBothWays(t *testing.T, pa, pb QPParams) {
	t.Helper()
	type host struct {
		q  *qp.QP
		cq *qp.CQ
		mr *qp.MR
	}
	var hs [2]host
	for i, pp := range []QPParams{pa, pb} {
		pd := qp.NewDevice().NewPD()
		cq := qp.NewCQ(16)
		q, err := qp.New(qp.InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPN: pp.LocalQPN, SQSigAll: true})
		require.NoError(t, err)
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE},
			qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, pp.Apply(q))
		require.Equal(t, qp.IBV_QPS_RTS, q.State())
		mr, err := pd.RegMR(make([]byte, 8192), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		hs[i] = host{q, cq, mr}
	}
	now := time.Unix(0, 0)
	for i := range hs {
		require.NoError(t, hs[1-i].q.PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{hs[1-i].mr.SGE(4096, 4096)}}))
		require.NoError(t, hs[i].q.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{hs[i].mr.SGE(0, 3000)}}))
	}
	var pkt bth.Packet
	for moved := true; moved; {
		moved = false
		for i := range hs {
			for hs[i].q.NextPacket(now, &pkt) {
				moved = true
				hs[1-i].q.HandlePacket(now, &pkt, 0)
			}
		}
	}
	for i := range hs {
		wc := make([]qp.WC, 4)
		n := hs[i].cq.Poll(wc)
		require.Equal(t, 2, n, "side %d completions", i)
		for _, w := range wc[:n] {
			require.Equal(t, qp.IBV_WC_SUCCESS, w.Status)
		}
	}
}

// A lost REP: the REQ's timer resends the REQ; the duplicate REQ makes the
// passive side resend its REP (IBTA 12.9.6), and the connection comes up.
func TestLostREPRetriesREQ(t *testing.T) {
	// B's REP timer (A's response timeout 22: 17 s) stays behind A's REQ
	// timer (6.44 s), so the duplicate REQ, not B's timer, brings the REP.
	p := newPair(t, Config{CMResponseTimeout: 22}, Config{})
	reps := 0
	p.drop = func(fromA bool, a AttrID) bool {
		if a == AttrREP {
			reps++
			return reps == 1
		}
		return false
	}
	idA, idB := p.connect()
	require.Equal(t, StateREQSent, p.a.State(idA))
	require.Equal(t, StateREPSent, p.b.State(idB))
	start := p.now
	p.advance()
	require.Equal(t, REQTimeout(&REQ{RemoteCMResponseTimeout: 20}, 18), p.now.Sub(start))
	require.Equal(t, []AttrID{AttrREQ, AttrREP, AttrREQ, AttrREP, AttrRTU}, p.sent)
	require.Equal(t, StateEstablished, p.a.State(idA))
	require.Equal(t, StateEstablished, p.b.State(idB))
	require.Equal(t, uint64(1), p.a.Counters().Retransmits)
	require.Equal(t, uint64(1), p.b.Counters().DuplicateREQs)
	require.Equal(t, uint64(0), p.b.Counters().Retransmits)
	require.Equal(t, []EventType{EventEstablished}, p.takeEvents(0))
	require.Equal(t, []EventType{EventConnectRequest, EventEstablished}, p.takeEvents(1))
}

// A lost RTU: the REP's timer resends the REP, the active side answers
// the duplicate REP with the RTU again.
func TestLostRTURetriesREP(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	rtus := 0
	p.drop = func(fromA bool, a AttrID) bool {
		if a == AttrRTU {
			rtus++
			return rtus == 1
		}
		return false
	}
	idA, idB := p.connect()
	require.Equal(t, StateEstablished, p.a.State(idA))
	require.Equal(t, StateREPSent, p.b.State(idB))
	start := p.now
	p.advance()
	// The passive side waits the active CM's response timeout (the REQ's
	// LocalCMResponseTimeout, 20) plus two packet lifetimes.
	require.Equal(t, IBTime(20)+2*IBTime(18), p.now.Sub(start))
	require.Equal(t, []AttrID{AttrREQ, AttrREP, AttrRTU, AttrREP, AttrRTU}, p.sent)
	require.Equal(t, StateEstablished, p.b.State(idB))
	require.Equal(t, uint64(1), p.b.Counters().Retransmits)
	require.Equal(t, uint64(1), p.a.Counters().DuplicateREPs)
	require.Equal(t, []EventType{EventConnectRequest, EventEstablished}, p.takeEvents(1))
	require.Equal(t, []EventType{EventEstablished}, p.takeEvents(0))
}

// A lost RTU, and the first RC packet arrives before the REP's timer: the
// caller reports it (IBV_EVENT_COMM_EST) and the passive side is
// established; the RTU that comes later is dropped and counted.
func TestLostRTUCommEstablished(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	p.drop = func(fromA bool, a AttrID) bool { return a == AttrRTU }
	_, idB := p.connect()
	require.Equal(t, StateREPSent, p.b.State(idB))
	require.False(t, p.b.CommEstablished(p.now, idB+1))
	require.True(t, p.b.CommEstablished(p.now, idB))
	require.False(t, p.b.CommEstablished(p.now, idB))
	require.Equal(t, StateEstablished, p.b.State(idB))
	require.True(t, p.b.Deadline().IsZero())
	p.deliver()
	require.Equal(t, []EventType{EventConnectRequest, EventEstablished}, p.takeEvents(1))
	require.Equal(t, uint64(1), p.b.Counters().CommEstablished)
	// A late RTU finds the connection established: dropped, counted.
	rtu, err := AppendMAD(nil, 1, &RTU{LocalCommID: p.lastRemote(idB), RemoteCommID: idB})
	require.NoError(t, err)
	require.ErrorIs(t, p.b.HandleMAD(p.now, addrA, rtu), ErrState)
	require.Equal(t, uint64(1), p.b.Counters().DropBadState)
}

func (p *pair) lastRemote(id uint32) uint32 {
	for _, c := range p.b.conns {
		if c.localID == id {
			return c.remoteID
		}
	}
	for _, c := range p.a.conns {
		if c.localID == id {
			return c.remoteID
		}
	}
	return 0
}

// A duplicate REQ before the consumer answers gets an MRA; the active
// side then waits the MRA's service timeout instead of resending.
func TestDuplicateREQBeforeAcceptSendsMRA(t *testing.T) {
	p := newPair(t, Config{}, Config{MRAServiceTimeout: 25})
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	idB := p.lastEvent(1, EventConnectRequest).ID
	start := p.now
	p.advance() // A resends the REQ; B answers with an MRA
	require.Equal(t, []AttrID{AttrREQ, AttrREQ, AttrMRA}, p.sent)
	require.Equal(t, StateMRAREQRcvd, p.a.State(idA))
	require.Equal(t, StateMRAREQSent, p.b.State(idB))
	require.Equal(t, p.now.Add(IBTime(25)+2*IBTime(18)), p.a.Deadline())
	// The consumer accepts late; the connection comes up.
	_, err = p.b.Accept(p.now, idB, acceptParams())
	require.NoError(t, err)
	p.deliver()
	require.Equal(t, StateEstablished, p.a.State(idA))
	require.Equal(t, StateEstablished, p.b.State(idB))
	require.Equal(t, []EventType{EventConnectRequest}, p.takeEvents(1)[:1])
	require.True(t, p.now.After(start))
}

func TestNoListenerRejectsAtOnce(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	dp := dialParams()
	dp.ServiceID = ServiceID(PortSpaceTCP, 9999)
	idA, err := p.a.Dial(p.now, dp)
	require.NoError(t, err)
	p.deliver()
	require.Equal(t, []AttrID{AttrREQ, AttrREJ}, p.sent)
	rej := p.lastEvent(0, EventRejected)
	require.Equal(t, RejInvalidServiceID, rej.Reason)
	require.Equal(t, idA, rej.ID)
	require.Zero(t, p.a.Len())
	require.Zero(t, p.b.Len())
	require.True(t, p.a.Deadline().IsZero())
	require.Equal(t, uint64(1), p.b.Counters().NoListener)
	require.Equal(t, uint64(1), p.b.Counters().RejectsSent)
	require.Equal(t, uint64(1), p.a.Counters().RejectsReceived)
	require.Empty(t, p.events[1])
}

func TestConsumerReject(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	idB := p.lastEvent(1, EventConnectRequest).ID
	require.ErrorIs(t, p.b.Reject(p.now, idB, RejConsumer, make([]byte, REJPrivateDataLen+1)), ErrFieldRange)
	require.NoError(t, p.b.Reject(p.now, idB, RejConsumer, []byte("busy")))
	require.ErrorIs(t, p.b.Reject(p.now, idB, RejConsumer, nil), ErrNoConnection)
	p.deliver()
	rej := p.lastEvent(0, EventRejected)
	require.Equal(t, RejConsumer, rej.Reason)
	require.Equal(t, "busy", string(rej.PrivateData[:4]))
	require.Zero(t, p.a.Len())
	require.Zero(t, p.b.Len())
	require.Equal(t, StateIdle, p.a.State(idA))
}

// The REQ unanswered: 1 + MaxCMRetries REQs, RemoteCMResponseTimeout + 2 *
// PacketLifeTime apart, then a REJ with reason timeout (ARI the CA GUID,
// as rxe sends in the perftest -R capture) and EventUnreachable.
func TestREQRetriesExhausted(t *testing.T) {
	p := newPair(t, Config{MaxCMRetries: 4}, Config{})
	p.drop = func(fromA bool, a AttrID) bool { return true }
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	start := p.now
	for range 5 {
		p.advance()
	}
	require.Equal(t, 5*REQTimeout(&REQ{RemoteCMResponseTimeout: 20}, 18), p.now.Sub(start))
	require.Equal(t, []AttrID{AttrREQ, AttrREQ, AttrREQ, AttrREQ, AttrREQ, AttrREJ}, p.sent)
	require.Equal(t, []EventType{EventUnreachable}, p.takeEvents(0))
	require.Zero(t, p.a.Len())
	require.True(t, p.a.Deadline().IsZero())
	require.Equal(t, StateIdle, p.a.State(idA))
	c := p.a.Counters()
	require.Equal(t, uint64(4), c.Retransmits)
	require.Equal(t, uint64(1), c.Timeouts)
	require.Equal(t, uint64(1), c.RejectsSent)
}

func TestTimeoutREJOnTheWire(t *testing.T) {
	m := NewManager(Config{CAGUID: 0x505400fffe123456, MaxCMRetries: 1})
	now := time.Unix(0, 0)
	id, err := m.Dial(now, dialParams())
	require.NoError(t, err)
	var last Outgoing
	for range 3 {
		for o, ok := m.PollMAD(); ok; o, ok = m.PollMAD() {
			last = o
		}
		m.HandleTimeout(m.Deadline())
	}
	for o, ok := m.PollMAD(); ok; o, ok = m.PollMAD() {
		last = o
	}
	_, msg, err := DecodeMAD(last.MAD[:])
	require.NoError(t, err)
	rej := msg.(*REJ)
	require.Equal(t, REJ{LocalCommID: id, MessageRejected: MsgOther, ARILength: 8, Reason: RejTimeout,
		ARI: [72]byte{0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56}}, *rej)
}

// The active side's MADs are all lost after its REQ: the passive side
// resends its REP MaxCMRetries times, then sends a REJ (timeout) and goes
// through TIMEWAIT; the active side, established by the first REP, takes
// the REJ to TIMEWAIT too.
func TestREPRetriesExhausted(t *testing.T) {
	p := newPair(t, Config{MaxCMRetries: 3}, Config{})
	reqs := 0
	p.drop = func(fromA bool, a AttrID) bool {
		if fromA && a == AttrREQ {
			reqs++
			return reqs > 1
		}
		return fromA
	}
	idA, idB := p.connect()
	for p.b.Len() > 0 {
		p.advance()
	}
	require.Equal(t, uint64(3), p.b.Counters().Retransmits)
	require.Equal(t, uint64(1), p.b.Counters().Timeouts)
	require.Equal(t, []EventType{EventConnectRequest, EventUnreachable, EventTimeWaitExit}, p.takeEvents(1))
	// A took the REJ at the same instant B entered TIMEWAIT: both leave it together.
	require.Equal(t, []EventType{EventEstablished, EventRejected, EventTimeWaitExit}, p.takeEvents(0))
	require.Equal(t, StateIdle, p.a.State(idA))
	require.Equal(t, StateIdle, p.b.State(idB))
	require.Equal(t, uint64(3), p.a.Counters().DuplicateREPs)
}

// A DREQ never answered: resent MaxCMRetries times, then TIMEWAIT with
// EventDisconnected{Timeout: true}.
func TestDREQRetriesExhausted(t *testing.T) {
	p := newPair(t, Config{MaxCMRetries: 2}, Config{})
	idA, _ := p.connect()
	p.takeEvents(0)
	p.drop = func(fromA bool, a AttrID) bool { return a == AttrDREQ }
	require.NoError(t, p.a.Disconnect(p.now, idA, []byte("bye")))
	require.ErrorIs(t, p.a.Disconnect(p.now, idA, nil), ErrState)
	p.deliver()
	p.advance()
	p.advance()
	require.Equal(t, StateDREQSent, p.a.State(idA))
	p.advance()
	require.Equal(t, StateTimeWait, p.a.State(idA))
	e := p.lastEvent(0, EventDisconnected)
	require.True(t, e.Timeout)
	require.Equal(t, uint64(2), p.a.Counters().Retransmits)
	p.advance()
	require.Zero(t, p.a.Len())
}

// The passive side disconnects; a DREQ that comes again in TIMEWAIT (our
// DREP was lost) is answered again.
func TestPassiveDisconnectAndLostDREP(t *testing.T) {
	// A's TIMEWAIT (4.096 us * 2^23, 34 s) outlasts B's DREQ timer (6.44 s).
	p := newPair(t, Config{PacketLifeTime: 22}, Config{})
	idA, idB := p.connect()
	dreps := 0
	p.drop = func(fromA bool, a AttrID) bool {
		if a == AttrDREP {
			dreps++
			return dreps == 1
		}
		return false
	}
	require.NoError(t, p.b.Disconnect(p.now, idB, nil))
	p.deliver()
	require.Equal(t, StateTimeWait, p.a.State(idA))
	require.Equal(t, StateDREQSent, p.b.State(idB))
	p.advance() // B resends the DREQ; A, in TIMEWAIT, answers with the DREP again
	require.Equal(t, StateTimeWait, p.b.State(idB))
	require.Equal(t, []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrDREQ, AttrDREP}, p.sent)
	for p.a.Len()+p.b.Len() > 0 {
		p.advance()
	}
}

func TestBadInputCountedDrops(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	idA, idB := p.connect()
	m := p.b
	before := m.Counters()
	good, err := AppendMAD(nil, 1, &RTU{LocalCommID: 1, RemoteCommID: 2})
	require.NoError(t, err)

	require.ErrorIs(t, m.HandleMAD(p.now, addrA, good[:100]), ErrTruncated)
	require.ErrorIs(t, m.HandleMAD(p.now, addrA, nil), ErrTruncated)
	bad := append([]byte(nil), good...)
	bad[1] = 0x04 // performance management class
	require.ErrorIs(t, m.HandleMAD(p.now, addrA, bad), ErrNotCM)
	lap := append([]byte(nil), good...)
	lap[17] = byte(AttrLAP)
	require.ErrorIs(t, m.HandleMAD(p.now, addrA, lap), ErrUnknownAttr)
	// REP, RTU, MRA, REJ, DREP for no connection.
	for _, msg := range []Message{&REP{RemoteCommID: 77, LocalQPN: 1}, &RTU{RemoteCommID: 77}, &MRA{RemoteCommID: 77},
		&REJ{RemoteCommID: 77}, &DREP{RemoteCommID: 77}} {
		b, err := AppendMAD(nil, 1, msg)
		require.NoError(t, err)
		require.ErrorIs(t, m.HandleMAD(p.now, addrA, b), ErrNoConnection, "%v", msg.Attr())
	}
	// The right IDs from the wrong address are no connection either.
	rtu, err := AppendMAD(nil, 1, &RTU{LocalCommID: idA, RemoteCommID: idB})
	require.NoError(t, err)
	require.ErrorIs(t, m.HandleMAD(p.now, netip.MustParseAddr("192.0.2.99"), rtu), ErrNoConnection)
	// A DREQ naming the wrong QPN.
	dreq, err := AppendMAD(nil, 1, &DREQ{LocalCommID: idA, RemoteCommID: idB, RemoteQPN: 0x999})
	require.NoError(t, err)
	require.Error(t, m.HandleMAD(p.now, addrA, dreq))
	require.Equal(t, StateEstablished, m.State(idB))

	c := m.Counters()
	require.Equal(t, before.DropMalformed+3, c.DropMalformed)
	require.Equal(t, before.DropUnknownAttr+1, c.DropUnknownAttr)
	require.Equal(t, before.DropUnknownConn+6, c.DropUnknownConn)
	require.Equal(t, before.DropBadQPN+1, c.DropBadQPN)
	require.Equal(t, before.MADsReceived+11, c.MADsReceived)
	_, ok := m.PollMAD()
	require.False(t, ok, "drops send nothing")

	// A DREQ for a connection nobody has still gets a DREP.
	dreq, err = AppendMAD(nil, 5, &DREQ{LocalCommID: 0xaa, RemoteCommID: 0xbb, RemoteQPN: 1})
	require.NoError(t, err)
	require.NoError(t, m.HandleMAD(p.now, addrA, dreq))
	o, ok := m.PollMAD()
	require.True(t, ok)
	h, msg, err := DecodeMAD(o.MAD[:])
	require.NoError(t, err)
	require.Equal(t, uint64(5), h.TransactionID)
	require.Equal(t, &DREP{LocalCommID: 0xbb, RemoteCommID: 0xaa}, msg)
	require.Equal(t, uint64(1), m.Counters().UnknownDREQs)
}

func TestREQChecks(t *testing.T) {
	m := NewManager(Config{MaxConnections: 1})
	require.NoError(t, m.Listen(svc))
	require.ErrorIs(t, m.Listen(svc), ErrListening)
	now := time.Unix(0, 0)
	reqMAD := func(id uint32, mut func(*REQ)) []byte {
		r := &REQ{LocalCommID: id, ServiceID: svc, LocalQPN: 5, PathMTU: 3}
		withIPHeader(r)
		mut(r)
		b, err := AppendMAD(nil, uint64(id), r)
		require.NoError(t, err)
		return b
	}
	rejReason := func() RejectReason {
		o, ok := m.PollMAD()
		require.True(t, ok)
		_, msg, err := DecodeMAD(o.MAD[:])
		require.NoError(t, err)
		return msg.(*REJ).Reason
	}
	require.Error(t, m.HandleMAD(now, addrA, reqMAD(1, func(r *REQ) { r.TransportServiceType = ServiceRD })))
	require.Equal(t, RejInvalidTransportType, rejReason())
	require.Error(t, m.HandleMAD(now, addrA, reqMAD(2, func(r *REQ) { r.PathMTU = 9 })))
	require.Equal(t, RejInvalidMTU, rejReason())
	require.NoError(t, m.HandleMAD(now, addrA, reqMAD(3, func(r *REQ) {})))
	require.ErrorIs(t, m.HandleMAD(now, addrA, reqMAD(4, func(r *REQ) {})), ErrTooManyConnections)
	require.Equal(t, RejNoResources, rejReason())
	_, err := m.Dial(now, dialParams())
	require.ErrorIs(t, err, ErrTooManyConnections)
	m.Unlisten(svc)
	require.Error(t, m.HandleMAD(now, addrA, reqMAD(5, func(r *REQ) {})))
	require.Equal(t, RejInvalidServiceID, rejReason())
	require.Equal(t, 1, m.Len())
}

func TestAPIErrors(t *testing.T) {
	m := NewManager(Config{})
	now := time.Unix(0, 0)
	for _, mut := range []func(*DialParams){
		func(p *DialParams) { p.QPN = 0 }, func(p *DialParams) { p.QPN = 1 << 24 },
		func(p *DialParams) { p.RetryCount = 8 }, func(p *DialParams) { p.PathMTU = 9 },
		func(p *DialParams) { p.StartingPSN = 1 << 24 }, func(p *DialParams) { p.Remote = netip.Addr{} },
		func(p *DialParams) { p.PrivateData = make([]byte, 57) },
		func(p *DialParams) { p.Remote = netip.MustParseAddr("fd00::1") }, // IP CM header of two families
	} {
		dp := dialParams()
		mut(&dp)
		_, err := m.Dial(now, dp)
		require.ErrorIs(t, err, ErrFieldRange)
	}
	require.Zero(t, m.Len())
	_, err := m.Accept(now, 1, acceptParams())
	require.ErrorIs(t, err, ErrNoConnection)
	require.ErrorIs(t, m.Disconnect(now, 1, nil), ErrNoConnection)
	id, err := m.Dial(now, dialParams())
	require.NoError(t, err)
	_, err = m.Accept(now, id, acceptParams())
	require.ErrorIs(t, err, ErrState)
	require.ErrorIs(t, m.Reject(now, id, RejConsumer, nil), ErrState)
	require.ErrorIs(t, m.Disconnect(now, id, nil), ErrState)
	// A service ID outside the IP CM space carries 92 bytes of private data.
	dp := dialParams()
	dp.ServiceID, dp.PrivateData = 0x1234, make([]byte, REQPrivateDataLen)
	_, err = m.Dial(now, dp)
	require.NoError(t, err)
}

// 50 connect/disconnect cycles, alternating who disconnects, leave no
// state behind once TIMEWAIT is over.
func TestFiftyCyclesLeaveNothing(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	seen := map[uint32]bool{}
	for i := range 50 {
		idA, idB := p.connect()
		require.False(t, seen[idA], "communication ID reused")
		seen[idA] = true
		require.Equal(t, StateEstablished, p.a.State(idA))
		require.Equal(t, StateEstablished, p.b.State(idB))
		if i%2 == 0 {
			require.NoError(t, p.a.Disconnect(p.now, idA, nil))
		} else {
			require.NoError(t, p.b.Disconnect(p.now, idB, nil))
		}
		p.deliver()
		if i%5 == 4 { // sometimes the next connection starts during TIMEWAIT
			continue
		}
		for p.a.Len()+p.b.Len() > 0 {
			p.advance()
		}
	}
	for p.a.Len()+p.b.Len() > 0 {
		p.advance()
	}
	for _, m := range []*Manager{p.a, p.b} {
		require.Zero(t, m.Len())
		require.Empty(t, m.remote)
		require.Empty(t, m.out)
		require.True(t, m.Deadline().IsZero())
		c := m.Counters()
		require.Zero(t, c.DropBadState+c.DropUnknownConn+c.DropMalformed+c.Retransmits+c.Timeouts)
	}
	require.Equal(t, 50, count(p.events[0], EventTimeWaitExit))
	require.Equal(t, 50, count(p.events[1], EventTimeWaitExit))
	require.Equal(t, 50, count(p.events[1], EventEstablished))
}

func count(es []Event, typ EventType) int {
	n := 0
	for _, e := range es {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// The REQ that rxe's rdma_cm sent in the capture, given to a Manager that
// listens on its port: a connect request with the capture's values, and a
// REP that carries them back.
func TestManagerTakesCapturedREQ(t *testing.T) {
	mads := readMADs(t, sharedCaptureRDMACM(t))
	m := NewManager(Config{CAGUID: 0x505400fffebf4369})
	require.NoError(t, m.Listen(ServiceID(PortSpaceTCP, 7471)))
	now := time.Unix(0, 0)
	require.NoError(t, m.HandleMAD(now, mads[0].src, mads[0].mad))
	e, ok := m.PollEvent()
	require.True(t, ok)
	require.Equal(t, EventConnectRequest, e.Type)
	require.True(t, e.HasIP)
	require.Equal(t, netip.MustParseAddrPort("192.168.65.5:37847"), e.IP.Src)
	require.Equal(t, uint32(0x11), e.Params.RemoteQPN)
	require.Equal(t, bth.PSN(0xe1a47d), e.Params.SQPSN)
	require.Equal(t, qp.IBV_MTU_1024, e.Params.PathMTU)
	require.Equal(t, uint8(19), e.Params.Timeout)
	require.Equal(t, netip.MustParseAddr("192.168.65.4"), e.Params.Local)
	pp, err := m.Accept(now, e.ID, AcceptParams{QPN: 0x11, StartingPSN: 0x8c84dd, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
	require.NoError(t, err)
	require.Equal(t, bth.PSN(0x8c84dd), pp.RQPSN)
	o, ok := m.PollMAD()
	require.True(t, ok)
	require.Equal(t, mads[0].src, o.To)
	// Our REP carries what rxe's REP in the capture carries, but for our
	// communication ID.
	_, want, err := DecodeMAD(mads[1].mad)
	require.NoError(t, err)
	h, got, err := DecodeMAD(o.MAD[:])
	require.NoError(t, err)
	require.Equal(t, uint64(0x0000000252b5cf34), h.TransactionID)
	w, g := want.(*REP), got.(*REP)
	w.LocalCommID, w.PrivateData = e.ID, [REPPrivateDataLen]byte{}
	require.Equal(t, w, g)
}

// BenchmarkConnectDisconnect runs one whole connection (REQ, REP, RTU,
// DREQ, DREP, TIMEWAIT on both sides) between two Managers per iteration.
func BenchmarkConnectDisconnect(b *testing.B) {
	p := newPair(b, Config{}, Config{})
	b.ReportAllocs()
	for b.Loop() {
		idA, _ := p.connect()
		if err := p.a.Disconnect(p.now, idA, nil); err != nil {
			b.Fatal(err)
		}
		p.deliver()
		for p.a.Len()+p.b.Len() > 0 {
			p.advance()
		}
		p.events = [2][]Event{}
		p.sent = p.sent[:0]
	}
}

// The consumer never answers: the active side's REQs get MRAs, its
// retries run out, and its timeout REJ makes the passive side forget the
// request (EventRejected) instead of holding it for ever.
func TestUnansweredRequestForgotten(t *testing.T) {
	p := newPair(t, Config{MaxCMRetries: 2}, Config{MRAServiceTimeout: 10})
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	idB := p.lastEvent(1, EventConnectRequest).ID
	for p.a.Len() > 0 {
		p.advance()
	}
	require.Equal(t, []AttrID{AttrREQ, AttrREQ, AttrMRA, AttrREQ, AttrMRA, AttrREJ}, p.sent)
	require.Equal(t, []EventType{EventUnreachable}, p.takeEvents(0))
	require.Equal(t, []EventType{EventConnectRequest, EventRejected}, p.takeEvents(1))
	require.Equal(t, StateIdle, p.a.State(idA))
	require.Equal(t, StateIdle, p.b.State(idB))
	require.Zero(t, p.b.Len())
	require.Empty(t, p.b.remote)
	require.Equal(t, uint64(2), p.b.Counters().DuplicateREQs)
}

func TestConnectIPv6(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	dp := dialParams()
	dp.Local, dp.Remote, dp.FlowLabel, dp.TrafficClass = a6, b6, 0x12345, 0x68
	idA, err := p.a.Dial(p.now, dp)
	require.NoError(t, err)
	o, ok := p.a.PollMAD()
	require.True(t, ok)
	require.Equal(t, b6, o.To)
	require.NoError(t, p.b.HandleMAD(p.now, a6, o.MAD[:]))
	e, ok := p.b.PollEvent()
	require.True(t, ok)
	require.True(t, e.HasIP)
	require.Equal(t, netip.AddrPortFrom(a6, 0xc725), e.IP.Src)
	require.Equal(t, b6, e.IP.Dst)
	require.Equal(t, a6, e.Request.Primary.LocalGID)
	require.Equal(t, b6, e.Params.Local)
	require.Equal(t, uint32(0x12345), e.Params.FlowLabel)
	require.Equal(t, uint8(0x68), e.Params.TrafficClass)
	_, err = p.b.Accept(p.now, e.ID, acceptParams())
	require.NoError(t, err)
	o, ok = p.b.PollMAD()
	require.True(t, ok)
	require.Equal(t, a6, o.To)
	require.NoError(t, p.a.HandleMAD(p.now, b6, o.MAD[:]))
	require.Equal(t, StateEstablished, p.a.State(idA))
	pa, ok := p.a.Params(idA)
	require.True(t, ok)
	at, _ := pa.RTRAttr()
	require.Equal(t, netip.AddrPortFrom(b6, 0), at.AV.Remote)
	require.Equal(t, a6, at.AV.Local)
	require.Equal(t, uint32(0x12345), at.AV.FlowLabel)
	// A MAD from no address is dropped and counted.
	require.Error(t, p.a.HandleMAD(p.now, netip.Addr{}, o.MAD[:]))
	require.Equal(t, uint64(1), p.a.Counters().DropMalformed)
}

func TestQPAttrsUC(t *testing.T) {
	pp := QPParams{TransportService: ServiceUC, RemoteQPN: 5, SQPSN: 9, RQPSN: 8, PathMTU: qp.IBV_MTU_4096, Timeout: 14,
		MaxRdAtomic: 1}
	a, m := pp.RTRAttr()
	require.Equal(t, qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN, m)
	require.Equal(t, bth.PSN(8), a.RQPSN)
	a, m = pp.RTSAttr()
	require.Equal(t, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN, m)
	require.Equal(t, bth.PSN(9), a.SQPSN)
	require.Zero(t, a.Timeout)
}

func TestACKTimeout(t *testing.T) {
	// Linux cm_ack_timeout: packet lifetime + 1, raised toward the CA's ACK delay.
	for _, tc := range []struct{ delay, plt, want uint8 }{
		{15, 18, 19}, {0, 18, 19}, {18, 18, 20}, {25, 18, 25}, {20, 18, 21}, {31, 31, 31},
	} {
		require.Equal(t, tc.want, ackTimeout(tc.delay, tc.plt), "delay %d lifetime %d", tc.delay, tc.plt)
	}
}

func TestGUIDFromMAC(t *testing.T) {
	require.Equal(t, uint64(0x505400fffe0aaaba), GUIDFromMAC([6]byte{0x52, 0x54, 0x00, 0x0a, 0xaa, 0xba}))
	require.Equal(t, uint64(0x505400fffebf4369), GUIDFromMAC([6]byte{0x52, 0x54, 0x00, 0xbf, 0x43, 0x69}))
}

// Transaction IDs as Linux's CM uses them (and the rxe capture shows):
// the REQ's for the REQ, REP, RTU and the active side's DREQ; a DREP
// answers with its DREQ's; a passive side's DREQ has a transaction ID of
// its own, ending in its communication ID.
func TestTransactionIDs(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	var tids []uint64
	tap := func(m *Manager) {
		for o, ok := m.PollMAD(); ok; o, ok = m.PollMAD() {
			var h Header
			require.NoError(t, h.Decode(o.MAD[:]))
			tids = append(tids, h.TransactionID)
			other, from := p.b, addrA
			if m == p.b {
				other, from = p.a, addrB
			}
			require.NoError(t, other.HandleMAD(p.now, from, o.MAD[:]))
		}
	}
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	tap(p.a)
	e, _ := p.b.PollEvent()
	_, err = p.b.Accept(p.now, e.ID, acceptParams())
	require.NoError(t, err)
	tap(p.b)
	tap(p.a)
	require.NoError(t, p.b.Disconnect(p.now, e.ID, nil))
	tap(p.b)
	tap(p.a)
	require.Len(t, tids, 5) // REQ, REP, RTU, DREQ, DREP
	require.Equal(t, uint32(idA), uint32(tids[0]))
	require.Equal(t, []uint64{tids[0], tids[0]}, tids[1:3])
	require.Equal(t, e.ID, uint32(tids[3]))
	require.Equal(t, tids[3], tids[4])
}

// The queues of MADs and events are bounded by Config.QueueLen; what does
// not fit is counted, never grown without bound.
func TestQueuesBounded(t *testing.T) {
	m := NewManager(Config{QueueLen: 2})
	require.NoError(t, m.Listen(svc))
	now := time.Unix(0, 0)
	for i := range 4 {
		r := &REQ{LocalCommID: uint32(i + 1), ServiceID: svc, LocalQPN: 5, PathMTU: 3}
		withIPHeader(r)
		b, err := AppendMAD(nil, 1, r)
		require.NoError(t, err)
		require.NoError(t, m.HandleMAD(now, addrA, b))
		b, err = AppendMAD(nil, 1, &DREQ{LocalCommID: 9, RemoteCommID: 9})
		require.NoError(t, err)
		require.NoError(t, m.HandleMAD(now, addrA, b)) // answered with a DREP
	}
	require.Equal(t, 4, m.Len())
	require.Len(t, m.events, 2)
	require.Len(t, m.out, 2)
	require.Equal(t, uint64(2+2), m.Counters().DropQueueFull)
	require.Equal(t, uint64(2), m.Counters().MADsSent)
}

func TestRandomPSNAndIDs(t *testing.T) {
	m := NewManager(Config{Rand: rand.New(rand.NewPCG(7, 7))})
	now := time.Unix(0, 0)
	psns := map[bth.PSN]bool{}
	for range 20 {
		dp := dialParams()
		dp.StartingPSN = 0
		id, err := m.Dial(now, dp)
		require.NoError(t, err)
		require.NotZero(t, id)
		pp, ok := m.Params(id)
		require.True(t, ok)
		require.True(t, pp.RQPSN.Valid())
		psns[pp.RQPSN] = true
	}
	require.Greater(t, len(psns), 15)
	_, ok := m.Params(12345)
	require.False(t, ok)
}

// An MRA for our REP (the active side needs time before its RTU) moves
// the passive side to MRA_REP_RCVD and stretches its REP timer by the
// MRA's service timeout.
func TestMRAForREP(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	p.drop = func(fromA bool, a AttrID) bool { return a == AttrRTU }
	idA, idB := p.connect()
	mra, err := AppendMAD(nil, 1, &MRA{LocalCommID: idA, RemoteCommID: idB, MessageMRAed: MsgREP, ServiceTimeout: 23})
	require.NoError(t, err)
	require.NoError(t, p.b.HandleMAD(p.now, addrA, mra))
	require.Equal(t, StateMRAREPRcvd, p.b.State(idB))
	require.Equal(t, p.now.Add(IBTime(23)+2*IBTime(18)), p.b.Deadline())
	// An MRA for a REQ we never sent on this connection is a counted drop.
	mra, err = AppendMAD(nil, 1, &MRA{LocalCommID: idA, RemoteCommID: idB, MessageMRAed: MsgREQ, ServiceTimeout: 23})
	require.NoError(t, err)
	require.ErrorIs(t, p.b.HandleMAD(p.now, addrA, mra), ErrState)
	p.drop = nil
	p.advance() // the REP goes again, and the RTU comes
	require.Equal(t, StateEstablished, p.b.State(idB))
}

func TestNames(t *testing.T) {
	require.Equal(t, "MRA_REP_RCVD", StateMRAREPRcvd.String())
	require.Equal(t, "state(42)", State(42).String())
	require.Equal(t, "TIMEWAIT_EXIT", EventTimeWaitExit.String())
	require.Equal(t, "event(0)", EventType(0).String())
	require.Equal(t, "event(42)", EventType(42).String())
}

func TestApplyError(t *testing.T) {
	pd := qp.NewDevice().NewPD()
	cq := qp.NewCQ(4)
	q, err := qp.New(qp.InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	pp := QPParams{TransportService: ServiceRC, PathMTU: qp.IBV_MTU_1024, RemoteQPN: 5, Remote: addrB}
	require.Error(t, pp.Apply(q), "a QP in RESET cannot go to RTR")
}

// Every check a REQ can fail runs before anything is reported or a REP
// can go out: a REQ naming a GID that is not ours, a UC REQ to an rdma_cm
// TCP port, an IP CM header that is not one, or one naming another
// destination each get a REJ with the reason Linux gives, are counted,
// and leave no connection; a good REQ after them is still taken.
func TestREQRejectedBeforeEvent(t *testing.T) {
	m := NewManager(Config{LocalGIDs: []netip.Addr{addrB}})
	require.NoError(t, m.Listen(svc))
	other := ServiceID(0x0200, 1) // not an RDMA IP CM service ID
	require.NoError(t, m.Listen(other))
	now := time.Unix(0, 0)
	handle := func(id uint32, mut func(*REQ)) error {
		r := &REQ{LocalCommID: id, ServiceID: svc, LocalQPN: 5, PathMTU: 3,
			Primary: Path{LocalGID: addrA, RemoteGID: addrB}}
		withIPHeader(r)
		mut(r)
		b, err := AppendMAD(nil, uint64(id), r)
		require.NoError(t, err)
		return m.HandleMAD(now, addrA, b)
	}
	rej := func(id uint32) *REJ {
		t.Helper()
		o, ok := m.PollMAD()
		require.True(t, ok)
		_, msg, err := DecodeMAD(o.MAD[:])
		require.NoError(t, err)
		r, ok := msg.(*REJ)
		require.True(t, ok, "a REJ, not %v", msg.Attr())
		require.Equal(t, id, r.RemoteCommID)
		require.Equal(t, uint8(MsgREQ), r.MessageRejected)
		_, more := m.PollMAD()
		require.False(t, more)
		return r
	}

	require.Error(t, handle(1, func(r *REQ) { r.Primary.RemoteGID = netip.MustParseAddr("192.0.2.99") }))
	r := rej(1)
	require.Equal(t, RejInvalidGID, r.Reason)
	gid := addrB.As16()
	require.Equal(t, uint8(16), r.ARILength)
	require.Equal(t, gid[:], r.ARIBytes())

	require.Error(t, handle(2, func(r *REQ) { r.TransportServiceType = ServiceUC }))
	require.Equal(t, RejConsumer, rej(2).Reason)

	require.Error(t, handle(3, func(r *REQ) { r.PrivateData[0] = 0x10 })) // major version 1
	require.Equal(t, RejConsumer, rej(3).Reason)
	require.Error(t, handle(4, func(r *REQ) { r.PrivateData[1] = 0x50 })) // IP version 5
	require.Equal(t, RejConsumer, rej(4).Reason)
	require.Error(t, handle(5, func(r *REQ) { r.PrivateData[35] ^= 0xff })) // another destination
	require.Equal(t, RejConsumer, rej(5).Reason)

	c := m.Counters()
	require.Equal(t, uint64(1), c.DropBadGID)
	require.Equal(t, uint64(1), c.DropBadTransport)
	require.Equal(t, uint64(3), c.DropBadPrivateData)
	require.Equal(t, uint64(5), c.RejectsSent)
	require.Zero(t, m.Len())
	_, ok := m.PollEvent()
	require.False(t, ok, "no rejected REQ reaches the consumer")

	// UC to a service ID that is not rdma_cm's, and RC to rdma_cm's TCP
	// port: both reported.
	require.NoError(t, handle(6, func(r *REQ) { r.ServiceID, r.TransportServiceType = other, ServiceUC }))
	require.NoError(t, handle(7, func(r *REQ) {}))
	require.Equal(t, 2, m.Len())
}

// When Accept's Apply fails (the QP cannot take the negotiated values), a
// REJ goes out instead of the REP, the active side sees EventRejected and
// never a REP, and the passive side forgets the connection.
func TestAcceptApplyFailsRejects(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	req := p.lastEvent(1, EventConnectRequest)
	ap := acceptParams()
	var seen QPParams
	ap.Apply = func(q *QPParams) error { seen = *q; return qp.ErrBadAttr }
	_, err = p.b.Accept(p.now, req.ID, ap)
	require.ErrorIs(t, err, qp.ErrBadAttr)
	require.Equal(t, uint32(0x12), seen.LocalQPN)
	require.Equal(t, bth.PSN(0x8c84dd), seen.RQPSN)
	p.deliver()
	require.Equal(t, []AttrID{AttrREQ, AttrREJ}, p.sent)
	require.Equal(t, RejConsumer, p.lastEvent(0, EventRejected).Reason)
	require.Equal(t, StateIdle, p.a.State(idA))
	require.Equal(t, StateIdle, p.b.State(req.ID))
	require.Equal(t, uint64(1), p.b.Counters().AcceptFailures)
	// A good Apply connects.
	applied := false
	ap.Apply = func(*QPParams) error { applied = true; return nil }
	idA, err = p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	idB := p.lastEvent(1, EventConnectRequest).ID
	_, err = p.b.Accept(p.now, idB, ap)
	require.NoError(t, err)
	p.deliver()
	require.True(t, applied)
	require.Equal(t, StateEstablished, p.a.State(idA))
	require.Equal(t, StateEstablished, p.b.State(idB))
}

// When Dial's Apply refuses the REP's values, a REJ (consumer defined,
// message REP) goes out instead of the RTU, the active side reports
// EventConnectError and forgets the connection, and the passive side,
// whose REP was rejected, enters TIMEWAIT with EventRejected.
func TestDialApplyFailsRejectsREP(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	dp := dialParams()
	var seen QPParams
	dp.Apply = func(q *QPParams) error { seen = *q; return qp.ErrBadAttr }
	idA, err := p.a.Dial(p.now, dp)
	require.NoError(t, err)
	p.deliver()
	idB := p.lastEvent(1, EventConnectRequest).ID
	_, err = p.b.Accept(p.now, idB, acceptParams())
	require.NoError(t, err)
	p.deliver()
	require.Equal(t, []AttrID{AttrREQ, AttrREP, AttrREJ}, p.sent)
	require.Equal(t, uint32(0x12), seen.RemoteQPN, "Apply saw the REP's values")
	require.Equal(t, bth.PSN(0x8c84dd), seen.SQPSN)
	e := p.lastEvent(0, EventConnectError)
	require.Equal(t, idA, e.ID)
	require.Equal(t, RejConsumer, e.Reason)
	require.Zero(t, count(p.events[0], EventEstablished))
	require.Equal(t, StateIdle, p.a.State(idA))
	require.Equal(t, uint64(1), p.a.Counters().REPsRefused)
	require.Equal(t, RejConsumer, p.lastEvent(1, EventRejected).Reason)
	require.Equal(t, StateTimeWait, p.b.State(idB))
	require.Equal(t, "CONNECT_ERROR", EventConnectError.String())
}
