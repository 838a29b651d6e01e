package rdmacm_test

import (
	"context"
	"net/netip"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// transfer: the client SENDs to the server, then RDMA WRITEs into the
// server's buffer and READs it back.
func transfer(t *testing.T, a, b side, client, server *rdmacm.Conn, tag byte) {
	t.Helper()
	sbuf := make([]byte, 64)
	smr, err := b.pd.RegMR(sbuf, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE|qp.IBV_ACCESS_REMOTE_READ)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.pd.DeregMR(smr)) }()
	require.NoError(t, server.QP().PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{smr.SGE(0, 64)}}))

	cbuf := make([]byte, 128)
	for i := range 32 {
		cbuf[i] = tag + byte(i)
	}
	cmr, err := a.pd.RegMR(cbuf, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.pd.DeregMR(cmr)) }()
	require.NoError(t, client.QP().PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{cmr.SGE(0, 32)}}))
	assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, a.cq).Status)
	wc := waitWC(t, b.cq)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc.Status)
	require.Equal(t, uint32(32), wc.ByteLen)
	b.ep.Sync()
	assert.Equal(t, cbuf[:32], sbuf[:32])

	require.NoError(t, client.QP().PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{cmr.SGE(0, 32)},
		RemoteAddr: smr.VA + 32, RKey: smr.RKey}))
	assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, a.cq).Status)
	require.NoError(t, client.QP().PostSend(qp.SendWR{WRID: 3, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{cmr.SGE(64, 64)},
		RemoteAddr: smr.VA, RKey: smr.RKey}))
	assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, a.cq).Status)
	a.ep.Sync()
	assert.Equal(t, cbuf[:32], cbuf[64:96])
	assert.Equal(t, cbuf[:32], cbuf[96:128])
}

// Dial, Accept, SEND/WRITE/READ, Disconnect: the negotiated values match
// on both sides, private data crosses both ways, and the passive side sees
// the active side's DREQ.
func TestDialAcceptTransferDisconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, a, b := newPair(t, "", "")
		l := b.listen(t)
		_, err := b.svc.Listen(7174)
		assert.ErrorIs(t, err, cm.ErrListening)

		client, server := connect(t, a, b, l)
		assert.Equal(t, []byte("rep-data"), client.PrivateData()[:8])
		assert.Equal(t, []byte("req-data"), server.PrivateData()[:8])
		assert.Equal(t, qp.IBV_QPS_RTS, client.QP().State())
		assert.Equal(t, qp.IBV_QPS_RTS, server.QP().State())
		cp, sp := client.Params(), server.Params()
		assert.Equal(t, server.QP().QPN(), cp.RemoteQPN)
		assert.Equal(t, client.QP().QPN(), sp.RemoteQPN)
		assert.Equal(t, cp.SQPSN, sp.RQPSN)
		assert.Equal(t, sp.SQPSN, cp.RQPSN)
		assert.Equal(t, netip.MustParseAddr("192.0.2.1"), server.RemoteAddr())

		transfer(t, a, b, client, server, 0x10)

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, client.Disconnect(ctx))
		select {
		case <-server.Disconnected():
		case <-ctx.Done():
			t.Fatal("the passive side never saw the DREQ")
		}
		assert.Equal(t, qp.IBV_QPS_ERR, server.QP().State())
		assert.Equal(t, qp.IBV_QPS_ERR, client.QP().State())
		require.NoError(t, server.Disconnect(ctx), "already disconnected by the peer")
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())
		assert.Equal(t, 0, a.svc.Stats().QPs)
		assert.Equal(t, 0, b.svc.Stats().QPs)
		assert.Zero(t, a.svc.Stats().CM.Retransmits)
		assert.Zero(t, b.svc.Stats().CM.Retransmits)
		require.NoError(t, l.Close())
	})
}

// The passive side's REP is lost: the active side's REQ retry (or the
// passive side's REP retry) brings the connection up anyway.
func TestLostREP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, a, b := newPair(t, "", "drop:dir=out,opcode=UD_SEND_ONLY,nth=1")
		l := b.listen(t)
		start := time.Now()
		client, server := connect(t, a, b, l)
		took := time.Since(start)
		sa, sb := a.svc.Stats().CM, b.svc.Stats().CM
		// Both sides' timers run out together: the REQ and the REP are
		// each resent once, whichever arrives first completes it.
		assert.GreaterOrEqual(t, sa.Retransmits+sb.Retransmits, uint64(1), "the REQ or the REP resent")
		assert.LessOrEqual(t, sa.Retransmits+sb.Retransmits, uint64(2))
		assert.Less(t, took, 2*cm.REQTimeout(&cm.REQ{RemoteCMResponseTimeout: cm.DefaultCMResponseTimeout}, cm.DefaultPacketLifeTime), "recovered at the first retry")
		// The first retry comes after the CM response timeout (4.096 us *
		// 2^20) plus two packet lifetimes (2 * 4.096 us * 2^18).
		assert.GreaterOrEqual(t, took, cm.IBTime(cm.DefaultCMResponseTimeout))
		transfer(t, a, b, client, server, 0x20)
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())
	})
}

