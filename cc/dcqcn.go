package cc

import (
	"fmt"
	"math"
	"time"
)

// Params are DCQCN's parameters, named after mlx5's rp_ and np_ settings
// (NVIDIA DOCA "DCQCN CC Parameters"; ROCEV2.md section 7) where one
// exists.
type Params struct {
	// LineRate is the port speed: the rate a flow starts at and never
	// exceeds.
	LineRate Rate
	// MinRate is rpg_min_rate: the rate is never cut below it.
	MinRate Rate
	// G is the alpha gain g: on a CNP alpha = (1-g)*alpha + g; each
	// AlphaPeriod without one, alpha = (1-g)*alpha (mlx5: dce_tcp_g/1024).
	G float64
	// InitialAlpha is alpha before the first CNP (initial_alpha_value/1023).
	InitialAlpha float64
	// AlphaPeriod is K, how often alpha decays (mlx5: dce_tcp_rtt).
	AlphaPeriod time.Duration
	// TimeReset is T, the rate-increase timer (rpg_time_reset).
	TimeReset time.Duration
	// ByteReset is B, the bytes sent between rate increases
	// (rpg_byte_reset); 0 turns the byte counter off.
	ByteReset int
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
	// RateReduceMonitorPeriod is the least time between two cuts; CNPs
	// inside it are counted as ignored (rate_reduce_monitor_period).
	RateReduceMonitorPeriod time.Duration
	// RateOnFirstCNP, when not 0, is the rate set on a flow's first CNP
	// (rate_to_set_on_first_cnp).
	RateOnFirstCNP Rate
	// ClampTargetRate sets the target rate to the current rate on every
	// cut (the paper's RT = RC); otherwise the target is kept.
	ClampTargetRate bool

	// MinTimeBetweenCNPs is the notification point's CNP interval per QP
	// (min_time_between_cnps; the paper's 50 us).
	MinTimeBetweenCNPs time.Duration
	// CNPDSCP is the DSCP of CNPs (cnp_dscp; ConnectX sends 48).
	CNPDSCP uint8
}

// Profile names.
const (
	ProfilePaper = "paper"
	ProfileMLX5  = "mlx5"
	ProfileHPCC  = "hpcc"
)

