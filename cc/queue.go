package cc

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// QueueConfig describes a switch egress queue: the congestion point.
type QueueConfig struct {
	LineRate Rate // drain rate
	Buffer   int  // bytes; a packet that does not fit is dropped (tail drop), unless PFC
	// WRED-ECN marking on the instantaneous queue depth: below KMin no
	// mark, from KMin to KMax a probability rising linearly to PMax, above
	// KMax every ECN-capable packet is marked CE.
	KMin, KMax int
	PMax       float64
	// PFC pauses the senders when the queue passes XOFF bytes and resumes
	// them below XON, instead of dropping (IEEE 802.1Qbb). The buffer must
	// hold the packets in flight when a pause takes effect.
	PFC       bool
	XOFF, XON int
}

// PFCHeadroom is the buffer PFC must keep above XOFF for the packets still
// arriving after a pause is sent.
const PFCHeadroom = 64 << 10

// DefaultQueue is a common switch configuration: WRED min 150000 and max
// 1500000 bytes, Pmax 10%, a 12 MB buffer, PFC off (XOFF 3 MB / XON 2 MB
// when turned on).
func DefaultQueue(lineRate Rate) QueueConfig {
	return QueueConfig{LineRate: lineRate, Buffer: 12 << 20, KMin: 150000, KMax: 1500000, PMax: 0.1,
		XOFF: 3 << 20, XON: 2 << 20}
}

// Check reports configurations that cannot work.
func (c *QueueConfig) Check() error {
	switch {
	case c.LineRate <= 0:
		return fmt.Errorf("cc: queue line rate must be positive")
	case c.Buffer <= 0:
		return fmt.Errorf("cc: queue buffer must be positive")
	case c.KMin < 0 || c.KMax < c.KMin:
		return fmt.Errorf("cc: need 0 <= Kmin (%d) <= Kmax (%d)", c.KMin, c.KMax)
	case c.PMax < 0 || c.PMax > 1:
		return fmt.Errorf("cc: Pmax %g must be in [0, 1]", c.PMax)
	case c.PFC && (c.XON <= 0 || c.XOFF <= c.XON || c.XOFF > c.Buffer-PFCHeadroom):
		return fmt.Errorf("cc: PFC needs 0 < XON (%d) < XOFF (%d) <= buffer (%d) - %d bytes of headroom for packets in flight", c.XON, c.XOFF, c.Buffer, PFCHeadroom)
	case !(c.LineRate > 0) || c.LineRate > MaxLineRate || math.IsNaN(c.PMax):
		return fmt.Errorf("cc: queue line rate must be positive and at most %v, Pmax a number", MaxLineRate)
	}
	return nil
}

// Queue is the state of a congestion point: how many bytes wait, and the
// marking, dropping and pausing decisions. Packets leave at the line rate;
// the caller times departures with DrainTime. Not safe for concurrent use.
type Queue struct {
	cfg    QueueConfig
	rng    *rand.Rand
	bytes  int
	paused bool
	// Counters.
	Enqueued, Marked, Dropped, Pauses uint64
}

// NewQueue returns an empty queue; seed drives the marking draws.
func NewQueue(cfg QueueConfig, seed uint64) (*Queue, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	return &Queue{cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0xC0FFEE))}, nil
}

// Bytes returns the queue depth in bytes.
func (q *Queue) Bytes() int { return q.bytes }

// Paused reports whether PFC holds the senders.
func (q *Queue) Paused() bool { return q.paused }

// Config returns the configuration.
func (q *Queue) Config() QueueConfig { return q.cfg }

// MarkProbability is the WRED-ECN probability at a depth of n bytes.
func (c *QueueConfig) MarkProbability(n int) float64 {
	switch {
	case n <= c.KMin:
		return 0
	case n > c.KMax:
		return 1
	case c.KMax == c.KMin:
		return c.PMax
	}
	return c.PMax * float64(n-c.KMin) / float64(c.KMax-c.KMin)
}

// Enqueue offers a packet of size bytes. It returns whether the packet was
// queued and whether it is to leave marked CE (ecnCapable packets only).
func (q *Queue) Enqueue(size int, ecnCapable bool) (queued, ce bool) {
	if q.bytes+size > q.cfg.Buffer {
		q.Dropped++
		return false, false
	}
	if ecnCapable {
		if p := q.cfg.MarkProbability(q.bytes); p > 0 && (p >= 1 || q.rng.Float64() < p) {
			ce = true
			q.Marked++
		}
	}
	q.bytes += size
	q.Enqueued++
	if q.cfg.PFC && !q.paused && q.bytes >= q.cfg.XOFF {
		q.paused = true
		q.Pauses++
	}
	return true, ce
}

// Dequeue removes a packet of size bytes that has left.
func (q *Queue) Dequeue(size int) {
	q.bytes -= size
	if q.bytes < 0 {
		q.bytes = 0
	}
	if q.paused && q.bytes <= q.cfg.XON {
		q.paused = false
	}
}
