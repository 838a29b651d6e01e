package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// side is one end of a connected pair.
type side struct {
	ep *Endpoint
	pd *PD
	cq *CQ
	qp *QP
}

type pairConfig struct {
	mtu      qp.MTU
	psn      [2]bth.PSN
	retry    uint8
	rnrRetry uint8
	timeout  uint8
	faults   [2]*Faults
	window   int // qp.InitAttr.MaxUnackedPSNs; 0: the default
}

func defaultPair() pairConfig {
	return pairConfig{mtu: qp.IBV_MTU_1024, psn: [2]bth.PSN{0x1000, 0x2000}, retry: 7, rnrRetry: 7, timeout: 12}
}

// connect builds endpoints on the two Conns and connects a QP on each to
// the other, as ibv_rc_pingpong would after its exchange.
func connect(t testing.TB, conns [2]Conn, cfg pairConfig) [2]*side {
	return connectOpts(t, conns, cfg, Options{})
}

// connectOpts is connect with Endpoints of options opts.
func connectOpts(t testing.TB, conns [2]Conn, cfg pairConfig, opts Options) [2]*side {
	var s [2]*side
	for i := range 2 {
		conn := conns[i]
		if cfg.faults[i] != nil {
			conn = WithFaults(conn, cfg.faults[i], nil)
		}
		ep := NewEndpoint(conn, opts)
		t.Cleanup(func() { ep.Close() })
		pd := ep.NewPD()
		cq := ep.NewCQ(1 << 16)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 4096, MaxRecvWR: 4096, SQSigAll: true, MaxUnackedPSNs: cfg.window})
		require.NoError(t, err)
		s[i] = &side{ep, pd, cq, q}
	}
	for i := range 2 {
		q, peer := s[i].qp, s[1-i]
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT,
			AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ | qp.IBV_ACCESS_REMOTE_ATOMIC},
			qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: cfg.mtu, DestQPN: peer.qp.QPN(), RQPSN: cfg.psn[1-i],
			MaxDestRdAtomic: 16, MinRNRTimer: 1, AV: qp.AddressVector{Remote: peer.ep.LocalAddr()}},
			qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: cfg.psn[i], Timeout: cfg.timeout, RetryCnt: cfg.retry,
			RNRRetry: cfg.rnrRetry, MaxRdAtomic: 16},
			qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC))
	}
	return s
}

func wait(t testing.TB, c *CQ, n int) []qp.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []qp.WC
	buf := make([]qp.WC, 64)
	for len(out) < n {
		k, err := c.Wait(ctx, buf)
		require.NoError(t, err, "waiting for %d completions, have %d", n, len(out))
		out = append(out, buf[:k]...)
	}
	return out
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13) ^ seed ^ byte(i>>9)
	}
	return b
}

var sizes = []int{0, 1, 1023, 1024, 1025, 1 << 20}

