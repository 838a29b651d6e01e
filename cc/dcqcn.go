package cc

import (
	"fmt"
	"math"
	"time"
)

// Params are DCQCN's parameters, named after mlx5's rp_ and np_ settings
// (NVIDIA DOCA "DCQCN CC Parameters"; docs/wire-format.md section 7) where one
// exists, and the rules the reaction and notification points follow where
// the references run DCQCN differently. Every rule's zero value is the
// paper's and ns3-rdma's (qbb-net-device.cc); docs/dcqcn.md tables every
// parameter of every profile with its source.
type Params struct {
	// LineRate is the port speed: the rate a flow starts at and never
	// exceeds.
	LineRate Rate
	// MinRate is rpg_min_rate: the rate is never cut below it.
	MinRate Rate
	// G is the alpha gain g: alpha = (1-g)*alpha + g for a CNP, (1-g)*alpha
	// for an AlphaPeriod without one.
	G float64
	// DCETCPG is mlx5's dce_tcp_g (1-1023) as Set was given it, 0 when G
	// was set directly; GReading says how it became G.
	DCETCPG int
	// GReading is how dce_tcp_g is read (see GReading).
	GReading GReading
	// InitialAlpha is alpha before the first cut (mlx5:
	// initial_alpha_value/1024; ns3-rdma 0.5; HPCC 1).
	InitialAlpha float64
	// AlphaPeriod is K, how often alpha is updated (mlx5: dce_tcp_rtt).
	AlphaPeriod time.Duration
	// TimeReset is T, the rate-increase timer (rpg_time_reset).
	TimeReset time.Duration
	// ByteReset is B, the bytes sent between rate increases; 0 turns the
	// byte counter off. Set's rpg_byte_reset is counted in ByteResetUnit.
	ByteReset int
	// ByteResetUnit is the bytes in one unit of mlx5's rpg_byte_reset
	// (0 or 1: bytes, as mstflint's text says; the mlx5 profile reads 64,
	// see docs/dcqcn.md); RPGByteReset is the value Set was given.
	ByteResetUnit, RPGByteReset int
	// Threshold is F, the number of increase events in fast recovery
	// before additive increase (rpg_threshold).
	Threshold int
	// AIRate is R_AI, the additive increase step (rpg_ai_rate).
	AIRate Rate
	// HAIRate is R_HAI, the hyper increase step (rpg_hai_rate).
	HAIRate Rate
	// MinDecFac is rpg_min_dec_fac in percent: a cut leaves at least this
	// share of the rate (50: a cut at most halves it).
	MinDecFac float64
	// RateReduceMonitorPeriod (rate_reduce_monitor_period), when not 0,
	// runs cuts on a free-running tick of this period, from the first CNP:
	// a tick cuts once if CNPs came since the previous one (mlx5's text:
	// "rate reduction will occur only if a CNP is received during the
	// relevant time interval"; HPCC's CheckRateDecreaseMlx). 0: each CNP
	// cuts at once (the paper, ns3-rdma).
	RateReduceMonitorPeriod time.Duration
	// MonitorIgnores reads the monitor period the other way: a CNP less
	// than RateReduceMonitorPeriod after the last cut is ignored (counted
	// in CNPIgnored), one after it cuts at once. No profile uses it; it is
	// kept for comparison.
	MonitorIgnores bool
	// RateOnFirstCNP, when not 0, is the rate and the target rate set on
	// a flow's first CNP (rate_to_set_on_first_cnp; HPCC sets both).
	RateOnFirstCNP Rate
	// ClampTargetRate sets the target rate to the current rate on every
	// cut (clamp_tgt_rate; the paper's RT = RC).
	ClampTargetRate bool
	// ClampTargetRateAfterTimeInc sets the target rate to the current rate
	// on a cut when the rate-increase timer has fired since the last cut
	// (clamp_tgt_rate_after_time_inc; HPCC: clamp unless the timer stage
	// is 0).
	ClampTargetRateAfterTimeInc bool
	// ClampTargetRateAfterByteInc sets the target rate to the current rate
	// on a cut when the byte counter has raised the rate since the last
	// cut (Google's isekai simulator, rdma_roce_cc_dcqcn.cc, which clamps
	// on a byte-counter stage above 0 whatever the flags; the reading of
	// mstflint's clamp_tgt_rate_after_time_inc text, "if the transmission
	// rate was increased due to the timer, and not only due to the byte
	// counter": a byte-counter increase clamps, the flag adds the timer's).
	// Off, only the timer's increases clamp (HPCC, which has no byte
	// counter).
	ClampTargetRateAfterByteInc bool
	// AlphaOnTick updates alpha only on a free-running AlphaPeriod tick
	// from the first CNP: raised if a CNP came since the previous tick,
	// decayed otherwise (mlx5's dce_tcp_rtt; HPCC's UpdateAlphaMlx); the
	// first CNP sets alpha to InitialAlpha and does not raise it. Off, a
	// cut raises alpha first and alpha decays every AlphaPeriod after the
	// last cut (the paper, ns3-rdma).
	AlphaOnTick bool
	// StageCheckFirst classifies an increase event by the stage counts
	// before it is counted (HPCC's RateIncEventMlx: F fast recovery steps,
	// then one additive step, then hyper); off, after (ns3-rdma: F-1 fast
	// recovery steps).
	StageCheckFirst bool
	// HyperStepConstant makes each hyper increase R_HAI (HPCC's
	// HyperIncreaseMlx); off, i*R_HAI with i the hyper stage (ns3-rdma).
	HyperStepConstant bool
	// HyperWithoutByteCounter, with the byte counter off, lets the timer
	// stage alone lead to hyper increase (HPCC, which has no byte
	// counter); off, a byte stage stuck at 0 keeps the increase additive
	// for good (ns3-rdma).
	HyperWithoutByteCounter bool

	// MinTimeBetweenCNPs is the notification point's CNP interval
	// (min_time_between_cnps; the paper's N = 50 us); 0: a CNP for every
	// CE-marked packet (HPCC's receiver flags every ACK of a marked
	// packet).
	MinTimeBetweenCNPs time.Duration
	// CNPPerPort paces CNPs per port, one NotificationPoint for all the
	// QPs of a port: at most one CNP per MinTimeBetweenCNPs from the port,
	// to whichever QP's marked packet came (NVIDIA's only text on it, in
	// mstflint's field description, mlxconfig's help and Mellanox's Linux
	// patch adding np_min_time_between_cnps: "minimum time between sending
	// CNPs from the port"; the mlx5 profile's reading). Off, per QP: each
	// QP has its own interval (the paper's "for the flow", ns3-rdma).
	// docs/dcqcn.md sets out both readings and what each does to many
	// flows into one port.
	CNPPerPort bool
	// CNPAtWindowEnd sends one CNP at the end of an interval in which
	// marked packets came but no CNP could go (the paper: "at most one CNP
	// every N microseconds for the flow, if any packet that arrives within
	// that time window was marked"; ns3-rdma's CheckandSendQCN timer);
	// off, those marks send nothing (mlx5). It needs per-QP pacing.
	CNPAtWindowEnd bool
	// CNPDSCP is the DSCP of CNPs (cnp_dscp; ConnectX sends 48).
	CNPDSCP uint8
}

