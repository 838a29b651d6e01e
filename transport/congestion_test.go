package transport

import (
	"bytes"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two senders with DCQCN write into one receiver through a 10 Gb/s
// congestion point: the queue marks CE, the receiver's QPs send CNPs, the
// senders cut their rates, and every byte arrives with nothing dropped.
func TestMemCongestionPointDCQCN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(Impairments{Delay: time.Microsecond}, 1)
		recvAddr := netip.MustParseAddrPort("192.0.2.10:4791")
		cp, err := n.AddCongestionPoint(recvAddr, cc.QueueConfig{LineRate: 10 * cc.Gbps, Buffer: 4 << 20, KMin: 5000, KMax: 200000, PMax: 0.01}, 1)
		require.NoError(t, err)
		params, err := cc.Profile(cc.ProfilePaper, 10*cc.Gbps)
		require.NoError(t, err)

		rc, _ := n.Listen(recvAddr)
		recv := NewEndpoint(rc, Options{})
		defer recv.Close()
		rpd := recv.NewPD()
		rcq := recv.NewCQ(64)
		const size = 4 << 20
		type sender struct {
			ep  *Endpoint
			q   *QP
			cq  *CQ
			src []byte
			smr *qp.MR
			dst []byte
			dmr *qp.MR
		}
		var ss []*sender
		for i, a := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
			c, _ := n.Listen(netip.MustParseAddrPort(a))
			ep := NewEndpoint(c, Options{})
			defer ep.Close()
			pd := ep.NewPD()
			cq := ep.NewCQ(64)
			q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true, CC: &params})
			require.NoError(t, err)
			rq, err := recv.NewQP(rpd, rcq, rcq, qp.InitAttr{CC: &params})
			require.NoError(t, err)
			access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE
			require.NoError(t, q.Connect(Remote{Addr: recvAddr, QPN: rq.QPN(), PSN: 0x100}, 0x100, ConnectAttr{Access: access}))
			require.NoError(t, rq.Connect(Remote{Addr: ep.LocalAddr(), QPN: q.QPN(), PSN: 0x100}, 0x100, ConnectAttr{Access: access}))
			s := &sender{ep: ep, q: q, cq: cq, src: pattern(size, byte(i+1)), dst: make([]byte, size)}
			s.smr, _ = pd.RegMR(s.src, qp.IBV_ACCESS_LOCAL_WRITE)
			s.dmr, _ = rpd.RegMR(s.dst, access)
			ss = append(ss, s)
		}
		for _, s := range ss {
			for k := range 4 {
				off := k * size / 4
				require.NoError(t, s.q.PostSend(qp.SendWR{WRID: uint64(k), Opcode: qp.IBV_WR_RDMA_WRITE,
					SGEs: []qp.SGE{s.smr.SGE(off, size/4)}, RemoteAddr: s.dmr.VA + uint64(off), RKey: s.dmr.RKey}))
			}
		}
		for _, s := range ss {
			wc := wait(t, s.cq, 4)
			for _, c := range wc {
				require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
			}
		}
		recv.Sync()
		var marked, cnps uint64
		for _, q := range recv.order {
			c := q.Counters()
			marked += c.NPECNMarked
			cnps += c.NPCNPSent
		}
		for i, s := range ss {
			assert.True(t, bytes.Equal(s.src, s.dst), "sender %d data", i)
			c := s.q.Counters()
			rate, alpha, _ := s.q.CCState()
			t.Logf("sender %d: rp_cnp_handled %d, rp_cnp_ignored %d, lowest rate %v, now %v (alpha %.3f), retransmitted %d",
				i, c.RPCNPHandled, c.RPCNPIgnored, s.q.CCLowestRate(), rate, alpha, c.RetransmittedPkts)
			assert.NotZero(t, c.RPCNPHandled, "sender %d handled CNPs", i)
			assert.Less(t, float64(s.q.CCLowestRate()), float64(params.LineRate)*0.75, "sender %d cut its rate", i)
			assert.Zero(t, c.RetransmittedPkts, "nothing was lost or reordered")
		}
		q := cp.Queue()
		t.Logf("congestion point: %d enqueued, %d marked, %d dropped; receiver: %d CE-marked packets, %d CNPs sent", q.Enqueued, q.Marked, q.Dropped, marked, cnps)
		assert.NotZero(t, q.Marked)
		assert.Equal(t, q.Marked, marked, "every mark the queue made reached the notification point")
		assert.NotZero(t, cnps)
		assert.Zero(t, q.Dropped)
	})
}
