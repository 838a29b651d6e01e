//go:build linux

package transport

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// udpPair opens two UDP Conns on loopback addresses with kernel-chosen
// ports (so tests never collide with a real 4791 listener).
func udpPair(t testing.TB) [2]Conn {
	var conns [2]Conn
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), UDPOptions{TOS: bth.TrafficClass(26, bth.ECT0), EphemeralPort: true})
		require.NoError(t, err)
		conns[i] = c
	}
	return conns
}

func TestUDPEveryOpcode(t *testing.T) {
	s := connect(t, udpPair(t), defaultPair())
	everyOpcode(t, s)
	// The peers verified nothing (ICRCAuto is off on UDP); check that what
	// crossed the wire carried the TOS we set.
	assert.Zero(t, s[1].ep.Stats().Malformed)
}

func TestUDPICRCVerifiesWithID0(t *testing.T) {
	conns := udpPair(t)
	var s [2]*side
	for i := range 2 {
		ep := NewEndpoint(conns[i], Options{ICRC: ICRCAssumeID0})
		t.Cleanup(func() { ep.Close() })
		pd := ep.NewPD()
		cq := ep.NewCQ(64)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true})
		require.NoError(t, err)
		s[i] = &side{ep, pd, cq, q}
	}
	cfg := defaultPair()
	for i := range 2 {
		q, peer := s[i].qp, s[1-i]
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_LOCAL_WRITE}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: cfg.mtu, DestQPN: peer.qp.QPN(), RQPSN: cfg.psn[1-i],
			MaxDestRdAtomic: 1, MinRNRTimer: 1, AV: qp.AddressVector{Remote: peer.ep.LocalAddr()}},
			qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: cfg.psn[i], Timeout: 12, RetryCnt: 1, RNRRetry: 1, MaxRdAtomic: 1},
			qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC))
	}
	src := pattern(5000, 1)
	dst := make([]byte, 5000)
	smr, _ := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 5000)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	wc := wait(t, s[0].cq, 1)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status, "every packet passed the receiver's ICRC check")
	s[1].ep.Sync()
	assert.Equal(t, src, dst)
	assert.Zero(t, s[1].ep.Stats().BadICRC)
	assert.Zero(t, s[0].ep.Stats().BadICRC)
	// The QP sends from the Linux source port for its QPN pair, unless
	// another socket on the machine (tests in other packages run at the
	// same time) holds that port: then it falls back to the receive port.
	want := bth.SourcePort(0, s[0].qp.QPN(), s[1].qp.QPN())
	if got := s[0].qp.SourcePort(); got != want {
		assert.Equal(t, conns[0].LocalAddr().Port(), got, "the fallback is the receive port")
		t.Logf("source port %d was taken; the QP fell back to the receive port %d", want, got)
	}
}

func TestUDPLossy(t *testing.T) {
	cfg := defaultPair()
	cfg.timeout = 8
	cfg.faults = [2]*Faults{NewFaults(1, LossRule(0.05)), NewFaults(2, LossRule(0.05))}
	s := connect(t, udpPair(t), cfg)
	a, b := s[0], s[1]
	n := 256 << 10
	src := pattern(n, 5)
	dst := make([]byte, n)
	back := make([]byte, n)
	smr, _ := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	kmr, _ := a.pd.RegMR(back, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE|qp.IBV_ACCESS_REMOTE_READ)
	require.NoError(t, b.qp.PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{dmr.SGE(0, n)}}))
	require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, n)}}))
	require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{kmr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	wc := wait(t, a.cq, 2)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[1].Status)
	b.ep.Sync()
	assert.Equal(t, src, dst)
	assert.Equal(t, src, back)
	assert.NotZero(t, a.qp.Counters().RetransmittedPkts)
}