// GReading is how mlx5's dce_tcp_g (0-1023, default 1019) becomes the
// alpha gain g.
type GReading uint8

const (
	// GWeight reads dce_tcp_g as the weight of the old alpha in 1024ths:
	// g = (1024 - dce_tcp_g)/1024, 5/1024 for the default 1019. Chosen:
	// alpha is a 10-bit fixed-point fraction on the NIC (initial_alpha_value
	// 1023 is "a fraction of 2^10", rpg_gd 11 makes the cut alpha/2^11 of
	// those units, i.e. alpha/2), and HPCC's ns-3 settings for the
	// Mellanox model, whose alpha is updated on the same 1 us tick, use g =
	// 1/256, which 5/1024 is close to; with g = 1019/1024 alpha would
	// forget a CNP within two ticks and each cut would be a halving or
	// nothing, depending on where in the tick the CNP fell.
	GWeight GReading = iota
	// GGain reads dce_tcp_g as g itself in 1024ths: g = dce_tcp_g/1024
	// (the reading this package had before, and some secondary sources').
	GGain
)

// gain returns g for dce_tcp_g v read as r.
func (r GReading) gain(v int) float64 {
	if r == GGain {
		return float64(v) / 1024
	}
	return float64(1024-v) / 1024
}

// Profile names.
const (
	ProfilePaper = "paper"
	ProfileMLX5  = "mlx5"
	ProfileHPCC  = "hpcc"
)

