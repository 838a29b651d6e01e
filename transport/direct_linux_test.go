//go:build linux

package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Direct reads (direct.go) need a Conn that can be kicked: the Linux UDP
// Conn. These tests run on loopback in real time; their timeouts only
// bound a hang.

// directPair is a UDP pair with 8-byte ping buffers (pingBuffers).
func directPair(t *testing.T, opts Options, cfg pairConfig) ([2]*side, [2][]qp.SGE) {
	s := connectOpts(t, udpPair(t), cfg, opts)
	return s, pingBuffers(t, s)
}

// steadyPair is defaultPair with an ACK timeout of 4.3 s (timeout 20),
// for the tests that assert nothing was retransmitted over loopback,
// where nothing is lost: with defaultPair's 16.8 ms, a stall of the test
// process under -race on a busy machine (CI runs packages side by side)
// once let the timer fire with nothing lost.
func steadyPair() pairConfig {
	cfg := defaultPair()
	cfg.timeout = 20
	return cfg
}

// ping sends one SEND from side i and waits, in this goroutine, for its
// receive at side 1-i and the SEND's own completion at side i.
func ping(t *testing.T, s [2]*side, sge [2][]qp.SGE, i int) {
	t.Helper()
	require.NoError(t, s[i].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[i]}))
	for _, c := range wait(t, s[1-i].cq, 1) {
		require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		require.Equal(t, qp.IBV_WC_RECV, c.Opcode)
	}
	require.NoError(t, s[1-i].qp.PostRecv(qp.RecvWR{SGEs: sge[1-i]}))
	for _, c := range wait(t, s[i].cq, 1) {
		require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		require.Equal(t, qp.IBV_WC_SEND, c.Opcode)
	}
}

// echo answers every receive at side 1 with a SEND, until ctx ends.
func echo(t *testing.T, ctx context.Context, s *side, sge []qp.SGE) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		wc := make([]qp.WC, 16)
		for {
			n, err := s.cq.Wait(ctx, wc)
			if err != nil {
				return
			}
			for _, c := range wc[:n] {
				if !assert.Equal(t, qp.IBV_WC_SUCCESS, c.Status) {
					return
				}
				if c.Opcode == qp.IBV_WC_RECV {
					assert.NoError(t, s.qp.PostRecv(qp.RecvWR{SGEs: sge}))
					assert.NoError(t, s.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge}))
				}
			}
		}
	}()
	return done
}

// pingPong runs n round trips of SENDs against echo, and returns when
// all have completed.
func pingPong(t *testing.T, s [2]*side, sge [2][]qp.SGE, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := echo(t, ctx, s[1], sge[1])
	defer func() { cancel(); <-done }()
	for range n {
		require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
		sent, got := false, false
		for !sent || !got {
			for _, c := range wait(t, s[0].cq, 1) {
				require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
				switch c.Opcode {
				case qp.IBV_WC_RECV:
					got = true
					require.NoError(t, s[0].qp.PostRecv(qp.RecvWR{SGEs: sge[0]}))
				case qp.IBV_WC_SEND:
					sent = true
				}
			}
		}
	}
}

// In a ping-pong, the goroutines in CQ.Wait read the socket themselves
// once the read loop has lent it, on both sides, and every message and
// ACK arrives.
func TestDirectReadPingPong(t *testing.T) {
	s, sge := directPair(t, Options{}, steadyPair())
	pingPong(t, s, sge, 200)
	for i := range 2 {
		st := s[i].ep.Stats()
		assert.NotZero(t, st.DirectBatches, "side %d: batches read in CQ.Wait", i)
		assert.Empty(t, st.Drops(), "side %d", i)
		c := s[i].qp.Counters()
		assert.Zero(t, c.RetransmittedPkts, "side %d", i)
		// One goroutine waits on each CQ: its channel is the one kept
		// for reuse, however many batches it read.
		s[i].ep.mu.Lock()
		free := len(s[i].cq.free)
		s[i].ep.mu.Unlock()
		assert.LessOrEqual(t, free, 1, "side %d: channels kept for reuse", i)
	}
}

