package cc

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMarkProbability(t *testing.T) {
	c := QueueConfig{LineRate: Gbps, Buffer: 1 << 20, KMin: 10000, KMax: 20000, PMax: 0.2}
	for _, tc := range []struct {
		depth int
		want  float64
	}{
		{0, 0}, {9999, 0}, {10000, 0}, // at or below Kmin: never
		{10001, 0.2 / 10000}, {12500, 0.05}, {15000, 0.1}, {19999, 0.2 * 9999 / 10000},
		{20000, 0.2},             // at Kmax: Pmax
		{20001, 1}, {1 << 20, 1}, // above Kmax: always
	} {
		assert.InDelta(t, tc.want, c.MarkProbability(tc.depth), 1e-12, "depth %d", tc.depth)
	}
	step := QueueConfig{KMin: 5000, KMax: 5000, PMax: 0.3}
	assert.Zero(t, step.MarkProbability(5000))
	assert.Equal(t, 1.0, step.MarkProbability(5001))
}

// The port marks by the depth a packet finds: never at or below Kmin, at
// about the curve's probability between, always above Kmax; packets that
// are not ECN-capable are never marked. (Marking at enqueue: the depth a
// packet finds is the depth it is marked on.)
func TestPortMarks(t *testing.T) {
	cfg := QueueConfig{LineRate: Gbps, Buffer: 1 << 20, KMin: 10000, KMax: 20000, PMax: 0.2, MarkAtEnqueue: true}
	for _, tc := range []struct {
		depth      int
		ecnCapable bool
		lo, hi     float64 // share of marked packets
	}{
		{10000, true, 0, 0},
		{15000, true, 0.08, 0.12},
		{20000, true, 0.17, 0.23},
		{20001, true, 1, 1},
		{30000, false, 0, 0},
	} {
		p, err := NewPort(cfg, 1)
		require.NoError(t, err)
		_, ok, _ := p.Arrive(t0, tc.depth, false)
		require.True(t, ok)
		const n = 4000
		for range n {
			_, ok, _ := p.Arrive(t0, 1, tc.ecnCapable)
			require.True(t, ok)
			p.Depart(1, false)
		}
		share := float64(p.Marked) / n
		assert.GreaterOrEqual(t, share, tc.lo, "depth %d", tc.depth)
		assert.LessOrEqual(t, share, tc.hi, "depth %d", tc.depth)
	}
}

func TestPortTailDrop(t *testing.T) {
	p, err := NewPort(QueueConfig{LineRate: Gbps, Buffer: 3000, KMin: 0, KMax: 3000, PMax: 0}, 1)
	require.NoError(t, err)
	for i, tc := range []struct {
		size   int
		depart bool // remove one 1000-byte packet first
		queued bool
		depth  int
	}{
		{1000, false, true, 1000},
		{1500, false, true, 2500},
		{501, false, false, 2500}, // one byte over the buffer
		{500, false, true, 3000},  // exactly full
		{1, false, false, 3000},
		{1000, true, true, 3000}, // room again after a departure
	} {
		if tc.depart {
			p.Depart(1000, false)
		}
		_, queued, _ := p.Arrive(t0, tc.size, true)
		assert.Equal(t, tc.queued, queued, "step %d", i)
		assert.Equal(t, tc.depth, p.Bytes(), "step %d", i)
	}
	assert.Equal(t, uint64(2), p.Dropped)
	assert.Equal(t, uint64(4), p.Enqueued)
	assert.Equal(t, 3000, p.MaxBytes)
}