// Profile returns a named parameter set for a port of the given speed
// (docs/dcqcn.md tables every value with its source):
//
//   - "paper": the SIGCOMM 2015 paper as the author's ns-3 (ns3-rdma)
//     runs it: g 1/256, K 55 us, T 55 us, B 10 MB, F 5, R_AI 40 Mb/s,
//     R_HAI 200 Mb/s growing with the stage, alpha 1 at the start (the
//     paper's; ns3-rdma's constructor starts at 0.5, which lets an 8:1
//     incast at 40 Gb/s reach PFC's XOFF before the first cuts bite),
//     alpha raised at each cut, each CNP cut at once, RT clamped on each cut,
//     CNPs per QP every N = 50 us with a CNP at the end of a window that
//     saw marks;
//   - "mlx5": NVIDIA ConnectX defaults as NVIDIA documents them:
//     rpg_time_reset 300 us, rpg_byte_reset 32767 in 64-byte units (2 MB;
//     see ByteResetUnit), rpg_threshold 1,
//     rpg_ai_rate 5 Mb/s, rpg_hai_rate 50 Mb/s, dce_tcp_g 1019 (g 5/1024,
//     see GWeight), dce_tcp_rtt 1 us with alpha on that tick,
//     rpg_min_dec_fac 50, rpg_min_rate 1 Mb/s, rate_reduce_monitor_period
//     4 us with cuts on that tick, initial_alpha_value 1023 (1023/1024),
//     clamp_tgt_rate 0, clamp_tgt_rate_after_time_inc 1, the target
//     clamped after a byte-counter increase (isekai's reading),
//     min_time_between_cnps 4 us per port with marks inside it dropped;
//     the increase stages as HPCC's Mellanox model counts them;
//   - "hpcc": HPCC's ns-3 (rdma-hw.cc *Mlx functions, run.py) settings
//     for DCQCN: t_alpha 1 us, t_dec 4 us, t_inc 300 us, g 1/256, F 1,
//     R_AI 5 Mb/s and R_HAI 50 Mb/s scaled by line rate / 25 Gb/s, a
//     constant hyper step reached after F timer events, no byte counter,
//     alpha 1 on the first CNP, clamp_tgt_rate 0, minimum rate 1000 Mb/s
//     (a tenth of a line slower than 10 Gb/s), a CNP for each marked packet.
func Profile(name string, lineRate Rate) (Params, error) {
	if !(lineRate > 0) || lineRate > MaxLineRate {
		return Params{}, fmt.Errorf("cc: line rate %v must be positive and at most %v", lineRate, MaxLineRate)
	}
	p := Params{LineRate: lineRate, CNPDSCP: 48}
	switch name {
	case ProfilePaper:
		p.MinRate = min(100*Mbps, lineRate/100)
		p.G = 1.0 / 256
		p.InitialAlpha = 1
		p.AlphaPeriod = 55 * time.Microsecond
		p.TimeReset = 55 * time.Microsecond
		p.ByteReset = 10 << 20
		p.Threshold = 5
		p.AIRate = 40 * Mbps
		p.HAIRate = 200 * Mbps
		p.ClampTargetRate = true
		p.MinTimeBetweenCNPs = 50 * time.Microsecond
		p.CNPAtWindowEnd = true
	case ProfileMLX5:
		p.MinRate = min(1*Mbps, lineRate/100)
		p.DCETCPG = 1019
		p.G = p.GReading.gain(p.DCETCPG)
		p.InitialAlpha = 1023.0 / 1024
		p.AlphaPeriod = time.Microsecond
		p.AlphaOnTick = true
		p.TimeReset = 300 * time.Microsecond
		p.ByteResetUnit, p.RPGByteReset = 64, 32767
		p.ByteReset = 64 * 32767
		p.Threshold = 1
		p.AIRate = 5 * Mbps
		p.HAIRate = 50 * Mbps
		p.MinDecFac = 50
		p.RateReduceMonitorPeriod = 4 * time.Microsecond
		p.ClampTargetRateAfterTimeInc = true
		p.ClampTargetRateAfterByteInc = true
		p.StageCheckFirst = true
		p.HyperStepConstant = true
		p.HyperWithoutByteCounter = true
		p.MinTimeBetweenCNPs = 4 * time.Microsecond
		p.CNPPerPort = true
	case ProfileHPCC:
		scale := float64(lineRate / (25 * Gbps))
		p.MinRate = min(1000*Mbps, lineRate/10)
		p.G = 1.0 / 256
		p.InitialAlpha = 1
		p.AlphaPeriod = time.Microsecond
		p.AlphaOnTick = true
		p.TimeReset = 300 * time.Microsecond
		p.Threshold = 1
		p.AIRate = Rate(5 * float64(Mbps) * scale)
		p.HAIRate = Rate(50 * float64(Mbps) * scale)
		p.RateReduceMonitorPeriod = 4 * time.Microsecond
		p.ClampTargetRateAfterTimeInc = true
		p.StageCheckFirst = true
		p.HyperStepConstant = true
		p.HyperWithoutByteCounter = true
	default:
		return Params{}, fmt.Errorf("cc: unknown profile %q (paper, mlx5, hpcc)", name)
	}
	return p, nil
}

