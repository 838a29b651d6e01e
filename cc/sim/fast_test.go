package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// both runs c per packet and on the fast path, and returns the two results
// and the packets each admitted to the port, in order, with the records of
// their departures (marks at dequeue) in order.
func both(t *testing.T, c Config) (res [2]*Result, admitted, left [2][]arrival) {
	for i, perPacket := range []bool{true, false} {
		c.PerPacket = perPacket
		var err error
		res[i], err = run(c, func(a arrival) {
			a.ID = 0 // numbered differently: the fast path counts drops in bulk
			switch {
			case a.Left:
				left[i] = append(left[i], a)
			case a.Queued:
				admitted[i] = append(admitted[i], a)
			}
		})
		require.NoError(t, err)
	}
	return res, admitted, left
}

// sameArrivals reports whether a and b are equal, without printing
// hundreds of thousands of them when they are not.
func sameArrivals(a, b []arrival) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// smallConfig is an incast of the matrix's kind, with a 1 MB buffer so
// that the buffer fills and the fast path counts drops.
func smallConfig(t *testing.T, profile string, flows, gbps int, seed uint64, d time.Duration) Config {
	line := cc.Rate(gbps) * cc.Gbps
	p, err := cc.Profile(profile, line)
	require.NoError(t, err)
	q := paperQueue(false)
	q.LineRate = line
	q.Buffer = 1 << 20
	return Config{Flows: flows, LinkRate: line, Duration: d, MTU: 1024, Delay: time.Microsecond,
		Queue: q, DCQCN: true, Params: p, Seed: seed}
}

// compareFastPath runs c both ways and checks that the fast path gives
// the per-packet run's results exactly, or that the first packet the two
// admit differently is one of two or more that reach the port in the same
// nanosecond: the per-packet run takes those in the order their sends were
// scheduled, through the flows' whole history of attempts, the fast path by
// when the sends were scheduled, then by flow (fast.go). Up to that packet,
// every admission, time and mark is the same. It reports whether the two
// were the same, and where they part.
func compareFastPath(t *testing.T, name string, c Config) (same bool, at time.Duration) {
	res, admitted, left := both(t, c)
	require.NotEmpty(t, admitted[0], name)
	i := 0
	for i < len(admitted[0]) && i < len(admitted[1]) && admitted[0][i] == admitted[1][i] {
		i++
	}
	if i == len(admitted[0]) && i == len(admitted[1]) {
		assert.True(t, sameArrivals(left[0], left[1]), "%s: marks at dequeue", name)
		assert.Equal(t, res[0], res[1], name)
		return true, 0
	}
	require.Less(t, i, min(len(admitted[0]), len(admitted[1])), "%s: one run admits more packets than the other, the rest alike", name)
	pp, fp := admitted[0][i], admitted[1][i]
	assert.Equal(t, pp.T, fp.T, "%s: the first difference is at one nanosecond", name)
	assert.NotEqual(t, pp.Flow, fp.Flow, name)
	// The fast path's packet reached the per-packet run's port in the
	// same nanosecond too.
	var all []arrival
	c.PerPacket = true
	_, err := run(c, func(a arrival) {
		if !a.Left && a.T == fp.T && a.Flow == fp.Flow {
			all = append(all, a)
		}
	})
	require.NoError(t, err)
	assert.NotEmpty(t, all, "%s: flow %d sent a packet that arrived at %v in the per-packet run too", name, fp.Flow, fp.T)
	// The marks at dequeue of the packets admitted alike: those that left
	// by the last one's departure.
	var common [2][]arrival
	if i > 0 {
		for k := range left {
			for _, a := range left[k] {
				if a.Depart <= admitted[0][i-1].Depart {
					common[k] = append(common[k], a)
				}
			}
		}
	}
	assert.True(t, sameArrivals(common[0], common[1]), "%s: the marks of the packets admitted alike", name)
	return false, pp.T
}

// The fast path against the per-packet run on the small incasts: 2:1 and
// 8:1 at 40 and 100 Gb/s, every profile, seeds 1-6, with a 1 MB buffer
// that fills (drops counted in bulk); seed 5 marks at enqueue, seed 6 runs
// without congestion control. Every run is the same, or parts at a tie
// (compareFastPath); most are the same (55 of the 72 when written).
func TestFastPathMatchesPerPacket(t *testing.T) {
	if testing.Short() {
		t.Skip("72 runs twice: a few seconds of CPU")
	}
	var drops uint64
	var same, total int
	for _, prof := range []string{cc.ProfilePaper, cc.ProfileMLX5, cc.ProfileHPCC} {
		for _, gbps := range []int{40, 100} {
			for _, n := range []int{2, 8} {
				for seed := uint64(1); seed <= 6; seed++ {
					c := smallConfig(t, prof, n, gbps, seed, 4*time.Millisecond)
					switch seed {
					case 5:
						c.Queue.MarkAtEnqueue = true
					case 6:
						c.DCQCN = false
					}
					name := fmt.Sprintf("%s/%dG/%d:1/seed%d enqueue=%v dcqcn=%v", prof, gbps, n, seed, c.Queue.MarkAtEnqueue, c.DCQCN)
					ok, at := compareFastPath(t, name, c)
					total++
					if ok {
						same++
					} else {
						t.Logf("%s: parts at a tie at %v", name, at)
					}
					c.PerPacket = true
					r, err := Run(c)
					require.NoError(t, err)
					drops += r.Drops
				}
			}
		}
	}
	t.Logf("%d of %d runs the same", same, total)
	assert.GreaterOrEqual(t, 2*same, total, "most runs have no tie the two orders take differently")
	assert.NotZero(t, drops, "some runs fill the buffer")
}

// Larger incasts, where more flows reach the port in the same nanosecond:
// the runs part at a tie (compareFastPath), and some do.
func TestFastPathDiffersOnlyAtTies(t *testing.T) {
	if testing.Short() {
		t.Skip("several runs twice")
	}
	var differ int
	for _, tc := range []struct {
		profile     string
		flows, gbps int
		seed        uint64
		perQP       bool
	}{
		{cc.ProfileMLX5, 32, 100, 1, false}, {cc.ProfileMLX5, 32, 40, 2, false}, {cc.ProfilePaper, 32, 100, 1, false},
		{cc.ProfileHPCC, 16, 100, 1, false}, {cc.ProfileMLX5, 16, 100, 2, false}, {cc.ProfilePaper, 16, 100, 2, false},
		// The benchmark's incast, its first millisecond, with its 12 MB
		// buffer.
		{cc.ProfileMLX5, 256, 100, 1, false}, {cc.ProfileMLX5, 256, 100, 1, true}, {cc.ProfilePaper, 256, 100, 1, false},
	} {
		name := fmt.Sprintf("%s/%dG/%d:1/seed%d/cnp-per-qp=%v", tc.profile, tc.gbps, tc.flows, tc.seed, tc.perQP)
		c := smallConfig(t, tc.profile, tc.flows, tc.gbps, tc.seed, 3*time.Millisecond)
		if tc.flows == 256 {
			c.Duration, c.Queue.Buffer = time.Millisecond, 12<<20
		}
		if tc.perQP {
			require.NoError(t, c.Params.Set("cnp_per_port=false"))
		}
		same, at := compareFastPath(t, name, c)
		if !same {
			differ++
			t.Logf("%s: parts at a tie at %v", name, at)
		}
	}
	assert.NotZero(t, differ, "these incasts have ties that the two orders take differently")
}