// The active side's RTU is lost: the passive side is established by the
// first packet its QP receives (CommEstablished), long before any REP
// retry, and the transfer goes through.
func TestLostRTU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, a, b := newPair(t, "drop:dir=out,opcode=UD_SEND_ONLY,nth=2", "")
		l := b.listen(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		accepted := acceptAsync(ctx, l, b.params(nil))
		client, err := a.svc.Dial(ctx, b.svc.LocalAddr(), 7174, a.params(nil))
		require.NoError(t, err)
		synctest.Wait()
		select {
		case <-accepted:
			t.Fatal("the passive side cannot be established: the RTU was lost and nothing was sent")
		default:
		}
		start := time.Now()
		buf := []byte("first packet")
		mr, err := a.pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		// A WRITE of no bytes to no memory: the first packet the passive
		// QP receives, which it ACKs.
		require.NoError(t, client.QP().PostSend(qp.SendWR{WRID: 9, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: nil}))
		assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, a.cq).Status)
		r := <-accepted
		require.NoError(t, r.err)
		server := r.c
		require.NotNil(t, server)
		assert.Less(t, time.Since(start), 10*time.Millisecond, "established by traffic, not by a REP retry")
		assert.Equal(t, uint64(1), b.svc.Stats().CM.CommEstablished)
		assert.Zero(t, b.svc.Stats().CM.Retransmits)
		transfer(t, a, b, client, server, 0x30)
		require.NoError(t, a.pd.DeregMR(mr))
		require.NoError(t, server.Disconnect(ctx))
		<-client.Disconnected()
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())
	})
}

// A connect to a port nobody listens on is rejected at once (REJ, reason
// invalid service ID), not left to time out; no QP stays behind.
func TestConnectNoListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, a, b := newPair(t, "", "")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		_, err := a.svc.Dial(ctx, b.svc.LocalAddr(), 9999, a.params(nil))
		took := time.Since(start)
		require.ErrorIs(t, err, rdmacm.ErrRejected)
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		assert.Equal(t, cm.RejInvalidServiceID, rej.Reason)
		assert.Contains(t, err.Error(), "port 9999")
		assert.Less(t, took, time.Millisecond, "one round trip")
		assert.Equal(t, 0, a.svc.Stats().QPs)
		assert.Equal(t, 0, a.svc.Stats().Connections)
		assert.Equal(t, uint64(1), b.svc.Stats().CM.NoListener)
	})
}

// A peer that never answers: Dial gives ErrUnreachable after the REQ's
// retries, and a ctx that ends first gives its error.
func TestDialUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newSide(t, newNet(), "192.0.2.1", "")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := a.svc.Dial(ctx, netip.MustParseAddr("192.0.2.9"), 7174, a.params(nil))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 0, a.svc.Stats().QPs)
		_, err = a.svc.Dial(context.Background(), netip.MustParseAddr("192.0.2.9"), 7174, a.params(nil))
		require.ErrorIs(t, err, rdmacm.ErrUnreachable)
		assert.Equal(t, 0, a.svc.Stats().QPs)
	})
}

// 50 connect/transfer/disconnect cycles leave no QP, MR, connection or
// goroutine behind.
func TestFiftyCycles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, a, b := newPair(t, "", "")
		l := b.listen(t)
		synctest.Wait()
		goroutines := bubbleGoroutines(t)
		require.Equal(t, 4, goroutines, "each side's Endpoint reader and Service")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		for i := range 50 {
			client, server := connect(t, a, b, l)
			transfer(t, a, b, client, server, byte(i))
			if i%2 == 0 {
				require.NoError(t, client.Disconnect(ctx))
			} else {
				require.NoError(t, server.Disconnect(ctx))
			}
			<-client.Disconnected()
			<-server.Disconnected()
			require.NoError(t, client.Close())
			require.NoError(t, server.Close())
		}
		assert.Equal(t, 0, a.svc.Stats().QPs)
		assert.Equal(t, 0, b.svc.Stats().QPs)
		// TIMEWAIT ends; the Managers forget every connection.
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.Equal(t, 0, a.svc.Stats().Connections)
		assert.Equal(t, 0, b.svc.Stats().Connections)
		assert.Equal(t, goroutines, bubbleGoroutines(t))
		// Every MR was deregistered (transfer checks DeregMR) and the CQs
		// hold no completion left over.
		assert.Equal(t, 0, a.cq.Poll(make([]qp.WC, 64)))
		assert.Equal(t, 0, b.cq.Poll(make([]qp.WC, 64)))
	})
}

