package cc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One test per rule of the reaction and notification points, each run
// both ways. The expected values were worked out by hand from the rules'
// text (Params), with numbers chosen to keep the arithmetic exact: a
// 40 Gb/s line, g = 1/4 or alpha pinned at 1 (a cut halves).

func us(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Microsecond))) }

// base is a reaction point with no rule on: the paper's, with round numbers.
func base() Params {
	return Params{LineRate: 40 * Gbps, MinRate: 100 * Mbps, G: 0.25, InitialAlpha: 0.5, AlphaPeriod: time.Second,
		TimeReset: time.Second, Threshold: 5, AIRate: Gbps, HAIRate: 4 * Gbps}
}

// Alpha raised at the cut (paper) or on the dce_tcp_rtt tick (mlx5).
func TestRuleAlpha(t *testing.T) {
	// At the CNP: alpha = 0.75*0.5 + 0.25 = 0.625 before the cut, RC =
	// 40*(1 - 0.3125) = 27.5; K after the cut alpha decays to 0.46875.
	p := base()
	p.AlphaPeriod = time.Microsecond
	r, err := NewReactionPoint(p)
	require.NoError(t, err)
	r.OnCNP(t0)
	assert.Equal(t, 0.625, r.Alpha())
	assert.InDelta(t, 27.5, gb(r.Rate()), 1e-12)
	assert.Equal(t, 0.46875, r.AlphaAt(us(1)))
	assert.Equal(t, 0.625*0.75*0.75*0.75, r.AlphaAt(us(3.5)), "three ticks by 3.5 us")

	// On the tick: the first CNP sets alpha to its initial 0.5 and cuts
	// with it (RC 30); the tick at 1 us decays it (no CNP since): 0.375; a
	// CNP at 1.5 us cuts with 0.375: RC = 30*(1-0.1875) = 24.375, and
	// raises alpha at the 2 us tick: 0.375*0.75 + 0.25 = 0.53125; two
	// quiet ticks later 0.53125*0.5625.
	p.AlphaOnTick = true
	r, _ = NewReactionPoint(p)
	r.OnCNP(t0)
	assert.Equal(t, 0.5, r.Alpha())
	assert.InDelta(t, 30.0, gb(r.Rate()), 1e-12)
	r.OnCNP(us(1.5))
	assert.Equal(t, 0.375, r.Alpha())
	assert.InDelta(t, 24.375, gb(r.Rate()), 1e-12)
	assert.Equal(t, 0.53125, r.AlphaAt(us(2)))
	assert.Equal(t, 0.53125*0.5625, r.AlphaAt(us(4)))
	assert.Equal(t, 0.375, r.Alpha(), "AlphaAt changes nothing")
}