// PFC pauses at XOFF and resumes only at XON: between the two the state
// depends on the way the depth came (hysteresis).
func TestPortPFCHysteresis(t *testing.T) {
	const xoff, xon = 3000, 1000
	p, err := NewPort(QueueConfig{LineRate: Gbps, Buffer: xoff + PFCHeadroom, KMax: 1 << 20, PFC: true, XOFF: xoff, XON: xon}, 1)
	require.NoError(t, err)
	for i, tc := range []struct {
		arrive, depart int
		paused         bool
		resumed        bool
	}{
		{arrive: 1000},
		{arrive: 1999},                // 2999: below XOFF
		{arrive: 1, paused: true},     // 3000: XOFF
		{arrive: 5000, paused: true},  // a paused port still takes packets
		{depart: 5000, paused: true},  // 3000
		{depart: 1000, paused: true},  // 2000: between XON and XOFF, still paused
		{depart: 999, paused: true},   // 1001
		{depart: 1, resumed: true},    // 1000: XON
		{arrive: 1999},                // 2999: between again, not paused
		{arrive: 1000, paused: true},  // 3999: XOFF again
		{depart: 3000, resumed: true}, // 999
	} {
		if tc.arrive > 0 {
			_, ok, _ := p.Arrive(t0, tc.arrive, false)
			require.True(t, ok, "step %d", i)
		}
		if tc.depart > 0 {
			_, resumed := p.Depart(tc.depart, false)
			assert.Equal(t, tc.resumed, resumed, "step %d resumes", i)
		}
		assert.Equal(t, tc.paused, p.Paused(), "step %d paused", i)
	}
	assert.Equal(t, uint64(2), p.Pauses)
}

// The line serializes size*8/rate per packet, back to back while packets
// wait, exact over many packets and rounded up to the nanosecond; an idle
// line starts with the packet that arrives.
func TestPortSerialization(t *testing.T) {
	for _, tc := range []struct {
		rate Rate
		size int
		one  time.Duration
	}{
		{Gbps, 1500, 12 * time.Microsecond},
		{40 * Gbps, 1082, 217 * time.Nanosecond}, // 216.4 ns
		{100 * Gbps, 64, 6 * time.Nanosecond},    // 5.12 ns
		{10 * Mbps, 1000, 800 * time.Microsecond},
	} {
		p, err := NewPort(QueueConfig{LineRate: tc.rate, Buffer: 1 << 30, KMax: 1 << 30}, 1)
		require.NoError(t, err)
		assert.Equal(t, tc.one, p.SerializationTime(tc.size), "%v %d", tc.rate, tc.size)
		ns := float64(tc.size) * 8 / float64(tc.rate) * 1e9
		for k := 1; k <= 1000; k++ {
			at, ok, _ := p.Arrive(t0, tc.size, false)
			require.True(t, ok)
			exact := float64(k) * ns
			want := time.Duration(exact)
			if float64(want) < exact-1e-6 {
				want++
			}
			require.Equal(t, want, at.Sub(t0), "%v: packet %d of a burst", tc.rate, k)
		}
		// After the burst has left, the line is idle: a packet arriving
		// later leaves one serialization time after it arrives.
		later := t0.Add(time.Second)
		at, _, _ := p.Arrive(later, tc.size, false)
		assert.Equal(t, tc.one, at.Sub(later))
	}
}

func TestNewPortRefuses(t *testing.T) {
	for _, c := range []QueueConfig{
		{LineRate: 0, Buffer: 1000},
		{LineRate: Gbps, Buffer: 0},
		{LineRate: Gbps, Buffer: 1000, KMin: 10, KMax: 5},
		{LineRate: Gbps, Buffer: 1000, PMax: 2},
		{LineRate: Gbps, Buffer: 1 << 20, PFC: true, XOFF: 1 << 20, XON: 1000},
	} {
		_, err := NewPort(c, 1)
		assert.Error(t, err, "%+v", c)
	}
	// Each refusal names the value at fault, not another.
	for _, c := range []struct {
		cfg  QueueConfig
		want string
	}{
		{QueueConfig{LineRate: Rate(math.NaN()), Buffer: 1000}, "cc: queue line rate NaNb/s must be positive"},
		{QueueConfig{LineRate: 2 * MaxLineRate, Buffer: 1000}, "must be positive and at most"},
		{QueueConfig{LineRate: Gbps, Buffer: 1000, PMax: math.NaN()}, "cc: Pmax must be a number in [0, 1]"},
	} {
		_, err := NewPort(c.cfg, 1)
		if assert.Error(t, err, "%+v", c.cfg) {
			assert.Contains(t, err.Error(), c.want)
			if c.cfg.PMax == c.cfg.PMax {
				assert.NotContains(t, err.Error(), "Pmax")
			} else {
				assert.NotContains(t, err.Error(), "line rate")
			}
		}
	}
}