// Profile returns a named parameter set for a port of the given speed:
//
//   - "paper": the SIGCOMM 2015 paper and the author's ns-3 sample
//     configuration (g 1/256, K 55 us, T 55 us, B 10 MB, F 5, R_AI
//     40 Mb/s, R_HAI 200 Mb/s, CNP interval 50 us);
//   - "mlx5": NVIDIA ConnectX defaults (rpg_time_reset 300 us,
//     rpg_byte_reset 32767, rpg_threshold 1, rpg_ai_rate 5 Mb/s,
//     rpg_hai_rate 50 Mb/s, dce_tcp_g 1019, dce_tcp_rtt 1 us,
//     rpg_min_dec_fac 50, rpg_min_rate 1 Mb/s, rate_reduce_monitor_period
//     4 us, initial_alpha_value 1023, min_time_between_cnps 4 us);
//   - "hpcc": the values of HPCC's ns-3 "production" DCQCN (t_alpha 1 us,
//     t_dec 4 us, t_inc 300 us, g 1/256, R_AI 5 Mb/s and R_HAI 50 Mb/s
//     scaled by line rate / 25 Gb/s, alpha 1 on the first CNP, byte counter
//     off), run by this package's rules: its stages follow ns3-rdma, not
//     HPCC's rdma-hw.cc (which checks the stage before counting it, and
//     whose hyper step does not grow), and CNPs inside t_dec are ignored
//     where HPCC applies them at the next check.
//
// The minimum rate of paper and hpcc is 100 Mb/s, or 1% of a slower line.
// The mlx5 values are NVIDIA's defaults as DOCA names them, but how the NIC
// uses dce_tcp_g (here g = dce_tcp_g/1024 applied per dce_tcp_rtt) was not
// checked against a NIC: with g = 1019/1024 alpha forgets a CNP within
// microseconds and every cut is close to a halving.
func Profile(name string, lineRate Rate) (Params, error) {
	if !(lineRate > 0) || lineRate > MaxLineRate {
		return Params{}, fmt.Errorf("cc: line rate %v must be positive and at most %v", lineRate, MaxLineRate)
	}
	p := Params{LineRate: lineRate, ClampTargetRate: true, CNPDSCP: 48, MinDecFac: 0}
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
		p.MinTimeBetweenCNPs = 50 * time.Microsecond
	case ProfileMLX5:
		p.MinRate = 1 * Mbps
		p.G = 1019.0 / 1024
		p.InitialAlpha = 1023.0 / 1024
		p.AlphaPeriod = time.Microsecond
		p.TimeReset = 300 * time.Microsecond
		p.ByteReset = 32767
		p.Threshold = 1
		p.AIRate = 5 * Mbps
		p.HAIRate = 50 * Mbps
		p.MinDecFac = 50
		p.RateReduceMonitorPeriod = 4 * time.Microsecond
		p.MinTimeBetweenCNPs = 4 * time.Microsecond
	case ProfileHPCC:
		scale := float64(lineRate / (25 * Gbps))
		p.MinRate = min(100*Mbps, lineRate/100)
		p.G = 1.0 / 256
		p.InitialAlpha = 1
		p.AlphaPeriod = time.Microsecond
		p.TimeReset = 300 * time.Microsecond
		p.Threshold = 5
		p.AIRate = Rate(5 * float64(Mbps) * scale)
		p.HAIRate = Rate(50 * float64(Mbps) * scale)
		p.RateReduceMonitorPeriod = 4 * time.Microsecond
		p.MinTimeBetweenCNPs = 4 * time.Microsecond
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
	// was ignored, e.g. inside DCQCN's rate_reduce_monitor_period).
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

// ReactionPoint is DCQCN's sender side for one QP (the paper's Algorithm 1
// and ns3-rdma's qbb-net-device.cc): CNPs cut the current rate RC; the
// alpha timer, the rate-increase timer and the byte counter bring it back
// through fast recovery, additive and hyper increase towards the target
// rate RT. Not safe for concurrent use.
type ReactionPoint struct {
	p     Params
	rc    Rate
	rt    Rate
	alpha float64
	// Increase stages: timer events and byte-counter events since the last cut.
	tStage, bStage int
	bytes          int
	cut            bool // a CNP has been handled: timers run
	cnpInPeriod    bool
	lastCut        time.Time
	lowest         Rate
	alphaAt        time.Time
	increaseAt     time.Time
	// Counters, named like mlx5's.
	CNPHandled uint64 // rp_cnp_handled
	CNPIgnored uint64 // rp_cnp_ignored: inside rate_reduce_monitor_period
	Cuts       uint64
	Increases  uint64
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

// Alpha returns the congestion estimate alpha.
func (r *ReactionPoint) Alpha() float64 { return r.alpha }

// Params returns the parameters.
func (r *ReactionPoint) Params() Params { return r.p }

// OnCNP handles a CNP for the QP at time now. It returns false when the
// CNP came inside rate_reduce_monitor_period of the last cut and was
// ignored.
func (r *ReactionPoint) OnCNP(now time.Time) bool {
	if r.cut && r.p.RateReduceMonitorPeriod > 0 && now.Sub(r.lastCut) < r.p.RateReduceMonitorPeriod {
		r.CNPIgnored++
		r.cnpInPeriod = true
		return false
	}
	r.CNPHandled++
	r.Cuts++
	first := !r.cut
	r.alpha = (1-r.p.G)*r.alpha + r.p.G
	if r.p.ClampTargetRate || first {
		r.rt = r.rc
	}
	factor := 1 - r.alpha/2
	if min := r.p.MinDecFac / 100; factor < min {
		factor = min
	}
	r.rc = Rate(float64(r.rc) * factor)
	if first && r.p.RateOnFirstCNP > 0 {
		r.rc = r.p.RateOnFirstCNP
	}
	r.rc = max(r.rc, r.p.MinRate)
	r.lowest = min(r.lowest, r.rc)
	r.tStage, r.bStage, r.bytes = 0, 0, 0
	r.cut = true
	r.cnpInPeriod = false
	r.lastCut = now
	r.alphaAt = now.Add(r.p.AlphaPeriod)
	r.increaseAt = now.Add(r.p.TimeReset)
	return true
}

// OnSent counts bytes the QP sent, for the byte counter.
func (r *ReactionPoint) OnSent(now time.Time, n int) {
	if !r.cut || r.p.ByteReset == 0 {
		return
	}
	r.bytes += n
	for r.bytes >= r.p.ByteReset {
		r.bytes -= r.p.ByteReset
		r.bStage++
		r.increase()
	}
}

// Deadline returns when OnTimeout must next run (alpha decay or the
// rate-increase timer), or the zero time when nothing is pending (before
// the first CNP, and once the rate is back at the line rate with alpha
// decayed to nothing).
func (r *ReactionPoint) Deadline() time.Time {
	if !r.cut {
		return time.Time{}
	}
	if r.alphaAt.Before(r.increaseAt) {
		return r.alphaAt
	}
	return r.increaseAt
}

// OnTimeout runs the timers due at or before now.
func (r *ReactionPoint) OnTimeout(now time.Time) {
	for r.cut {
		next := r.Deadline()
		if next.After(now) {
			return
		}
		if next.Equal(r.alphaAt) {
			if !r.cnpInPeriod {
				r.alpha *= 1 - r.p.G
			}
			r.cnpInPeriod = false
			r.alphaAt = r.alphaAt.Add(r.p.AlphaPeriod)
		} else {
			r.tStage++
			r.increase()
			r.increaseAt = r.increaseAt.Add(r.p.TimeReset)
		}
		// Back at full speed with no congestion left to remember: stop.
		if r.rc >= r.p.LineRate && r.rt >= r.p.LineRate && r.alpha < 1e-6 {
			r.cut = false
		}
	}
}

// increase is one rate-increase event (the paper's fast recovery,
// additive and hyper increase).
func (r *ReactionPoint) increase() {
	r.Increases++
	F := r.p.Threshold
	// With the byte counter off its stage stays 0: after F timer events
	// the increase is additive for good, as with an idle byte counter in
	// ns3-rdma.
	lo, hi := min(r.tStage, r.bStage), max(r.tStage, r.bStage)
	switch {
	case hi < F: // fast recovery
	case lo >= F: // hyper increase
		r.rt += Rate(float64(r.p.HAIRate) * float64(lo-F+1))
	default: // additive increase
		r.rt += r.p.AIRate
	}
	r.rt = min(r.rt, r.p.LineRate)
	r.rc = min((r.rt+r.rc)/2, r.p.LineRate)
}

// NotificationPoint is DCQCN's receiver side for one QP: it turns
// CE-marked packets into CNPs to the sending QP, at most one per
// MinTimeBetweenCNPs (the paper's 50 us per flow). For RDMA READ the
// requester is the notification point of the responses.
type NotificationPoint struct {
	interval time.Duration
	last     time.Time
	sentAny  bool
	// Counters, named like mlx5's.
	ECNMarked uint64 // np_ecn_marked_roce_packets
	CNPSent   uint64 // np_cnp_sent
}

// NewNotificationPoint returns a notification point with the given CNP
// interval.
func NewNotificationPoint(interval time.Duration) *NotificationPoint {
	return &NotificationPoint{interval: interval}
}

// OnMarked records a CE-marked packet and reports whether a CNP is due now.
func (n *NotificationPoint) OnMarked(now time.Time) bool {
	n.ECNMarked++
	if n.sentAny && now.Sub(n.last) < n.interval {
		return false
	}
	n.sentAny = true
	n.last = now
	n.CNPSent++
	return true
}