func TestUDPDropsForeignSource(t *testing.T) {
	conns := udpPair(t)
	s := connect(t, conns, defaultPair())
	// A third socket sends a valid-looking packet to B's QP: B must drop it.
	c3, err := ListenUDP(netip.MustParseAddrPort("127.0.0.3:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer c3.Close()
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: s[1].qp.QPN(), PSN: 0x1000}, Payload: []byte("x")}
	e := bth.Encap{Src: c3.LocalAddr().Addr(), Dst: s[1].ep.LocalAddr().Addr(), SrcPort: c3.LocalAddr().Port(), DstPort: s[1].ep.LocalAddr().Port()}
	data, err := p.Append(nil, &e)
	require.NoError(t, err)
	_, err = c3.WriteBatch([]Datagram{{Data: data, Src: c3.LocalAddr(), Dst: s[1].ep.LocalAddr()}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s[1].ep.Stats().BadSource == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, uint64(0), s[1].qp.Counters().ReceivedPackets)
}

// Over real UDP sockets, strict source (the default) drops a SEND from the
// requester's address but another UDP port, and the real SEND lands.
func TestUDPStrictSourcePort(t *testing.T) {
	// A 1 s ACK timeout (18): a retransmission, after a first SEND slowed
	// past 16.7 ms by -race on a busy machine (2 runs in 100 before), would
	// be a duplicate too.
	cfg := defaultPair()
	cfg.timeout = 18
	s := connect(t, udpPair(t), cfg)
	a, b := s[0], s[1]
	src := []byte("real message")
	dst := make([]byte, 64)
	smr, err := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	dmr, err := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	recv := func(id uint64) {
		require.NoError(t, b.qp.PostRecv(qp.RecvWR{WRID: id, SGEs: []qp.SGE{dmr.SGE(0, len(dst))}}))
	}
	recv(1)
	require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(src))}}))
	wait(t, a.cq, 1)
	wait(t, b.cq, 1)
	port, pinned := b.qp.PeerSourcePort()
	require.True(t, pinned)
	require.Equal(t, a.qp.SourcePort(), port)

	// Another socket on A's address sends B the SEND A sends next.
	f, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer f.Close()
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: b.qp.QPN(), PSN: 0x1001}, Payload: []byte("forged")}
	e := bth.Encap{Src: f.LocalAddr().Addr(), Dst: b.ep.LocalAddr().Addr(), SrcPort: f.LocalAddr().Port(), DstPort: b.ep.LocalAddr().Port()}
	data, err := p.Append(nil, &e)
	require.NoError(t, err)
	recv(2)
	_, err = f.WriteBatch([]Datagram{{Data: data, Src: f.LocalAddr(), Dst: b.ep.LocalAddr()}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.ep.Stats().BadSourcePort == 1 }, 5*time.Second, time.Millisecond)
	b.ep.Sync()
	require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(src))}}))
	wait(t, a.cq, 1)
	wc := wait(t, b.cq, 1)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
	b.ep.Sync()
	assert.Equal(t, src, dst[:len(src)])
	assert.Zero(t, b.qp.Counters().DuplicateRequest)
}

// The UDP Conn over IPv6 (two endpoints on ::1, told apart by port):
// IPv6 headers in the ICRC, traffic class in and out.
func TestUDPIPv6(t *testing.T) {
	var conns [2]Conn
	for i := range 2 {
		c, err := ListenUDP(netip.MustParseAddrPort("[::1]:0"), UDPOptions{EphemeralPort: true})
		if err != nil {
			t.Skipf("no IPv6 loopback here: %v", err)
		}
		conns[i] = c
	}
	var s [2]*side
	for i := range 2 {
		ep := NewEndpoint(conns[i], Options{ICRC: ICRCAssumeID0, DSCP: 10})
		t.Cleanup(func() { ep.Close() })
		pd := ep.NewPD()
		cq := ep.NewCQ(64)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true})
		require.NoError(t, err)
		s[i] = &side{ep, pd, cq, q}
	}
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ
	for i := range 2 {
		require.NoError(t, s[i].qp.Connect(Remote{Addr: s[1-i].ep.LocalAddr(), QPN: s[1-i].qp.QPN(), PSN: 0xFFFFF0}, 0xFFFFF0, ConnectAttr{Access: access}))
	}
	src := pattern(100000, 4)
	back := make([]byte, len(src))
	dst := make([]byte, len(src))
	smr, _ := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	bmr, _ := s[0].pd.RegMR(back, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := s[1].pd.RegMR(dst, access)
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, len(src))}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{bmr.SGE(0, len(src))}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	wc := wait(t, s[0].cq, 2)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[1].Status)
	assert.Equal(t, src, back)
	assert.Zero(t, s[1].ep.Stats().BadICRC, "the receiver verified every ICRC over IPv6 headers")
	assert.Zero(t, s[0].ep.Stats().BadICRC)
	assert.NotZero(t, s[1].ep.Stats().Received)
}