// The per-packet path of the port: an arrival that is marked by chance and
// its departure.
func BenchmarkPortPerPacket(b *testing.B) {
	p, _ := NewPort(QueueConfig{LineRate: 40 * Gbps, Buffer: 12 << 20, KMin: 5000, KMax: 200000, PMax: 0.01}, 1)
	p.Arrive(t0, 100000, false) // a standing queue between Kmin and Kmax
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		at, _, _ := p.Arrive(now, 1082, true)
		p.Depart(1082, true)
		now = at
	}
}

// Marking at dequeue decides on the bytes behind a packet when it starts
// to leave; at enqueue, on the bytes it found. Four 1000-byte packets A-D
// arrive together at an idle port that marks above 1500 bytes (Kmin = Kmax
// = 1500): at enqueue A, B, C, D find 0, 1000, 2000, 3000 bytes, so C and
// D are marked; at dequeue A, B, C, D leave 0, 2000, 1000, 0 bytes behind,
// so only B is: the drained queue marks nothing more.
func TestPortMarksAtDequeue(t *testing.T) {
	for _, tc := range []struct {
		enqueue bool
		want    []bool
	}{
		{false, []bool{false, true, false, false}},
		{true, []bool{false, false, true, true}},
	} {
		p, err := NewPort(QueueConfig{LineRate: Gbps, Buffer: 1 << 20, KMin: 1500, KMax: 1500, PMax: 1, MarkAtEnqueue: tc.enqueue}, 1)
		require.NoError(t, err)
		var got, atArrive []bool
		var departs []time.Time
		for range 4 {
			at, ok, ce := p.Arrive(t0, 1000, true)
			require.True(t, ok)
			atArrive = append(atArrive, ce)
			departs = append(departs, at)
		}
		for i, at := range departs {
			assert.Equal(t, t0.Add(time.Duration(i+1)*8*time.Microsecond), at)
			ce, _ := p.Depart(1000, true)
			got = append(got, ce || atArrive[i])
			if tc.enqueue {
				assert.False(t, ce, "marking at enqueue, Depart never marks")
			} else {
				assert.False(t, atArrive[i], "marking at dequeue, Arrive never marks")
			}
		}
		assert.Equal(t, tc.want, got, "enqueue %v", tc.enqueue)
		assert.Equal(t, uint64(len(slicesTrue(tc.want))), p.Marked)
	}
	// A packet alone in the port leaves nothing behind: never marked, even
	// with Kmin = Kmax = 0 (mark above 0 bytes).
	p, err := NewPort(QueueConfig{LineRate: Gbps, Buffer: 1 << 20, PMax: 1}, 1)
	require.NoError(t, err)
	_, _, _ = p.Arrive(t0, 1000, true)
	ce, _ := p.Depart(1000, true)
	assert.False(t, ce)
	// A packet that arrives while another leaves counts behind the next.
	_, _, _ = p.Arrive(t0, 1000, true)
	_, _, _ = p.Arrive(t0, 1000, true)
	_, _, _ = p.Arrive(t0, 1000, true)
	ce, _ = p.Depart(1000, true) // the first: 0 behind it when it started
	assert.False(t, ce)
	ce, _ = p.Depart(1000, true) // the second: 1000 behind it
	assert.True(t, ce)
}

func slicesTrue(b []bool) []bool {
	var out []bool
	for _, x := range b {
		if x {
			out = append(out, x)
		}
	}
	return out
}
