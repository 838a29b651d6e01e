package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Connection attempts that fail after the REP (the peer REJects it; the
// REP's retries run out) leave nothing behind in the CQ the caller gives
// Accept again: the abandoned QP is destroyed, its posted receive without
// a completion, and the next, good, client's connection starts with an
// empty CQ (rping -s and bw -R servers reuse their CQ across attempts and
// take any flushed completion as fatal).
func TestFailedAcceptLeavesNoCompletions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := newPair(t, "", "")
		g := rawPeer(t, n)
		l := b.listen(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		rbuf := make([]byte, 64)
		rmr, err := b.pd.RegMR(rbuf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		p := b.params(nil)
		p.RecvWRs = []qp.RecvWR{{WRID: 0x5150, SGEs: []qp.SGE{rmr.SGE(0, 64)}}}
		ch := acceptAsync(ctx, l, p)
		to := b.svc.LocalAddr()

		// 1: the peer rejects the REP.
		g.Send(to, badREQ(t, 0x73, to, func(*cm.REQ) {}))
		h, msg := recvMsg(t, g)
		rep, ok := msg.(*cm.REP)
		require.True(t, ok, "a REP, not %v", msg.Attr())
		rej, err := cm.AppendMAD(nil, h.TransactionID, &cm.REJ{LocalCommID: 0x73, RemoteCommID: rep.LocalCommID,
			MessageRejected: cm.MsgREP, Reason: cm.RejConsumer})
		require.NoError(t, err)
		g.Send(to, rej)

		// 2: the REP is never answered (one retry).
		g.Send(to, badREQ(t, 0x74, to, func(r *cm.REQ) { r.MaxCMRetries = 1 }))
		_, msg = recvMsg(t, g)
		_, ok = msg.(*cm.REP)
		require.True(t, ok, "a REP, not %v", msg.Attr())
		_, msg = recvMsg(t, g)
		_, ok = msg.(*cm.REP)
		require.True(t, ok, "the REP resent, not %v", msg.Attr())
		_, msg = recvMsg(t, g)
		r, ok := msg.(*cm.REJ)
		require.True(t, ok, "a REJ after the last retry, not %v", msg.Attr())
		assert.Equal(t, cm.RejTimeout, r.Reason)
		synctest.Wait()
		assert.Equal(t, uint64(2), b.svc.Stats().AcceptFailures)
		assert.Zero(t, b.svc.Stats().QPs, "the failed attempts' QPs are destroyed")
		assert.Zero(t, b.cq.Poll(make([]qp.WC, 4)), "a failed attempt's completions in the CQ")

		client, err := a.svc.Dial(ctx, to, 7174, a.params(nil))
		require.NoError(t, err)
		out := <-ch
		require.NoError(t, out.err, "Accept went on to the good client")
		wcs := make([]qp.WC, 4)
		assert.Zero(t, b.cq.Poll(wcs), "completions in the good connection's CQ: %v", wcs)
		// The good connection's receive is the one posted for it.
		sbuf := []byte("0123456789abcdef")
		smr, err := a.pd.RegMR(sbuf, 0)
		require.NoError(t, err)
		require.NoError(t, client.QP().PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, 16)}}))
		assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, a.cq).Status)
		wc := waitWC(t, b.cq)
		assert.Equal(t, qp.IBV_WC_SUCCESS, wc.Status)
		assert.Equal(t, uint64(0x5150), wc.WRID)
		assert.Equal(t, uint32(16), wc.ByteLen)
		require.NoError(t, client.Disconnect(ctx))
		require.NoError(t, client.Close())
		require.NoError(t, out.c.Close())
	})
}