// finite reports whether x is a finite number (not NaN or infinite).
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// MaxLineRate is the fastest line rate the package accepts (10 Tb/s): a
// packet at a faster rate would take less than a nanosecond.
const MaxLineRate = 10000 * Gbps

// Check reports parameters that cannot work: non-finite numbers, rates out
// of (0, line rate], timers under 100 ns.
func (p *Params) Check() error {
	for _, x := range []float64{float64(p.LineRate), float64(p.MinRate), p.G, p.InitialAlpha, float64(p.AIRate),
		float64(p.HAIRate), p.MinDecFac, float64(p.RateOnFirstCNP)} {
		if !finite(x) {
			return fmt.Errorf("cc: parameters must be finite numbers (got %v)", x)
		}
	}
	switch {
	case !(p.LineRate > 0) || p.LineRate > MaxLineRate:
		return fmt.Errorf("cc: line rate %v must be positive and at most %v", p.LineRate, MaxLineRate)
	case !(p.MinRate > 0) || p.MinRate > p.LineRate:
		return fmt.Errorf("cc: min rate %v must be in (0, line rate %v]", p.MinRate, p.LineRate)
	case !(p.G > 0) || p.G > 1:
		return fmt.Errorf("cc: g %g must be in (0, 1]", p.G)
	case !(p.InitialAlpha >= 0) || p.InitialAlpha > 1:
		return fmt.Errorf("cc: initial alpha %g must be in [0, 1]", p.InitialAlpha)
	case p.AlphaPeriod < 100*time.Nanosecond || p.TimeReset < 100*time.Nanosecond:
		return fmt.Errorf("cc: the alpha period and the rate-increase timer must be at least 100ns")
	case p.ByteReset < 0 || p.Threshold < 1:
		return fmt.Errorf("cc: byte reset must be >= 0 and the threshold F >= 1")
	case !(p.AIRate >= 0) || !(p.HAIRate >= 0) || p.AIRate > MaxLineRate || p.HAIRate > MaxLineRate:
		// A step larger than the line rate is allowed (the paper's 200 Mb/s
		// hyper step on a 100 Mb/s line): the target is clamped to the line.
		return fmt.Errorf("cc: increase steps %v and %v must be in [0, %v]", p.AIRate, p.HAIRate, MaxLineRate)
	case p.MinDecFac < 0 || p.MinDecFac > 100:
		return fmt.Errorf("cc: rpg_min_dec_fac %g must be a percentage", p.MinDecFac)
	case p.RateOnFirstCNP < 0 || p.RateOnFirstCNP > p.LineRate:
		return fmt.Errorf("cc: rate_to_set_on_first_cnp %v must be at most the line rate %v", p.RateOnFirstCNP, p.LineRate)
	case p.MinTimeBetweenCNPs < 0 || p.RateReduceMonitorPeriod < 0:
		return fmt.Errorf("cc: CNP interval and monitor period must not be negative")
	case p.RateReduceMonitorPeriod > 0 && p.RateReduceMonitorPeriod < 100*time.Nanosecond:
		return fmt.Errorf("cc: the monitor period %v must be 0 or at least 100ns", p.RateReduceMonitorPeriod)
	case p.ByteResetUnit < 0 || p.ByteResetUnit > 1<<20:
		return fmt.Errorf("cc: rpg_byte_reset unit %d must be 0-%d bytes", p.ByteResetUnit, 1<<20)
	case p.DCETCPG < 0 || p.DCETCPG > 1023:
		return fmt.Errorf("cc: dce_tcp_g %d must be 0-1023", p.DCETCPG)
	case p.CNPPerPort && p.CNPAtWindowEnd:
		return fmt.Errorf("cc: a CNP at the window's end needs per-QP pacing: it goes to the QP whose packets were marked")
	}
	return nil
}

