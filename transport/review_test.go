package transport

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every goroutine waiting on a CQ is woken: by completions, and by Close.
func TestCQWaitersAllWoken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := memPair(t, Impairments{Delay: time.Microsecond}, defaultPair())
		a := s[0]
		mr, _ := a.pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE)
		dmr, _ := s[1].pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
		var wg sync.WaitGroup
		got := make([]int, 3)
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wc := make([]qp.WC, 1)
				n, _ := a.cq.Wait(context.Background(), wc)
				got[i] = n
			}()
		}
		synctest.Wait()
		// Two completions from one ACK wake two waiters; Close wakes the third.
		for k := range 2 {
			require.NoError(t, a.qp.PostSend(qp.SendWR{WRID: uint64(k), Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{mr.SGE(0, 8)},
				RemoteAddr: dmr.VA, RKey: dmr.RKey}))
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 2, got[0]+got[1]+got[2], "two waiters got a completion each")
		a.ep.Close()
		wg.Wait()
		assert.ErrorIs(t, a.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND}), ErrClosed)
	})
}

// A delayed and duplicated inbound packet is delivered twice, later.
func TestDelayedDuplicateInbound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dup, err := ParseFault("dup:dir=in,opcode=SEND_ONLY,count=1")
		require.NoError(t, err)
		delay, err := ParseFault("delay=3ms:dir=in,opcode=SEND_ONLY,count=1")
		require.NoError(t, err)
		cfg := defaultPair()
		cfg.faults[1] = NewFaults(1, dup, delay)
		s, _ := memPair(t, Impairments{Delay: time.Microsecond}, cfg)
		a, b := s[0], s[1]
		mr, _ := a.pd.RegMR([]byte("x"), qp.IBV_ACCESS_LOCAL_WRITE)
		rmr, _ := b.pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, b.qp.PostRecv(qp.RecvWR{SGEs: []qp.SGE{rmr.SGE(0, 8)}}))
		start := time.Now()
		require.NoError(t, a.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr.SGE(0, 1)}}))
		wait(t, b.cq, 1)
		assert.GreaterOrEqual(t, time.Since(start), 3*time.Millisecond)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, uint64(1), b.qp.Counters().DuplicateRequest, "the copy arrived as a duplicate")
	})
}
