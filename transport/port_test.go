package transport_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Endpoint's active MTU bounds the UD messages of QPs created after
// it is set: 1024 by default, 4096 once set, and a bad code is refused.
func TestEndpointActiveMTU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{Delay: 5 * time.Microsecond}, 1)
		a := newUDSide(t, n, "192.0.2.1", false, nil)
		b := newUDSide(t, n, "192.0.2.2", false, nil)
		assert.Equal(t, qp.IBV_MTU_1024, a.ep.ActiveMTU())
		src, err := a.pd.RegMR(make([]byte, 4096), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		wr := qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{src.SGE(0, 4096)},
			AH: &qp.AddressVector{Remote: b.ep.LocalAddr()}, RemoteQPN: b.q.QPN(), RemoteQKey: 0x11111111}
		assert.ErrorIs(t, a.q.PostSend(wr), qp.ErrBadWR, "4096 bytes over the default MTU of 1024")

		assert.Error(t, a.ep.SetActiveMTU(0))
		assert.Error(t, a.ep.SetActiveMTU(6))
		require.NoError(t, a.ep.SetActiveMTU(qp.IBV_MTU_4096))
		assert.Equal(t, qp.IBV_MTU_4096, a.ep.ActiveMTU())
		a2 := addUDQP(t, a.ep, false, nil)
		// The receiver's port must take 4096-byte datagrams too.
		require.NoError(t, b.ep.SetActiveMTU(qp.IBV_MTU_4096))
		b = addUDQP(t, b.ep, false, nil)
		wr.RemoteQPN = b.q.QPN()
		buf := make([]byte, qp.GRHLen+4096)
		mr, err := b.pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		require.NoError(t, b.q.PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{mr.SGE(0, len(buf))}}))
		src2, err := a2.pd.RegMR(make([]byte, 4096), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		wr.SGEs = []qp.SGE{src2.SGE(0, 4096)}
		require.NoError(t, a2.q.PostSend(wr), "a UD QP created after SetActiveMTU sends 4096 bytes")
		wc := waitWC(t, b.cq)
		require.Equal(t, qp.IBV_WC_SUCCESS, wc.Status)
		assert.Equal(t, uint32(qp.GRHLen+4096), wc.ByteLen)
	})
}
