package qp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inPlacePair connects two QPs of type typ back to back at MTU 256.
func inPlacePair(t *testing.T, typ QPType) (a, r *QP, pds [2]*PD) {
	t.Helper()
	var qps [2]*QP
	for i := range 2 {
		pds[i] = NewDevice().NewPD()
		cq := NewCQ(64)
		q, err := New(InitAttr{PD: pds[i], SendCQ: cq, RecvCQ: cq, QPN: uint32(0x11 + i), QPType: typ, MaxSendWR: 8, MaxRecvWR: 8})
		require.NoError(t, err)
		qps[i] = q
		access := IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: access}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
		mask := IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
		if typ == IBV_QPT_RC {
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
		}
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_256, DestQPN: uint32(0x12 - i), RQPSN: 0x100, MaxDestRdAtomic: 1,
			MinRNRTimer: 1, AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.1:4791")}}, mask))
		mask = IBV_QP_STATE | IBV_QP_SQ_PSN
		if typ == IBV_QPT_RC {
			mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC
		}
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}, mask))
	}
	return qps[0], qps[1], pds
}

// PayloadInPlace: an RC WRITE's packets from one SGE carry a view of its
// memory; from SGEs that are not contiguous, the scratch buffer; READ
// responses, ACKs and UC WRITEs (complete once handed out) never say so.
func TestPayloadInPlace(t *testing.T) {
	now := time.Unix(1700000000, 0)
	a, r, pds := inPlacePair(t, IBV_QPT_RC)
	src := make([]byte, 1024)
	smr, err := pds[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	dmr, err := pds[1].RegMR(make([]byte, 1024), IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_READ)
	require.NoError(t, err)
	var p bth.Packet
	require.NoError(t, a.PostSend(SendWR{Opcode: IBV_WR_RDMA_WRITE, SGEs: []SGE{smr.SGE(0, 512)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	require.True(t, a.NextPacket(now, &p))
	assert.True(t, a.PayloadInPlace(), "%v", p.BTH.Opcode)
	assert.Same(t, &src[0], &p.Payload[0], "the first packet's payload is the region itself")
	r.HandlePacket(now, &p, bth.NotECT)
	require.True(t, a.NextPacket(now, &p))
	assert.True(t, a.PayloadInPlace())
	assert.Same(t, &src[256], &p.Payload[0])
	r.HandlePacket(now, &p, bth.NotECT)
	require.True(t, r.NextPacket(now, &p), "the ACK")
	assert.False(t, r.PayloadInPlace())
	a.HandlePacket(now, &p, bth.NotECT)

	// Two SGEs with a gap: the payload is gathered into the scratch buffer.
	require.NoError(t, a.PostSend(SendWR{Opcode: IBV_WR_RDMA_WRITE, SGEs: []SGE{smr.SGE(0, 100), smr.SGE(200, 100)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	require.True(t, a.NextPacket(now, &p))
	assert.False(t, a.PayloadInPlace())
	r.HandlePacket(now, &p, bth.NotECT)
	require.True(t, r.NextPacket(now, &p))
	a.HandlePacket(now, &p, bth.NotECT)

	// A READ: its response comes from the responder's memory.
	require.NoError(t, a.PostSend(SendWR{Opcode: IBV_WR_RDMA_READ, SGEs: []SGE{smr.SGE(0, 200)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	require.True(t, a.NextPacket(now, &p))
	assert.False(t, a.PayloadInPlace(), "a READ request carries no payload")
	r.HandlePacket(now, &p, bth.NotECT)
	require.True(t, r.NextPacket(now, &p))
	assert.NotEmpty(t, p.Payload)
	assert.False(t, r.PayloadInPlace(), "READ response")

	ua, _, upds := inPlacePair(t, IBV_QPT_UC)
	umr, err := upds[0].RegMR(make([]byte, 256), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	require.NoError(t, ua.PostSend(SendWR{Opcode: IBV_WR_RDMA_WRITE, SGEs: []SGE{umr.SGE(0, 256)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	require.True(t, ua.NextPacket(now, &p))
	assert.NotEmpty(t, p.Payload)
	assert.False(t, ua.PayloadInPlace(), "UC completes once handed out")
}
