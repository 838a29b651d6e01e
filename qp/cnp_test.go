package qp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ccQP returns a QP in RTS on pd with DCQCN parameters p and P_Key pkey.
func ccQP(t *testing.T, pd *PD, qpn uint32, p cc.Params, pkey uint16) *QP {
	cq := NewCQ(64)
	q, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPN: qpn, CC: &p})
	require.NoError(t, err)
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, PKey: pkey, AccessFlags: IBV_ACCESS_LOCAL_WRITE}, IBV_QP_STATE|IBV_QP_PKEY_INDEX|IBV_QP_ACCESS_FLAGS))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x200,
		MaxDestRdAtomic: 1, MinRNRTimer: 1, AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}},
		IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC))
	return q
}

// marked feeds q a CE-marked request at now and reports whether a CNP
// came out.
func marked(q *QP, now time.Time) bool {
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: q.QPN, PSN: 0x205}}
	q.HandlePacket(now, &p, bth.CE)
	return cnpOut(q, now)
}

func cnpOut(q *QP, now time.Time) bool {
	var out bth.Packet
	cnp := false
	for q.NextPacket(now, &out) {
		if out.BTH.Opcode == bth.CNP {
			cnp = true
		}
	}
	return cnp
}

// mlx5 paces CNPs per port: two QPs of one device share the 4 us.
func TestCNPPacedPerPort(t *testing.T) {
	p, err := cc.Profile(cc.ProfileMLX5, 40*cc.Gbps)
	require.NoError(t, err)
	pd := NewDevice().NewPD()
	a, b := ccQP(t, pd, 0x11, p, 0), ccQP(t, pd, 0x12, p, 0)
	t0 := time.Unix(1700000000, 0)
	assert.True(t, marked(a, t0))
	assert.False(t, marked(b, t0.Add(2*time.Microsecond)), "the port sent a CNP 2 us ago")
	assert.True(t, marked(b, t0.Add(5*time.Microsecond)))
	// Per QP (the paper's rule with mlx5's interval), B has its own.
	p.CNPPerPort = false
	pd = NewDevice().NewPD()
	a, b = ccQP(t, pd, 0x11, p, 0), ccQP(t, pd, 0x12, p, 0)
	assert.True(t, marked(a, t0))
	assert.True(t, marked(b, t0.Add(2*time.Microsecond)))
}

// The paper's notification point sends one CNP at the end of a window
// that saw marks.
func TestCNPAtWindowEnd(t *testing.T) {
	p, err := cc.Profile(cc.ProfilePaper, 40*cc.Gbps)
	require.NoError(t, err)
	q := ccQP(t, NewDevice().NewPD(), 0x11, p, 0)
	t0 := time.Unix(1700000000, 0)
	assert.True(t, marked(q, t0))
	assert.False(t, marked(q, t0.Add(10*time.Microsecond)))
	end := t0.Add(50 * time.Microsecond)
	assert.False(t, q.Deadline().After(end), "the QP wakes by the window's end")
	q.HandleTimeout(end)
	assert.True(t, cnpOut(q, end), "the CNP for the mark at 10 us")
	assert.Equal(t, uint64(2), q.Counters.NPCNPSent)
}

// ConnectX sends CNPs with P_Key 0xFFFF: a QP with another P_Key takes
// them; a CNP with a third P_Key is still a violation.
func TestCNPDefaultPKeyAccepted(t *testing.T) {
	p, err := cc.Profile(cc.ProfileMLX5, 40*cc.Gbps)
	require.NoError(t, err)
	q := ccQP(t, NewDevice().NewPD(), 0x11, p, 0x8123)
	now := time.Unix(1700000000, 0)
	cnp := bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: 0x11}}
	q.HandlePacket(now, &cnp, bth.NotECT)
	assert.Equal(t, uint64(1), q.Counters.RPCNPHandled)
	assert.Zero(t, q.Counters.PKeyViolations)
	cnp.BTH.PKey = 0x1234
	q.HandlePacket(now, &cnp, bth.NotECT)
	assert.Equal(t, uint64(1), q.Counters.PKeyViolations)
	cnp.BTH.PKey = 0x0123 // the QP's partition, limited membership
	q.HandlePacket(now, &cnp, bth.NotECT)
	assert.Equal(t, uint64(2), q.Counters.RPCNPHandled)
}

// npQP returns a QP in RTS like ccQP, with init's congestion fields.
func npQP(t *testing.T, pd *PD, qpn uint32, init InitAttr) *QP {
	cq := NewCQ(64)
	init.PD, init.SendCQ, init.RecvCQ, init.QPN = pd, cq, cq, qpn
	q, err := New(init)
	require.NoError(t, err)
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: IBV_ACCESS_LOCAL_WRITE}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x200,
		MaxDestRdAtomic: 1, MinRNRTimer: 1, AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}},
		IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC))
	return q
}