// Algorithm is the sender side of a congestion control algorithm, as a
// Sender drives it for a QP: it is told about CNPs and bytes sent, runs its
// timers when its deadline comes, and gives the rate the Sender's pacer
// keeps to. The rate may change only inside OnCNP, OnSent and OnTimeout:
// the Sender reads it after each. DCQCN's ReactionPoint is one; other
// algorithms can take its place in qp.InitAttr.CCAlgorithm.
type Algorithm interface {
	// OnCNP handles a CNP and reports whether it acted on it (false: it
	// was ignored, as DCQCN's reaction point does inside
	// rate_reduce_monitor_period under Params.MonitorIgnores).
	OnCNP(now time.Time) bool
	// OnSent counts bytes sent (whole packets).
	OnSent(now time.Time, n int)
	// Rate is the rate to send at now.
	Rate() Rate
	// Deadline is when OnTimeout must next run; zero for never.
	Deadline() time.Time
	OnTimeout(now time.Time)
}

var _ Algorithm = (*ReactionPoint)(nil)

// QuietSender is an Algorithm that can say how many more bytes its OnSent
// takes without acting on them: told of fewer, OnSent only counts them, so
// that telling it of k packets at once, at any time, leaves it as telling
// it of each when it left. Sender.SendTrain uses it to tell the algorithm
// once per train instead of once per packet.
type QuietSender interface {
	Algorithm
	// QuietBytes is how many more bytes OnSent takes without acting on
	// them (math.MaxInt when it acts on none).
	QuietBytes() int
}

var _ QuietSender = (*ReactionPoint)(nil)