// The cut at once (paper), on the monitor tick with CNPs deferred (mlx5),
// or with CNPs inside the monitor period ignored (the old reading).
func TestRuleCut(t *testing.T) {
	type step struct {
		at     float64 // us
		cnp    bool    // a CNP at the time, else OnTimeout
		rate   float64 // Gb/s after
		handle bool
	}
	p := base()
	p.InitialAlpha, p.G = 1, 1.0/256 // alpha stays 1: each cut halves
	for _, tc := range []struct {
		name      string
		monitor   time.Duration
		ignores   bool
		steps     []step
		coalesced uint64
	}{
		{"at once", 0, false, []step{{0, true, 20, true}, {1, true, 10, true}, {5, true, 5, true}}, 0},
		// Ticks at 0+4k us from the first CNP: the CNP at 0 cuts at 4, the
		// one at 1 is folded into that cut, the one at 5 cuts at 8.
		{"deferred to the tick", 4 * time.Microsecond, false,
			[]step{{0, true, 40, true}, {1, true, 40, true}, {3.9, false, 40, false}, {4, false, 20, false},
				{5, true, 20, true}, {7.9, false, 20, false}, {8, false, 10, false}}, 1},
		{"ignored inside the period", 4 * time.Microsecond, true,
			[]step{{0, true, 20, true}, {2, true, 20, false}, {4, true, 10, true}}, 0},
	} {
		p.RateReduceMonitorPeriod, p.MonitorIgnores = tc.monitor, tc.ignores
		r, err := NewReactionPoint(p)
		require.NoError(t, err)
		for i, s := range tc.steps {
			if s.cnp {
				assert.Equal(t, s.handle, r.OnCNP(us(s.at)), "%s: step %d handled", tc.name, i)
			} else {
				r.OnTimeout(us(s.at))
			}
			assert.InDelta(t, s.rate, gb(r.Rate()), 1e-12, "%s: step %d at %v us", tc.name, i, s.at)
		}
		assert.Equal(t, tc.coalesced, r.CNPCoalesced, tc.name)
	}
	// The pending cut is the deadline.
	p.RateReduceMonitorPeriod, p.MonitorIgnores = 4*time.Microsecond, false
	r, _ := NewReactionPoint(p)
	r.OnCNP(us(1))
	assert.Equal(t, us(5), r.Deadline(), "first tick 4 us after the first CNP")
	r.OnTimeout(us(5))
	r.OnCNP(us(9)) // exactly on a tick: the next one
	assert.Equal(t, us(13), r.Deadline())
}

// clamp_tgt_rate, clamp_tgt_rate_after_time_inc and the byte counter's
// clamp: whether RT takes RC on the second cut. After the first cut (RC
// 20, RT 40) one increase event brings RC to 30; the second cut halves RC
// to 15 and leaves RT at 30 when clamped, at 40 when not.
func TestRuleClamp(t *testing.T) {
	for _, tc := range []struct {
		clamp, afterTimeInc, byTimer bool
		rt                           float64
		afterByteInc                 bool
	}{
		{true, false, true, 30, false},
		{true, false, false, 30, false},
		{false, true, true, 30, false},  // the timer raised the rate: clamp
		{false, true, false, 40, false}, // only the byte counter did: no clamp
		{false, false, true, 40, false},
		// isekai's reading: a byte-counter increase clamps, a timer one
		// only with clamp_tgt_rate_after_time_inc.
		{false, false, false, 30, true},
		{false, true, false, 30, true},
		{false, false, true, 40, true},
		{false, true, true, 30, true},
	} {
		p := base()
		p.InitialAlpha, p.G = 1, 1.0/256
		p.TimeReset, p.ByteReset = 10*time.Microsecond, 1000
		p.ClampTargetRate, p.ClampTargetRateAfterTimeInc = tc.clamp, tc.afterTimeInc
		p.ClampTargetRateAfterByteInc = tc.afterByteInc
		r, _ := NewReactionPoint(p)
		r.OnCNP(t0)
		require.InDelta(t, 20.0, gb(r.Rate()), 1e-12)
		require.InDelta(t, 40.0, gb(r.Target()), 1e-12)
		if tc.byTimer {
			r.OnTimeout(us(10))
		} else {
			r.OnSent(us(5), 1000)
		}
		require.InDelta(t, 30.0, gb(r.Rate()), 1e-12, "one fast recovery step")
		r.OnCNP(us(11))
		assert.InDelta(t, 15.0, gb(r.Rate()), 1e-12)
		assert.InDelta(t, tc.rt, gb(r.Target()), 1e-12, "%+v", tc)
	}
}

