package cc

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Unix(1700000000, 0)

func gb(r Rate) float64 { return float64(r / Gbps) }

// The expected values below were computed by hand from the paper's
// formulas (with g = 1/256, F = 5, R_AI = 40 Mb/s, R_HAI = 200 Mb/s, a
// 40 Gb/s line), independently of this code.
func TestReactionPointPaperSequence(t *testing.T) {
	p, err := Profile(ProfilePaper, 40*Gbps)
	require.NoError(t, err)
	assert.Equal(t, 1.0, p.InitialAlpha, "the paper's initial alpha")
	r, err := NewReactionPoint(p)
	require.NoError(t, err)
	assert.Equal(t, 40.0, gb(r.Rate()))
	assert.True(t, r.Deadline().IsZero(), "no timers before the first CNP")

	// One CNP: alpha = (1-g)*1 + g = 1, RC = 40*(1-1/2), RT = RC before the cut.
	r.OnCNP(t0)
	assert.InDelta(t, 20.0, gb(r.Rate()), 1e-9)
	assert.InDelta(t, 40.0, gb(r.Target()), 1e-9)
	assert.InDelta(t, 1.0, r.Alpha(), 1e-12)
	// A second CNP 1 us later (the paper has no monitor period).
	t1 := t0.Add(time.Microsecond)
	r.OnCNP(t1)
	assert.InDelta(t, 10.0, gb(r.Rate()), 1e-9)
	assert.InDelta(t, 20.0, gb(r.Target()), 1e-9)
	assert.Equal(t, uint64(2), r.CNPHandled)

	// Timer events every T = 55 us after the last cut; alpha decays every
	// K = 55 us. Four rounds of fast recovery, then additive increase.
	want := []struct{ rc, rt, alpha float64 }{
		{15.0, 20.0, 0.99609375},
		{17.5, 20.0, 0.9922027587890625},
		{18.75, 20.0, 0.9883269667625427},
		{19.375, 20.0, 0.9844663145486265},
		{19.7075, 20.04, 0.980620743007421},
		{19.89375, 20.08, 0.9767901932300482},
	}
	for i, w := range want {
		now := t1.Add(time.Duration(i+1) * 55 * time.Microsecond)
		require.Equal(t, now, r.Deadline(), "event %d", i+1)
		r.OnTimeout(now)
		assert.InDelta(t, w.rc, gb(r.Rate()), 1e-9, "RC after timer event %d", i+1)
		assert.InDelta(t, w.rt, gb(r.Target()), 1e-9, "RT after timer event %d", i+1)
		assert.InDelta(t, w.alpha, r.Alpha(), 1e-12, "alpha after %d periods", i+1)
	}
	// Five byte-counter events (B = 10 MiB each): additive until the byte
	// stage reaches F too, then hyper increase.
	now := t1.Add(6*55*time.Microsecond + time.Microsecond)
	bytesWant := []struct{ rc, rt float64 }{
		{20.006875, 20.12}, {20.0834375, 20.16}, {20.14171875, 20.2}, {20.190859375, 20.24}, {20.3154296875, 20.44},
	}
	for i, w := range bytesWant {
		r.OnSent(now, 10<<20)
		assert.InDelta(t, w.rc, gb(r.Rate()), 1e-9, "RC after byte event %d", i+1)
		assert.InDelta(t, w.rt, gb(r.Target()), 1e-9, "RT after byte event %d", i+1)
	}
	// The 7th timer event: both stages >= F: hyper increase by R_HAI.
	r.OnTimeout(t1.Add(7 * 55 * time.Microsecond))
	assert.InDelta(t, 20.47771484375, gb(r.Rate()), 1e-9)
	assert.InDelta(t, 20.64, gb(r.Target()), 1e-9)
}

func TestReactionPointMinRateAndLineRate(t *testing.T) {
	p, _ := Profile(ProfilePaper, 10*Gbps)
	r, _ := NewReactionPoint(p)
	now := t0
	for range 40 {
		r.OnCNP(now)
		now = now.Add(time.Microsecond)
	}
	assert.Equal(t, p.MinRate, r.Rate(), "never below rpg_min_rate")
	// Recovery never passes the line rate.
	for range 20000 {
		r.OnSent(now, 10<<20)
		now = now.Add(55 * time.Microsecond)
		r.OnTimeout(now)
	}
	assert.Equal(t, p.LineRate, r.Rate())
	assert.LessOrEqual(t, r.Target(), p.LineRate)
}

