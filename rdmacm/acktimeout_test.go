package rdmacm_test

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ConnParams.ACKTimeout (rdma_set_option RDMA_OPTION_ID_ACK_TIMEOUT) is
// the local ACK timeout of the QP on the side that sets it, Dial or
// Accept, instead of the path's (PacketLifeTime+1: 19 with rdma_cm's
// default lifetime, about 2 s). perftest -R sets -u on every rdma_cm id;
// without it, bw -R with --loss waited 2 s per lost window tail and did
// not finish where the same run over TCP took 11 s.
func TestACKTimeoutOption(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, a, b := newPair(t, "", "")
		l := b.listen(t)
		client, server := connect(t, a, b, l)
		assert.Equal(t, uint8(19), client.QP().Attr().Timeout, "the path's, without the option")
		assert.Equal(t, uint8(19), server.QP().Attr().Timeout)
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())

		// The option on one side: its QP only, as rdma_init_qp_attr.
		for _, dialSide := range []bool{true, false} {
			ap, bp := a.params(nil), b.params(nil)
			if dialSide {
				ap.ACKTimeout = 14
			} else {
				bp.ACKTimeout = 12
			}
			client, server := connectWith(t, a, b, l, ap, bp)
			if dialSide {
				assert.Equal(t, uint8(14), client.QP().Attr().Timeout)
				assert.Equal(t, uint8(19), server.QP().Attr().Timeout)
			} else {
				assert.Equal(t, uint8(19), client.QP().Attr().Timeout)
				assert.Equal(t, uint8(12), server.QP().Attr().Timeout)
			}
			require.NoError(t, client.Close())
			require.NoError(t, server.Close())
		}
		require.NoError(t, l.Close())
	})
}
