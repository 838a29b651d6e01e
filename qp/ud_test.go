package qp

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// udHost is one UD QP in RTS on its own device, with a 4 KiB region.
type udHost struct {
	q    *QP
	cq   *CQ
	pd   *PD
	mr   *MR
	addr netip.Addr
}

func newUDHost(t *testing.T, dev *Device, addr string, qpn, qkey uint32, srq *SRQ) *udHost {
	h := &udHost{cq: NewCQ(256), pd: dev.NewPD(), addr: netip.MustParseAddr(addr)}
	if srq != nil {
		h.pd = srq.PD()
	}
	var err error
	h.q, err = New(InitAttr{PD: h.pd, SendCQ: h.cq, RecvCQ: h.cq, QPN: qpn, QPType: IBV_QPT_UD, SRQ: srq, SQSigAll: true})
	require.NoError(t, err)
	if qpn == 1 {
		qkey = bth.GSIQKey // as Linux's ib_mad sets it on QP1
	}
	require.NoError(t, h.q.Modify(&Attr{State: IBV_QPS_INIT, QKey: qkey}, IBV_QP_STATE|IBV_QP_QKEY))
	require.NoError(t, h.q.Modify(&Attr{State: IBV_QPS_RTR}, IBV_QP_STATE))
	require.NoError(t, h.q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x500}, IBV_QP_STATE|IBV_QP_SQ_PSN))
	h.mr, err = h.pd.RegMR(make([]byte, 4096), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	return h
}

// send posts a UD SEND of data to (addr, qpn, qkey).
func (h *udHost) send(t *testing.T, wrid uint64, data []byte, to netip.Addr, qpn, qkey uint32, imm bool) error {
	copy(h.mr.Buf[2048:], data)
	wr := SendWR{WRID: wrid, Opcode: IBV_WR_SEND, SGEs: []SGE{h.mr.SGE(2048, len(data))},
		AH: &AddressVector{Remote: netip.AddrPortFrom(to, 4791)}, RemoteQPN: qpn, RemoteQKey: qkey}
	if imm {
		wr.Opcode, wr.ImmData = IBV_WR_SEND_WITH_IMM, 0x01020304
	}
	return h.q.PostSend(wr)
}

// handOver takes every packet from has to send, encodes it in the IP and
// UDP headers its work request's address gives (TOS tos, hop limit hop),
// checks and decodes it as a receiver would, and hands it by
// HandleReceived to the QP among to whose QPN it names. It returns the
// packets as they went and the RecvInfo each was given with.
func handOver(t *testing.T, now time.Time, from *udHost, tos, hop uint8, to ...*QP) ([]bth.Packet, []RecvInfo) {
	var out []bth.Packet
	var infos []RecvInfo
	var p bth.Packet
	for from.q.NextPacket(now, &p) {
		qpn, av := from.q.SentTo()
		require.Equal(t, qpn, p.BTH.DestQP, "SentTo names the packet's QP")
		e := bth.Encap{Src: from.addr, Dst: av.Remote.Addr(), SrcPort: bth.SourcePort(0, from.q.QPN, qpn),
			TrafficClass: tos, HopLimit: hop}
		data, err := p.Append(nil, &e)
		require.NoError(t, err)
		_, _, err = e.VerifyICRC(data)
		require.NoError(t, err)
		var in bth.Packet
		require.NoError(t, in.Decode(data))
		out = append(out, in)
		ri := RecvInfo{Src: netip.AddrPortFrom(e.Src, e.SrcPort), Dst: netip.AddrPortFrom(e.Dst, bth.UDPPort), TOS: tos, HopLimit: hop}
		infos = append(infos, ri)
		for _, q := range to {
			if q.QPN == qpn {
				q.HandleReceived(now, &in, &ri)
			}
		}
	}
	return out, infos
}

// ipv4Sum is the IPv4 header checksum (RFC 791), computed here apart from
// package bth.
func ipv4Sum(h []byte) uint16 {
	var s uint32
	for i := 0; i < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s>>16 != 0 {
		s = s&0xFFFF + s>>16
	}
	return ^uint16(s)
}