// The reading of mlx5 this package had before: g = dce_tcp_g/1024, alpha
// raised at the CNP, an immediate cut, CNPs inside the monitor period
// ignored. Each is still a rule that can be chosen.
func TestReactionPointMonitorPeriodAndMinDecFac(t *testing.T) {
	p, _ := Profile(ProfileMLX5, 100*Gbps)
	require.NoError(t, p.Set("dce_tcp_g_reading=gain"))
	p.AlphaOnTick, p.MonitorIgnores = false, true
	r, _ := NewReactionPoint(p)
	r.OnCNP(t0)
	// alpha = 1019/1024 + (5/1024)*(1023/1024); the cut factor 1-alpha/2
	// is just above rpg_min_dec_fac's 0.5.
	alpha := 1019.0/1024 + 5.0/1024*1023.0/1024
	assert.InDelta(t, alpha, r.Alpha(), 1e-12)
	assert.InDelta(t, 100*(1-alpha/2), gb(r.Rate()), 1e-9)
	// A CNP 2 us later is inside rate_reduce_monitor_period (4 us).
	r.OnCNP(t0.Add(2 * time.Microsecond))
	assert.Equal(t, uint64(1), r.CNPIgnored)
	assert.InDelta(t, 100*(1-alpha/2), gb(r.Rate()), 1e-9, "an ignored CNP does not cut")
	r.OnCNP(t0.Add(5 * time.Microsecond))
	assert.Equal(t, uint64(2), r.CNPHandled)

	p.MinDecFac = 80
	r, _ = NewReactionPoint(p)
	r.OnCNP(t0)
	assert.InDelta(t, 80.0, gb(r.Rate()), 1e-9, "a cut leaves at least rpg_min_dec_fac percent")
}

func TestProfilesAndCheck(t *testing.T) {
	for _, name := range []string{ProfilePaper, ProfileMLX5, ProfileHPCC} {
		p, err := Profile(name, 25*Gbps)
		require.NoError(t, err, name)
		require.NoError(t, p.Check(), name)
	}
	h, _ := Profile(ProfileHPCC, 100*Gbps)
	assert.InDelta(t, 20e6, float64(h.AIRate), 1, "HPCC scales R_AI by line rate / 25G")
	// Every profile works on slow lines too: a hyper-increase step above
	// the line rate is clamped, not refused.
	for _, name := range []string{ProfilePaper, ProfileMLX5, ProfileHPCC} {
		for _, line := range []Rate{10 * Mbps, 100 * Mbps, 150 * Mbps} {
			p, err := Profile(name, line)
			require.NoError(t, err, name)
			r, err := NewReactionPoint(p)
			require.NoError(t, err, "%s at %v", name, line)
			r.OnCNP(t0)
			for range 1000 {
				r.OnTimeout(r.Deadline())
			}
			assert.LessOrEqual(t, r.Rate(), line, "%s at %v", name, line)
		}
	}
	_, err := Profile("reno", 10*Gbps)
	assert.Error(t, err)
	bad := h
	bad.G = 0
	assert.Error(t, bad.Check())
	_, err = NewReactionPoint(bad)
	assert.Error(t, err)
}

func TestNotificationPointInterval(t *testing.T) {
	n := NewNotificationPoint(50*time.Microsecond, false)
	var sent []int
	for i := range 200 { // a CE-marked packet every microsecond
		if n.OnMarked(t0.Add(time.Duration(i) * time.Microsecond)) {
			sent = append(sent, i)
		}
	}
	assert.Equal(t, []int{0, 50, 100, 150}, sent)
	assert.Equal(t, uint64(200), n.ECNMarked)
	assert.Equal(t, uint64(4), n.CNPSent)
}

func TestPacer(t *testing.T) {
	p := NewPacer(8*Gbps, 1000) // 1 byte per ns
	ok, _ := p.Take(t0, 1000)
	assert.True(t, ok, "a full bucket sends a burst")
	ok, at := p.Take(t0, 500)
	assert.False(t, ok)
	assert.Equal(t, t0.Add(500*time.Nanosecond), at)
	ok, _ = p.Take(at, 500)
	assert.True(t, ok)
	// Over a long run the pacer keeps to its rate.
	now, sent := at, 0
	for now.Before(at.Add(time.Millisecond)) {
		if ok, next := p.Take(now, 1000); ok {
			sent += 1000
		} else {
			now = next
		}
	}
	assert.InDelta(t, 1e6, float64(sent), 2000, "8 Gb/s for 1 ms is 1 MB")
	p.SetRate(now, 4*Gbps)
	ok, at = p.Take(now, 1000)
	if !ok {
		assert.Equal(t, 2*time.Microsecond, at.Sub(now).Round(time.Microsecond))
	}
}