var bubbleRE = regexp.MustCompile(`^goroutine \d+ \[[^\]]*synctest bubble (\d+)[,\]]`)

// bubbleGoroutines counts the goroutines of the calling goroutine's
// synctest bubble that this module's code started (runtime.NumGoroutine
// would also count those of other tests still ending outside the bubble,
// and the bubble's own root shows its label only at times).
func bubbleGoroutines(t *testing.T) int {
	t.Helper()
	buf := make([]byte, 1<<20)
	stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
	self := bubbleRE.FindStringSubmatch(stacks[0]) // the caller's
	require.NotNil(t, self, "the caller is in no synctest bubble")
	n := 0
	for _, g := range stacks {
		if m := bubbleRE.FindStringSubmatch(g); m != nil && m[1] == self[1] && strings.Contains(g, "created by github.com/roce-emu/") {
			n++
		}
	}
	return n
}

// Bad input on QP1: a MAD that is not a CM MAD, one with an unknown
// attribute, and a datagram with the wrong Q_Key are dropped and counted,
// and connections still come up afterwards.
func TestBadMADs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := newPair(t, "", "")
		// A third host sends raw datagrams to b's QP1 from a UD QP.
		c, err := n.Listen(netip.MustParseAddrPort("192.0.2.3:4791"))
		require.NoError(t, err)
		ep := transport.NewEndpoint(c, transport.Options{})
		t.Cleanup(func() { ep.Close() })
		pd, cq := ep.NewPD(), ep.NewCQ(16)
		// Its QP1 may send with the GSI Q_Key; another UD QP may not (a
		// Q_Key with the high bit set sends the QP's own, IBTA 10.2.5).
		newUD := func(qpn, qkey uint32) *transport.QP {
			q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{QPType: qp.IBV_QPT_UD, QPN: qpn, SQSigAll: true})
			require.NoError(t, err)
			require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, QKey: qkey}, qp.IBV_QP_STATE|qp.IBV_QP_QKEY|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT))
			require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR}, qp.IBV_QP_STATE))
			require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS}, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN))
			return q
		}
		gsi, other := newUD(1, bth.GSIQKey), newUD(0, 0x1234)
		buf := make([]byte, 3*cm.MADLen)
		notCM := buf[:cm.MADLen]
		notCM[0] = 0x42 // base version
		lap := buf[cm.MADLen : 2*cm.MADLen]
		h := cm.CMHeader(7, cm.AttrLAP)
		h.Append(lap[:0])
		short := buf[2*cm.MADLen : 2*cm.MADLen+10]
		mr, err := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		send := func(q *transport.QP, off, n int, qkey uint32) {
			require.NoError(t, q.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr.SGE(off, n)},
				AH: &qp.AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}, RemoteQPN: 1, RemoteQKey: qkey}))
			assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, cq).Status)
		}
		send(gsi, 0, len(notCM), bth.GSIQKey)
		send(gsi, cm.MADLen, len(lap), bth.GSIQKey)
		send(gsi, 2*cm.MADLen, len(short), bth.GSIQKey)
		send(other, 0, len(notCM), 0x1234) // the wrong Q_Key for QP1
		time.Sleep(time.Millisecond)       // the network's delay
		synctest.Wait()
		st := b.svc.Stats()
		assert.Equal(t, uint64(2), st.CM.DropMalformed, "not CM, truncated")
		assert.Equal(t, uint64(1), st.CM.DropUnknownAttr, "LAP")
		assert.Equal(t, uint64(1), st.QP1.QKeyViolations)
		assert.Zero(t, st.CM.MADsSent, "nothing answers garbage")

		l := b.listen(t)
		client, server := connect(t, a, b, l)
		transfer(t, a, b, client, server, 0x40)
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())
	})
}