// wantGRH is the 40-byte slot rdma-core reads on RoCEv2 (rxe_resp.c
// execute): IPv4, 20 zero bytes and the IPv4 header; IPv6, the IPv6
// header. udpLen is the UDP payload, BTH to ICRC.
func wantGRH(src, dst netip.Addr, tos, hop uint8, udpLen int) []byte {
	g := make([]byte, GRHLen)
	if src.Is4() {
		h := g[20:]
		h[0], h[1] = 0x45, tos
		binary.BigEndian.PutUint16(h[2:], uint16(20+8+udpLen))
		h[6], h[8], h[9] = 0x40, hop, 17 // DF, TTL, UDP
		copy(h[12:], src.AsSlice())
		copy(h[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(h[10:], ipv4Sum(h[:20]))
		return g
	}
	g[0], g[1] = 0x60|tos>>4, tos<<4
	binary.BigEndian.PutUint16(g[4:], uint16(8+udpLen))
	g[6], g[7] = 17, hop
	copy(g[8:], src.AsSlice())
	copy(g[24:], dst.AsSlice())
	return g
}

// One IPv4 GRH written out by hand: 192.0.2.1 -> 192.0.2.2, TOS 0, TTL
// 64, a 5-byte SEND Only (UDP payload 12+8+5+3+4 = 32, IP total 60).
func TestGRHBytes(t *testing.T) {
	want, _ := hex.DecodeString("0000000000000000000000000000000000000000" +
		"4500003c000040004011b6adc0000201c0000202")
	assert.Equal(t, want, wantGRH(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 0, 64, 32))
	var b [GRHLen]byte
	ri := RecvInfo{Src: netip.MustParseAddrPort("192.0.2.1:49152"), Dst: netip.MustParseAddrPort("192.0.2.2:4791"), HopLimit: 64}
	require.True(t, grh(&b, &ri, 32))
	assert.Equal(t, want, b[:])
	assert.False(t, grh(&b, nil, 32))
	assert.Equal(t, make([]byte, GRHLen), b[:])
	ri.Dst = netip.MustParseAddrPort("[fd00::2]:4791")
	assert.False(t, grh(&b, &ri, 32), "addresses of two families")
}

// A UD SEND arrives with the GRH slot filled as rdma-core expects on
// RoCEv2, byte by byte, the source QPN and address in the completion,
// and the DETH the work request asked for.
func TestUDSendGRH(t *testing.T) {
	cases := []struct {
		name       string
		a, b       string
		tos, hop   uint8
		imm        bool
		n          int
		wantUDPLen int
	}{
		{"IPv4", "192.0.2.1", "192.0.2.2", 0, 64, false, 5, 12 + 8 + 5 + 3 + 4},
		{"IPv4 TOS TTL imm", "10.0.0.1", "10.0.0.2", 0x6A, 1, true, 256, 12 + 8 + 4 + 256 + 4},
		{"IPv6", "fd00::1", "fd00::2", 0, 64, false, 1024, 12 + 8 + 1024 + 4},
		{"IPv6 traffic class imm", "2001:db8::a", "2001:db8::b", 0xB9, 255, true, 7, 12 + 8 + 4 + 7 + 1 + 4},
		{"IPv4 empty", "192.0.2.1", "192.0.2.2", 2, 64, false, 0, 12 + 8 + 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := time.Unix(1700000000, 0)
			a := newUDHost(t, NewDevice(), c.a, 0x11, 0x5555, nil)
			b := newUDHost(t, NewDevice(), c.b, 0x22, 0x1234, nil)
			for i := range b.mr.Buf {
				b.mr.Buf[i] = 0xEE
			}
			require.NoError(t, b.q.PostRecv(RecvWR{WRID: 7, SGEs: []SGE{b.mr.SGE(0, GRHLen+1024)}}))
			data := pattern(c.n, 4)
			require.NoError(t, a.send(t, 1, data, b.addr, 0x22, 0x1234, c.imm))
			pkts, infos := handOver(t, now, a, c.tos, c.hop, b.q)
			require.Len(t, pkts, 1)
			p := pkts[0]
			assert.Equal(t, bth.UDSendOnly+bth.Opcode(map[bool]int{false: 0, true: 1}[c.imm]), p.BTH.Opcode)
			assert.Equal(t, bth.DETH{QKey: 0x1234, SrcQP: 0x11}, p.DETH)
			assert.Equal(t, bth.PSN(0x500), p.BTH.PSN)
			assert.False(t, p.BTH.AckReq)
			assert.Equal(t, c.wantUDPLen, p.Len())

			sc := make([]WC, 2)
			require.Equal(t, 1, a.cq.Poll(sc), "the send completes when the packet leaves")
			assert.Equal(t, WC{WRID: 1, Opcode: IBV_WC_SEND, ByteLen: uint32(c.n), QPNum: 0x11}, sc[0])
			rc := make([]WC, 2)
			require.Equal(t, 1, b.cq.Poll(rc))
			want := WC{WRID: 7, Opcode: IBV_WC_RECV, ByteLen: uint32(GRHLen + c.n), Flags: IBV_WC_GRH,
				QPNum: 0x22, SrcQP: 0x11, SrcAddr: infos[0].Src}
			if c.imm {
				want.Flags |= IBV_WC_WITH_IMM
				want.ImmData = 0x01020304
			}
			assert.Equal(t, want, rc[0])
			assert.Equal(t, wantGRH(a.addr, b.addr, c.tos, c.hop, c.wantUDPLen), b.mr.Buf[:GRHLen], "GRH slot")
			assert.True(t, bytes.Equal(data, b.mr.Buf[GRHLen:GRHLen+c.n]))
			assert.Equal(t, byte(0xEE), b.mr.Buf[GRHLen+c.n], "nothing written past the message")

			// The next datagram takes the next PSN.
			require.NoError(t, a.send(t, 2, data[:min(c.n, 1)], b.addr, 0x22, 0x1234, false))
			pkts, _ = handOver(t, now, a, c.tos, c.hop)
			assert.Equal(t, bth.PSN(0x501), pkts[0].BTH.PSN)
		})
	}
}

// Q_Keys: a datagram with another Q_Key is dropped and counted; a work
// request's Q_Key with the high bit set sends the QP's own (IBTA C10-15).
func TestUDQKey(t *testing.T) {
	now := time.Unix(1700000000, 0)
	a := newUDHost(t, NewDevice(), "192.0.2.1", 0x11, 0x1234, nil)
	b := newUDHost(t, NewDevice(), "192.0.2.2", 0x22, 0x1234, nil)
	require.NoError(t, b.q.PostRecv(RecvWR{WRID: 7, SGEs: []SGE{b.mr.SGE(0, 1024)}}))
	require.NoError(t, a.send(t, 1, []byte("bad"), b.addr, 0x22, 0x4321, false))
	handOver(t, now, a, 0, 64, b.q)
	assert.Equal(t, uint64(1), b.q.Counters.QKeyViolations)
	assert.Equal(t, uint64(1), b.q.Counters.Drops())
	assert.Zero(t, b.cq.Len())
	assert.Equal(t, 1, b.q.RecvQueued(), "no receive WQE taken")

	require.NoError(t, a.send(t, 2, []byte("own"), b.addr, 0x22, 0x80000000, false))
	pkts, _ := handOver(t, now, a, 0, 64, b.q)
	assert.Equal(t, uint32(0x1234), pkts[0].DETH.QKey, "the QP's own Q_Key")
	assert.Equal(t, 1, b.cq.Len())
	assert.Equal(t, uint64(1), b.q.Counters.QKeyViolations)

	// Modify changes the Q_Key in RTS.
	require.NoError(t, b.q.Modify(&Attr{State: IBV_QPS_RTS, QKey: 0x99}, IBV_QP_STATE|IBV_QP_QKEY))
	assert.Equal(t, uint32(0x99), b.q.Attr().QKey)
}

// A UD message is one packet of at most the MTU: a larger one is refused
// at post time; the MTU is the device's active MTU when the QP is made.
func TestUDMessageSize(t *testing.T) {
	dev := NewDevice()
	assert.Equal(t, IBV_MTU_1024, dev.ActiveMTU())
	a := newUDHost(t, dev, "192.0.2.1", 0x11, 1, nil)
	to := netip.MustParseAddr("192.0.2.2")
	require.NoError(t, a.send(t, 1, make([]byte, 1024), to, 0x22, 1, false))
	err := a.send(t, 2, make([]byte, 1025), to, 0x22, 1, false)
	assert.ErrorIs(t, err, ErrBadWR)
	assert.ErrorContains(t, err, "over the MTU")
	assert.Equal(t, 1, a.q.SendQueued())

	require.ErrorIs(t, dev.SetActiveMTU(7), ErrBadAttr)
	require.NoError(t, dev.SetActiveMTU(IBV_MTU_4096))
	big := newUDHost(t, dev, "192.0.2.1", 0x12, 1, nil)
	assert.Equal(t, IBV_MTU_4096, big.q.Attr().PathMTU)
	wr := SendWR{Opcode: IBV_WR_SEND, SGEs: []SGE{big.mr.SGE(0, 4096)}, AH: &AddressVector{Remote: netip.AddrPortFrom(to, 0)}, RemoteQPN: 0x22}
	require.NoError(t, big.q.PostSend(wr))
	wr.SGEs = []SGE{big.mr.SGE(0, 2048), big.mr.SGE(0, 2049)}
	assert.ErrorIs(t, big.q.PostSend(wr), ErrBadWR)

	// UD carries SEND only, and needs an address.
	for _, op := range []WROpcode{IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND_WITH_INV} {
		assert.ErrorIs(t, a.q.PostSend(SendWR{Opcode: op, AH: wr.AH, RemoteQPN: 0x22}), ErrBadWR, "%s", op)
	}
	assert.ErrorIs(t, a.q.PostSend(SendWR{Opcode: IBV_WR_SEND, RemoteQPN: 0x22}), ErrBadWR, "no address")

	// A datagram over the receiver's MTU is dropped.
	b := newUDHost(t, NewDevice(), "192.0.2.2", 0x22, 1, nil)
	require.NoError(t, b.q.PostRecv(RecvWR{WRID: 1, SGEs: []SGE{b.mr.SGE(0, 4096)}}))
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: 0x22}, DETH: bth.DETH{QKey: 1, SrcQP: 0x12},
		Payload: make([]byte, 2048)}
	b.q.HandlePacket(time.Time{}, &p, bth.NotECT)
	assert.Zero(t, b.cq.Len())
	assert.Equal(t, uint64(1), b.q.Counters.DroppedMsgPkts)
	assert.Equal(t, 1, b.q.RecvQueued())
}