// With ReplyHold off, or a QP whose local ACK timeout is under
// minHoldTimeout, the read loop never lends the socket.
func TestDirectReadOff(t *testing.T) {
	short := defaultPair()
	short.timeout = 8
	for _, c := range []struct {
		name string
		opts Options
		cfg  pairConfig
	}{
		{"reply-hold off", Options{ReplyHold: -1}, defaultPair()},
		{"short timeout", Options{}, short},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, sge := directPair(t, c.opts, c.cfg)
			pingPong(t, s, sge, 50)
			for i := range 2 {
				assert.Zero(t, s[i].ep.Stats().DirectBatches, "side %d", i)
			}
		})
	}
}

// longLease keeps a lent socket lent for the length of a test (and an
// ACK held until the next CQ.Wait finds its CQ empty).
var longLease = Options{ReplyHold: time.Minute}

// lend has side 0 send a SEND that side 1 receives in CQ.Wait, after
// which side 1's read loop has lent its socket (longLease).
func lend(t *testing.T, s [2]*side, sge [2][]qp.SGE) {
	t.Helper()
	got := make(chan []qp.WC)
	go func() { got <- wait(t, s[1].cq, 1) }()
	parkedIn(t, s[1].cq) // the read loop lends only after waking a waiter
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
	for _, c := range <-got {
		require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		require.Equal(t, qp.IBV_WC_RECV, c.Opcode)
	}
}

// parkedIn waits until a goroutine is parked in c.Wait (or reads there).
func parkedIn(t *testing.T, c *CQ) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.ep.mu.Lock()
		defer c.ep.mu.Unlock()
		return len(c.waiters) > 0
	}, 10*time.Second, 100*time.Microsecond, "a goroutine waits in CQ.Wait")
}

// readingInWait waits until ep has lent its socket and a goroutine in
// CQ.Wait reads it.
func readingInWait(t *testing.T, ep *Endpoint) {
	t.Helper()
	require.Eventually(t, func() bool {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		return ep.lent && ep.inline
	}, 10*time.Second, 100*time.Microsecond, "a goroutine in CQ.Wait reads the socket")
}

// A goroutine reading the socket in CQ.Wait returns when its ctx ends,
// and the socket reads as before afterwards (the kick undone).
func TestDirectReadCtxCancel(t *testing.T) {
	s, sge := directPair(t, longLease, defaultPair())
	lend(t, s, sge)
	cancelWhileReading(t, s[1])
	pingPong(t, s, sge, 20)
}

// cancelWhileReading ends the ctx of a goroutine reading in side's
// CQ.Wait, and checks that Wait returns context.Canceled.
func cancelWhileReading(t *testing.T, side *side) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := side.cq.Wait(ctx, make([]qp.WC, 1))
		errc <- err
	}()
	readingInWait(t, side.ep)
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return when its ctx ended")
	}
}

// Completions that no read produced (a Modify to ERR flushing the posted
// receives, from another goroutine) wake the goroutine reading in Wait.
func TestDirectReadWokenByOtherCompletions(t *testing.T) {
	s, sge := directPair(t, longLease, defaultPair())
	lend(t, s, sge)
	got := make(chan []qp.WC)
	go func() {
		wc := make([]qp.WC, 8)
		n, err := s[1].cq.Wait(context.Background(), wc)
		assert.NoError(t, err)
		got <- wc[:n]
	}()
	readingInWait(t, s[1].ep)
	require.NoError(t, s[1].qp.Modify(&qp.Attr{State: qp.IBV_QPS_ERR}, qp.IBV_QP_STATE))
	select {
	case wc := <-got:
		require.NotEmpty(t, wc)
		assert.Equal(t, qp.IBV_WC_WR_FLUSH_ERR, wc[0].Status)
	case <-time.After(10 * time.Second):
		t.Fatal("the flushed receives did not wake the goroutine reading in Wait")
	}
}

// When no goroutine comes back to Wait, the read loop takes the socket
// back (ReplyHold later): the peer's SENDs are received and ACKed with
// nobody waiting.
func TestDirectReadLentSocketReturns(t *testing.T) {
	s, sge := directPair(t, Options{}, steadyPair())
	lend(t, s, sge)
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
	for _, c := range wait(t, s[0].cq, 2) {
		require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		require.Equal(t, qp.IBV_WC_SEND, c.Opcode)
	}
	s[1].ep.mu.Lock()
	lent := s[1].ep.lent
	s[1].ep.mu.Unlock()
	assert.False(t, lent, "the read loop took the socket back")
	assert.Equal(t, 1, s[1].cq.Poll(make([]qp.WC, 4)), "the SEND was received with nobody waiting")
	assert.Zero(t, s[0].qp.Counters().RetransmittedPkts)
}