// A DREQ for a connection Accept answered with a REP, before its RTU:
// the peer gets its DREP, the attempt is counted as failed and Accept
// takes the next request; the Listener and the Service stay open.
func TestDREQBeforeRTUKeepsAccepting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := newPair(t, "", "")
		g := rawPeer(t, n)
		l := b.listen(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		ch := acceptAsync(ctx, l, b.params(nil))
		to := b.svc.LocalAddr()
		g.Send(to, badREQ(t, 0x73, to, func(*cm.REQ) {}))
		_, msg := recvMsg(t, g)
		rep, ok := msg.(*cm.REP)
		require.True(t, ok, "a REP, not %v", msg.Attr())
		dreq, err := cm.AppendMAD(nil, 0x9001, &cm.DREQ{LocalCommID: 0x73, RemoteCommID: rep.LocalCommID, RemoteQPN: rep.LocalQPN})
		require.NoError(t, err)
		g.Send(to, dreq)
		_, msg = recvMsg(t, g)
		_, ok = msg.(*cm.DREP)
		require.True(t, ok, "a DREP, not %v", msg.Attr())
		synctest.Wait()
		select {
		case r := <-ch:
			t.Fatalf("Accept returned on a DREQ before the RTU: %v", r.err)
		default:
		}
		assert.Equal(t, uint64(1), b.svc.Stats().AcceptFailures)
		assert.Zero(t, b.svc.Stats().QPs, "the attempt's QP is destroyed")

		client, err := a.svc.Dial(ctx, to, 7174, a.params(nil))
		require.NoError(t, err)
		out := <-ch
		require.NoError(t, out.err, "Accept went on to the good client")
		transfer(t, a, b, client, out.c, 3)
		require.NoError(t, client.Disconnect(ctx))
		require.NoError(t, client.Close())
		require.NoError(t, out.c.Close())
	})
}

// Giving up a connection attempt tells the peer, as rdma_destroy_id does
// on a program's exit: a Dial whose context ends while its REQ is
// unanswered sends a REJ (timeout, ARI the CA GUID); an Accept whose
// context ends while its REP waits for the RTU sends a REJ (consumer
// defined). Both are counted (Stats.Abandoned) and Drain returns once
// they are sent.
func TestAbandonedAttemptsSendREJ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNet()
		b := newSide(t, n, "192.0.2.2", "")
		g := rawPeer(t, n)
		peer := netip.MustParseAddr("192.0.2.3")

		ctx, cancel := context.WithCancel(context.Background())
		dialed := dialAsync(ctx, b, peer, b.params(nil))
		_, msg := recvMsg(t, g)
		req, ok := msg.(*cm.REQ)
		require.True(t, ok, "a REQ, not %v", msg.Attr())
		cancel()
		require.ErrorIs(t, (<-dialed).err, context.Canceled)
		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		require.NoError(t, b.svc.Drain(dctx))
		_, msg = recvMsg(t, g)
		rej, ok := msg.(*cm.REJ)
		require.True(t, ok, "a REJ for the abandoned REQ, not %v", msg.Attr())
		assert.Equal(t, cm.RejTimeout, rej.Reason)
		assert.Equal(t, req.LocalCommID, rej.LocalCommID)
		assert.Equal(t, uint8(cm.MsgOther), rej.MessageRejected)
		assert.Equal(t, uint64(1), b.svc.Stats().Abandoned)
		assert.Zero(t, b.svc.Stats().QPs)

		l := b.listen(t)
		actx, acancel := context.WithCancel(context.Background())
		accepted := acceptAsync(actx, l, b.params(nil))
		to := b.svc.LocalAddr()
		g.Send(to, badREQ(t, 0x73, to, func(*cm.REQ) {}))
		_, msg = recvMsg(t, g)
		rep, ok := msg.(*cm.REP)
		require.True(t, ok, "a REP, not %v", msg.Attr())
		acancel()
		require.ErrorIs(t, (<-accepted).err, context.Canceled)
		require.NoError(t, b.svc.Drain(dctx))
		_, msg = recvMsg(t, g)
		rej, ok = msg.(*cm.REJ)
		require.True(t, ok, "a REJ for the abandoned REP, not %v", msg.Attr())
		assert.Equal(t, cm.RejConsumer, rej.Reason)
		assert.Equal(t, rep.LocalCommID, rej.LocalCommID)
		assert.Equal(t, uint32(0x73), rej.RemoteCommID)
		assert.Equal(t, uint64(2), b.svc.Stats().Abandoned)
		assert.Equal(t, uint64(2), b.svc.Stats().CM.RejectsSent)
		assert.Zero(t, b.svc.Stats().QPs)
	})
}