// The increase stages: counted before or after the check (fast recovery
// lasts F-1 or F events), hyper step growing or constant, hyper reached or
// not with the byte counter off. F = 2, R_AI 1 Gb/s, R_HAI 4 Gb/s; two
// cuts leave RC 10 and RT 20; timer events k = 1, 2, ...
func TestRuleStages(t *testing.T) {
	for _, tc := range []struct {
		name                               string
		checkFirst, constant, hyperNoBytes bool
		rc, rt                             []float64
	}{
		// ns3-rdma: k=1 fast recovery (stage 1 < F); then the byte stage,
		// stuck at 0, keeps the increase additive.
		{"ns3-rdma", false, false, false, []float64{15, 18, 20, 21.5}, []float64{20, 21, 22, 23}},
		// Hyper once the timer stage alone reaches F, by (stage-F+1)*R_HAI.
		{"growing hyper without the byte counter", false, false, true,
			[]float64{15, 19.5, 25.75, 32.875}, []float64{20, 24, 32, 40}},
		{"constant hyper without the byte counter", false, true, true,
			[]float64{15, 19.5, 23.75, 27.875}, []float64{20, 24, 28, 32}},
		// HPCC: the stage before the event: 0, 1 fast recovery; 2 = F
		// additive; above F hyper by R_HAI.
		{"HPCC", true, true, true, []float64{15, 17.5, 19.25, 22.125, 25.5625}, []float64{20, 20, 21, 25, 29}},
		{"check first, byte counter holds it additive", true, true, false,
			[]float64{15, 17.5, 19.25, 20.625}, []float64{20, 20, 21, 22}},
	} {
		p := base()
		p.InitialAlpha, p.G = 1, 1.0/256
		p.ClampTargetRate = true
		p.Threshold, p.TimeReset = 2, 10*time.Microsecond
		p.StageCheckFirst, p.HyperStepConstant, p.HyperWithoutByteCounter = tc.checkFirst, tc.constant, tc.hyperNoBytes
		r, _ := NewReactionPoint(p)
		r.OnCNP(t0)
		r.OnCNP(t0)
		require.InDelta(t, 10.0, gb(r.Rate()), 1e-12)
		require.InDelta(t, 20.0, gb(r.Target()), 1e-12)
		for k := range tc.rc {
			r.OnTimeout(us(float64(10 * (k + 1))))
			assert.InDelta(t, tc.rc[k], gb(r.Rate()), 1e-9, "%s: RC after event %d", tc.name, k+1)
			assert.InDelta(t, tc.rt[k], gb(r.Target()), 1e-9, "%s: RT after event %d", tc.name, k+1)
		}
	}
}

// rate_to_set_on_first_cnp sets RC and RT; the cut follows.
func TestRuleRateOnFirstCNP(t *testing.T) {
	p := base()
	p.InitialAlpha, p.G = 1, 1.0/256
	p.RateOnFirstCNP = 10 * Gbps
	r, _ := NewReactionPoint(p)
	r.OnCNP(t0)
	assert.InDelta(t, 5.0, gb(r.Rate()), 1e-12)
	assert.InDelta(t, 10.0, gb(r.Target()), 1e-12, "not the line rate: the first CNP set it")
	assert.InDelta(t, 5.0, gb(r.Lowest()), 1e-12)
}

// The notification point: marks inside the interval dropped (mlx5), or
// one CNP at the interval's end (the paper, ns3-rdma); per port, the QPs
// share one.
func TestRuleNotificationPoint(t *testing.T) {
	marks := []float64{0, 10, 20, 60, 130}
	drop := NewNotificationPoint(50*time.Microsecond, false)
	var sent []float64
	for _, m := range marks {
		if drop.OnMarked(us(m)) {
			sent = append(sent, m)
		}
		assert.True(t, drop.Deadline().IsZero())
	}
	assert.Equal(t, []float64{0, 60, 130}, sent)

	end := NewNotificationPoint(50*time.Microsecond, true)
	sent = nil
	for _, m := range append(marks, 1000) {
		for d := end.Deadline(); !d.IsZero() && !d.After(us(m)); d = end.Deadline() {
			require.True(t, end.OnTimeout(d))
			sent = append(sent, float64(d.Sub(t0)/time.Microsecond))
		}
		if m == 1000 {
			break
		}
		if end.OnMarked(us(m)) {
			sent = append(sent, m)
		}
	}
	// 0 at once; 10 and 20 at the window's end, 50; 60 in the window
	// 50-100, at 100; 130 in 100-150, at 150.
	assert.Equal(t, []float64{0, 50, 100, 150}, sent)
	assert.Equal(t, uint64(4), end.CNPSent)
	assert.False(t, end.OnTimeout(us(2000)), "nothing deferred")

	// Per port: one notification point for QPs A and B, 4 us apart.
	port := NewNotificationPoint(4*time.Microsecond, false)
	assert.True(t, port.OnMarked(us(0)))  // A
	assert.False(t, port.OnMarked(us(2))) // B: the port sent one 2 us ago
	assert.True(t, port.OnMarked(us(5)))  // B
}

