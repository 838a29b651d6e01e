// Package sim runs DCQCN in simulated time: an N-to-1 incast of
// continuously backlogged senders through one switch egress queue (the
// congestion point of package cc, cc.Port) to one receiver. Senders are
// cc.Senders (the reaction point and its pacer), the receiver's
// notification point turns CE marks into CNPs, and the port marks, drops
// or pauses as configured.
//
// It models flows, not queue pairs: a dropped packet is lost goodput (a
// real RC sender would also go back N), and PFC pauses take effect at once.
// By default the senders, open loop, run ahead of the port in trains and
// the packets that reach a full buffer are counted as drops in bulk
// (fast.go); Config.PerPacket runs every send and arrival as an event, the
// reference the fast path is tested against.
package sim

import (
	"fmt"
	"github.com/roce-emu/roce-emu/internal/fifo"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// Config describes an incast.
type Config struct {
	Flows    int           // senders
	LinkRate cc.Rate       // every link and the bottleneck
	Duration time.Duration // simulated time
	MTU      int           // payload bytes per packet
	Overhead int           // header bytes per packet on the wire (default bth.PacketOverhead, 58: Ethernet, IPv4, UDP, BTH, ICRC)
	Delay    time.Duration // one-way delay of each hop; CNPs take one Delay back
	Queue    cc.QueueConfig
	// DCQCN turns congestion control on; off, senders send at line rate.
	DCQCN  bool
	Params cc.Params
	Sample time.Duration // how often rates, alpha and the queue are recorded (default Duration/1000)
	Seed   uint64
	// PerPacket runs every send attempt and every arrival at the port as
	// an event in one queue, the reference the default is checked
	// against. By default each sender's attempts are run on their own,
	// in order, only as far as the port or the sender's own events need
	// them, and while the buffer is full the arrivals before the next
	// departure are counted as drops without an event each (fast.go).
	// PFC always runs per packet.
	PerPacket bool
}

// Sample is the state at one time.
type Sample struct {
	T     time.Duration
	Rates []cc.Rate
	Alpha []float64
	Queue int
}

// Result is what an incast produced. In JSON the 64-bit counters (cnps,
// marked, drops, pauses, cnps_ignored, cnps_coalesced) are decimal
// strings, as tshark writes 64-bit fields (jq reads numbers as doubles).
type Result struct {
	Samples []Sample `json:"-"` // in the CSV and the plot, not in the JSON summary
	// PerFlowGbps is each flow's delivered throughput over the last half
	// of the run, in Gb/s.
	PerFlowGbps []float64 `json:"per_flow_gbps"`
	// JainIndex is Jain's fairness index of PerFlowGbps.
	JainIndex float64 `json:"jain_index"`
	// Utilization is the bottleneck's delivered bytes over the last half
	// divided by what the line rate allows.
	Utilization float64 `json:"utilization"`
	QueueP50    int     `json:"queue_p50_bytes"`
	QueueP99    int     `json:"queue_p99_bytes"`
	QueueMax    int     `json:"queue_max_bytes"`
	CNPs        uint64  `json:"cnps,string"`
	Marked      uint64  `json:"marked,string"`
	Drops       uint64  `json:"drops,string"`
	Pauses      uint64  `json:"pauses,string"`
	// CNPsIgnored counts CNPs the reaction points ignored (the
	// monitor_ignores reading of the monitor period; no profile uses it).
	CNPsIgnored uint64 `json:"cnps_ignored,string"`
	// CNPsCoalesced counts CNPs that found a cut already pending on the
	// monitor tick (mlx5, hpcc): acted on, but no cut of their own.
	CNPsCoalesced uint64 `json:"cnps_coalesced,string"`
}

type eventKind uint8

const (
	evSend      eventKind = iota
	evSendPaced           // a send the pacer held back: handled as evSend, in its own lane
	evArrive
	evDepart
	evDeliver
	evCNP
	evTimer
	evNPTimer
	evSample
)

type event struct {
	at   time.Duration
	born time.Duration // when it was scheduled
	seq  uint64
	gen  uint64
	flow int32
	size int32
	kind eventKind
	ce   bool
}

// before orders events by time, then by the order they were scheduled:
// the time they were scheduled at, then the order of scheduling (seq).
// Events are scheduled while the events before them are handled, in time
// order, so born never decreases with seq in the per-packet run and
// (at, born, seq) is (at, seq); the fast path schedules a sender's timer
// late, when it runs the sender's attempts, and born keeps it in its
// place.
func (e *event) before(o *event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	if e.born != o.born {
		return e.born < o.born
	}
	return e.seq < o.seq
}

// events is a 4-ary min-heap of events by time, then by push order: four
// children per node keep the tree shallow and a node's children in one or
// two cache lines. Keys are unique (seq), so the pop order is the one any
// priority queue would give.
type events []event

func (h *events) push(e event) {
	*h = append(*h, e)
	q := *h
	i := len(q) - 1
	for i > 0 {
		parent := (i - 1) / 4
		if !e.before(&q[parent]) {
			break
		}
		q[i] = q[parent]
		i = parent
	}
	q[i] = e
}

func (h *events) pop() event {
	q := *h
	top := q[0]
	n := len(q) - 1
	last := q[n]
	q = q[:n]
	i := 0
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < c+4 && j < n; j++ {
			if q[j].before(&q[m]) {
				m = j
			}
		}
		if !q[m].before(&last) {
			break
		}
		q[i] = q[m]
		i = m
	}
	if n > 0 {
		q[i] = last
	}
	*h = q
	return top
}