// everyOpcode runs every work request type at every size and checks every
// byte and completion.
func everyOpcode(t *testing.T, s [2]*side) {
	a, b := s[0], s[1]
	for _, n := range sizes {
		src := pattern(max(n, 8), byte(n))
		dst := make([]byte, max(n, 8)+8)
		back := make([]byte, max(n, 8))
		smr, err := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		kmr, _ := a.pd.RegMR(back, qp.IBV_ACCESS_LOCAL_WRITE)
		dmr, _ := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE|qp.IBV_ACCESS_REMOTE_READ|qp.IBV_ACCESS_REMOTE_ATOMIC)

		// SEND, SEND_WITH_IMM, SEND_WITH_INV.
		// Over UDP the race detector cannot see that a packet orders this
		// goroutine's use of dst before B's endpoint writes it; taking B's
		// lock (Sync) after touching dst tells it.
		for k, op := range []qp.WROpcode{qp.IBV_WR_SEND, qp.IBV_WR_SEND_WITH_IMM, qp.IBV_WR_SEND_WITH_INV} {
			clear(dst)
			b.ep.Sync()
			require.NoError(t, b.qp.PostRecv(qp.RecvWR{WRID: uint64(k), SGEs: []qp.SGE{dmr.SGE(0, len(dst))}}))
			require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: uint64(k), Opcode: op, SGEs: []qp.SGE{smr.SGE(0, n)}, ImmData: 0x01020304, InvalidateRKey: 0x55}))
			sc, rc := wait(t, a.cq, 1), wait(t, b.cq, 1)
			require.Equal(t, qp.IBV_WC_SUCCESS, sc[0].Status, "%s %d", op, n)
			require.Equal(t, qp.IBV_WC_SUCCESS, rc[0].Status, "%s %d", op, n)
			assert.Equal(t, uint32(n), rc[0].ByteLen)
			assert.True(t, bytes.Equal(src[:n], dst[:n]), "%s %d bytes", op, n)
			switch op {
			case qp.IBV_WR_SEND_WITH_IMM:
				assert.Equal(t, uint32(0x01020304), rc[0].ImmData)
			case qp.IBV_WR_SEND_WITH_INV:
				assert.Equal(t, uint32(0x55), rc[0].InvalidatedRKey)
			}
			b.ep.Sync()
		}
		// RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ.
		clear(dst)
		b.ep.Sync()
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 10, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
		require.NoError(t, b.qp.PostRecv(qp.RecvWR{WRID: 11}))
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 11, Opcode: qp.IBV_WR_RDMA_WRITE_WITH_IMM, SGEs: []qp.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey, ImmData: 7}))
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 12, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{kmr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
		sc := wait(t, a.cq, 3)
		for i, c := range sc {
			require.Equal(t, qp.IBV_WC_SUCCESS, c.Status, "%d bytes, wr %d", n, c.WRID)
			require.Equal(t, uint64(10+i), c.WRID)
		}
		rc := wait(t, b.cq, 1)
		assert.Equal(t, qp.IBV_WC_RECV_RDMA_WITH_IMM, rc[0].Opcode)
		assert.Equal(t, uint32(7), rc[0].ImmData)
		assert.True(t, bytes.Equal(src[:n], dst[:n]))
		assert.True(t, bytes.Equal(src[:n], back[:n]))
		assert.Equal(t, make([]byte, len(dst)-n), dst[n:], "nothing written past %d bytes", n)
	}
	// Atomics on an aligned word.
	word := make([]byte, 16)
	binary.LittleEndian.PutUint64(word[8:], 40)
	wmr, _ := b.pd.RegMR(word, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_ATOMIC)
	res := make([]byte, 16)
	rmr, _ := a.pd.RegMR(res, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 20, Opcode: qp.IBV_WR_ATOMIC_FETCH_AND_ADD, SGEs: []qp.SGE{rmr.SGE(0, 8)}, RemoteAddr: wmr.VA + 8, RKey: wmr.RKey, CompareAdd: 2}))
	require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 21, Opcode: qp.IBV_WR_ATOMIC_CMP_AND_SWP, SGEs: []qp.SGE{rmr.SGE(8, 8)}, RemoteAddr: wmr.VA + 8, RKey: wmr.RKey, CompareAdd: 42, Swap: 1000}))
	sc := wait(t, a.cq, 2)
	require.Equal(t, qp.IBV_WC_SUCCESS, sc[0].Status)
	require.Equal(t, qp.IBV_WC_SUCCESS, sc[1].Status)
	assert.Equal(t, uint64(40), binary.LittleEndian.Uint64(res))
	assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(res[8:]))
	b.ep.Sync() // B wrote word; nothing on B completed after it
	assert.Equal(t, uint64(1000), binary.LittleEndian.Uint64(word[8:]))
}

func memPair(t *testing.T, imp Impairments, cfg pairConfig) ([2]*side, *Network) {
	n := NewNetwork(imp, 1)
	var conns [2]Conn
	for i, a := range []string{"192.0.2.1", "192.0.2.2"} {
		c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(a), 4791))
		require.NoError(t, err)
		conns[i] = c
	}
	return connect(t, conns, cfg), n
}

func TestMemEveryOpcode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := memPair(t, Impairments{Delay: 5 * time.Microsecond}, defaultPair())
		everyOpcode(t, s)
	})
}

func TestMemPSNWrap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultPair()
		cfg.psn = [2]bth.PSN{0xFFFFF0, 0xFFFFFD}
		s, _ := memPair(t, Impairments{Delay: 5 * time.Microsecond}, cfg)
		everyOpcode(t, s)
	})
}

