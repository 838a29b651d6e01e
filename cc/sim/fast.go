package sim

import (
	"math"
	"time"

	"github.com/roce-emu/roce-emu/cc"
)

// The fast path: senders run ahead on their own, drops are counted in
// bulk.
//
// A sender in this simulation is open loop: what it sends depends only on
// its pacer, its reaction point and its own events (CNPs, timers), never on
// what the port does with its packets (no window, no ACKs, no go-back-N;
// see the package comment). So a sender's attempts need not wait in the
// event queue: each flow keeps its pending attempt (when the pacer or the
// line lets it try next) and runs its attempts, with the same calls to its
// cc.Sender at the same times as the per-packet run (cc.Sender.SendTrain:
// the bucket and the reaction point bit for bit as TrySend per attempt
// leaves them), ahead of time, as far as nothing can change it first: up
// to its next CNP or timer, the next sample (which reads its rate), and the
// earliest a CNP not yet scheduled could come (horizon: a CNP goes to the
// flow whose packet was delivered marked, one Delay after the delivery or
// the notification point's timer that makes it; a delivery comes one Delay
// after its packet's departure; a departure after an admission). What it
// sends goes in flight to the port.
//
//   - Before one of its own events and before a sample, a sender's attempts
//     that come first have run.
//   - While the port has room, the arrivals before the next event are
//     handed to cc.Port.Arrive one at a time in order, the earliest over
//     the flows, as the per-packet run does.
//   - While the buffer is full (no room for one more packet), nothing
//     happens at the port until the next departure: every arrival before
//     it is a drop, and each flow's are counted in one pass (Port.Dropped)
//     without being put in order. A drop changes nothing else: no mark is
//     drawn for it (marks are drawn at dequeue, and with MarkAtEnqueue at
//     the enqueue of a packet that fits), and the depth stays.
//
// Events are taken in time order, then by the time they were scheduled at
// (event.born), as in the per-packet run. Where those tie, the per-packet
// run orders by the order of scheduling, which depends on the whole history
// of the flows' attempts; here: a sender's attempt after its own event, an
// arrival after an event, and arrivals sent at the same nanosecond by when
// their sends were scheduled, then by flow. Where that differs, the two
// runs admit a different one of two packets that reach the port in the
// same nanosecond and go on differently from there
// (TestFastPathMatchesPerPacket, TestFastPathDiffersOnlyAtTies: up to the
// first difference everything is the same, and the first difference is
// such a tie).

// maxTrain bounds the packets a flow sends in one call of runAhead. It
// does not bound its packets in flight: advance calls runAhead until the
// flow reaches the event it is advanced to, so a flow holds what it sends
// in (delay + transmission time), as the per-packet run's events do.
const maxTrain = 1024

// A packet on its way to the port is the cc.TrainSend that sent it: sent
// at At (it arrives txDelay later), its send scheduled at After.

// precedes reports whether something at (at, born) comes before an event
// at (eAt, eBorn).
func precedes(at, born, eAt, eBorn time.Duration) bool {
	return at < eAt || at == eAt && born < eBorn
}

// step runs flow fi's pending attempt alone: the sender sends a packet now,
// or the pacer says when to try again.
func (s *state) step(fi int, f *flow) {
	now := f.att
	saved := s.clock
	s.clock = now
	if f.snd != nil {
		if wait := f.snd.TrySend(s.epoch.Add(now), s.pkt); wait > 0 {
			f.att, f.attBorn = now+wait, now
			s.clock = saved
			return
		}
		s.armTimer(fi, f)
	}
	f.arr = append(f.arr, cc.TrainSend{At: now, After: f.attBorn})
	f.att, f.attBorn = now+s.txTime, now
	s.clock = saved
}

