package cc

import (
	"fmt"
	"math"
	"time"
)

// Sender is one QP's sending side of congestion control: its Algorithm
// (DCQCN's ReactionPoint, or another) and the token-bucket Pacer that
// keeps its packets to the algorithm's rate. It is the one face a QP
// drives, in the shape of quic-go's congestion control and pacer
// (internal/congestion): queries (TimeUntilSend, CanSend, Deadline) change
// nothing; events (OnPacketSent, OnCNP, OnTimeout) change state.
//
// The rate is read from the algorithm only after an event that may have
// changed it, and the tokens earned until that event are counted at the
// rate before it: nothing has to push the rate into the pacer per packet.
// An Algorithm's Rate must therefore change only inside its OnCNP, OnSent
// and OnTimeout. Sizes are bytes on the wire (bth.PacketOverhead and the
// payload). Not safe for concurrent use.
type Sender struct {
	alg   Algorithm
	pacer Pacer
}

// NewSender returns a sender that paces alg's rate with a bucket of burst
// bytes, full at the start. burst must be positive; it is the most a
// sender that was idle may send at once.
func NewSender(alg Algorithm, burst int) (*Sender, error) {
	if alg == nil {
		return nil, fmt.Errorf("cc: a sender needs an algorithm")
	}
	if burst <= 0 {
		return nil, fmt.Errorf("cc: the pacer's burst %d must be positive", burst)
	}
	r := alg.Rate()
	if !(r > 0) || r > MaxLineRate {
		return nil, fmt.Errorf("cc: the algorithm's rate %v must be positive and at most %v", r, MaxLineRate)
	}
	return &Sender{alg: alg, pacer: Pacer{rate: r, burst: float64(burst), tokens: float64(burst)}}, nil
}

// Algorithm returns the algorithm, for its own state and counters.
func (s *Sender) Algorithm() Algorithm { return s.alg }

// Rate returns the rate the sender keeps to now.
func (s *Sender) Rate() Rate { return s.pacer.rate }

// TimeUntilSend returns how long from now until a packet of n bytes may
// leave: 0 when it may leave now. It changes nothing.
func (s *Sender) TimeUntilSend(now time.Time, n int) time.Duration {
	return s.pacer.TimeUntilSend(now, n)
}

// CanSend reports whether a packet of n bytes may leave now. It changes
// nothing.
func (s *Sender) CanSend(now time.Time, n int) bool { return s.pacer.TimeUntilSend(now, n) == 0 }

// OnPacketSent records a packet of n bytes that left at now: it spends the
// pacer's tokens and counts the bytes for the algorithm (DCQCN's byte
// counter).
func (s *Sender) OnPacketSent(now time.Time, n int) {
	s.pacer.OnSent(now, n)
	s.alg.OnSent(now, n)
	s.sync(now)
}

// TrySend sends a packet of n bytes at now if the pacer allows it: it
// returns 0 after doing what OnPacketSent does, or how long from now until
// the packet may leave, changing nothing (TimeUntilSend). It is the two
// calls in one, with the pacer's tokens worked out once.
func (s *Sender) TrySend(now time.Time, n int) time.Duration {
	if wait := s.pacer.TrySend(now, n); wait > 0 {
		return wait
	}
	s.alg.OnSent(now, n)
	s.sync(now)
	return 0
}

// A TrainSend is a packet SendTrain sent: At, when it left, and After,
// when the attempt that sent it was scheduled (the attempt before it), both
// offsets from SendTrain's base.
type TrainSend struct{ At, After time.Duration }

