package qp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>8)
	}
	return b
}

var sizes = []int{0, 1, 1023, 1024, 1025, 1 << 20}

func TestSendRecvSizes(t *testing.T) {
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := newWire(t, defaultOpts())
			src := pattern(n+1, 7)[:n]
			dst := make([]byte, n+16)
			smr, err := w.pd[0].RegMR(append(src, 0), IBV_ACCESS_LOCAL_WRITE)
			require.NoError(t, err)
			rmr, err := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE)
			require.NoError(t, err)
			require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: 9, SGEs: []SGE{rmr.SGE(0, len(dst))}}))
			require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND_WITH_IMM, Flags: IBV_SEND_SIGNALED,
				SGEs: []SGE{smr.SGE(0, n)}, ImmData: 0xDEADBEEF}))
			rc := w.poll(1, 1)
			sc := w.poll(0, 1)
			require.Equal(t, IBV_WC_SUCCESS, rc[0].Status)
			assert.Equal(t, IBV_WC_RECV, rc[0].Opcode)
			assert.Equal(t, uint32(n), rc[0].ByteLen)
			assert.Equal(t, uint32(0xDEADBEEF), rc[0].ImmData)
			assert.Equal(t, IBV_WC_WITH_IMM, rc[0].Flags)
			assert.Equal(t, IBV_WC_SUCCESS, sc[0].Status)
			assert.Equal(t, IBV_WC_SEND, sc[0].Opcode)
			assert.True(t, bytes.Equal(src, dst[:n]))
			assert.Equal(t, make([]byte, 16), dst[n:], "nothing written past the message")
		})
	}
}

func TestWriteReadSizes(t *testing.T) {
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := newWire(t, defaultOpts())
			local := pattern(max(n, 1), 3)
			remote := make([]byte, max(n, 1))
			back := make([]byte, max(n, 1))
			lmr, _ := w.pd[0].RegMR(local, IBV_ACCESS_LOCAL_WRITE)
			bmr, _ := w.pd[0].RegMR(back, IBV_ACCESS_LOCAL_WRITE)
			rmr, _ := w.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_READ)
			require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED,
				SGEs: []SGE{lmr.SGE(0, n)}, RemoteAddr: rmr.VA, RKey: rmr.RKey}))
			require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 2, Opcode: IBV_WR_RDMA_READ, Flags: IBV_SEND_SIGNALED,
				SGEs: []SGE{bmr.SGE(0, n)}, RemoteAddr: rmr.VA, RKey: rmr.RKey}))
			wc := w.poll(0, 2)
			require.Equal(t, IBV_WC_SUCCESS, wc[0].Status, "%v", wc[0])
			require.Equal(t, IBV_WC_SUCCESS, wc[1].Status, "%v", wc[1])
			assert.Equal(t, IBV_WC_RDMA_WRITE, wc[0].Opcode)
			assert.Equal(t, IBV_WC_RDMA_READ, wc[1].Opcode)
			assert.True(t, bytes.Equal(local[:n], remote[:n]))
			assert.True(t, bytes.Equal(local[:n], back[:n]))
			assert.Zero(t, w.cq[1].Len(), "RDMA WRITE without immediate and READ complete nothing at the responder")
		})
	}
}