// nLanes is the number of lanes: one each for arrivals, departures,
// deliveries, CNPs, sends, and sends the pacer held back (a flow's next
// send is first looked at when its link is free, one packet time after
// the last, and, if the pacer holds it back, again when the pacer allows:
// most of these second looks come in time order too).
const nLanes = 6

// heapOnly, set by a test, schedules every event on the heap: the order
// the lanes must give.
var heapOnly bool

// lane returns the lane of an event kind, or -1 for the heap.
func lane(k eventKind) int {
	if heapOnly {
		return -1
	}
	switch k {
	case evArrive:
		return 0
	case evDepart:
		return 1
	case evDeliver:
		return 2
	case evCNP:
		return 3
	case evSend:
		return 4
	case evSendPaced:
		return 5
	}
	return -1
}

type flow struct {
	rp       *cc.ReactionPoint
	snd      *cc.Sender // rp and the flow's pacer
	np       *cc.NotificationPoint
	nextFree time.Duration // the sender's link is busy until then
	sendOK   bool          // a send event is scheduled
	timerGen uint64
	timerAt  time.Duration
	waiting  bool // paused by PFC
	npArmed  bool // an evNPTimer is scheduled for a CNP at the window's end
	// The fast path (fast.go): the pending attempt to send, when it was
	// scheduled (the previous attempt), and the packets sent that have
	// not reached the port yet (arr[arrHead:]).
	att, attBorn time.Duration
	arr          []cc.TrainSend
	arrHead      int
	// What the fast path's horizon looks at, each in time order: the
	// flow's CNPs scheduled that have not come yet, its packets in the
	// port (their departures), its packets on the way to the receiver
	// (their deliveries), and the notification point's timer (npAt, when
	// npArmed).
	cnpDue, departDue, deliverDue times
	npAt                          time.Duration
}

// times is a first-in-first-out queue of times (fifo.Queue, bounded
// by what it holds even when it never empties: a flow with a packet
// always in a full port).
type times struct{ q fifo.Queue[time.Duration] }

func (t *times) push(at time.Duration) { t.q.Push(at) }

// pop drops the first time, if any.
func (t *times) pop() {
	if t.q.Len() > 0 {
		t.q.Pop()
	}
}