// SendTrain runs, in one call, the attempts of a sender that always has a
// packet of n bytes to send and whose line is busy gap after each packet:
// what a caller does calling TrySend once per attempt. Times are offsets
// from base. The first attempt is at next and was scheduled at after; an
// attempt the pacer lets go sends the packet (TrySend's bookkeeping, and
// the algorithm told of the bytes) and the next attempt comes gap later;
// one it holds back comes again when TrySend says.
//
// It runs the attempts before until, at most most packets, appending each
// packet sent to sent, and stops after a packet whose bytes the algorithm
// may have acted on (DCQCN's byte counter reaching rpg_byte_reset: its
// rate or Deadline may have changed; for an Algorithm that is not a
// QuietSender, every packet). It returns the next attempt, when that was
// scheduled (the last attempt run), whether it stopped after such a
// packet, and sent. The pacer's bucket and the algorithm end as the
// attempts one at a time leave them, to the last bit: the bucket's
// arithmetic is TrySend's, on Durations instead of time.Times, and a
// QuietSender is told of the bytes of packets it does not act on in one
// OnSent. gap and n must be positive.
func (s *Sender) SendTrain(base time.Time, next, after, until, gap time.Duration, n, most int, sent []TrainSend) (time.Duration, time.Duration, bool, []TrainSend) {
	p := &s.pacer
	quiet := -1 // tell the algorithm of every packet
	if q, ok := s.alg.(QuietSender); ok {
		quiet = q.QuietBytes()
	}
	init, tokens := p.init, p.tokens
	var last time.Duration
	if init {
		last = p.last.Sub(base)
	}
	rate, burst := float64(p.rate), p.burst
	need := math.Min(float64(n), burst)
	pending, lastSent, count := 0, time.Duration(0), 0
	acted := false
	var earned [8]struct {
		d     time.Duration // 0: empty (d is positive)
		bytes float64
	}
	for next < until && count < most {
		// Pacer.available and Pacer.wait, written out: the same
		// operations in the same order, so the same bits. For d under a
		// second d.Seconds() is float64(d)/1e9 exactly; x/8 and x*0.125
		// are the same rounding of the same quotient; math.Min of two
		// numbers that are not NaN, infinite or both zero is the smaller.
		have := tokens
		if init {
			if d := next - last; d > 0 {
				// The tokens d earns, from a small table: a backlogged
				// sender's attempts come at few distinct distances from
				// its last send (the line's gap, and that and the
				// pacer's short waits).
				slot := &earned[d&7]
				if slot.d != d {
					var sec float64
					if d < time.Second {
						sec = float64(d) / 1e9
					} else {
						sec = d.Seconds()
					}
					slot.d, slot.bytes = d, sec*rate*0.125
				}
				if x := tokens + slot.bytes; x < burst {
					have = x
				} else {
					have = burst
				}
			}
		}
		if have < need {
			w := time.Duration(math.MaxInt64) // a rate of 0 waits forever
			if rate > 0 {
				w = time.Duration(math.Ceil((need - have) * 8 / rate * 1e9))
			}
			after = next
			next += min(w, math.MaxInt64-next)
			continue
		}
		if !init {
			init, last = true, next
		} else if next > last {
			last = next
		}
		tokens = have - float64(n)
		sent = append(sent, TrainSend{At: next, After: after})
		count++
		lastSent = next
		after, next = next, next+gap
		if quiet >= n {
			quiet -= n
			pending += n
			continue
		}
		p.init, p.last, p.tokens = init, base.Add(last), tokens
		now := base.Add(lastSent)
		s.alg.OnSent(now, pending+n)
		pending = 0
		s.sync(now)
		acted = true
		break
	}
	if !acted {
		if init {
			p.init, p.last, p.tokens = init, base.Add(last), tokens
		}
		if pending > 0 {
			// Fewer bytes than the algorithm acts on: only counted.
			s.alg.OnSent(base.Add(lastSent), pending)
		}
	}
	return next, after, acted, sent
}

// OnCNP hands a CNP to the algorithm and reports whether it acted on it
// (false: ignored, as inside DCQCN's rate_reduce_monitor_period).
func (s *Sender) OnCNP(now time.Time) bool {
	acted := s.alg.OnCNP(now)
	s.sync(now)
	return acted
}

// Deadline returns when OnTimeout must next run for the algorithm's
// timers; zero for never. When a packet waits for the pacer, the caller
// also wakes at now+TimeUntilSend.
func (s *Sender) Deadline() time.Time { return s.alg.Deadline() }

// OnTimeout runs the algorithm's timers due at or before now.
func (s *Sender) OnTimeout(now time.Time) {
	s.alg.OnTimeout(now)
	s.sync(now)
}

// sync reads the algorithm's rate after an event at now: tokens up to now
// are earned at the rate before it.
func (s *Sender) sync(now time.Time) {
	if r := s.alg.Rate(); r != s.pacer.rate {
		s.pacer.SetRate(now, r)
	}
}
