// Package incast sets up the tests' N-to-1 RDMA WRITE incasts: one QP with
// DCQCN on each sender, its partner QP on the shared receiver, registered
// buffers, and the writes posted. The tests in transport and cmd/roce-emu
// differ only in the network between the QPs and in what they assert.
package incast

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/require"
)

// Setup describes an incast.
type Setup struct {
	Recv    *transport.Endpoint
	Senders []*transport.Endpoint
	// SenderPeer and RecvPeer give the address that sender i's QP, and the
	// receiver's QP for sender i, send to: the other end, or a switch port.
	SenderPeer, RecvPeer func(i int) netip.AddrPort
	Params               *cc.Params
	PSN                  bth.PSN
	Attr                 transport.ConnectAttr // Access is set here
	Size                 int                   // bytes each sender writes
	WRs                  int                   // in this many RDMA WRITEs
}

// Pair is sender i's QP and the receiver's QP for it, with the bytes it
// writes and the buffer they land in.
type Pair struct {
	Q, RQ    *transport.QP
	CQ       *transport.CQ
	Src, Dst []byte
}

// Start connects the pairs, registers the buffers and posts every sender's
// writes.
func Start(t testing.TB, s Setup) []*Pair {
	t.Helper()
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE
	attr := s.Attr
	attr.Access = access
	rpd, rcq := s.Recv.NewPD(), s.Recv.NewCQ(64)
	var pairs []*Pair
	for i, ep := range s.Senders {
		pd, cq := ep.NewPD(), ep.NewCQ(64)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true, CC: s.Params})
		require.NoError(t, err)
		rq, err := s.Recv.NewQP(rpd, rcq, rcq, qp.InitAttr{CC: s.Params})
		require.NoError(t, err)
		require.NoError(t, q.Connect(transport.Remote{Addr: s.SenderPeer(i), QPN: rq.QPN(), PSN: s.PSN}, s.PSN, attr))
		require.NoError(t, rq.Connect(transport.Remote{Addr: s.RecvPeer(i), QPN: q.QPN(), PSN: s.PSN}, s.PSN, attr))
		p := &Pair{Q: q, RQ: rq, CQ: cq, Src: make([]byte, s.Size), Dst: make([]byte, s.Size)}
		for k := range p.Src {
			p.Src[k] = byte(k*13) ^ byte(k>>9) ^ byte(i+1)
		}
		smr, err := pd.RegMR(p.Src, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		dmr, err := rpd.RegMR(p.Dst, access)
		require.NoError(t, err)
		for k := range s.WRs {
			off := k * s.Size / s.WRs
			require.NoError(t, q.PostSend(qp.SendWR{WRID: uint64(k), Opcode: qp.IBV_WR_RDMA_WRITE,
				SGEs: []qp.SGE{smr.SGE(off, s.Size/s.WRs)}, RemoteAddr: dmr.VA + uint64(off), RKey: dmr.RKey}))
		}
		pairs = append(pairs, p)
	}
	return pairs
}

// Wait waits, for at most a minute, until every sender has n successful
// completions.
func Wait(t testing.TB, pairs []*Pair, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wc := make([]qp.WC, 64)
	for i, p := range pairs {
		for got := 0; got < n; {
			k, err := p.CQ.Wait(ctx, wc)
			require.NoError(t, err, "sender %d: waiting for %d completions, have %d", i, n, got)
			for _, c := range wc[:k] {
				require.Equal(t, qp.IBV_WC_SUCCESS, c.Status, "sender %d", i)
			}
			got += k
		}
	}
}