func TestAtomics(t *testing.T) {
	w := newWire(t, defaultOpts())
	remote := make([]byte, 16)
	binary.LittleEndian.PutUint64(remote[8:], 100)
	res := make([]byte, 16)
	rmr, _ := w.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_ATOMIC)
	lmr, _ := w.pd[0].RegMR(res, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_ATOMIC_FETCH_AND_ADD, Flags: IBV_SEND_SIGNALED,
		SGEs: []SGE{lmr.SGE(0, 8)}, RemoteAddr: rmr.VA + 8, RKey: rmr.RKey, CompareAdd: 5}))
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 2, Opcode: IBV_WR_ATOMIC_CMP_AND_SWP, Flags: IBV_SEND_SIGNALED,
		SGEs: []SGE{lmr.SGE(8, 8)}, RemoteAddr: rmr.VA + 8, RKey: rmr.RKey, CompareAdd: 105, Swap: 7}))
	wc := w.poll(0, 2)
	require.Equal(t, IBV_WC_SUCCESS, wc[0].Status)
	require.Equal(t, IBV_WC_SUCCESS, wc[1].Status)
	assert.Equal(t, IBV_WC_FETCH_ADD, wc[0].Opcode)
	assert.Equal(t, IBV_WC_COMP_SWAP, wc[1].Opcode)
	assert.Equal(t, uint64(100), binary.LittleEndian.Uint64(res[0:]))
	assert.Equal(t, uint64(105), binary.LittleEndian.Uint64(res[8:]))
	assert.Equal(t, uint64(7), binary.LittleEndian.Uint64(remote[8:]))
}

func TestWriteWithImm(t *testing.T) {
	w := newWire(t, defaultOpts())
	src := pattern(3000, 1)
	remote := make([]byte, 3000)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	rmr, _ := w.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: 77}))
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_RDMA_WRITE_WITH_IMM, Flags: IBV_SEND_SIGNALED,
		SGEs: []SGE{smr.SGE(0, 3000)}, RemoteAddr: rmr.VA, RKey: rmr.RKey, ImmData: 42}))
	rc := w.poll(1, 1)
	assert.Equal(t, IBV_WC_RECV_RDMA_WITH_IMM, rc[0].Opcode)
	assert.Equal(t, uint32(42), rc[0].ImmData)
	assert.Equal(t, uint32(3000), rc[0].ByteLen)
	assert.Equal(t, src, remote)
}

// PSNs starting just below 0xFFFFFF wrap in the middle of the transfers.
func TestPSNWrap(t *testing.T) {
	o := defaultOpts()
	o.psnA, o.psnB = 0xFFFFF0, 0xFFFFFE
	w := newWire(t, o)
	n := 64 << 10
	src := pattern(n, 9)
	dst := make([]byte, n)
	back := make([]byte, n)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	bmr, _ := w.pd[0].RegMR(back, IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_READ)
	require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: 1, SGEs: []SGE{dmr.SGE(0, n)}}))
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, n)}}))
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 2, Opcode: IBV_WR_RDMA_READ, Flags: IBV_SEND_SIGNALED,
		SGEs: []SGE{bmr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	wc := w.poll(0, 2)
	require.Equal(t, IBV_WC_SUCCESS, wc[0].Status)
	require.Equal(t, IBV_WC_SUCCESS, wc[1].Status)
	assert.Equal(t, src, dst)
	assert.Equal(t, src, back)
	var wrapped bool
	for _, s := range w.seen {
		if s.psn < 0x10 {
			wrapped = true
		}
	}
	assert.True(t, wrapped, "PSNs wrapped past 0xFFFFFF")
}

