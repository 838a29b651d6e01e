package transport

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manyPair is n connected RC QP pairs on one pair of Endpoints: qps[0][i]
// talks to qps[1][i]. Each side's QPs share one CQ.
type manyPair struct {
	ep  [2]*Endpoint
	pd  [2]*PD
	cq  [2]*CQ
	qps [2][]*QP
}

// connectMany builds Endpoints on conns and n QP pairs between them, with
// path MTU mtu and send queues of sq work requests. The local ACK timeout
// is 537 ms (code 17), so that a loaded machine's pauses do not look like
// losses.
func connectMany(t testing.TB, conns [2]Conn, n, sq int, mtu qp.MTU) *manyPair {
	m := &manyPair{}
	for i := range 2 {
		ep := NewEndpoint(conns[i], Options{})
		t.Cleanup(func() { ep.Close() })
		m.ep[i], m.pd[i] = ep, ep.NewPD()
		m.cq[i] = ep.NewCQ(n*sq + 64)
		m.qps[i] = make([]*QP, n)
		for k := range n {
			q, err := ep.NewQP(m.pd[i], m.cq[i], m.cq[i], qp.InitAttr{MaxSendWR: sq, MaxRecvWR: 1, SQSigAll: true})
			require.NoError(t, err)
			m.qps[i][k] = q
		}
	}
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ
	for i := range 2 {
		for k, q := range m.qps[i] {
			peer := m.qps[1-i][k]
			err := q.Connect(Remote{Addr: m.ep[1-i].LocalAddr(), QPN: peer.QPN(), PSN: 0x100},
				0x100, ConnectAttr{PathMTU: mtu, Access: access, Timeout: 17, RetryCnt: 7, RNRRetry: 7})
			require.NoError(t, err)
		}
	}
	return m
}

// runWrites keeps depth WRITEs of size bytes outstanding on each of the
// first n QPs of m until total have completed, and fails on any error.
func runWrites(t testing.TB, m *manyPair, n, depth, size, total int) {
	src := make([]byte, size)
	dst := make([]byte, size)
	smr, err := m.pd[0].RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	dmr, err := m.pd[1].RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, err)
	wr := qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, size)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}
	byQPN := make(map[uint32]*QP, n)
	posted := 0
	post := func(q *QP) {
		if err := q.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		posted++
	}
	for _, q := range m.qps[0][:n] {
		byQPN[q.QPN()] = q
		for range depth {
			if posted < total {
				post(q)
			}
		}
	}
	wc := make([]qp.WC, 256)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for done := 0; done < total; {
		k, err := m.cq[0].Wait(ctx, wc)
		if err != nil {
			t.Fatalf("%d of %d WRITEs completed: %v", done, total, err)
		}
		for _, c := range wc[:k] {
			if c.Status != qp.IBV_WC_SUCCESS {
				t.Fatalf("QPN %#x: %s", c.QPNum, c.Status)
			}
			done++
			if posted < total {
				post(byQPN[c.QPNum])
			}
		}
	}
}

// TestManyQPsWithLoss runs 300 QP pairs on one Endpoint pair over a
// network that loses 2% of the datagrams: every QP's retransmission timer
// and go-back-N run from the Endpoint's one deadline heap, and every WRITE
// completes.
func TestManyQPsWithLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conns := netConns(t, Impairments{Loss: 0.02, Delay: 20 * time.Microsecond}, 7)
		const n = 300
		m := connectMany(t, conns, n, 4, qp.IBV_MTU_1024)
		runWrites(t, m, n, 2, 4096, 4*n)
		var retrans uint64
		for _, q := range m.qps[0] {
			retrans += q.Counters().RetransmittedPkts
		}
		assert.NotZero(t, retrans, "with 2% loss some packets are resent by the QPs' timers or NAKs")
		m.ep[0].mu.Lock()
		defer m.ep[0].mu.Unlock()
		for _, q := range m.qps[0] {
			if d := q.q.Deadline(); !d.IsZero() {
				assert.GreaterOrEqual(t, q.heapIdx, 0, "QPN %#x has a deadline but is not in the heap", q.QPN())
				assert.False(t, d.Before(q.due), "QPN %#x is in the heap after its deadline", q.QPN())
			}
		}
	})
}

// TestScheduleDestroy destroys QPs with armed timers and packets queued:
// they leave the heap at once, the others keep running.
func TestScheduleDestroy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conns := netConns(t, Impairments{Delay: time.Millisecond}, 1)
		m := connectMany(t, conns, 4, 4, qp.IBV_MTU_1024)
		buf := make([]byte, 4096)
		smr, err := m.pd[0].RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		dmr, err := m.pd[1].RegMR(make([]byte, 4096), qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
		require.NoError(t, err)
		for _, q := range m.qps[0] {
			require.NoError(t, q.PostSend(qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 4096)},
				RemoteAddr: dmr.VA, RKey: dmr.RKey}))
		}
		m.ep[0].mu.Lock()
		assert.Len(t, m.ep[0].timers, 4, "each QP waits for its ACK")
		m.ep[0].mu.Unlock()
		m.qps[0][1].Destroy()
		m.qps[0][2].Destroy()
		m.ep[0].mu.Lock()
		assert.Len(t, m.ep[0].timers, 2)
		for i, w := range m.ep[0].timers {
			assert.Equal(t, i, w.heapIdx)
			assert.False(t, w.gone)
		}
		m.ep[0].mu.Unlock()
		wc := wait(t, m.cq[0], 2)
		got := map[uint32]bool{wc[0].QPNum: true, wc[1].QPNum: true}
		assert.Equal(t, map[uint32]bool{m.qps[0][0].QPN(): true, m.qps[0][3].QPN(): true}, got)
	})
}