// front returns the first time, ok false when there is none.
func (t *times) front() (time.Duration, bool) {
	if f := t.q.Front(); f != nil {
		return *f, true
	}
	return 0, false
}

// arrival is a packet's arrival at the bottleneck port and the port's
// decisions, as a test sees them (see run): told once at the arrival, and
// for a queued packet once more at its departure (Left set), when the
// port's dequeue mark is known.
type arrival struct {
	ID         uint64        // the arrival's number, from 0
	T, Depart  time.Duration // arrival, and departure when queued
	Flow, Size int
	Queued, CE bool
	Left       bool
}

// Run simulates the incast.
func Run(c Config) (*Result, error) { return run(c, nil) }

// run is Run, telling trace (when not nil) about every arrival at the
// bottleneck port.
func run(c Config, trace func(arrival)) (*Result, error) {
	if c.Flows < 1 || c.Flows > 1024 {
		return nil, fmt.Errorf("sim: flows %d must be 1-1024", c.Flows)
	}
	if !(c.LinkRate > 0) || c.LinkRate > cc.MaxLineRate {
		return nil, fmt.Errorf("sim: link rate %v must be positive and at most %v", c.LinkRate, cc.MaxLineRate)
	}
	if c.Duration < 10*time.Microsecond || c.Duration > 10*time.Second {
		return nil, fmt.Errorf("sim: duration %v must be 10us to 10s", c.Duration)
	}
	if c.MTU < 64 || c.MTU > 9000 {
		return nil, fmt.Errorf("sim: MTU %d must be 64 to 9000 bytes", c.MTU)
	}
	if c.Delay < 0 || c.Delay >= c.Duration/4 {
		return nil, fmt.Errorf("sim: delay %v must be at least 0 and under a quarter of the duration", c.Delay)
	}
	if c.Overhead == 0 {
		c.Overhead = bth.PacketOverhead
	}
	if c.Overhead < 0 || c.Overhead > 1000 {
		return nil, fmt.Errorf("sim: overhead %d must be 0 (the default, %d) to 1000 bytes per packet", c.Overhead, bth.PacketOverhead)
	}
	if c.LinkRate.TxTime(c.MTU+c.Overhead) < time.Nanosecond {
		return nil, fmt.Errorf("sim: a %d-byte packet takes under 1ns at %v, the simulation's time step; use a bigger MTU or a slower link", c.MTU+c.Overhead, c.LinkRate)
	}
	if c.Sample <= 0 {
		c.Sample = c.Duration / 1000
	}
	if c.Sample < c.Duration/1000000 || c.Sample < 10*time.Nanosecond {
		return nil, fmt.Errorf("sim: sample interval %v is too short: at most a million samples, each at least 10ns apart", c.Sample)
	}
	if c.Queue.Buffer < c.MTU+c.Overhead {
		return nil, fmt.Errorf("sim: a buffer of %d bytes cannot hold one %d-byte packet", c.Queue.Buffer, c.MTU+c.Overhead)
	}
	if c.Queue.LineRate == 0 {
		c.Queue.LineRate = c.LinkRate
	}
	if c.Queue.PFC {
		// When the queue pauses, what each sender already sent is still on
		// the wire: one packet in transmission and a Delay's worth behind
		// it. PFC loses nothing only if the buffer above XOFF holds that.
		pkt := c.MTU + c.Overhead
		perFlow := (int64(c.Delay/c.LinkRate.TxTime(pkt)) + 2) * int64(pkt)
		if need := int64(c.Flows) * perFlow; int64(c.Queue.Buffer-c.Queue.XOFF) < need {
			return nil, fmt.Errorf("sim: with PFC the buffer above XOFF (%d bytes) must hold what %d flows have in flight when paused, %d bytes; raise --buffer or lower --xoff",
				c.Queue.Buffer-c.Queue.XOFF, c.Flows, need)
		}
	}
	q, err := cc.NewPort(c.Queue, c.Seed)
	if err != nil {
		return nil, err
	}
	if c.DCQCN {
		c.Params.LineRate = c.LinkRate
		if err := c.Params.Check(); err != nil {
			return nil, err
		}
	}
	epoch := time.Unix(0, 0)
	abs := func(d time.Duration) time.Time { return epoch.Add(d) }
	pkt := c.MTU + c.Overhead
	txTime := c.LinkRate.TxTime(pkt)
	s := &state{cfg: c, q: q, trace: trace, epoch: epoch, clock: -1, pkt: pkt, txTime: txTime, txDelay: txTime + c.Delay}
	fast := !c.PerPacket && !c.Queue.PFC
	rng := rand.New(rand.NewPCG(c.Seed, 0x51A7))
	s.flows = make([]*flow, c.Flows)
	var portNP *cc.NotificationPoint // per-port CNP pacing: one for all flows
	if c.DCQCN && c.Params.CNPPerPort {
		portNP = cc.NewNotificationPoint(c.Params.MinTimeBetweenCNPs, false)
	}
	for i := range s.flows {
		f := &flow{}
		if c.DCQCN {
			f.rp, _ = cc.NewReactionPoint(c.Params)
			if f.snd, err = cc.NewSender(f.rp, 2*pkt); err != nil {
				return nil, err
			}
			f.np = portNP
			if f.np == nil {
				f.np = cc.NewNotificationPoint(c.Params.MinTimeBetweenCNPs, c.Params.CNPAtWindowEnd)
			}
		}
		s.flows[i] = f
		// Start each flow within one packet time of the others, at random:
		// flows started together would tie at the queue forever, and tail
		// drop would always pick the same one.
		start := time.Duration(rng.Int64N(int64(c.LinkRate.TxTime(pkt)) + 1))
		if fast {
			f.att, f.attBorn = start, -1
			s.keys = append(s.keys, start+s.txDelay)
		} else {
			s.push(event{at: start, kind: evSend, flow: int32(i)})
			f.sendOK = true
		}
	}
	s.pushSample(0)
	half := c.Duration / 2
	delivered := make([]int64, c.Flows)
	res := &Result{}
	var queueSamples []int
	for {
		if fast && s.fastArrivals() {
			continue
		}
		e, ok := s.next()
		if !ok {
			break
		}
		if e.at > c.Duration {
			break
		}
		now := e.at
		s.clock = now
		fi := int(e.flow)
		f := s.flowAt(fi)
		if fast {
			// A sender's attempts before one of its own events, and
			// every sender's before a sample, run first.
			switch e.kind {
			case evCNP, evTimer:
				s.advance(fi, f, e.at, e.born)
			case evSample:
				for i, g := range s.flows {
					s.advance(i, g, e.at, e.born)
				}
			}
		}
		switch e.kind {
		case evSend, evSendPaced:
			f.sendOK = false
			if q.Paused() {
				f.waiting = true
				continue
			}
			if f.snd != nil {
				if wait := f.snd.TrySend(abs(now), pkt); wait > 0 {
					s.push(event{at: now + wait, kind: evSendPaced, flow: e.flow})
					f.sendOK = true
					continue
				}
				s.armTimer(fi, f)
			}
			s.push(event{at: now + txTime + c.Delay, kind: evArrive, flow: e.flow, size: int32(pkt)})
			f.nextFree = now + txTime
			s.push(event{at: f.nextFree, kind: evSend, flow: e.flow})
			f.sendOK = true
		case evArrive:
			departAt, queued, ce := q.Arrive(abs(now), int(e.size), c.DCQCN)
			id := s.arrivals
			s.arrivals++
			if s.trace != nil {
				s.trace(arrival{ID: id, T: now, Flow: fi, Size: int(e.size), Queued: queued, CE: ce, Depart: departAt.Sub(epoch)})
			}
			if !queued {
				continue
			}
			s.push(event{at: departAt.Sub(epoch), kind: evDepart, flow: e.flow, size: e.size, ce: ce, gen: id})
		case evDepart:
			ce, resumed := q.Depart(int(e.size), c.DCQCN)
			if ce {
				e.ce = true
				if s.trace != nil {
					s.trace(arrival{ID: e.gen, Depart: now, Flow: fi, Size: int(e.size), Queued: true, CE: true, Left: true})
				}
			}
			if resumed {
				for i, g := range s.flows {
					if g.waiting {
						g.waiting = false
						s.push(event{at: now, kind: evSend, flow: int32(i)})
						g.sendOK = true
					}
				}
			}
			s.push(event{at: now + c.Delay, kind: evDeliver, flow: e.flow, size: e.size, ce: e.ce})
			if fast {
				f.departDue.pop()
				f.deliverDue.push(now + c.Delay)
			}
		case evDeliver:
			if fast {
				f.deliverDue.pop()
			}
			if now >= half {
				delivered[fi] += int64(int(e.size) - c.Overhead)
			}
			if e.ce && f.np != nil {
				if f.np.OnMarked(abs(now)) {
					res.CNPs++
					s.pushCNP(fi, now+c.Delay)
				} else if d := f.np.Deadline(); !d.IsZero() && !f.npArmed {
					f.npArmed, f.npAt = true, d.Sub(epoch)
					s.push(event{at: d.Sub(epoch), kind: evNPTimer, flow: e.flow})
				}
			}
		case evNPTimer:
			f.npArmed = false
			if f.np.OnTimeout(abs(now)) {
				res.CNPs++
				s.pushCNP(fi, now+c.Delay)
			}
		case evCNP:
			f.cnpDue.pop()
			f.snd.OnCNP(abs(now))
			s.armTimer(fi, f)
		case evTimer:
			if e.gen != f.timerGen {
				continue
			}
			f.timerAt = 0
			f.snd.OnTimeout(abs(now))
			s.armTimer(fi, f)
		case evSample:
			sm := Sample{T: now, Queue: q.Bytes(), Rates: make([]cc.Rate, c.Flows), Alpha: make([]float64, c.Flows)}
			for i, g := range s.flows {
				if g.rp != nil {
					sm.Rates[i], sm.Alpha[i] = g.rp.Rate(), g.rp.AlphaAt(abs(now))
				} else {
					sm.Rates[i] = c.LinkRate
				}
			}
			res.Samples = append(res.Samples, sm)
			if now >= half {
				queueSamples = append(queueSamples, q.Bytes())
			}
			s.pushSample(now + c.Sample)
		}
	}
	secs := (c.Duration - half).Seconds()
	var total, sum, sumSq float64
	for _, b := range delivered {
		g := float64(b) * 8 / secs / 1e9
		res.PerFlowGbps = append(res.PerFlowGbps, g)
		sum += g
		sumSq += g * g
		total += float64(b)
	}
	if sumSq > 0 {
		res.JainIndex = sum * sum / (float64(c.Flows) * sumSq)
	}
	// Goodput over the line rate's capacity for payload.
	res.Utilization = total * 8 / secs / float64(c.Queue.LineRate) * float64(pkt) / float64(c.MTU)
	slices.Sort(queueSamples)
	if n := len(queueSamples); n > 0 {
		res.QueueP50 = queueSamples[n/2]
		res.QueueP99 = queueSamples[min(n-1, int(math.Ceil(0.99*float64(n)))-1)]
		res.QueueMax = queueSamples[n-1]
	}
	res.Marked, res.Drops, res.Pauses = q.Marked, q.Dropped, q.Pauses
	for _, f := range s.flows {
		if f.rp != nil {
			res.CNPsIgnored += f.rp.CNPIgnored
			res.CNPsCoalesced += f.rp.CNPCoalesced
		}
	}
	return res, nil
}