// Two goroutines in Wait on two CQs: one reads the socket, the other is
// parked and woken by the first's reads; each gets its own completions.
func TestDirectReadTwoWaiters(t *testing.T) {
	s, sge := directPair(t, longLease, defaultPair())
	// A second QP pair on the same Endpoints, with CQs of its own.
	var q2 [2]*QP
	var cq2 [2]*CQ
	for i := range 2 {
		cq2[i] = s[i].ep.NewCQ(64)
		q, err := s[i].ep.NewQP(s[i].pd, cq2[i], cq2[i], qp.InitAttr{MaxSendWR: 16, MaxRecvWR: 16, SQSigAll: true})
		require.NoError(t, err)
		q2[i] = q
	}
	for i := range 2 {
		peer := q2[1-i]
		require.NoError(t, q2[i].Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q2[i].Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: qp.IBV_MTU_1024, DestQPN: peer.QPN(), RQPSN: 0x100,
			MinRNRTimer: 1, AV: qp.AddressVector{Remote: s[1-i].ep.LocalAddr()}},
			qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER))
		require.NoError(t, q2[i].Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
			qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC))
		require.NoError(t, q2[i].PostRecv(qp.RecvWR{SGEs: sge[i]}))
	}
	lend(t, s, sge)
	type res struct {
		which int
		wc    []qp.WC
	}
	got := make(chan res, 2)
	waitOn := func(k int, cq *CQ) {
		go func() {
			wc := make([]qp.WC, 4)
			n, err := cq.Wait(context.Background(), wc)
			assert.NoError(t, err)
			got <- res{k, wc[:n]}
		}()
	}
	// The second pair's goroutine reads; the first pair's parks.
	waitOn(1, cq2[1])
	readingInWait(t, s[1].ep)
	waitOn(0, s[1].cq)
	parkedIn(t, s[1].cq)
	// The reader leaves first: the parked goroutine must not wait on
	// a socket nobody reads.
	for _, k := range []int{1, 0} {
		q := []*QP{s[0].qp, q2[0]}[k]
		require.NoError(t, q.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
		select {
		case r := <-got:
			require.Equal(t, k, r.which, "the completion woke the goroutine of its own CQ")
			require.NotEmpty(t, r.wc)
			assert.Equal(t, qp.IBV_WC_RECV, r.wc[0].Opcode)
		case <-time.After(10 * time.Second):
			t.Fatalf("the SEND on QP pair %d woke no goroutine", k)
		}
	}
}

// Close while a goroutine reads in Wait: Wait returns ErrClosed, and
// Close returns (the read loop ended).
func TestDirectReadClose(t *testing.T) {
	s, sge := directPair(t, longLease, defaultPair())
	lend(t, s, sge)
	errc := make(chan error)
	go func() {
		_, err := s[1].cq.Wait(context.Background(), make([]qp.WC, 1))
		errc <- err
	}()
	readingInWait(t, s[1].ep)
	closed := make(chan error)
	go func() { closed <- s[1].ep.Close() }()
	for range 2 {
		select {
		case err := <-errc:
			assert.True(t, errors.Is(err, ErrClosed), "Wait: %v", err)
		case err := <-closed:
			assert.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Close or Wait hung")
		}
	}
}

// A goroutine left parked in Wait (as a CM Service's on QP1's CQ) keeps
// the socket with the read loop: lending it would only have it taken
// back when the woken goroutine leaves Wait.
func TestDirectReadNotWithOthersParked(t *testing.T) {
	s, sge := directPair(t, Options{}, defaultPair())
	idle := s[1].ep.NewCQ(4)
	ctx, cancel := context.WithCancel(context.Background())
	parked := make(chan struct{})
	go func() {
		defer close(parked)
		_, err := idle.Wait(ctx, make([]qp.WC, 1))
		assert.ErrorIs(t, err, context.Canceled)
	}()
	parkedIn(t, idle)
	pingPong(t, s, sge, 50)
	cancel()
	<-parked
	lends := func(ep *Endpoint) int {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		return ep.lends
	}
	assert.Zero(t, lends(s[1].ep), "the side with a goroutine parked on another CQ")
	assert.NotZero(t, lends(s[0].ep), "the other side")
}