func TestLossyMixed(t *testing.T) {
	for _, loss := range []float64{0.01, 0.05, 0.20} {
		t.Run(fmt.Sprint(loss), func(t *testing.T) {
			o := defaultOpts()
			o.timeout = 8 // 1 ms
			w := newWire(t, o)
			w.loss, w.dup, w.reorder = loss, 0.02, 0.05
			const msgs = 60
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
					require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: uint64(i), SGEs: []SGE{bmr.SGE(off, 4096)}}))
					wr = SendWR{Opcode: IBV_WR_SEND}
				case 1:
					wr = SendWR{Opcode: IBV_WR_RDMA_WRITE, RemoteAddr: bmr.VA + uint64(off), RKey: bmr.RKey}
				case 2:
					// Write then read back in the same slot.
					require.NoError(t, w.qp[0].PostSend(SendWR{WRID: uint64(1000 + i), Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED,
						SGEs: []SGE{amr.SGE(off, n)}, RemoteAddr: bmr.VA + uint64(off), RKey: bmr.RKey}))
					wr = SendWR{Opcode: IBV_WR_RDMA_READ, RemoteAddr: bmr.VA + uint64(off), RKey: bmr.RKey}
					wr.SGEs = []SGE{kmr.SGE(off, n)}
				}
				wr.WRID = uint64(i)
				wr.Flags = IBV_SEND_SIGNALED
				if wr.SGEs == nil {
					wr.SGEs = []SGE{amr.SGE(off, n)}
				}
				require.NoError(t, w.qp[0].PostSend(wr))
			}
			wc := w.poll(0, msgs+msgs/3)
			// Completions come in posting order, all successful.
			var ids []uint64
			for _, c := range wc {
				require.Equal(t, IBV_WC_SUCCESS, c.Status, "wr %d: %v (counters A %+v B %+v)", c.WRID, c.Status, w.qp[0].Counters, w.qp[1].Counters)
				ids = append(ids, c.WRID)
			}
			var want []uint64
			for i := range msgs {
				if i%3 == 2 {
					want = append(want, uint64(1000+i))
				}
				want = append(want, uint64(i))
			}
			assert.Equal(t, want, ids)
			rc := w.poll(1, msgs/3)
			for k, c := range rc {
				assert.Equal(t, IBV_WC_SUCCESS, c.Status)
				assert.Equal(t, uint64(k*3), c.WRID)
			}
			for i := range msgs {
				n := 1 + (i*997)%4096
				off := i * 4096
				assert.Equal(t, bufA[off:off+n], bufB[off:off+n], "message %d", i)
				if i%3 == 2 {
					assert.Equal(t, bufA[off:off+n], back[off:off+n], "read %d", i)
				}
			}
			t.Logf("loss %.2f: counters A %+v", loss, w.qp[0].Counters)
			t.Logf("loss %.2f: counters B %+v", loss, w.qp[1].Counters)
			if loss >= 0.05 {
				assert.NotZero(t, w.qp[0].Counters.RetransmittedPkts)
			}
		})
	}
}

func TestRNRThenRecovery(t *testing.T) {
	w := newWire(t, defaultOpts())
	src := pattern(100, 1)
	dst := make([]byte, 100)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, 100)}}))
	// No receive posted: the responder answers RNR NAK.
	w.runUntil(func() bool { return w.qp[0].Counters.RNRNakRetryErr >= 2 })
	assert.Equal(t, uint64(2), w.qp[1].Counters.SendRNRErr)
	start := w.now
	require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: 5, SGEs: []SGE{dmr.SGE(0, 100)}}))
	wc := w.poll(0, 1)
	assert.Equal(t, IBV_WC_SUCCESS, wc[0].Status)
	assert.Equal(t, src, dst)
	// min_rnr_timer 12 is 640 us (IBTA Table 45).
	assert.GreaterOrEqual(t, w.now.Sub(start).Microseconds(), int64(0))
	var rnr []seenPkt
	for _, s := range w.seen {
		if s.from == 1 && s.syn.Kind() == bth.KindRNRNAK {
			rnr = append(rnr, s)
		}
	}
	require.NotEmpty(t, rnr)
	assert.Equal(t, uint8(12), rnr[0].syn.Value())
}

func TestRNRRetryExhausted(t *testing.T) {
	o := defaultOpts()
	o.rnrRetry = 2
	w := newWire(t, o)
	src := pattern(10, 1)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, SGEs: []SGE{smr.SGE(0, 10)}}))
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 2, Opcode: IBV_WR_SEND, SGEs: []SGE{smr.SGE(0, 10)}}))
	wc := w.poll(0, 2)
	assert.Equal(t, IBV_WC_RNR_RETRY_EXC_ERR, wc[0].Status)
	assert.Equal(t, IBV_WC_WR_FLUSH_ERR, wc[1].Status)
	assert.Equal(t, IBV_QPS_ERR, w.qp[0].State())
	assert.Equal(t, uint64(3), w.qp[0].Counters.RNRNakRetryErr, "the first try and two retries")
}