// runAhead runs flow fi's attempts before until, at most most packets,
// putting what they send in flight.
func (s *state) runAhead(fi int, f *flow, until time.Duration, most int) {
	if f.arrHead == len(f.arr) {
		f.arr, f.arrHead = f.arr[:0], 0
	} else if f.arrHead >= 1024 && 2*f.arrHead >= len(f.arr) {
		n := copy(f.arr, f.arr[f.arrHead:])
		f.arr, f.arrHead = f.arr[:n], 0
	}
	for f.att < until && most > 0 {
		if f.snd == nil { // no congestion control: a packet every txTime
			for ; f.att < until && most > 0; most-- {
				f.arr = append(f.arr, cc.TrainSend{At: f.att, After: f.attBorn})
				f.att, f.attBorn = f.att+s.txTime, f.att
			}
			return
		}
		var acted bool
		n := len(f.arr)
		f.att, f.attBorn, acted, f.arr = f.snd.SendTrain(s.epoch, f.att, f.attBorn, until, s.txTime, s.pkt, most, f.arr)
		most -= len(f.arr) - n
		if acted {
			// The byte counter acted: the reaction point's deadline may
			// have moved, as armTimer after each send finds.
			saved := s.clock
			s.clock = f.arr[len(f.arr)-1].At
			s.armTimer(fi, f)
			s.clock = saved
		}
	}
}

// advance runs flow fi's attempts that come before an event at (at, born).
func (s *state) advance(fi int, f *flow, at, born time.Duration) {
	for f.att < at {
		s.runAhead(fi, f, at, maxTrain)
	}
	for precedes(f.att, f.attBorn, at, born) {
		s.step(fi, f)
	}
	s.rekey(fi, f)
}

// horizon is how far flow f may run ahead when nothing has happened since
// s.clock: not to its own next CNP or timer, nor the next sample (which
// reads its rate), nor the earliest a CNP for it not yet scheduled can
// come. A CNP goes to the flow whose packet was delivered marked (per QP
// and per port alike) and comes one Delay after the delivery or the
// notification point's timer that makes it; a delivery comes one Delay
// after its packet leaves the port; a packet not yet admitted leaves
// after every packet in the port and after s.clock.
func (s *state) horizon(f *flow) time.Duration {
	d := s.cfg.Delay
	h := min(max(s.clock, s.lastDepart)+1+2*d, s.nextSample, s.cfg.Duration+1)
	if t, ok := f.deliverDue.front(); ok {
		h = min(h, t+d)
	}
	if t, ok := f.departDue.front(); ok {
		h = min(h, t+2*d)
	}
	if f.npArmed {
		h = min(h, f.npAt+d)
	}
	if t, ok := f.cnpDue.front(); ok {
		h = min(h, t)
	}
	if f.timerAt != 0 {
		h = min(h, f.timerAt)
	}
	return h
}

// head returns flow fi's next packet in flight, running ahead as far as
// the horizon allows; nil when it has none, the flow's next attempt being
// at or past the horizon.
func (s *state) head(fi int, f *flow) *cc.TrainSend {
	if f.arrHead == len(f.arr) {
		if h := s.horizon(f); f.att < h {
			s.runAhead(fi, f, h, maxTrain)
		}
		if f.arrHead == len(f.arr) {
			return nil
		}
	}
	return &f.arr[f.arrHead]
}

// rekey records flow fi's key: its next packet's arrival, or, with none
// in flight, the earliest its next attempt's packet could arrive. Keys
// never go down: a flow's packets arrive in order, and its attempts only
// move on.
func (s *state) rekey(fi int, f *flow) {
	k := f.att + s.txDelay
	if f.arrHead < len(f.arr) {
		k = f.arr[f.arrHead].At + s.txDelay
	}
	if old := s.keys[fi]; k != old && (old == s.minKey || k < s.minKey) {
		s.minValid = false
	}
	s.keys[fi] = k
}

