package qp

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLossyManySeeds runs a mixed SEND/WRITE/READ workload under loss,
// duplication and reordering with many random seeds: every completion
// successful and in order, every byte in place, no PSN used twice.
func TestLossyManySeeds(t *testing.T) {
	seeds := uint64(120)
	if testing.Short() {
		seeds = 20
	}
	for seed := uint64(0); seed < seeds; seed++ {
		o := defaultOpts()
		o.timeout = 8
		w := newWire(t, o)
		w.rng = rand.New(rand.NewPCG(seed, 99))
		w.loss, w.dup, w.reorder = []float64{0.01, 0.05, 0.2}[seed%3], 0.02, 0.05
		const msgs = 30
		bufA := pattern(msgs*4096, 5)
		bufB := make([]byte, msgs*4096)
		back := make([]byte, msgs*4096)
		amr, _ := w.pd[0].RegMR(bufA, IBV_ACCESS_LOCAL_WRITE)
		kmr, _ := w.pd[0].RegMR(back, IBV_ACCESS_LOCAL_WRITE)
		bmr, _ := w.pd[1].RegMR(bufB, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_READ)
		for i := range msgs {
			n := 1 + (i*997)%4096
			off := i * 4096
			var wr SendWR
			switch i % 3 {
			case 0:
				w.qp[1].PostRecv(RecvWR{WRID: uint64(i), SGEs: []SGE{bmr.SGE(off, 4096)}})
				wr = SendWR{Opcode: IBV_WR_SEND, SGEs: []SGE{amr.SGE(off, n)}}
			case 1:
				wr = SendWR{Opcode: IBV_WR_RDMA_WRITE, RemoteAddr: bmr.VA + uint64(off), RKey: bmr.RKey, SGEs: []SGE{amr.SGE(off, n)}}
			case 2:
				w.qp[0].PostSend(SendWR{WRID: uint64(1000 + i), Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED,
					SGEs: []SGE{amr.SGE(off, n)}, RemoteAddr: bmr.VA + uint64(off), RKey: bmr.RKey})
				wr = SendWR{Opcode: IBV_WR_RDMA_READ, RemoteAddr: bmr.VA + uint64(off), RKey: bmr.RKey, SGEs: []SGE{kmr.SGE(off, n)}}
			}
			wr.WRID = uint64(i)
			wr.Flags = IBV_SEND_SIGNALED
			w.qp[0].PostSend(wr)
		}
		wc := w.poll(0, msgs+msgs/3)
		require.Len(t, wc, msgs+msgs/3, "seed %d", seed)
		k := 0
		for i := range msgs {
			if i%3 == 2 {
				require.Equal(t, uint64(1000+i), wc[k].WRID, "seed %d", seed)
				k++
			}
			require.Equal(t, uint64(i), wc[k].WRID, "seed %d", seed)
			k++
		}
		for _, c := range wc {
			require.Equal(t, IBV_WC_SUCCESS, c.Status, "seed %d wr %d\nA %+v\nB %+v", seed, c.WRID, w.qp[0].Counters, w.qp[1].Counters)
		}
		for i := range msgs {
			n := 1 + (i*997)%4096
			off := i * 4096
			require.Equal(t, bufA[off:off+n], bufB[off:off+n], "seed %d message %d", seed, i)
			if i%3 == 2 {
				require.Equal(t, bufA[off:off+n], back[off:off+n], "seed %d read %d", seed, i)
			}
		}
	}
}