// Random loss with duplicates and reordering: every byte verified and
// every completion in order.
func TestMemLossy(t *testing.T) {
	for _, loss := range []float64{0.01, 0.05, 0.20} {
		t.Run(fmt.Sprint(loss), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := defaultPair()
				cfg.timeout = 8 // 1 ms
				s, net := memPair(t, Impairments{Delay: 10 * time.Microsecond, Jitter: 20 * time.Microsecond, Loss: loss, Duplicate: 0.02}, cfg)
				a, b := s[0], s[1]
				const msgs = 40
				src := pattern(msgs*8192, 3)
				dst := make([]byte, msgs*8192)
				back := make([]byte, msgs*8192)
				smr, _ := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
				kmr, _ := a.pd.RegMR(back, qp.IBV_ACCESS_LOCAL_WRITE)
				dmr, _ := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE|qp.IBV_ACCESS_REMOTE_READ)
				recvs := 0
				for i := range msgs {
					n := 1 + (i*2741)%8192
					off := i * 8192
					wr := qp.SendWR{WRID: uint64(i), SGEs: []qp.SGE{smr.SGE(off, n)}}
					switch i % 3 {
					case 0:
						require.NoError(t, b.qp.PostRecv(qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{dmr.SGE(off, 8192)}}))
						recvs++
						wr.Opcode = qp.IBV_WR_SEND
					case 1:
						wr.Opcode, wr.RemoteAddr, wr.RKey = qp.IBV_WR_RDMA_WRITE, dmr.VA+uint64(off), dmr.RKey
					case 2:
						require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: uint64(1000 + i), Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(off, n)}, RemoteAddr: dmr.VA + uint64(off), RKey: dmr.RKey}))
						wr = qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{kmr.SGE(off, n)}, RemoteAddr: dmr.VA + uint64(off), RKey: dmr.RKey}
					}
					require.NoError(t, a.qp.PostSend(wr))
				}
				sc := wait(t, a.cq, msgs+msgs/3)
				var want, got []uint64
				for i := range msgs {
					if i%3 == 2 {
						want = append(want, uint64(1000+i))
					}
					want = append(want, uint64(i))
				}
				for _, c := range sc {
					require.Equal(t, qp.IBV_WC_SUCCESS, c.Status, "wr %d", c.WRID)
					got = append(got, c.WRID)
				}
				assert.Equal(t, want, got, "completions in posting order")
				rc := wait(t, b.cq, recvs)
				for k, c := range rc {
					require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
					assert.Equal(t, uint64(3*k), c.WRID)
				}
				b.ep.Sync()
				for i := range msgs {
					n := 1 + (i*2741)%8192
					off := i * 8192
					require.True(t, bytes.Equal(src[off:off+n], dst[off:off+n]), "message %d", i)
					if i%3 == 2 {
						require.True(t, bytes.Equal(src[off:off+n], back[off:off+n]), "read %d", i)
					}
				}
				ca := a.qp.Counters()
				t.Logf("loss %.2f: network lost %d dup %d; A retransmitted %d packets, seq NAKs %d, timeouts %d; B out-of-sequence %d duplicates %d",
					loss, net.Lost, net.Duplicated, ca.RetransmittedPkts, ca.PacketSeqErr, ca.LocalAckTimeoutErr,
					b.qp.Counters().OutOfSequence, b.qp.Counters().DuplicateRequest)
				assert.NotZero(t, ca.RetransmittedPkts)
			})
		})
	}
}

func TestMemRNRThenRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := memPair(t, Impairments{Delay: 5 * time.Microsecond}, defaultPair())
		a, b := s[0], s[1]
		src := pattern(3000, 1)
		dst := make([]byte, 3000)
		smr, _ := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
		dmr, _ := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, 3000)}}))
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.NotZero(t, b.qp.Counters().SendRNRErr, "no receive posted: RNR NAK")
		assert.NotZero(t, a.qp.Counters().RNRNakRetryErr)
		require.NoError(t, b.qp.PostRecv(qp.RecvWR{WRID: 2, SGEs: []qp.SGE{dmr.SGE(0, 3000)}}))
		sc := wait(t, a.cq, 1)
		require.Equal(t, qp.IBV_WC_SUCCESS, sc[0].Status)
		assert.Equal(t, src, dst)
	})
}

func TestMemRKeyViolation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := memPair(t, Impairments{Delay: 5 * time.Microsecond}, defaultPair())
		a, b := s[0], s[1]
		src := pattern(100, 1)
		dst := make([]byte, 100)
		smr, _ := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
		dmr, _ := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_READ) // no remote write
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 100)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, 100)}}))
		sc := wait(t, a.cq, 2)
		assert.Equal(t, qp.IBV_WC_REM_ACCESS_ERR, sc[0].Status)
		assert.Equal(t, qp.IBV_WC_WR_FLUSH_ERR, sc[1].Status)
		b.ep.Sync()
		assert.Equal(t, make([]byte, 100), dst, "nothing written")
		assert.Equal(t, qp.IBV_QPS_ERR, a.qp.State())
		assert.Equal(t, uint64(1), b.qp.Counters().RespRemoteAccessErr)
	})
}