type state struct {
	cfg   Config
	epoch time.Time // simulated time 0
	q     *cc.Port
	trace func(arrival)
	ev    events
	// lanes hold the events of the kinds that are mostly scheduled a
	// fixed time ahead (arrivals, departures, deliveries, CNPs, sends),
	// each in the order scheduled: as long as that order is also time
	// order they need no heap (see push).
	lanes [nLanes]fifo.Queue[event] // each in time order
	seq   uint64
	// clock is the time of what is being handled: an event, or in the
	// fast path a sender's attempt or an arrival. Events scheduled now are
	// born at it.
	clock time.Duration
	flows []*flow
	// The fast path's constants: bytes on the wire per packet, the
	// sender's transmission time, and that plus the hop's delay (a send's
	// arrival at the port).
	pkt             int
	txTime, txDelay time.Duration
	nextSample      time.Duration   // the pending sample's time
	keys            []time.Duration // the fast path's flow keys (rekey)
	minKey          time.Duration   // the least key and the flows that have it (least), if minValid
	cands           []int
	minValid        bool
	lastDepart      time.Duration // the latest departure scheduled
	// arrivals counts the packets that reached the port.
	arrivals uint64
}

// push schedules an event. Events are taken in time order, then in the
// order they were scheduled (seq), whatever holds them: an event goes to
// its kind's lane when it is not earlier than the lane's last event, so
// that each lane stays in (time, seq) order, and to the heap otherwise.
// Arrivals (a fixed transmission and delay after their send), deliveries
// and CNPs (a fixed delay after the event that makes them) and the port's
// departures (first in, first out) are scheduled in time order; sends,
// held back or not, mostly are. The order events are taken in is the one a
// single heap would give: only the cost differs.
func (s *state) push(e event) {
	e = s.stamp(e)
	if l := lane(e.kind); l >= 0 {
		if t := s.lanes[l].Back(); t == nil || !e.before(t) {
			s.lanes[l].Push(e)
			return
		}
	}
	s.ev.push(e)
}