func TestParamsSet(t *testing.T) {
	p, _ := Profile(ProfileMLX5, 25*Gbps)
	require.NoError(t, p.Set("rpg_ai_rate=10"))
	assert.Equal(t, 10*Mbps, p.AIRate)
	require.NoError(t, p.Set("rpg_hai_rate=1Gbps"))
	assert.Equal(t, Gbps, p.HAIRate)
	require.NoError(t, p.Set("rpg_time_reset=55"))
	assert.Equal(t, 55*time.Microsecond, p.TimeReset)
	require.NoError(t, p.Set("dce_tcp_rtt=2us"))
	assert.Equal(t, 2*time.Microsecond, p.AlphaPeriod)
	require.NoError(t, p.Set("dce_tcp_g=4"))
	assert.Equal(t, 1020.0/1024, p.G, "read as the weight of the old alpha")
	require.NoError(t, p.Set("dce_tcp_g_reading=gain"))
	assert.Equal(t, 4.0/1024, p.G)
	require.NoError(t, p.Set("dce_tcp_g_reading=weight"))
	assert.Equal(t, 1020.0/1024, p.G)
	require.NoError(t, p.Set("dce_tcp_g_reading=gain"))
	require.NoError(t, p.Set("dce_tcp_g=4"))
	assert.Equal(t, 4.0/1024, p.G)
	require.NoError(t, p.Set("initial_alpha_value=512"))
	assert.Equal(t, 0.5, p.InitialAlpha, "initial_alpha_value is in 1024ths")
	require.NoError(t, p.Set("rpg_byte_reset=0"))
	assert.Zero(t, p.ByteReset)
	require.NoError(t, p.Check())
	for _, bad := range []string{"rpg_ai_rate", "nope=1", "rpg_threshold=x", "cnp_dscp=64", "rpg_time_reset=fast",
		"dce_tcp_g=1024", "dce_tcp_g=0", "dce_tcp_g_reading=half", "alpha_on_tick=maybe"} {
		assert.Error(t, p.Set(bad), bad)
	}
	r, err := ParseRate("40")
	require.NoError(t, err)
	assert.Equal(t, 40*Gbps, r)
	r, _ = ParseRate("100Mbps")
	assert.Equal(t, 100*Mbps, r)
}

func TestCheckRefusesNonsense(t *testing.T) {
	base, _ := Profile(ProfilePaper, 40*Gbps)
	nan := math.NaN()
	for name, mod := range map[string]func(p *Params){
		"NaN g":               func(p *Params) { p.G = nan },
		"NaN alpha":           func(p *Params) { p.InitialAlpha = nan },
		"NaN min rate":        func(p *Params) { p.MinRate = Rate(nan) },
		"NaN AI":              func(p *Params) { p.AIRate = Rate(nan) },
		"first CNP over line": func(p *Params) { p.RateOnFirstCNP = 100 * Gbps },
		"1ns timer":           func(p *Params) { p.TimeReset = time.Nanosecond },
		"line rate 1 Pb/s":    func(p *Params) { p.LineRate = 1e15 },
	} {
		p := base
		mod(&p)
		assert.Error(t, p.Check(), name)
	}
	q := DefaultQueue(40 * Gbps)
	q.PFC, q.XOFF = true, q.Buffer
	assert.Error(t, q.Check(), "PFC without headroom above XOFF")
	q = DefaultQueue(Rate(nan))
	assert.Error(t, q.Check())
}

// With the byte counter off its stage stays 0, so after F timer events
// the increase is additive, never hyper.
func TestByteCounterOffIsAdditive(t *testing.T) {
	p, _ := Profile(ProfilePaper, 40*Gbps)
	p.ByteReset = 0
	r, _ := NewReactionPoint(p)
	r.OnCNP(t0)
	r.OnCNP(t0.Add(time.Microsecond))
	prev := r.Target()
	for i := range 12 {
		r.OnTimeout(r.Deadline())
		step := r.Target() - prev
		prev = r.Target()
		if i >= 4 && i < 10 {
			assert.InDelta(t, float64(p.AIRate), float64(step), 1, "timer event %d is additive", i+1)
		}
	}
}