// A goroutine reading in Wait on a busy-polling Conn stops spinning when
// its ctx ends, well before the busy-poll budget is spent.
func TestDirectReadCtxCancelBusyPoll(t *testing.T) {
	s, sge := directPair(t, longLease, defaultPair())
	lend(t, s, sge)
	s[1].ep.kicker.(*udpConn).setBusyPoll(time.Minute)
	cancelWhileReading(t, s[1])
}

// Several goroutines in Wait on one CQ, one message at a time, each Wait
// with a ctx of its own (context.WithTimeout per call): every message
// wakes one of them. A kick undone only after the batch was handled (the
// lock released to write meanwhile) once left the read loop reading with
// the deadline still set, and it stopped.
func TestDirectReadManyWaitersOneCQ(t *testing.T) {
	const waiters, msgs = 4, 1000
	s, sge := directPair(t, Options{}, defaultPair())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recvd := make(chan struct{}, msgs)
	for range waiters {
		go func() {
			wc := make([]qp.WC, 1)
			for {
				wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
				n, err := s[1].cq.Wait(wctx, wc)
				wcancel()
				if ctx.Err() != nil || errors.Is(err, ErrClosed) {
					return
				}
				for _, c := range wc[:n] {
					if c.Opcode == qp.IBV_WC_RECV {
						assert.NoError(t, s[1].qp.PostRecv(qp.RecvWR{SGEs: sge[1]}))
						recvd <- struct{}{}
					}
				}
			}
		}()
	}
	for m := range msgs {
		require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
		select {
		case <-recvd:
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d: received by no goroutine in Wait (side 1: %+v)", m, s[1].ep.Stats())
		}
		wait(t, s[0].cq, 1)
	}
}

// A goroutine reading in Wait whose ctx ends as the Endpoint closes:
// Close returns. The kicked read once left the socket lent to nobody, and
// Close waited for the read loop for ever.
func TestDirectReadCloseWhileKicked(t *testing.T) {
	for i := range 100 {
		s, sge := directPair(t, longLease, defaultPair())
		lend(t, s, sge)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := s[1].cq.Wait(ctx, make([]qp.WC, 1))
			errc <- err
		}()
		readingInWait(t, s[1].ep)
		closed := make(chan error, 1)
		go cancel()
		go func() { closed <- s[1].ep.Close() }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: Close hung", i)
		}
		<-errc
		s[0].ep.Close()
	}
}

// Two goroutines in Wait on one CQ, each woken by a SEND of its own.
func TestDirectReadTwoWaitersOneCQ(t *testing.T) {
	s, sge := directPair(t, longLease, defaultPair())
	lend(t, s, sge)
	got := make(chan error, 2)
	for range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s[1].cq.Wait(ctx, make([]qp.WC, 1))
			got <- err
		}()
	}
	require.Eventually(t, func() bool {
		s[1].ep.mu.Lock()
		defer s[1].ep.mu.Unlock()
		return len(s[1].cq.waiters) == 2 && s[1].ep.inline
	}, 10*time.Second, 100*time.Microsecond, "one goroutine reads, one is parked")
	for k := range 2 {
		require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
		assert.NoError(t, <-got, "Wait %d", k)
	}
}

// A read deadline the read loop finds (a kick meant for a reader in Wait
// that was undone too late, whoever undid it) does not stop it: only
// kicks set deadlines.
func TestDirectReadLoopSurvivesStaleKick(t *testing.T) {
	s, sge := directPair(t, Options{ReplyHold: -1}, defaultPair()) // the read loop reads throughout
	s[1].ep.kicker.kick()                                          // the deadline without the flag: undone elsewhere
	pingPong(t, s, sge, 10)
}

