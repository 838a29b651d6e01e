package cc

import (
	"math"
	"time"
)

// Pacer is a token bucket that spaces a sender's packets at a rate (as
// quic-go's congestion/pacer.go): the bucket holds at most burst bytes and
// refills at the rate. TimeUntilSend asks without changing anything;
// OnSent spends. Sender drives one for a QP. Not safe for concurrent use.
type Pacer struct {
	rate   Rate
	burst  float64
	tokens float64 // at last
	last   time.Time
	init   bool
}

// NewPacer returns a full pacer at rate r with a bucket of burst bytes.
func NewPacer(r Rate, burst int) *Pacer {
	return &Pacer{rate: r, burst: float64(burst), tokens: float64(burst)}
}

// Rate returns the rate the bucket refills at.
func (p *Pacer) Rate() Rate { return p.rate }

// SetRate changes the rate from now on; tokens earned before now, at the
// old rate, are kept.
func (p *Pacer) SetRate(now time.Time, r Rate) {
	p.refill(now)
	p.rate = r
}

// available returns the tokens the bucket holds at now.
func (p *Pacer) available(now time.Time) float64 {
	if !p.init {
		return p.tokens
	}
	if d := now.Sub(p.last); d > 0 {
		return math.Min(p.burst, p.tokens+d.Seconds()*float64(p.rate)/8)
	}
	return p.tokens
}

func (p *Pacer) refill(now time.Time) {
	if !p.init {
		p.init, p.last = true, now
		return
	}
	if now.After(p.last) {
		p.tokens = p.available(now)
		p.last = now
	}
}

// TimeUntilSend returns how long from now until n bytes may leave: 0 when
// they may leave now. A packet larger than the bucket may go once the
// bucket is full. It changes nothing: asking twice gives the same answer.
func (p *Pacer) TimeUntilSend(now time.Time, n int) time.Duration {
	return p.wait(p.available(now), n)
}

// wait returns how long until n bytes may leave with have tokens now.
func (p *Pacer) wait(have float64, n int) time.Duration {
	need := math.Min(float64(n), p.burst)
	if have >= need {
		return 0
	}
	if !(p.rate > 0) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Ceil((need - have) * 8 / float64(p.rate) * 1e9))
}

// TrySend is TimeUntilSend and, when that is 0, OnSent, with the tokens
// at now worked out once: it returns 0 and spends the tokens for n bytes
// that leave at now, or how long from now until they may leave, changing
// nothing. The bucket ends as TimeUntilSend then OnSent leave it, to the
// last bit of its float.
func (p *Pacer) TrySend(now time.Time, n int) time.Duration {
	have := p.available(now)
	if w := p.wait(have, n); w > 0 {
		return w
	}
	// What refill does: available(now) is what it stores.
	if !p.init {
		p.init, p.last = true, now
	} else if now.After(p.last) {
		p.last = now
	}
	p.tokens = have - float64(n)
	return 0
}

// OnSent spends the tokens for n bytes that left at now. The bucket may go
// into debt (a packet sent before TimeUntilSend allowed it, or larger than
// the bucket), which later packets wait out.
func (p *Pacer) OnSent(now time.Time, n int) {
	p.refill(now)
	p.tokens -= float64(n)
}

// Take asks to send n bytes at now. It returns true and spends the tokens,
// or false and the time when enough tokens will be there: TimeUntilSend
// and OnSent in one call.
func (p *Pacer) Take(now time.Time, n int) (bool, time.Time) {
	p.refill(now)
	if wait := p.TimeUntilSend(now, n); wait > 0 {
		return false, now.Add(wait)
	}
	p.OnSent(now, n)
	return true, time.Time{}
}
