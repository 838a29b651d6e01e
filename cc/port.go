package cc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// QueueConfig describes a switch egress port's queue and line: the
// congestion point that Port models.
type QueueConfig struct {
	LineRate Rate // drain rate: the port serializes size*8/LineRate per packet
	Buffer   int  // bytes; a packet that does not fit is dropped (tail drop), unless PFC
	// WRED-ECN marking on the instantaneous queue depth: below KMin no
	// mark, from KMin to KMax a probability rising linearly to PMax, above
	// KMax every ECN-capable packet is marked CE.
	KMin, KMax int
	PMax       float64
	// MarkAtEnqueue decides the mark when a packet arrives, on the depth
	// it finds. Off (the default), the mark is decided when the packet
	// starts to leave, on the depth behind it, as both reference
	// simulators do (ns3-rdma: qbb-net-device.cc DequeueAndTransmit; HPCC:
	// switch-node.cc SwitchNotifyDequeue, after the packet's bytes are
	// taken off the egress count): a queue that drains stops marking at
	// once, where enqueue marks still arrive a queue's worth of time late.
	MarkAtEnqueue bool
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
	case math.IsNaN(c.PMax):
		return fmt.Errorf("cc: Pmax must be a number in [0, 1]")
	case !(c.LineRate > 0) || c.LineRate > MaxLineRate:
		return fmt.Errorf("cc: queue line rate %v must be positive and at most %v", c.LineRate, MaxLineRate)
	}
	return nil
}

// Port is a switch egress port, the congestion point of DCQCN: a queue of
// bytes in front of a line. It is the one port model of the module: the
// in-memory network's congestion points and the UDP switch in package
// transport and the incast of cc/sim all run it. Sans-IO: it holds no
// packets and no timers, only the decisions and the clock of the line.
//
//   - Arrive admits a packet of size bytes (on the wire, as bth.WireLen
//     counts them) at now: tail drop when it does not fit in Buffer; with
//     MarkAtEnqueue, WRED-ECN marking on the depth it finds
//     (MarkProbability); the time its last bit leaves, with the line
//     serializing one packet after the other at LineRate (size*8/LineRate
//     each, starting when the packet arrives or when the line comes free,
//     whichever is later, kept exact and rounded up to the nanosecond);
//   - the caller removes it at that time with Depart, in the order the
//     packets arrived; by default Depart decides the mark, on the depth
//     behind the packet when it started to leave (the bytes in the port
//     then, less its own). A packet leaves CE when Arrive or Depart says
//     so;
//   - with PFC, the port pauses its senders (Paused) once the depth reaches
//     XOFF and resumes them once it falls to XON or below (IEEE 802.1Qbb
//     XOFF/XON). A paused port still takes what arrives: the caller holds
//     or stops its senders, as its kind of link allows.
//
// Not safe for concurrent use.
type Port struct {
	cfg       QueueConfig
	rng       *rand.Rand
	bytes     int
	headStart int // bytes in the port, the head packet's own included, when it started to leave
	paused    bool
	nsPerByte float64
	// The line is busy until free plus frac nanoseconds (0 <= frac < 1).
	free time.Time
	frac float64
	// Counters: packets queued, marked CE, dropped at a full buffer, PFC
	// pauses (XOFF events), and the deepest the queue has been, in bytes.
	Enqueued, Marked, Dropped, Pauses uint64
	MaxBytes                          int
}

// NewPort returns an empty port with an idle line; seed drives the marking
// draws, so that equal seeds and equal arrivals give equal marks.
func NewPort(cfg QueueConfig, seed uint64) (*Port, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	return &Port{cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0xC0FFEE)), nsPerByte: 8e9 / float64(cfg.LineRate)}, nil
}

// Bytes returns the queue depth in bytes.
func (p *Port) Bytes() int { return p.bytes }

// Paused reports whether PFC holds the senders.
func (p *Port) Paused() bool { return p.paused }

// Config returns the configuration.
func (p *Port) Config() QueueConfig { return p.cfg }

// MarkProbability is the WRED-ECN probability at a depth of n bytes: 0 up
// to KMin, rising linearly to PMax at KMax, 1 above KMax.
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

// SerializationTime returns how long the line takes to send n bytes,
// n*8/LineRate, rounded up to the nanosecond.
func (p *Port) SerializationTime(n int) time.Duration {
	return time.Duration(math.Ceil(float64(n) * p.nsPerByte))
}

// snap is how close, in nanoseconds, the line clock's fraction must come
// to a whole nanosecond to be taken as one: float rounding, not time.
const snap = 1e-6

// mark draws a WRED-ECN decision at a depth of n bytes.
func (p *Port) mark(n int) bool {
	if pr := p.cfg.MarkProbability(n); pr > 0 && (pr >= 1 || p.rng.Float64() < pr) {
		p.Marked++
		return true
	}
	return false
}

// Arrive offers a packet of size bytes at now. It reports whether the
// packet was queued (false: dropped, the buffer is full), with
// MarkAtEnqueue whether it is to leave marked CE (ecnCapable packets
// only), and when its last bit leaves the port; the caller then calls
// Depart.
func (p *Port) Arrive(now time.Time, size int, ecnCapable bool) (departAt time.Time, queued, ce bool) {
	if p.bytes+size > p.cfg.Buffer {
		p.Dropped++
		return time.Time{}, false, false
	}
	if ecnCapable && p.cfg.MarkAtEnqueue {
		ce = p.mark(p.bytes)
	}
	if p.bytes == 0 { // the line is idle: the packet starts to leave now
		p.headStart = size
	}
	p.bytes += size
	p.Enqueued++
	p.MaxBytes = max(p.MaxBytes, p.bytes)
	if p.cfg.PFC && !p.paused && p.bytes >= p.cfg.XOFF {
		p.paused = true
		p.Pauses++
	}
	if now.After(p.free) { // idle line: start now
		p.free, p.frac = now, 0
	}
	t := p.frac + float64(size)*p.nsPerByte
	whole := math.Floor(t)
	p.free = p.free.Add(time.Duration(whole))
	switch p.frac = t - whole; {
	case p.frac < snap:
		p.frac = 0
	case p.frac > 1-snap:
		p.free, p.frac = p.free.Add(1), 0
	}
	if p.frac > 0 {
		return p.free.Add(1), true, ce
	}
	return p.free, true, ce
}

// Depart removes a packet of size bytes whose last bit has left, the
// oldest in the port. Unless MarkAtEnqueue, it decides whether the packet
// leaves marked CE (ecnCapable packets only), on the bytes that were
// behind it when it started to leave; the next packet starts to leave now.
// It reports whether this ended a PFC pause (the depth fell to XON).
func (p *Port) Depart(size int, ecnCapable bool) (ce, resumed bool) {
	if ecnCapable && !p.cfg.MarkAtEnqueue {
		ce = p.mark(max(p.headStart-size, 0))
	}
	p.bytes -= size
	if p.bytes < 0 {
		p.bytes = 0
	}
	p.headStart = p.bytes
	if p.paused && p.bytes <= p.cfg.XON {
		p.paused = false
		return ce, true
	}
	return ce, false
}