// TestDirectReadLeaseAfterKick: a goroutine reads the lent socket in Wait
// past its lease (the timer fires while it reads and leaves the lease
// out), then its ctx ends (a kick) and it leaves Wait for good. The lease
// restarts at the kick and is armed again, so the read loop takes the
// socket back and the peer's next SEND is received while the application
// only polls. (From a review: without the re-arm the socket stayed lent
// to nobody.)
func TestDirectReadLeaseAfterKick(t *testing.T) {
	s, sge := directPair(t, Options{ReplyHold: 20 * time.Millisecond}, steadyPair())
	lend(t, s, sge)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := s[1].cq.Wait(ctx, make([]qp.WC, 1))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
	wc := make([]qp.WC, 4)
	lent := func() bool { s[1].ep.mu.Lock(); defer s[1].ep.mu.Unlock(); return s[1].ep.lent }
	require.Eventually(t, func() bool { return s[1].cq.Poll(wc) > 0 }, 2*time.Second, time.Millisecond,
		"the SEND is received with nobody in Wait (lent=%v)", lent())
}

// connectSecond connects one more QP on each of the pair's Endpoints, side
// 1's completing on cq1, as connectOpts connects the first.
func connectSecond(t *testing.T, s [2]*side, cq1 *CQ, cfg pairConfig) [2]*QP {
	t.Helper()
	var q [2]*QP
	for i := range 2 {
		cq := s[i].cq
		if i == 1 {
			cq = cq1
		}
		var err error
		q[i], err = s[i].ep.NewQP(s[i].pd, cq, cq, qp.InitAttr{MaxSendWR: 16, MaxRecvWR: 16, SQSigAll: true})
		require.NoError(t, err)
	}
	for i := range 2 {
		require.NoError(t, q[i].Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE},
			qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q[i].Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: cfg.mtu, DestQPN: q[1-i].QPN(), RQPSN: cfg.psn[1-i],
			MinRNRTimer: 1, AV: qp.AddressVector{Remote: s[1-i].ep.LocalAddr()}},
			qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER))
		require.NoError(t, q[i].Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: cfg.psn[i], Timeout: cfg.timeout, RetryCnt: cfg.retry,
			RNRRetry: cfg.rnrRetry},
			qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC))
	}
	return q
}

// A goroutine waiting on a CQ of its own, with nothing for it (an rdma_cm
// Service on QP1's CQ), that reads the lent socket in Wait does not end
// the holds made for the goroutine it wakes: the echo's ACKs still leave
// with its replies. (It did: back in Wait on its empty CQ after each
// batch it read, it wrote the held ACK before the reply was posted; two
// such holds in a row stopped the holding. `roce-emu lat -R` sent the ACK
// and the reply in two system calls per round trip, for 1.5 times the
// latency of `lat`.)
func TestReplyHoldNotEndedByAnotherCQsWaiter(t *testing.T) {
	cfg := steadyPair()
	// The long lease keeps the socket lent to the background waiter
	// however slowly it comes back to Wait (-race on a busy machine).
	s, sge := directPair(t, longLease, cfg)
	bg := s[1].ep.NewCQ(16)
	q := connectSecond(t, s, bg, cfg)
	mr, err := s[1].pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	require.NoError(t, q[1].PostRecv(qp.RecvWR{SGEs: []qp.SGE{mr.SGE(0, 8)}}))
	ctx, cancel := context.WithCancel(context.Background())
	woken := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { // the background waiter
		defer close(done)
		wc := make([]qp.WC, 4)
		for {
			n, err := bg.Wait(ctx, wc)
			if err != nil {
				return
			}
			if n > 0 {
				select {
				case woken <- struct{}{}:
				default:
				}
			}
		}
	}()
	defer func() { cancel(); <-done }()
	parkedIn(t, bg)
	// Its one completion wakes it with nobody else waiting on side 1: the
	// read loop lends it the socket, which it reads from then on.
	require.NoError(t, q[0].PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
	<-woken
	readingInWait(t, s[1].ep)
	const rounds = 200
	s[1].ep.mu.Lock()
	before := s[1].ep.holds
	s[1].ep.mu.Unlock()
	pingPong(t, s, sge, rounds)
	s[1].ep.mu.Lock()
	holds := s[1].ep.holds - before
	s[1].ep.mu.Unlock()
	t.Logf("%d holds in %d round trips", holds, rounds)
	// 145 to 174 of 200 seen under -race beside other packages' tests
	// (which batches went unheld there was not traced); 7 when the
	// background waiter ended the holds.
	assert.GreaterOrEqual(t, holds, rounds/2, "side 1 held its ACK for the echo's reply in most round trips")
	for i := range 2 {
		assert.Zero(t, s[i].qp.Counters().RetransmittedPkts, "side %d", i)
	}
}