// A source port another socket holds is not stolen: the Conn sends from
// its receive port instead.
func TestUDPSourcePortTaken(t *testing.T) {
	c, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer c.Close()
	other, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	require.NoError(t, err)
	defer other.Close()
	taken := uint16(other.LocalAddr().(*net.UDPAddr).Port)
	assert.Equal(t, c.LocalAddr().Port(), c.SourcePort(taken))
}

// The portable Conn (ListenUDP off Linux) runs the same end-to-end test on
// loopback here: every opcode, every size, one datagram per system call,
// no TOS read.
func TestStdUDPEveryOpcode(t *testing.T) {
	var conns [2]Conn
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := listenStd(netip.AddrPortFrom(netip.MustParseAddr(a), 0), UDPOptions{TOS: bth.TrafficClass(26, bth.ECT0), EphemeralPort: true})
		require.NoError(t, err)
		conns[i] = c
	}
	s := connect(t, conns, defaultPair())
	everyOpcode(t, s)
	assert.Zero(t, s[1].ep.Stats().Malformed)
	// A lossy run, so that retransmission goes through it too.
	cfg := defaultPair()
	cfg.timeout = 8
	cfg.faults = [2]*Faults{NewFaults(1, LossRule(0.05)), NewFaults(2, LossRule(0.05))}
	var lossy [2]Conn
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := listenStd(netip.AddrPortFrom(netip.MustParseAddr(a), 0), UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		lossy[i] = c
	}
	ls := connect(t, lossy, cfg)
	n := 64 << 10
	src := pattern(n, 7)
	dst := make([]byte, n)
	smr, _ := ls[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := ls[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, ls[0].qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	wc := wait(t, ls[0].cq, 1)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
	ls[1].ep.Sync()
	assert.Equal(t, src, dst)
}

// The portable Conn reports no TOS, and sends from the socket of each
// datagram's source port.
func TestStdUDPConn(t *testing.T) {
	a, err := listenStd(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer a.Close()
	b, err := listenStd(netip.MustParseAddrPort("127.0.0.2:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer b.Close()
	other, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	require.NoError(t, err)
	taken := uint16(other.LocalAddr().(*net.UDPAddr).Port)
	assert.Equal(t, a.LocalAddr().Port(), a.SourcePort(taken), "a taken port falls back to the receive port")
	other.Close()
	free := taken
	assert.Equal(t, free, a.SourcePort(free))
	_, err = a.WriteBatch([]Datagram{{Data: []byte("one"), Src: netip.AddrPortFrom(a.LocalAddr().Addr(), free), Dst: b.LocalAddr(), TOS: 0xFF},
		{Data: []byte("two"), Src: a.LocalAddr(), Dst: b.LocalAddr()}})
	require.NoError(t, err)
	ds := make([]Datagram, 4)
	ds[0].Data = make([]byte, 0, 2048)
	var got []string
	var ports []uint16
	for len(got) < 2 {
		n, err := b.ReadBatch(ds)
		require.NoError(t, err)
		require.Equal(t, 1, n, "one datagram per call")
		assert.False(t, ds[0].TOSKnown)
		got = append(got, string(ds[0].Data))
		ports = append(ports, ds[0].Src.Port())
	}
	assert.Equal(t, []string{"one", "two"}, got)
	assert.Equal(t, []uint16{free, a.LocalAddr().Port()}, ports)
	require.NoError(t, a.Close())
	_, err = a.ReadBatch(ds)
	assert.ErrorIs(t, err, net.ErrClosed)
}