// ReactionPoint is DCQCN's sender side for one QP (the paper's Algorithm
// 1, ns3-rdma's qbb-net-device.cc, HPCC's rdma-hw.cc *Mlx functions):
// CNPs cut the current rate RC by alpha/2; the rate-increase timer and the
// byte counter bring it back through fast recovery, additive and hyper
// increase towards the target rate RT. Params' rules choose how alpha is
// updated, when a cut happens, how RT is clamped and how the increase
// stages count.
//
// Alpha and the monitor tick are free-running clocks that need no wake-up
// of their own: alpha is brought up to date (its decay over the ticks
// without a CNP in closed form) whenever an event reads it, and Deadline
// names only a pending cut and the rate-increase timer. Not safe for
// concurrent use.
type ReactionPoint struct {
	p     Params
	rc    Rate
	rt    Rate
	alpha float64
	// Increase stages: timer events and byte-counter events since the last cut.
	tStage, bStage int
	bytes          int
	started        bool      // a CNP has come: alpha's clock runs
	increasing     bool      // a cut happened and the rate is not back: the increase timer runs
	alphaAt        time.Time // alpha's next tick
	cnpSinceAlpha  bool      // AlphaOnTick: a CNP came since alpha's last tick
	anchor         time.Time // the first CNP: monitor ticks are anchor + k*period
	cutPending     bool      // a monitor tick is to cut
	cutAt          time.Time
	everCut        bool
	lastCut        time.Time
	increaseAt     time.Time
	lowest         Rate
	// Counters, named like mlx5's.
	CNPHandled uint64 // rp_cnp_handled: CNPs acted on (cut now or at the next monitor tick)
	CNPIgnored uint64 // rp_cnp_ignored: with MonitorIgnores, CNPs inside the monitor period
	// CNPCoalesced counts CNPs that found a cut already pending on the
	// monitor tick: they make no cut of their own.
	CNPCoalesced uint64
	Cuts         uint64
	Increases    uint64
}

// NewReactionPoint returns a reaction point sending at the line rate.
func NewReactionPoint(p Params) (*ReactionPoint, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	return &ReactionPoint{p: p, rc: p.LineRate, rt: p.LineRate, alpha: p.InitialAlpha, lowest: p.LineRate}, nil
}

// Rate returns the current rate RC.
func (r *ReactionPoint) Rate() Rate { return r.rc }

// Lowest returns the lowest rate RC has had.
func (r *ReactionPoint) Lowest() Rate { return r.lowest }

// Target returns the target rate RT.
func (r *ReactionPoint) Target() Rate { return r.rt }

// Alpha returns the congestion estimate alpha as of the last event.
func (r *ReactionPoint) Alpha() float64 { return r.alpha }

// AlphaAt returns alpha at now, its ticks up to now applied; it changes
// nothing.
func (r *ReactionPoint) AlphaAt(now time.Time) float64 {
	a, _, _ := r.alphaTicks(now)
	return a
}

// Params returns the parameters.
func (r *ReactionPoint) Params() Params { return r.p }

// alphaTicks returns alpha after the ticks at or before now, the next
// tick, and whether any tick passed.
func (r *ReactionPoint) alphaTicks(now time.Time) (float64, time.Time, bool) {
	if !r.started || r.alphaAt.After(now) {
		return r.alpha, r.alphaAt, false
	}
	k := r.p.AlphaPeriod
	n := int64(now.Sub(r.alphaAt)/k) + 1
	g := r.p.G
	a := r.alpha
	if r.p.AlphaOnTick && r.cnpSinceAlpha {
		a = (1-g)*a + g
	} else {
		a *= 1 - g
	}
	switch {
	case n == 2:
		a *= 1 - g
	case n > 2:
		a *= math.Pow(1-g, float64(n-1))
	}
	return a, r.alphaAt.Add(time.Duration(n) * k), true
}

// advanceAlpha applies alpha's ticks at or before now.
func (r *ReactionPoint) advanceAlpha(now time.Time) {
	if a, next, ticked := r.alphaTicks(now); ticked {
		r.alpha, r.alphaAt, r.cnpSinceAlpha = a, next, false
	}
}