// Without RecvInfo (HandlePacket) a UD receive still skips the GRH slot,
// writes it zero and does not claim IBV_WC_GRH.
func TestUDWithoutRecvInfo(t *testing.T) {
	b := newUDHost(t, NewDevice(), "192.0.2.2", 0x22, 1, nil)
	for i := range b.mr.Buf {
		b.mr.Buf[i] = 0xEE
	}
	require.NoError(t, b.q.PostRecv(RecvWR{WRID: 1, SGEs: []SGE{b.mr.SGE(0, 100)}}))
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: 0x22, PSN: 77}, DETH: bth.DETH{QKey: 1, SrcQP: 0x12},
		Payload: []byte("hi")}
	b.q.HandlePacket(time.Time{}, &p, bth.NotECT)
	wc := make([]WC, 1)
	require.Equal(t, 1, b.cq.Poll(wc))
	assert.Equal(t, WC{WRID: 1, Opcode: IBV_WC_RECV, ByteLen: GRHLen + 2, QPNum: 0x22, SrcQP: 0x12}, wc[0])
	assert.Equal(t, make([]byte, GRHLen), b.mr.Buf[:GRHLen])
	assert.Equal(t, []byte("hi"), b.mr.Buf[GRHLen:GRHLen+2])
	// PSNs are not checked: any PSN is taken.
	require.NoError(t, b.q.PostRecv(RecvWR{WRID: 2, SGEs: []SGE{b.mr.SGE(0, 100)}}))
	p.BTH.PSN = 3
	b.q.HandlePacket(time.Time{}, &p, bth.NotECT)
	assert.Equal(t, 1, b.cq.Len())
}

