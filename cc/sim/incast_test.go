package sim

import (
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// paperQueue is the DCQCN paper's marking at 40 Gb/s: Kmin 5 KB, Kmax
// 200 KB, Pmax 1%.
func paperQueue(pfc bool) cc.QueueConfig {
	return cc.QueueConfig{LineRate: 40 * cc.Gbps, Buffer: 12 << 20, KMin: 5000, KMax: 200000, PMax: 0.01,
		PFC: pfc, XOFF: 3 << 20, XON: 2 << 20}
}

func incast(t *testing.T, flows int, dcqcn, pfc bool) *Result {
	p, err := cc.Profile(cc.ProfilePaper, 40*cc.Gbps)
	require.NoError(t, err)
	r, err := Run(Config{Flows: flows, LinkRate: 40 * cc.Gbps, Duration: 60 * time.Millisecond, MTU: 1024,
		Delay: time.Microsecond, Queue: paperQueue(pfc), DCQCN: dcqcn, Params: p, Seed: 1})
	require.NoError(t, err)
	return r
}

// With the paper's profile at 40 Gb/s, 2:1 and 8:1 incasts converge: fair
// (Jain >= 0.98 over the last half), the link busy (>= 0.9), the queue held
// near Kmax, nothing dropped or paused. Without DCQCN the same incast
// drops (no PFC) or builds a standing queue held only by PFC pauses.
func TestIncastConverges(t *testing.T) {
	for _, n := range []int{2, 8} {
		for _, pfc := range []bool{false, true} {
			r := incast(t, n, true, pfc)
			t.Logf("%d:1 DCQCN pfc=%v: per-flow %.2f Gb/s, Jain %.4f, utilisation %.3f, queue p50 %d p99 %d max %d, %d CNPs, %d marked, %d drops, %d pauses",
				n, pfc, r.PerFlowGbps, r.JainIndex, r.Utilization, r.QueueP50, r.QueueP99, r.QueueMax, r.CNPs, r.Marked, r.Drops, r.Pauses)
			assert.GreaterOrEqual(t, r.JainIndex, 0.98, "%d:1 fairness", n)
			assert.GreaterOrEqual(t, r.Utilization, 0.9, "%d:1 utilisation", n)
			assert.LessOrEqual(t, r.QueueP99, 300000, "%d:1 queue p99 within 1.5 Kmax (200 KB)", n)
			assert.Zero(t, r.Drops)
			assert.Zero(t, r.Pauses, "DCQCN keeps the queue far below XOFF")
			assert.NotZero(t, r.CNPs)
		}
		none := incast(t, n, false, false)
		t.Logf("%d:1 no CC: per-flow %.2f, Jain %.4f, drops %d, queue max %d", n, none.PerFlowGbps, none.JainIndex, none.Drops, none.QueueMax)
		assert.NotZero(t, none.Drops, "%d:1 without DCQCN overflows the buffer", n)
		paused := incast(t, n, false, true)
		t.Logf("%d:1 no CC, PFC: queue p50 %d, pauses %d", n, paused.QueueP50, paused.Pauses)
		assert.NotZero(t, paused.Pauses)
		assert.Zero(t, paused.Drops)
		assert.Greater(t, paused.QueueP50, 10*200000, "%d:1 without DCQCN the queue stands at PFC's XOFF", n)
	}
}

func TestIncastDeterministic(t *testing.T) {
	a, b := incast(t, 4, true, false), incast(t, 4, true, false)
	assert.Equal(t, a.PerFlowGbps, b.PerFlowGbps)
	assert.Equal(t, a.CNPs, b.CNPs)
	assert.Equal(t, len(a.Samples), len(b.Samples))
}

func TestIncastBadConfig(t *testing.T) {
	for _, c := range []Config{
		{Flows: 0, LinkRate: cc.Gbps, Duration: time.Millisecond, MTU: 1024, Queue: paperQueue(false)},
		{Flows: 2, LinkRate: 0, Duration: time.Millisecond, MTU: 1024, Queue: paperQueue(false)},
		{Flows: 2, LinkRate: cc.Gbps, Duration: time.Millisecond, MTU: 1024, Queue: cc.QueueConfig{LineRate: cc.Gbps, Buffer: 1000, KMin: 10, KMax: 5}},
		{Flows: 2, LinkRate: cc.Gbps, Duration: time.Millisecond, MTU: 1024, Queue: paperQueue(false), DCQCN: true, Params: cc.Params{}},
		// A negative per-packet overhead.
		{Flows: 2, LinkRate: 40 * cc.Gbps, Duration: time.Millisecond, MTU: 64, Overhead: -1000, Queue: paperQueue(false)},
		// Packets shorter than the 1ns time step.
		{Flows: 1, LinkRate: 1000 * cc.Gbps, Duration: 10 * time.Microsecond, MTU: 64, Queue: paperQueue(false)},
		// PFC with too little buffer above XOFF for 8 flows 10us away.
		{Flows: 8, LinkRate: 40 * cc.Gbps, Duration: 10 * time.Millisecond, MTU: 1024, Delay: 10 * time.Microsecond,
			Queue: cc.QueueConfig{LineRate: 40 * cc.Gbps, Buffer: 12 << 20, KMin: 5000, KMax: 200000, PMax: 0.01, PFC: true, XOFF: 12<<20 - cc.PFCHeadroom, XON: 2 << 20}},
	} {
		_, err := Run(c)
		assert.Error(t, err)
	}
}

// The lanes take events in the order one heap would: every arrival at the
// port (time, flow, the port's decisions) and the results are the same
// with every event on the heap.
func TestLanesKeepTheOrder(t *testing.T) {
	defer func() { heapOnly = false }()
	for _, tc := range []struct {
		profile string
		flows   int
		pfc     bool
	}{{cc.ProfileMLX5, 32, false}, {cc.ProfilePaper, 8, true}, {cc.ProfileHPCC, 4, false}} {
		p, err := cc.Profile(tc.profile, 100*cc.Gbps)
		require.NoError(t, err)
		q := paperQueue(tc.pfc)
		q.LineRate = 100 * cc.Gbps
		// Per packet (every send and arrival an event), and on the fast
		// path (the other events).
		for _, perPacket := range []bool{true, false} {
			c := Config{Flows: tc.flows, LinkRate: 100 * cc.Gbps, Duration: time.Millisecond, MTU: 1024,
				Delay: time.Microsecond, Queue: q, DCQCN: true, Params: p, Seed: 5, PerPacket: perPacket}
			var got [2][]arrival
			var res [2]*Result
			for i, only := range []bool{true, false} {
				heapOnly = only
				res[i], err = run(c, func(a arrival) { got[i] = append(got[i], a) })
				require.NoError(t, err)
			}
			require.NotEmpty(t, got[0])
			assert.Equal(t, got[0], got[1], tc.profile)
			assert.Equal(t, res[0], res[1], tc.profile)
			t.Logf("%s %d:1 per packet %v: %d arrivals, %d drops, %d CNPs", tc.profile, tc.flows, perPacket, len(got[0]), res[0].Drops, res[0].CNPs)
		}
	}
}
