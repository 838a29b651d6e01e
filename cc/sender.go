package cc

import (
	"fmt"
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
