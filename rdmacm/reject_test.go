package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listener that gets REQs it cannot serve answers each with a REJ
// before any REP (a GID that is not this side's: invalid GID; a UC REQ to
// the TCP port space, garbage in the IP CM header, a QPN the QP cannot
// take: consumer defined), counts them, and its Accept goes on to take
// the next, good, connection: rping -s and bw -R servers do not end on one
// bad REQ.
func TestListenerRejectsBadREQsAndKeepsAccepting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := newPair(t, "", "")
		g := rawPeer(t, n)

		l := b.listen(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ch := acceptAsync(ctx, l, b.params(nil))

		to := b.svc.LocalAddr()
		cases := []struct {
			name   string
			mut    func(*cm.REQ)
			reason cm.RejectReason
		}{
			{"GID not ours", func(r *cm.REQ) { r.Primary.RemoteGID = netip.MustParseAddr("192.0.2.99") }, cm.RejInvalidGID},
			{"UC to RDMA_PS_TCP", func(r *cm.REQ) { r.TransportServiceType = cm.ServiceUC }, cm.RejConsumer},
			{"IP CM header version", func(r *cm.REQ) { r.PrivateData[0], r.PrivateData[1] = 0x30, 0x90 }, cm.RejConsumer},
			{"QPN the QP refuses", func(r *cm.REQ) { r.LocalQPN = 1 }, cm.RejConsumer},
		}
		for i, tc := range cases {
			id := uint32(0x100 + i)
			g.Send(to, badREQ(t, id, to, tc.mut))
			m, ok := g.Recv(10 * time.Second)
			require.True(t, ok, "%s: no answer", tc.name)
			h, msg, err := cm.DecodeMAD(m.MAD)
			require.NoError(t, err, tc.name)
			rej, isREJ := msg.(*cm.REJ)
			require.True(t, isREJ, "%s: answered with %v, not a REJ", tc.name, h.AttrID)
			assert.Equal(t, tc.reason, rej.Reason, tc.name)
			assert.Equal(t, id, rej.RemoteCommID, tc.name)
			assert.Equal(t, uint64(id), h.TransactionID, tc.name)
		}
		// Nothing else came: no REP for any of them.
		_, more := g.Recv(10 * time.Second)
		require.False(t, more, "a MAD after the REJs")

		client, err := a.svc.Dial(ctx, to, 7174, a.params(nil))
		require.NoError(t, err)
		r := <-ch
		require.NoError(t, r.err, "Accept went on to the good request")
		transfer(t, a, b, client, r.c, 7)

		st := b.svc.Stats()
		assert.Equal(t, uint64(1), st.CM.DropBadGID)
		assert.Equal(t, uint64(1), st.CM.DropBadTransport)
		assert.Equal(t, uint64(1), st.CM.DropBadPrivateData)
		assert.Equal(t, uint64(1), st.CM.AcceptFailures)
		assert.Equal(t, uint64(1), st.AcceptFailures)
		assert.Equal(t, uint64(4), st.CM.RejectsSent)
		assert.Equal(t, 1, st.QPs, "the rejected request's QP was destroyed")
		require.NoError(t, client.Disconnect(ctx))
		require.NoError(t, client.Close())
		require.NoError(t, r.c.Close())
	})
}

// A REP whose values the active side's QP does not take (QPN 1) gets a
// REJ (consumer defined, message REP) instead of the RTU, as rdma_cm's
// cma_rep_recv does; Dial fails with ErrConnectError and leaves no QP.
func TestDialRejectsREPItCannotApply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNet()
		a := newSide(t, n, "192.0.2.1", "")
		g := rawPeer(t, n)
		peer := netip.MustParseAddr("192.0.2.3")

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		dialed := dialAsync(ctx, a, peer, a.params(nil))
		m, ok := g.Recv(10 * time.Second)
		require.True(t, ok)
		h, msg, err := cm.DecodeMAD(m.MAD)
		require.NoError(t, err)
		req := msg.(*cm.REQ)
		rep, err := cm.AppendMAD(nil, h.TransactionID, &cm.REP{LocalCommID: 0x77, RemoteCommID: req.LocalCommID, LocalQPN: 1,
			StartingPSN: 5, TargetACKDelay: 15, RNRRetryCount: 7})
		require.NoError(t, err)
		g.Send(m.From, rep)
		require.ErrorIs(t, (<-dialed).err, rdmacm.ErrConnectError)
		m, ok = g.Recv(10 * time.Second)
		require.True(t, ok)
		_, msg, err = cm.DecodeMAD(m.MAD)
		require.NoError(t, err)
		rej, isREJ := msg.(*cm.REJ)
		require.True(t, isREJ, "a REJ, not %v", msg.Attr())
		assert.Equal(t, cm.RejConsumer, rej.Reason)
		assert.Equal(t, uint8(cm.MsgREP), rej.MessageRejected)
		assert.Equal(t, uint32(0x77), rej.RemoteCommID)
		_, more := g.Recv(10 * time.Second)
		assert.False(t, more, "no RTU")
		st := a.svc.Stats()
		assert.Equal(t, uint64(1), st.CM.REPsRefused)
		assert.Zero(t, st.QPs)
		assert.Zero(t, st.Connections)
	})
}