func TestMemRetryExhausted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := defaultPair()
		cfg.retry = 2
		cfg.timeout = 10
		s, n := memPair(t, Impairments{Delay: 5 * time.Microsecond}, cfg)
		n.SetImpairments(Impairments{Delay: 5 * time.Microsecond, Loss: 1})
		a := s[0]
		smr, _ := a.pd.RegMR(pattern(10, 1), qp.IBV_ACCESS_LOCAL_WRITE)
		start := time.Now()
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, 10)}}))
		sc := wait(t, a.cq, 1)
		assert.Equal(t, qp.IBV_WC_RETRY_EXC_ERR, sc[0].Status)
		assert.Equal(t, 3*qp.LocalAckTimeout(10), time.Since(start), "three local ACK timeouts of 4.096 us * 2^10")
		assert.Equal(t, uint64(3), a.qp.Counters().LocalAckTimeoutErr)
	})
}

func TestMemStateErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(Impairments{}, 1)
		c, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		ep := NewEndpoint(c, Options{})
		defer ep.Close()
		pd := ep.NewPD()
		cq := ep.NewCQ(16)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{})
		require.NoError(t, err)
		assert.ErrorIs(t, q.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND}), qp.ErrBadState, "post in RESET")
		assert.ErrorIs(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS}, qp.IBV_QP_STATE), qp.ErrBadTransition, "RESET -> RTS")
		assert.ErrorIs(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT}, qp.IBV_QP_STATE), qp.ErrBadTransition, "INIT without access flags")
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		assert.ErrorIs(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: 9}, qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|
			qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER), qp.ErrBadAttr)
		assert.Equal(t, qp.IBV_QPS_INIT, q.State(), "a refused Modify changes nothing")
		mr, _ := pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, q.PostRecv(qp.RecvWR{WRID: 5, SGEs: []qp.SGE{mr.SGE(0, 8)}}))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_ERR}, qp.IBV_QP_STATE))
		wc := wait(t, cq, 1)
		assert.Equal(t, qp.IBV_WC_WR_FLUSH_ERR, wc[0].Status, "moving to ERR flushes the receive queue")
		require.NoError(t, q.PostSend(qp.SendWR{WRID: 6, Opcode: qp.IBV_WR_SEND}))
		wc = wait(t, cq, 1)
		assert.Equal(t, uint64(6), wc[0].WRID)
		assert.Equal(t, qp.IBV_WC_WR_FLUSH_ERR, wc[0].Status, "posting in ERR completes with a flush error")
	})
}

// Fault rules inside a Network (Impairments.Faults): drop the first and the second
// transmission of the WRITE Middle with PSN 0x1003, so that only the third
// copy arrives. The first loss is repaired by the sequence NAK the next
// packet provokes; the second by the local ACK timeout, since the
// responder NAKs a gap only once.
func TestMemNetworkFaultRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		psn, op := bth.PSN(0x1003), bth.RCWriteMiddle
		f := NewFaults(1, &FaultRule{Kind: FaultDrop, Dir: Both, PSN: &psn, Opcode: &op, Nth: 1},
			&FaultRule{Kind: FaultDrop, Dir: Both, PSN: &psn, Opcode: &op, Nth: 2})
		cfg := defaultPair()
		cfg.timeout = 8
		s, n := memPair(t, Impairments{Delay: 5 * time.Microsecond}, cfg)
		n.SetImpairments(Impairments{Delay: 5 * time.Microsecond, Faults: f})
		a, b := s[0], s[1]
		src := pattern(8192, 2)
		dst := make([]byte, 8192)
		smr, _ := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
		dmr, _ := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
		require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 8192)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
		wc := wait(t, a.cq, 1)
		require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
		b.ep.Sync()
		assert.Equal(t, src, dst)
		assert.Equal(t, uint64(2), n.Lost, "two copies of PSN 0x1003 dropped")
		c := a.qp.Counters()
		assert.Equal(t, uint64(1), c.PacketSeqErr, "%+v", c)
		assert.Equal(t, uint64(1), c.LocalAckTimeoutErr, "%+v", c)
		assert.Equal(t, uint64(1), b.qp.Counters().NAKsSent)
	})
}