// stamp numbers an event in the order it was scheduled, at the time of
// the event being handled.
func (s *state) stamp(e event) event {
	s.seq++
	e.seq = s.seq
	e.born = s.clock
	return e
}

// next takes the earliest event of the heap and the lanes.
func (s *state) next() (event, bool) {
	switch src, _ := s.peekSrc(); {
	case src == -1:
		return s.ev.pop(), true
	case src >= 0:
		return s.lanes[src].Pop(), true
	}
	return event{}, false
}

// peek returns the earliest event of the heap and the lanes without
// taking it, nil when there is none.
func (s *state) peek() *event {
	_, e := s.peekSrc()
	return e
}

// peekSrc returns where the earliest event is (-1 the heap, a lane, -2
// none) and the event.
func (s *state) peekSrc() (int, *event) {
	var best *event
	src := -2
	if len(s.ev) > 0 {
		best, src = &s.ev[0], -1
	}
	for i := range s.lanes {
		if s.lanes[i].Len() == 0 {
			continue
		}
		if h := s.lanes[i].Front(); best == nil || h.before(best) {
			best, src = h, i
		}
	}
	return src, best
}

func (s *state) flowAt(i int) *flow {
	if i >= 0 && i < len(s.flows) {
		return s.flows[i]
	}
	return nil
}

// pushCNP schedules a CNP for flow i at at.
func (s *state) pushCNP(i int, at time.Duration) {
	s.flows[i].cnpDue.push(at)
	s.push(event{at: at, kind: evCNP, flow: int32(i)})
}

// pushSample schedules the sample at at.
func (s *state) pushSample(at time.Duration) {
	s.nextSample = at
	s.push(event{at: at, kind: evSample})
}

// armTimer schedules the reaction point's next deadline, replacing an
// earlier one.
func (s *state) armTimer(i int, f *flow) {
	d := f.rp.Deadline()
	if d.IsZero() {
		return
	}
	at := d.Sub(s.epoch)
	if f.timerAt != 0 && f.timerAt == at {
		return
	}
	f.timerGen++
	f.timerAt = at
	s.push(event{at: at, kind: evTimer, flow: int32(i), gen: f.timerGen})
}