// memNetConns returns two Conns on a Network with no impairments and a
// receive queue of queueLen datagrams.
func memNetConns(t testing.TB, queueLen int) [2]Conn {
	return netConns(t, Impairments{QueueLen: queueLen}, 1)
}

// netConns returns two Conns, 192.0.2.1 and 192.0.2.2 port 4791, on a
// Network with imp and random seed seed.
func netConns(t testing.TB, imp Impairments, seed uint64) [2]Conn {
	n := NewNetwork(imp, seed)
	var cs [2]Conn
	for i, a := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
		c, err := n.Listen(netip.MustParseAddrPort(a))
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	return cs
}

// idleQPBytes connects n QP pairs on one Endpoint pair over an in-memory
// Network and returns the heap they take per QP (2n QPs): the growth of
// runtime.MemStats.HeapAlloc, after a collection, from before the QPs
// were created to after they were connected.
func idleQPBytes(t testing.TB, n int) float64 {
	conns := memNetConns(t, 0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := connectMany(t, conns, n, 0, qp.IBV_MTU_1024)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(m)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(2*n)
}

// TestIdleQPMemory: 10,000 idle connected QP pairs take at most 4 KiB of
// heap per QP, Endpoint and CQs included.
func TestIdleQPMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 20,000 QPs")
	}
	per := idleQPBytes(t, 10000)
	t.Logf("%.0f bytes of heap per idle connected QP", per)
	assert.LessOrEqual(t, per, 4096.0)
}

// BenchmarkIdleQPMemory reports the heap per idle connected QP with
// 10,000 QP pairs on one Endpoint pair (idleQPBytes), once per op.
//
//	go test ./transport -run '^$' -bench IdleQPMemory -benchtime 3x
func BenchmarkIdleQPMemory(b *testing.B) {
	var sum float64
	for b.Loop() {
		sum += idleQPBytes(b, 10000)
	}
	b.ReportMetric(sum/float64(b.N), "B/qp")
}

// TestLazyDeadlineHeap: a QP's heap entry stays where its first deadline
// put it while later posts move its ACK timer later and ACKs stop it; the
// timer's fire at that entry takes it out (nothing in flight), and with
// it another QP's stale entry due within timerSlack, with no timeout and
// no resend.
func TestLazyDeadlineHeap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A microsecond on the wire: the ACK comes back after the
		// writer has armed the ACK timer, so the first post puts the QP
		// in the heap (with no delay the read loop may handle the ACK
		// while the writer has released the lock, and the QP never
		// gets a deadline).
		conns := netConns(t, Impairments{QueueLen: 64, Delay: time.Microsecond}, 1)
		m := connectMany(t, conns, 2, 4, qp.IBV_MTU_1024)
		src, err := m.pd[0].RegMR(make([]byte, 64), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		dst, err := m.pd[1].RegMR(make([]byte, 64), qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
		require.NoError(t, err)
		write := func(q *QP) {
			require.NoError(t, q.PostSend(qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{src.SGE(0, 64)},
				RemoteAddr: dst.VA, RKey: dst.RKey}))
			wait(t, m.cq[0], 1)
		}
		ep := m.ep[0]
		entry := func(q *QP) (due, deadline time.Time, in bool) {
			ep.mu.Lock()
			defer ep.mu.Unlock()
			return q.due, q.q.Deadline(), q.heapIdx >= 0
		}
		a, b := m.qps[0][0], m.qps[0][1]
		write(a)
		first, d, in := entry(a)
		require.True(t, in, "the first post puts the QP in the heap")
		assert.True(t, d.IsZero(), "the ACK stopped the ACK timer")
		time.Sleep(timerSlack / 2)
		write(b)
		bDue, _, in := entry(b)
		require.True(t, in)
		require.True(t, bDue.After(first) && bDue.Sub(first) < timerSlack, "b's entry is due within timerSlack after a's")
		time.Sleep(100 * time.Millisecond)
		write(a)
		due, d, in := entry(a)
		assert.True(t, d.IsZero())
		assert.True(t, in && due.Equal(first), "a later deadline leaves the entry where it was")

		time.Sleep(time.Until(first) + timerSlack/10)
		synctest.Wait()
		_, _, in = entry(a)
		assert.False(t, in, "the fire at the stale entry took a QP with nothing in flight out of the heap")
		_, _, in = entry(b)
		assert.False(t, in, "b's stale entry, due within timerSlack of a's, went with the same fire")
		for _, q := range m.qps[0] {
			c := q.Counters()
			assert.Zero(t, c.RetransmittedPkts, "QPN %#x", q.QPN())
			assert.Zero(t, c.LocalAckTimeoutErr, "QPN %#x", q.QPN())
			assert.Zero(t, c.CompleterRetry, "QPN %#x", q.QPN())
		}
	})
}