// QP1, the GSI QP: a UD QP with QPN 1 whose Q_Key is 0x80010000; CM MADs
// go from QP1 to QP1 (docs/wire-format.md section 9: CM over rdma_cm).
func TestGSIQP(t *testing.T) {
	now := time.Unix(1700000000, 0)
	devA, devB := NewDevice(), NewDevice()
	a := newUDHost(t, devA, "192.0.2.1", 1, 0, nil)
	b := newUDHost(t, devB, "192.0.2.2", 1, 0, nil)
	assert.Equal(t, uint32(bth.GSIQKey), a.q.Attr().QKey)
	_, err := New(InitAttr{PD: a.pd, SendCQ: a.cq, RecvCQ: a.cq, QPN: 1, QPType: IBV_QPT_UD})
	assert.ErrorIs(t, err, ErrQPNInUse, "one QP1 per device")
	_, err = New(InitAttr{PD: a.pd, SendCQ: a.cq, RecvCQ: a.cq, QPN: 1, QPType: IBV_QPT_UC})
	assert.ErrorIs(t, err, ErrBadAttr, "QP1 is UD")
	assert.ErrorIs(t, a.q.Modify(&Attr{State: IBV_QPS_RTS, QKey: 5}, IBV_QP_STATE|IBV_QP_QKEY), ErrBadAttr)
	require.NoError(t, a.q.Modify(&Attr{State: IBV_QPS_RTS, QKey: bth.GSIQKey}, IBV_QP_STATE|IBV_QP_QKEY))

	require.NoError(t, b.q.PostRecv(RecvWR{WRID: 3, SGEs: []SGE{b.mr.SGE(0, GRHLen+256)}}))
	mad := pattern(256, 0x10)
	require.NoError(t, a.send(t, 1, mad, b.addr, 1, bth.GSIQKey, false))
	pkts, _ := handOver(t, now, a, 0, 64, b.q)
	assert.Equal(t, bth.DETH{QKey: bth.GSIQKey, SrcQP: 1}, pkts[0].DETH)
	assert.Equal(t, uint32(1), pkts[0].BTH.DestQP)
	wc := make([]WC, 1)
	require.Equal(t, 1, b.cq.Poll(wc))
	assert.Equal(t, IBV_WC_SUCCESS, wc[0].Status)
	assert.Equal(t, uint32(1), wc[0].SrcQP)
	assert.Equal(t, uint32(GRHLen+256), wc[0].ByteLen)
	assert.True(t, bytes.Equal(mad, b.mr.Buf[GRHLen:GRHLen+256]))

	// A MAD with another Q_Key is not QP1's.
	require.NoError(t, b.q.PostRecv(RecvWR{WRID: 4, SGEs: []SGE{b.mr.SGE(0, GRHLen+256)}}))
	require.NoError(t, a.send(t, 2, mad, b.addr, 1, 0x1234, false))
	handOver(t, now, a, 0, 64, b.q)
	assert.Equal(t, uint64(1), b.q.Counters.QKeyViolations)

	a.q.Destroy()
	q1, err := New(InitAttr{PD: a.pd, SendCQ: a.cq, RecvCQ: a.cq, QPN: 1, QPType: IBV_QPT_UD})
	require.NoError(t, err, "QPN 1 is free again")
	assert.Equal(t, uint32(1), q1.QPN)
}