// What each profile chooses.
func TestProfileRules(t *testing.T) {
	paper, _ := Profile(ProfilePaper, 40*Gbps)
	mlx5, _ := Profile(ProfileMLX5, 40*Gbps)
	hpcc, _ := Profile(ProfileHPCC, 40*Gbps)
	assert.Equal(t, Params{LineRate: 40 * Gbps, MinRate: 100 * Mbps, G: 1.0 / 256, InitialAlpha: 1,
		AlphaPeriod: 55 * time.Microsecond, TimeReset: 55 * time.Microsecond, ByteReset: 10 << 20, Threshold: 5,
		AIRate: 40 * Mbps, HAIRate: 200 * Mbps, ClampTargetRate: true, MinTimeBetweenCNPs: 50 * time.Microsecond,
		CNPAtWindowEnd: true, CNPDSCP: 48}, paper)
	assert.Equal(t, Params{LineRate: 40 * Gbps, MinRate: 1 * Mbps, G: 5.0 / 1024, DCETCPG: 1019, InitialAlpha: 1023.0 / 1024,
		AlphaPeriod: time.Microsecond, AlphaOnTick: true, TimeReset: 300 * time.Microsecond,
		ByteReset: 32767 * 64, ByteResetUnit: 64, RPGByteReset: 32767, Threshold: 1, AIRate: 5 * Mbps, HAIRate: 50 * Mbps,
		MinDecFac: 50, RateReduceMonitorPeriod: 4 * time.Microsecond, ClampTargetRateAfterTimeInc: true,
		ClampTargetRateAfterByteInc: true,
		StageCheckFirst:             true, HyperStepConstant: true, HyperWithoutByteCounter: true,
		MinTimeBetweenCNPs: 4 * time.Microsecond, CNPPerPort: true, CNPDSCP: 48}, mlx5)
	assert.Equal(t, Params{LineRate: 40 * Gbps, MinRate: 1000 * Mbps, G: 1.0 / 256, InitialAlpha: 1,
		AlphaPeriod: time.Microsecond, AlphaOnTick: true, TimeReset: 300 * time.Microsecond, Threshold: 1,
		AIRate: 8 * Mbps, HAIRate: 80 * Mbps, RateReduceMonitorPeriod: 4 * time.Microsecond,
		ClampTargetRateAfterTimeInc: true, StageCheckFirst: true, HyperStepConstant: true, HyperWithoutByteCounter: true,
		CNPDSCP: 48}, hpcc)
	h1, _ := Profile(ProfileHPCC, Gbps)
	assert.Equal(t, 100*Mbps, h1.MinRate, "a tenth of a slow line")
	p := mlx5
	p.CNPAtWindowEnd = true
	assert.Error(t, p.Check(), "a CNP at the window's end needs per-QP pacing")
	p = mlx5
	require.NoError(t, p.Set("rpg_byte_reset_unit=1"))
	assert.Equal(t, 32767, p.ByteReset)
	require.NoError(t, p.Set("rpg_byte_reset=100"))
	assert.Equal(t, 100, p.ByteReset)
	require.NoError(t, p.Set("rpg_byte_reset_unit=64"))
	assert.Equal(t, 6400, p.ByteReset)
	require.NoError(t, p.Set("clamp_tgt_rate_after_byte_inc=false"))
	assert.False(t, p.ClampTargetRateAfterByteInc)
}