// A QP with the notification point alone (a ConnectX whose reaction
// point is off) answers CE with CNPs at mlx5's interval, sends unpaced and
// ignores the CNPs it receives.
func TestNotificationPointAlone(t *testing.T) {
	p, err := cc.Profile(cc.ProfileMLX5, 40*cc.Gbps)
	require.NoError(t, err)
	pd := NewDevice().NewPD()
	q := npQP(t, pd, 0x11, InitAttr{NP: &p})
	t0 := time.Unix(1700000000, 0)
	assert.True(t, marked(q, t0), "the first mark is answered")
	assert.False(t, marked(q, t0.Add(3*time.Microsecond)), "inside min_time_between_cnps (4 us)")
	assert.True(t, marked(q, t0.Add(4*time.Microsecond)), "the interval is over")
	assert.False(t, marked(q, t0.Add(5*time.Microsecond)))
	assert.True(t, q.Deadline().IsZero(), "mlx5 drops the marks inside the interval: no window-end timer")
	assert.Equal(t, uint64(4), q.Counters.NPECNMarked)
	assert.Equal(t, uint64(2), q.Counters.NPCNPSent)
	// Not CE-marked: nothing.
	pk := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: q.QPN, PSN: 0x206}}
	q.HandlePacket(t0.Add(time.Second), &pk, bth.ECT0)
	assert.False(t, cnpOut(q, t0.Add(time.Second)))
	// No reaction point: no rate, CNPs ignored as mlx5 counts them.
	_, _, ok := q.CCState()
	assert.False(t, ok)
	cnp := bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: 0x11}}
	q.HandlePacket(t0, &cnp, bth.NotECT)
	assert.Equal(t, uint64(1), q.Counters.RPCNPIgnored)
	assert.Zero(t, q.Counters.RPCNPHandled)
	cuts, _ := q.CCCuts()
	assert.Zero(t, cuts)

	// Per port, as mlx5: a second QP of the device shares the interval.
	b := npQP(t, pd, 0x12, InitAttr{NP: &p})
	assert.False(t, marked(b, t0.Add(6*time.Microsecond)), "the port sent a CNP 2 us ago")
	assert.True(t, marked(b, t0.Add(8*time.Microsecond)))

	// The paper's notification point alone: one CNP at the window's end.
	pp, err := cc.Profile(cc.ProfilePaper, 40*cc.Gbps)
	require.NoError(t, err)
	w := npQP(t, NewDevice().NewPD(), 0x11, InitAttr{NP: &pp})
	assert.True(t, marked(w, t0))
	assert.False(t, marked(w, t0.Add(10*time.Microsecond)))
	end := t0.Add(50 * time.Microsecond)
	assert.Equal(t, end, w.Deadline(), "the QP wakes at the window's end")
	w.HandleTimeout(end)
	assert.True(t, cnpOut(w, end))
	assert.Equal(t, uint64(2), w.Counters.NPCNPSent)
}

// RPOnly: the reaction point without the notification point counts CE
// marks and sends no CNP; a CNP it receives cuts its rate.
func TestReactionPointOnly(t *testing.T) {
	p, err := cc.Profile(cc.ProfilePaper, 40*cc.Gbps)
	require.NoError(t, err)
	q := npQP(t, NewDevice().NewPD(), 0x11, InitAttr{CC: &p, RPOnly: true})
	t0 := time.Unix(1700000000, 0)
	assert.False(t, marked(q, t0))
	assert.Equal(t, uint64(1), q.Counters.NPECNMarked)
	assert.Zero(t, q.Counters.NPCNPSent)
	cnp := bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: 0x11}}
	q.HandlePacket(t0, &cnp, bth.NotECT)
	assert.Equal(t, uint64(1), q.Counters.RPCNPHandled)
	cuts, coalesced := q.CCCuts()
	assert.Equal(t, uint64(1), cuts, "the paper cuts at each CNP")
	assert.Zero(t, coalesced)
	rate, _, ok := q.CCState()
	assert.True(t, ok)
	assert.Less(t, float64(rate), float64(40*cc.Gbps))
}

func TestNotificationPointAttrErrors(t *testing.T) {
	p, err := cc.Profile(cc.ProfileMLX5, 40*cc.Gbps)
	require.NoError(t, err)
	pd := NewDevice().NewPD()
	cq := NewCQ(4)
	_, err = New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, CC: &p, NP: &p})
	assert.ErrorIs(t, err, ErrBadAttr)
	_, err = New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, RPOnly: true})
	assert.ErrorIs(t, err, ErrBadAttr)
	bad := p
	bad.MinTimeBetweenCNPs = -time.Microsecond
	_, err = New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, NP: &bad})
	assert.ErrorIs(t, err, ErrBadAttr)
	bad = p
	bad.CNPAtWindowEnd = true // with mlx5's per-port pacing
	_, err = New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, NP: &bad})
	assert.ErrorIs(t, err, ErrBadAttr)
}