// UD's state machine: a Q_Key to reach INIT; no address, path MTU,
// destination QPN or RQ PSN.
func TestUDTransitions(t *testing.T) {
	pd := NewDevice().NewPD()
	cq := NewCQ(4)
	q, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPType: IBV_QPT_UD})
	require.NoError(t, err)
	assert.Equal(t, IBV_QPT_UD, q.Type())
	assert.ErrorIs(t, q.Modify(&Attr{State: IBV_QPS_INIT}, IBV_QP_STATE), ErrBadTransition)
	assert.ErrorIs(t, q.Modify(&Attr{State: IBV_QPS_INIT, QKey: 1}, IBV_QP_STATE|IBV_QP_QKEY|IBV_QP_ACCESS_FLAGS), ErrBadTransition)
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, QKey: 1}, IBV_QP_STATE|IBV_QP_QKEY))
	av := AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}
	for _, m := range []AttrMask{IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC} {
		assert.ErrorIs(t, q.Modify(&Attr{State: IBV_QPS_RTR, AV: av, PathMTU: IBV_MTU_256, DestQPN: 2}, IBV_QP_STATE|m), ErrBadTransition, "%s", m)
	}
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR}, IBV_QP_STATE))
	assert.ErrorIs(t, q.Modify(&Attr{State: IBV_QPS_RTS}, IBV_QP_STATE), ErrBadTransition, "needs SQ_PSN")
	assert.ErrorIs(t, q.Modify(&Attr{State: IBV_QPS_RTS}, IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT), ErrBadTransition)
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 9}, IBV_QP_STATE|IBV_QP_SQ_PSN))
	assert.Equal(t, "STATE|QKEY", (IBV_QP_STATE | IBV_QP_QKEY).String())
}

// The address handle is copied at post time: the caller may reuse it.
func TestUDAddressCopied(t *testing.T) {
	a := newUDHost(t, NewDevice(), "192.0.2.1", 0x11, 1, nil)
	av := &AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791"), TrafficClass: 0x10}
	require.NoError(t, a.q.PostSend(SendWR{Opcode: IBV_WR_SEND, AH: av, RemoteQPN: 0x22}))
	av.Remote = netip.MustParseAddrPort("192.0.2.9:4791")
	var p bth.Packet
	require.True(t, a.q.NextPacket(time.Time{}, &p))
	qpn, got := a.q.SentTo()
	assert.Equal(t, uint32(0x22), qpn)
	assert.Equal(t, AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791"), TrafficClass: 0x10}, got)
}
