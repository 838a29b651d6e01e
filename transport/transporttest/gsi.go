package transporttest

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// GSIMADLen is the size of a management datagram (IBTA 13.4.1): what a
// GSI QP sends and receives after the 40-byte GRH slot.
const GSIMADLen = 256

const gsiRecvs = 16

// GSI is a bare QP1 on an Endpoint: it sends whatever 256-byte MADs a
// test builds, as UD SENDs to a peer's QP1 with Q_Key 0x80010000, and
// hands back the MADs that come, so that a test can play a CM peer that
// sends what no well-behaved CM would (a REQ for a GID that is not the
// peer's, a UC REQ to an rdma_cm TCP port, garbage private data) and see
// the answer on the wire.
type GSI struct {
	t    testing.TB
	ep   *transport.Endpoint
	pd   *transport.PD
	cq   *transport.CQ
	qp   *transport.QP
	mr   *qp.MR
	buf  []byte
	port uint16 // the peers' RoCEv2 UDP port
	// received while Send waited for its completion
	pending []GSIMAD
}

// GSIMAD is one MAD a GSI received.
type GSIMAD struct {
	From netip.Addr
	MAD  []byte // GSIMADLen bytes
	WC   qp.WC
}

// NewGSI creates QP1 on ep (which must have none) in RTS with receive
// WQEs posted; peers are reached at ep's own UDP port (4791 on a RoCEv2
// network). It is destroyed when the test ends.
func NewGSI(t testing.TB, ep *transport.Endpoint) *GSI {
	t.Helper()
	g := &GSI{t: t, ep: ep, port: ep.LocalAddr().Port()}
	if g.port == 0 {
		g.port = bth.UDPPort
	}
	g.pd = ep.NewPD()
	g.cq = ep.NewCQ(2 * gsiRecvs)
	q, err := ep.NewQP(g.pd, g.cq, g.cq, qp.InitAttr{QPType: qp.IBV_QPT_UD, QPN: 1, MaxSendWR: gsiRecvs, MaxRecvWR: gsiRecvs})
	if err != nil {
		t.Fatalf("transporttest: QP1: %v", err)
		return nil
	}
	g.qp = q
	t.Cleanup(q.Destroy)
	for _, m := range []struct {
		a    qp.Attr
		mask qp.AttrMask
	}{
		{qp.Attr{State: qp.IBV_QPS_INIT, QKey: bth.GSIQKey}, qp.IBV_QP_STATE | qp.IBV_QP_QKEY},
		{qp.Attr{State: qp.IBV_QPS_RTR}, qp.IBV_QP_STATE},
		{qp.Attr{State: qp.IBV_QPS_RTS}, qp.IBV_QP_STATE | qp.IBV_QP_SQ_PSN},
	} {
		if err := q.Modify(&m.a, m.mask); err != nil {
			t.Fatalf("transporttest: QP1: %v", err)
			return nil
		}
	}
	g.buf = make([]byte, (gsiRecvs+1)*(qp.GRHLen+GSIMADLen))
	if g.mr, err = g.pd.RegMR(g.buf, qp.IBV_ACCESS_LOCAL_WRITE); err != nil {
		t.Fatalf("transporttest: QP1 buffer: %v", err)
		return nil
	}
	for i := range gsiRecvs {
		g.post(i)
	}
	return g
}

func (g *GSI) post(i int) {
	g.t.Helper()
	if err := g.qp.PostRecv(qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{g.mr.SGE(i*(qp.GRHLen+GSIMADLen), qp.GRHLen+GSIMADLen)}}); err != nil {
		g.t.Fatalf("transporttest: QP1 receive: %v", err)
	}
}

// Send sends mad (GSIMADLen bytes) to QP1 at to and waits for the SEND to
// complete.
func (g *GSI) Send(to netip.Addr, mad []byte) {
	g.t.Helper()
	if len(mad) != GSIMADLen {
		g.t.Fatalf("transporttest: a MAD is %d bytes, not %d", GSIMADLen, len(mad))
		return
	}
	off := gsiRecvs * (qp.GRHLen + GSIMADLen)
	g.ep.Locked(func() { copy(g.buf[off:], mad) })
	err := g.qp.PostSend(qp.SendWR{WRID: 1 << 32, Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED,
		SGEs: []qp.SGE{g.mr.SGE(off, GSIMADLen)},
		AH:   &qp.AddressVector{Remote: netip.AddrPortFrom(to, g.port)}, RemoteQPN: 1, RemoteQKey: bth.GSIQKey})
	if err != nil {
		g.t.Fatalf("transporttest: QP1 send: %v", err)
		return
	}
	for {
		m, ok := g.next(30 * time.Second)
		if !ok {
			return
		}
		if m.WC.Opcode == qp.IBV_WC_SEND {
			if m.WC.Status != qp.IBV_WC_SUCCESS {
				g.t.Fatalf("transporttest: QP1 send completed %v", m.WC.Status)
			}
			return
		}
		g.pending = append(g.pending, m)
	}
}

// Recv returns the next MAD QP1 received, waiting up to wait; ok is false
// when none came by then.
func (g *GSI) Recv(wait time.Duration) (m GSIMAD, ok bool) {
	g.t.Helper()
	if len(g.pending) > 0 {
		m = g.pending[0]
		g.pending = g.pending[1:]
		return m, true
	}
	for {
		m, ok = g.next(wait)
		if !ok || m.WC.Opcode != qp.IBV_WC_SEND {
			return m, ok
		}
	}
}

// next returns the next completion: a received MAD (its receive WQE
// posted again) or a send completion (MAD nil).
func (g *GSI) next(wait time.Duration) (GSIMAD, bool) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	wc := make([]qp.WC, 1)
	if _, err := g.cq.Wait(ctx, wc); err != nil {
		return GSIMAD{}, false
	}
	if wc[0].Opcode == qp.IBV_WC_SEND || wc[0].WRID >= gsiRecvs {
		return GSIMAD{WC: wc[0]}, true
	}
	i := int(wc[0].WRID)
	m := GSIMAD{From: wc[0].SrcAddr.Addr(), WC: wc[0]}
	if wc[0].Status == qp.IBV_WC_SUCCESS && wc[0].ByteLen >= qp.GRHLen {
		off := i*(qp.GRHLen+GSIMADLen) + qp.GRHLen
		g.ep.Locked(func() {
			m.MAD = append([]byte(nil), g.buf[off:off+int(wc[0].ByteLen)-qp.GRHLen]...)
		})
	}
	g.post(i)
	return m, true
}
