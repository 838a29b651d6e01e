package transport_test

import (
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Endpoint on which no CM runs (no QP1: `roce-emu server`, bw without
// -R) answers a REQ to its QP1 with a REJ, reason invalid service ID, at
// once, and a DREQ with a DREP, as Linux's CM does for a port nobody
// listens on; other MADs to QP1 are dropped; each is counted. Once a QP1
// exists (a CM runs), its MADs are its own.
func TestEndpointWithoutCMRejectsREQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{Delay: 10 * time.Microsecond}, 1)
		open := func(addr string) *transport.Endpoint {
			c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 4791))
			require.NoError(t, err)
			ep := transport.NewEndpoint(c, transport.Options{})
			t.Cleanup(func() { ep.Close() })
			return ep
		}
		a, b := open("192.0.2.1"), open("192.0.2.2")
		g := transporttest.NewGSI(t, a)
		to := netip.MustParseAddr("192.0.2.2")

		// A REQ as rping -c sends it.
		m := cm.NewManager(cm.Config{})
		_, err := m.Dial(time.Unix(0, 0), cm.DialParams{Local: netip.MustParseAddr("192.0.2.1"), Remote: to,
			ServiceID: cm.ServiceID(cm.PortSpaceTCP, 7174), SrcPort: 40000, QPN: 0x11})
		require.NoError(t, err)
		out, ok := m.PollMAD()
		require.True(t, ok)
		start := time.Now()
		g.Send(to, out.MAD[:])
		ans, ok := g.Recv(time.Second)
		require.True(t, ok, "no answer to the REQ")
		assert.Less(t, time.Since(start), time.Millisecond, "answered at once")
		assert.Equal(t, to, ans.From)
		require.NoError(t, m.HandleMAD(time.Unix(0, 0), ans.From, ans.MAD))
		ev, ok := m.PollEvent()
		require.True(t, ok)
		assert.Equal(t, cm.EventRejected, ev.Type)
		assert.Equal(t, cm.RejInvalidServiceID, ev.Reason)

		// A DREQ for a connection nobody has gets its DREP.
		dreq, err := cm.AppendMAD(nil, 77, &cm.DREQ{LocalCommID: 5, RemoteCommID: 6, RemoteQPN: 0x11})
		require.NoError(t, err)
		g.Send(to, dreq)
		ans, ok = g.Recv(time.Second)
		require.True(t, ok, "no answer to the DREQ")
		h, msg, err := cm.DecodeMAD(ans.MAD)
		require.NoError(t, err)
		assert.Equal(t, uint64(77), h.TransactionID)
		assert.Equal(t, &cm.DREP{LocalCommID: 6, RemoteCommID: 5}, msg)

		// An RTU, a MAD that is not CM's, and 10 bytes: dropped, unanswered.
		rtu, err := cm.AppendMAD(nil, 78, &cm.RTU{LocalCommID: 5, RemoteCommID: 6})
		require.NoError(t, err)
		g.Send(to, rtu)
		notCM := append([]byte(nil), rtu...)
		notCM[1] = 0x81 // management class
		g.Send(to, notCM)
		_, ok = g.Recv(time.Second)
		assert.False(t, ok, "an answer to a MAD that needs none")

		st := b.Stats()
		assert.Equal(t, uint64(1), st.CMRejects)
		assert.Equal(t, uint64(1), st.CMDREPs)
		assert.Equal(t, uint64(2), st.CMDropped)
		assert.Zero(t, st.UnknownQP)

		// With a QP1 on b, the REQ is QP1's: no answer from the Endpoint.
		gb := transporttest.NewGSI(t, b)
		g.Send(to, out.MAD[:])
		got, ok := gb.Recv(time.Second)
		require.True(t, ok)
		assert.Equal(t, out.MAD[:], got.MAD)
		_, ok = g.Recv(time.Second)
		assert.False(t, ok)
		assert.Equal(t, uint64(1), b.Stats().CMRejects)
	})
}
