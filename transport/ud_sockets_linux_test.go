//go:build linux

package transport_test

import (
	"net/netip"
	"os"
	"testing"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(es)
}

// A UD QP on UDP that sends to many remote QPNs keeps one source port:
// the Conn's file descriptors do not grow with the peers' QPNs (a review
// found one socket per destination QPN).
func TestUDSourcePortSockets(t *testing.T) {
	c, err := transport.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), transport.UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	ep := transport.NewEndpoint(c, transport.Options{})
	defer ep.Close()
	pd := ep.NewPD()
	cq := ep.NewCQ(4096)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{QPType: qp.IBV_QPT_UD, MaxSendWR: 4096, MaxRecvWR: 16, SQSigAll: true})
	require.NoError(t, err)
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, QKey: 0x11111111}, qp.IBV_QP_STATE|qp.IBV_QP_QKEY|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT))
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR}, qp.IBV_QP_STATE))
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: 100}, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN))
	mr, err := pd.RegMR(make([]byte, 16), qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	before := openFDs(t)
	const peers = 1000
	for i := range peers {
		require.NoError(t, q.PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr.SGE(0, 16)},
			AH: &qp.AddressVector{Remote: netip.MustParseAddrPort("127.0.0.1:9")}, RemoteQPN: uint32(0x100 + i), RemoteQKey: 0x11111111}))
		if i%16 == 15 {
			ep.Sync()
		}
	}
	ep.Sync()
	after := openFDs(t)
	t.Logf("file descriptors: %d before, %d after sends to %d remote QPNs", before, after, peers)
	assert.Less(t, after-before, 16, "sockets opened for UD destinations")
}