// OnCNP handles a CNP for the QP at time now. It returns false only when
// MonitorIgnores is set and the CNP came inside rate_reduce_monitor_period
// of the last cut.
func (r *ReactionPoint) OnCNP(now time.Time) bool {
	r.advanceAlpha(now)
	if !r.started {
		r.started = true
		r.anchor = now
		r.alphaAt = now.Add(r.p.AlphaPeriod)
		r.alpha = r.p.InitialAlpha
		if f := r.p.RateOnFirstCNP; f > 0 {
			r.rc, r.rt = min(f, r.p.LineRate), min(f, r.p.LineRate)
			r.lowest = min(r.lowest, r.rc)
		}
	} else if r.p.AlphaOnTick {
		r.cnpSinceAlpha = true
	}
	m := r.p.RateReduceMonitorPeriod
	switch {
	case m > 0 && r.p.MonitorIgnores:
		if r.everCut && now.Sub(r.lastCut) < m {
			r.CNPIgnored++
			return false
		}
		r.cut(now)
	case m > 0:
		if r.cutPending {
			r.CNPCoalesced++
		} else {
			// The first monitor tick after now.
			k := now.Sub(r.anchor)/m + 1
			r.cutAt = r.anchor.Add(k * m)
			r.cutPending = true
		}
	default:
		r.cut(now)
	}
	r.CNPHandled++
	return true
}

// cut is one rate decrease at now.
func (r *ReactionPoint) cut(now time.Time) {
	r.Cuts++
	if !r.p.AlphaOnTick {
		r.alpha = (1-r.p.G)*r.alpha + r.p.G
		r.alphaAt = now.Add(r.p.AlphaPeriod)
	}
	if r.p.ClampTargetRate || (r.p.ClampTargetRateAfterTimeInc && r.tStage > 0) ||
		(r.p.ClampTargetRateAfterByteInc && r.bStage > 0) {
		r.rt = r.rc
	}
	factor := 1 - r.alpha/2
	if m := r.p.MinDecFac / 100; factor < m {
		factor = m
	}
	r.rc = max(Rate(float64(r.rc)*factor), r.p.MinRate)
	r.lowest = min(r.lowest, r.rc)
	r.tStage, r.bStage, r.bytes = 0, 0, 0
	r.everCut = true
	r.lastCut = now
	r.increasing = true
	r.increaseAt = now.Add(r.p.TimeReset)
}

// OnSent counts bytes the QP sent, for the byte counter.
func (r *ReactionPoint) OnSent(now time.Time, n int) {
	if !r.increasing || r.p.ByteReset == 0 {
		return
	}
	r.bytes += n
	for r.bytes >= r.p.ByteReset && r.increasing {
		r.bytes -= r.p.ByteReset
		r.advanceAlpha(now)
		r.increase(false)
	}
}

// QuietBytes returns how many more bytes OnSent counts before the byte
// counter's next rate increase: OnSent of at most that many does nothing
// but add them to the count, whatever its now. With the byte counter off,
// or the rate back at the line rate (the counter stopped), OnSent ignores
// bytes: math.MaxInt.
func (r *ReactionPoint) QuietBytes() int {
	if !r.increasing || r.p.ByteReset == 0 {
		return math.MaxInt
	}
	return r.p.ByteReset - r.bytes - 1
}

// Deadline returns when OnTimeout must next run (a cut pending on the
// monitor tick, or the rate-increase timer), or the zero time when nothing
// is pending (before the first CNP, and once the rate is back at the line
// rate).
func (r *ReactionPoint) Deadline() time.Time {
	switch {
	case r.cutPending && r.increasing:
		if r.cutAt.After(r.increaseAt) {
			return r.increaseAt
		}
		return r.cutAt
	case r.cutPending:
		return r.cutAt
	case r.increasing:
		return r.increaseAt
	}
	return time.Time{}
}

// OnTimeout runs the timers due at or before now: a pending cut first
// (after alpha's ticks up to it, as HPCC schedules the cut 1 ns after the
// alpha update), then rate-increase timer events.
func (r *ReactionPoint) OnTimeout(now time.Time) {
	for {
		next := r.Deadline()
		if next.IsZero() || next.After(now) {
			r.advanceAlpha(now)
			return
		}
		r.advanceAlpha(next)
		if r.cutPending && next.Equal(r.cutAt) {
			r.cutPending = false
			r.cut(next)
			continue
		}
		r.increaseAt = r.increaseAt.Add(r.p.TimeReset)
		r.increase(true)
	}
}

