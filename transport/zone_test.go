package transport_test

import (
	"net/netip"
	"testing"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/require"
)

// An Endpoint bound to a link-local address has it with its zone
// (fe80::1%eth0, as ListenUDP requires), but a GID carries none: a QP whose
// address vector names its local address from the GID (AV.Local =
// fe80::1) is accepted.
func TestAVLocalLinkLocalWithoutZone(t *testing.T) {
	n := transport.NewNetwork(transport.Impairments{}, 1)
	c, err := n.Listen(netip.MustParseAddrPort("[fe80::1%eth0]:4791"))
	require.NoError(t, err)
	ep := transport.NewEndpoint(c, transport.Options{})
	defer ep.Close()
	pd := ep.NewPD()
	cq := ep.NewCQ(4)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 1, MaxRecvWR: 1})
	require.NoError(t, err)
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE},
		qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT))
	av := qp.AddressVector{Local: netip.MustParseAddr("fe80::1"), Remote: netip.MustParseAddrPort("[fe80::2]:4791"), HopLimit: 64}
	err = q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: qp.IBV_MTU_1024, DestQPN: 0x11, RQPSN: 1, MinRNRTimer: 12, AV: av,
		AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE, MaxDestRdAtomic: 1},
		qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER)
	require.NoError(t, err, "the GID of the endpoint's own link-local address names it")
}