func TestRKeyViolation(t *testing.T) {
	for _, c := range []struct {
		name string
		wr   func(l, r *MR) SendWR
	}{
		{"bad rkey", func(l, r *MR) SendWR {
			return SendWR{Opcode: IBV_WR_RDMA_WRITE, SGEs: []SGE{l.SGE(0, 64)}, RemoteAddr: r.VA, RKey: r.RKey + 1}
		}},
		{"out of bounds", func(l, r *MR) SendWR {
			return SendWR{Opcode: IBV_WR_RDMA_WRITE, SGEs: []SGE{l.SGE(0, 64)}, RemoteAddr: r.VA + 4096 - 32, RKey: r.RKey}
		}},
		{"no remote read", func(l, r *MR) SendWR {
			return SendWR{Opcode: IBV_WR_RDMA_READ, SGEs: []SGE{l.SGE(0, 64)}, RemoteAddr: r.VA, RKey: r.RKey}
		}},
		{"no remote atomic", func(l, r *MR) SendWR {
			return SendWR{Opcode: IBV_WR_ATOMIC_FETCH_AND_ADD, SGEs: []SGE{l.SGE(0, 8)}, RemoteAddr: r.VA, RKey: r.RKey, CompareAdd: 1}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWire(t, defaultOpts())
			local := pattern(4096, 1)
			remote := make([]byte, 4096)
			lmr, _ := w.pd[0].RegMR(local, IBV_ACCESS_LOCAL_WRITE)
			rmr, _ := w.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
			wr := c.wr(lmr, rmr)
			wr.WRID, wr.Flags = 1, IBV_SEND_SIGNALED
			require.NoError(t, w.qp[0].PostSend(wr))
			wc := w.poll(0, 1)
			assert.Equal(t, IBV_WC_REM_ACCESS_ERR, wc[0].Status)
			assert.Equal(t, IBV_QPS_ERR, w.qp[0].State())
			assert.Equal(t, IBV_QPS_ERR, w.qp[1].State(), "remote access errors are fatal to the responder too (rxe)")
			assert.Equal(t, make([]byte, 4096), remote, "nothing written")
			assert.Equal(t, uint64(1), w.qp[1].Counters.RespRemoteAccessErr)
		})
	}
}

func TestRetryExhausted(t *testing.T) {
	o := defaultOpts()
	o.retry = 3
	o.timeout = 10
	w := newWire(t, o)
	w.drop = func(from int, p *bth.Packet) bool { return from == 0 } // the peer never hears us
	src := pattern(10, 1)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, SGEs: []SGE{smr.SGE(0, 10)}}))
	start := w.now
	wc := w.poll(0, 1)
	assert.Equal(t, IBV_WC_RETRY_EXC_ERR, wc[0].Status)
	assert.Equal(t, uint64(4), w.qp[0].Counters.LocalAckTimeoutErr)
	assert.Equal(t, 4, w.sent[0], "the first send and three retries")
	// Four timeouts of 4.096 us * 2^10.
	assert.Equal(t, 4*LocalAckTimeout(10), w.now.Sub(start))
}

// retry_cnt 7 never runs out, as on rxe; with StrictRetryCount it means 7.
func TestRetryCount7(t *testing.T) {
	o := defaultOpts()
	o.timeout = 1
	w := newWire(t, o)
	w.drop = func(from int, p *bth.Packet) bool { return from == 0 }
	smr, _ := w.pd[0].RegMR(pattern(10, 1), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, SGEs: []SGE{smr.SGE(0, 10)}}))
	w.runUntil(func() bool { return w.sent[0] >= 100 })
	assert.Equal(t, IBV_QPS_RTS, w.qp[0].State())

	o.strict = true
	w = newWire(t, o)
	w.drop = func(from int, p *bth.Packet) bool { return from == 0 }
	smr, _ = w.pd[0].RegMR(pattern(10, 1), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, SGEs: []SGE{smr.SGE(0, 10)}}))
	wc := w.poll(0, 1)
	assert.Equal(t, IBV_WC_RETRY_EXC_ERR, wc[0].Status)
	assert.Equal(t, 8, w.sent[0])
}
