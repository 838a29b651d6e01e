package transport_test

import (
	"bytes"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/internal/incast"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two senders with DCQCN write into one receiver through a 10 Gb/s
// congestion point: the queue marks CE, the receiver's QPs send CNPs, the
// senders cut their rates, and every byte arrives with nothing dropped.
func TestMemCongestionPointDCQCN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{Delay: time.Microsecond}, 1)
		recvAddr := netip.MustParseAddrPort("192.0.2.10:4791")
		cp, err := n.AddCongestionPoint(recvAddr, cc.QueueConfig{LineRate: 10 * cc.Gbps, Buffer: 4 << 20, KMin: 5000, KMax: 200000, PMax: 0.01}, 1)
		require.NoError(t, err)
		params, err := cc.Profile(cc.ProfilePaper, 10*cc.Gbps)
		require.NoError(t, err)

		rc, _ := n.Listen(recvAddr)
		recv := transport.NewEndpoint(rc, transport.Options{})
		defer recv.Close()
		var senders []*transport.Endpoint
		for _, a := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
			c, _ := n.Listen(netip.MustParseAddrPort(a))
			ep := transport.NewEndpoint(c, transport.Options{})
			defer ep.Close()
			senders = append(senders, ep)
		}
		ss := incast.Start(t, incast.Setup{Recv: recv, Senders: senders, Params: &params, PSN: 0x100, Size: 4 << 20, WRs: 4,
			SenderPeer: func(int) netip.AddrPort { return recvAddr },
			RecvPeer:   func(i int) netip.AddrPort { return senders[i].LocalAddr() }})
		incast.Wait(t, ss, 4)
		recv.Sync()
		var marked, cnps uint64
		for _, s := range ss {
			c := s.RQ.Counters()
			marked += c.NPECNMarked
			cnps += c.NPCNPSent
		}
		for i, s := range ss {
			assert.True(t, bytes.Equal(s.Src, s.Dst), "sender %d data", i)
			c := s.Q.Counters()
			rate, alpha, _ := s.Q.CCState()
			t.Logf("sender %d: rp_cnp_handled %d, rp_cnp_ignored %d, lowest rate %v, now %v (alpha %.3f), retransmitted %d",
				i, c.RPCNPHandled, c.RPCNPIgnored, s.Q.CCLowestRate(), rate, alpha, c.RetransmittedPkts)
			assert.NotZero(t, c.RPCNPHandled, "sender %d handled CNPs", i)
			assert.Less(t, float64(s.Q.CCLowestRate()), float64(params.LineRate)*0.75, "sender %d cut its rate", i)
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
