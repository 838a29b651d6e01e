package transport_test

import (
	"context"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type udSide struct {
	ep *transport.Endpoint
	pd *transport.PD
	cq *transport.CQ
	q  *transport.QP
}

// udSide opens an Endpoint on n at addr with one UD QP (QPN 1 when gsi).
func newUDSide(t *testing.T, n *transport.Network, addr string, gsi bool, srq *qp.SRQ) udSide {
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 4791))
	require.NoError(t, err)
	ep := transport.NewEndpoint(c, transport.Options{})
	t.Cleanup(func() { ep.Close() })
	return addUDQP(t, ep, gsi, srq)
}

func addUDQP(t *testing.T, ep *transport.Endpoint, gsi bool, srq *qp.SRQ) udSide {
	pd := ep.NewPD()
	cq := ep.NewCQ(64)
	init := qp.InitAttr{QPType: qp.IBV_QPT_UD, MaxSendWR: 16, MaxRecvWR: 16, SQSigAll: true, SRQ: srq}
	qkey := uint32(0x11111111)
	if gsi {
		init.QPN, qkey = 1, bth.GSIQKey
	}
	q, err := ep.NewQP(pd, cq, cq, init)
	require.NoError(t, err)
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, QKey: qkey}, qp.IBV_QP_STATE|qp.IBV_QP_QKEY|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT))
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR}, qp.IBV_QP_STATE))
	require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: 100}, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN))
	return udSide{ep, pd, cq, q}
}

func waitWC(t *testing.T, cq *transport.CQ) qp.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]qp.WC, 1)
	n, err := cq.Wait(ctx, wc)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	return wc[0]
}

// UD through the Endpoint: each SEND goes where its address handle says
// (two receivers, one sender), a UD QP takes packets from any address,
// the receive completion names the sender and the GRH slot holds its IPv4
// header. QP1 exists with its Q_Key, and sends with it to another QP1 (a
// work request's Q_Key with the high bit set means the QP's own).
func TestEndpointUD(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{Delay: 5 * time.Microsecond}, 1)
		a := newUDSide(t, n, "192.0.2.1", false, nil)
		b := newUDSide(t, n, "192.0.2.2", false, nil)
		c := newUDSide(t, n, "192.0.2.3", false, nil)
		g1 := newUDSide(t, n, "192.0.2.4", true, nil)
		g2 := newUDSide(t, n, "192.0.2.5", true, nil)
		assert.Equal(t, uint32(1), g1.q.QPN())

		msg := []byte("a UD datagram")
		type leg struct {
			from, to udSide
			qkey     uint32
		}
		legs := []leg{{a, b, 0x11111111}, {a, c, 0x11111111}, {g1, g2, bth.GSIQKey}}
		bufs := make([][]byte, len(legs))
		for i, l := range legs {
			bufs[i] = make([]byte, qp.GRHLen+64)
			mr, err := l.to.pd.RegMR(bufs[i], qp.IBV_ACCESS_LOCAL_WRITE)
			require.NoError(t, err)
			require.NoError(t, l.to.q.PostRecv(qp.RecvWR{WRID: 7, SGEs: []qp.SGE{mr.SGE(0, len(bufs[i]))}}))
		}
		for i, l := range legs {
			src, err := l.from.pd.RegMR(append([]byte(nil), msg...), qp.IBV_ACCESS_LOCAL_WRITE)
			require.NoError(t, err)
			require.NoError(t, l.from.q.PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{src.SGE(0, len(msg))},
				AH: &qp.AddressVector{Remote: l.to.ep.LocalAddr()}, RemoteQPN: l.to.q.QPN(), RemoteQKey: l.qkey}))
		}
		for i, l := range legs {
			wc := waitWC(t, l.to.cq)
			require.Equal(t, qp.IBV_WC_SUCCESS, wc.Status, "leg %d", i)
			assert.Equal(t, l.from.q.QPN(), wc.SrcQP)
			assert.Equal(t, l.from.ep.LocalAddr().Addr(), wc.SrcAddr.Addr())
			assert.Equal(t, uint32(qp.GRHLen+len(msg)), wc.ByteLen)
			l.to.ep.Sync()
			assert.Equal(t, msg, bufs[i][qp.GRHLen:qp.GRHLen+len(msg)])
			// The GRH slot: 20 reserved bytes, then the IPv4 header with the
			// sender's and the receiver's addresses.
			ip := bufs[i][20:40]
			assert.Equal(t, byte(0x45), ip[0])
			assert.Equal(t, l.from.ep.LocalAddr().Addr().As4(), [4]byte(ip[12:16]))
			assert.Equal(t, l.to.ep.LocalAddr().Addr().As4(), [4]byte(ip[16:20]))
			assert.Equal(t, qp.IBV_WC_SUCCESS, waitWC(t, l.from.cq).Status)
		}
		for _, s := range []udSide{b, c, g2} {
			assert.Zero(t, s.ep.Stats().BadSource)
			assert.Zero(t, s.q.Counters().QKeyViolations)
		}
	})
}

// Two UD QPs on one Endpoint share an SRQ: each message takes the next
// receive WQE from it, and the limit event comes once when the queue
// drops below the armed limit.
func TestEndpointSRQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{Delay: 5 * time.Microsecond}, 1)
		a := newUDSide(t, n, "192.0.2.1", false, nil)
		c, err := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
		require.NoError(t, err)
		ep := transport.NewEndpoint(c, transport.Options{})
		t.Cleanup(func() { ep.Close() })
		pd := ep.NewPD()
		srq, err := pd.NewSRQ(qp.SRQInitAttr{MaxWR: 8, SRQLimit: 3})
		require.NoError(t, err)
		buf := make([]byte, 4*(qp.GRHLen+16))
		mr, err := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		for i := range 4 {
			require.NoError(t, srq.PostRecv(qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{mr.SGE(i*(qp.GRHLen+16), qp.GRHLen+16)}}))
		}
		r1 := addUDQP(t, ep, false, srq.SRQ())
		r2 := addUDQP(t, ep, false, srq.SRQ())
		assert.Error(t, r1.q.PostRecv(qp.RecvWR{WRID: 9}), "a QP with an SRQ takes no receive WQEs of its own")
		src, _ := a.pd.RegMR([]byte("0123456789abcdef"), qp.IBV_ACCESS_LOCAL_WRITE)
		for i, r := range []udSide{r1, r2} {
			require.NoError(t, a.q.PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{src.SGE(0, 16)},
				AH: &qp.AddressVector{Remote: ep.LocalAddr()}, RemoteQPN: r.q.QPN(), RemoteQKey: 0x11111111}))
		}
		w1, w2 := waitWC(t, r1.cq), waitWC(t, r2.cq)
		assert.Equal(t, uint64(0), w1.WRID, "the first WQE posted")
		assert.Equal(t, uint64(1), w2.WRID, "the next, taken by the other QP")
		assert.Equal(t, 2, srq.Queued())
		ev := make([]qp.AsyncEvent, 4)
		require.Equal(t, 1, ep.PollEvents(ev), "below the limit of 3 once")
		assert.Equal(t, qp.IBV_EVENT_SRQ_LIMIT_REACHED, ev[0].Type)
		assert.Equal(t, 0, ep.PollEvents(ev))
	})
}
