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