// increase is one rate-increase event, from the timer or the byte counter
// (the paper's fast recovery, additive and hyper increase).
func (r *ReactionPoint) increase(timer bool) {
	r.Increases++
	if !r.p.StageCheckFirst {
		r.count(timer)
	}
	t, b := r.tStage, r.bStage
	if r.p.ByteReset == 0 {
		b = 0
		if r.p.HyperWithoutByteCounter {
			b = t
		}
	}
	F := r.p.Threshold
	lo, hi := min(t, b), max(t, b)
	hyper, i := lo >= F, lo-F+1
	if r.p.StageCheckFirst {
		hyper, i = lo > F, lo-F
	}
	switch {
	case hi < F: // fast recovery
	case hyper:
		if r.p.HyperStepConstant {
			i = 1
		}
		r.rt += Rate(float64(r.p.HAIRate) * float64(i))
	default: // additive increase
		r.rt += r.p.AIRate
	}
	if r.p.StageCheckFirst {
		r.count(timer)
	}
	r.rt = min(r.rt, r.p.LineRate)
	r.rc = min((r.rt+r.rc)/2, r.p.LineRate)
	// Back at full speed: the increase timer and the byte counter stop
	// until the next cut.
	if r.rc >= r.p.LineRate && r.rt >= r.p.LineRate {
		r.increasing = false
	}
}

func (r *ReactionPoint) count(timer bool) {
	if timer {
		r.tStage++
	} else {
		r.bStage++
	}
}

// NotificationPoint is DCQCN's receiver side: it turns CE-marked packets
// into CNPs to the sending QP, at most one per MinTimeBetweenCNPs. With
// per-QP pacing (the paper) a QP has its own; with per-port pacing (mlx5)
// the QPs of a port share one. With CNPAtWindowEnd, marks that come while
// no CNP may go make one CNP when the interval ends (Deadline, OnTimeout).
// For RDMA READ the requester is the notification point of the responses.
// Not safe for concurrent use.
type NotificationPoint struct {
	interval time.Duration
	atEnd    bool
	last     time.Time
	sentAny  bool
	deferred bool
	// Counters, named like mlx5's.
	ECNMarked uint64 // np_ecn_marked_roce_packets
	CNPSent   uint64 // np_cnp_sent
}

// NewNotificationPoint returns a notification point with the given CNP
// interval; atWindowEnd sends a CNP at the end of an interval that saw
// marks (Params.CNPAtWindowEnd).
func NewNotificationPoint(interval time.Duration, atWindowEnd bool) *NotificationPoint {
	return &NotificationPoint{interval: interval, atEnd: atWindowEnd}
}

// OnMarked records a CE-marked packet and reports whether a CNP is due now.
func (n *NotificationPoint) OnMarked(now time.Time) bool {
	n.ECNMarked++
	if n.sentAny && now.Sub(n.last) < n.interval {
		if n.atEnd {
			n.deferred = true
		}
		return false
	}
	n.send(now)
	return true
}

func (n *NotificationPoint) send(now time.Time) {
	n.sentAny, n.deferred = true, false
	n.last = now
	n.CNPSent++
}

// Deadline returns when a deferred CNP is due (the end of the interval),
// or the zero time.
func (n *NotificationPoint) Deadline() time.Time {
	if !n.deferred {
		return time.Time{}
	}
	return n.last.Add(n.interval)
}

// OnTimeout reports whether a deferred CNP is due at now, and counts it
// as sent.
func (n *NotificationPoint) OnTimeout(now time.Time) bool {
	if !n.deferred || now.Before(n.last.Add(n.interval)) {
		return false
	}
	n.send(now)
	return true
}