// least finds the least key and the flows that have it, unless known: it
// stays known until one of those flows' keys moves (rekey).
func (s *state) least() {
	if s.minValid {
		return
	}
	k := time.Duration(math.MaxInt64)
	for _, x := range s.keys {
		k = min(k, x)
	}
	s.cands = s.cands[:0]
	for fi, x := range s.keys {
		if x == k {
			s.cands = append(s.cands, fi)
		}
	}
	s.minKey, s.minValid = k, true
}

// fastArrivals hands the port the arrivals that come before the next
// event. With room in the buffer it takes the earliest one and reports
// true: the caller looks again, since that arrival's departure may now come
// first. With the buffer full, before a departure (or the end), it counts
// every flow's arrivals before it as drops and reports false.
func (s *state) fastArrivals() bool {
	at, born := s.cfg.Duration+1, time.Duration(math.MinInt64)
	isDepart := true
	if e := s.peek(); e != nil && e.at <= s.cfg.Duration {
		at, born, isDepart = e.at, e.born, e.kind == evDepart
	}
	if s.q.Bytes()+s.pkt > s.cfg.Queue.Buffer {
		if isDepart {
			s.dropBefore(at, born)
		}
		return false
	}
	for {
		// The least key: the earliest arrival, or the earliest one that
		// a flow not yet run far enough could make.
		s.least()
		k := s.minKey
		if k > at {
			return false
		}
		var best *cc.TrainSend
		bi, grew := -1, false
		for _, fi := range s.cands {
			f := s.flows[fi]
			if f.arrHead == len(f.arr) {
				// Nothing in flight: nothing happens before k, so the
				// flow may run ahead from k on (see horizon).
				s.clock = max(s.clock, k-s.txDelay)
				s.head(fi, f)
				grew = true
				continue
			}
			// All arrive at k: by when they were sent, then when their
			// sends were scheduled, then by flow.
			if a := &f.arr[f.arrHead]; best == nil || a.At < best.At || a.At == best.At && a.After < best.After {
				best, bi = a, fi
			}
		}
		if grew {
			for _, fi := range s.cands {
				s.rekey(fi, s.flows[fi])
			}
			continue
		}
		if !precedes(k, best.At, at, born) {
			return false
		}
		f := s.flows[bi]
		f.arrHead++
		s.rekey(bi, f)
		s.clock = k
		departAt, queued, ce := s.q.Arrive(s.epoch.Add(k), s.pkt, s.cfg.DCQCN)
		id := s.arrivals
		s.arrivals++
		if s.trace != nil {
			s.trace(arrival{ID: id, T: k, Flow: bi, Size: s.pkt, Queued: queued, CE: ce, Depart: departAt.Sub(s.epoch)})
		}
		if queued {
			t := departAt.Sub(s.epoch)
			s.push(event{at: t, kind: evDepart, flow: int32(bi), size: int32(s.pkt), ce: ce, gen: id})
			f.departDue.push(t)
			s.lastDepart = max(s.lastDepart, t)
		}
		return true
	}
}

// dropBefore counts every flow's arrivals before a departure at (at,
// born) as drops: the buffer is full until then.
func (s *state) dropBefore(at, born time.Duration) {
	// Nothing is admitted before the departure, so nothing is made before
	// it: the flows may run ahead to one Delay past it.
	s.clock = max(s.clock, at)
	for fi, k := range s.keys {
		if k > at {
			continue
		}
		f := s.flows[fi]
		for {
			for f.arrHead < len(f.arr) {
				a := &f.arr[f.arrHead]
				if !precedes(a.At+s.txDelay, a.At, at, born) {
					break
				}
				f.arrHead++
				s.q.Dropped++
				s.arrivals++
				if s.trace != nil {
					s.trace(arrival{ID: s.arrivals - 1, T: a.At + s.txDelay, Flow: fi, Size: s.pkt})
				}
			}
			if f.arrHead < len(f.arr) || s.head(fi, f) == nil {
				break
			}
		}
		s.rekey(fi, f)
	}
}
