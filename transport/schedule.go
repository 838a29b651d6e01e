package transport

import (
	"container/heap"
	"time"
)

// The Endpoint's schedule of its QPs, so that its work grows with the QPs
// that have something to do, not with the QPs it has:
//
//   - deadlines: a min-heap (container/heap) of the QPs whose
//     qp.QP.Deadline is set, earliest first; the Endpoint's one timer is
//     armed for its root. A QP's entry is refreshed after each event that
//     may have moved its deadline (a packet received, a post, a Modify, a
//     timeout, a packet handed out), so arming costs O(log n) per QP
//     touched, not a scan of every QP. The heap is lazy: an entry moves
//     only when its QP's deadline comes earlier than it. A deadline that
//     moves later or goes away (an ACK timer restarted by each post,
//     stopped by each ACK) leaves the entry where it is; the timer pops
//     it then, finds the QP's deadline later or unset, and puts it back at
//     the new one or leaves it out. So the invariant is: every QP with a
//     deadline d is in the heap at or before d. A stream of posts and ACKs
//     on one QP, or on a thousand, touches the heap about once per local
//     ACK timeout per QP instead of twice per message.
//   - active: the QPs that may have a packet to send, in turn. A QP joins
//     on an event and leaves when NextPacket has nothing for it: a QP
//     produces packets only after an event (its pacer and RNR wait are
//     deadlines), so an idle QP costs nothing per batch.
//   - dirty: the QPs touched since the heap was last refreshed.
//
// Demultiplexing a received packet to its QP is one map lookup by the
// BTH's destination QPN (Endpoint.qps).

// deadlineHeap orders QPs by their deadline (QP.due); QP.heapIdx is each
// one's index, -1 when it is not in the heap.
type deadlineHeap []*QP

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *deadlineHeap) Push(x any) {
	w := x.(*QP)
	w.heapIdx = len(*h)
	*h = append(*h, w)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	n := len(old) - 1
	w := old[n]
	old[n] = nil
	w.heapIdx = -1
	*h = old[:n]
	return w
}

// setDeadline puts w in the heap at deadline d, or moves it there if d is
// earlier than where it is; a zero or later d leaves it (the lazy heap:
// the timer's pop refreshes it).
func (h *deadlineHeap) setDeadline(w *QP, d time.Time) {
	switch {
	case d.IsZero():
	case w.heapIdx < 0:
		w.due = d
		heap.Push(h, w)
	case d.Before(w.due):
		w.due = d
		heap.Fix(h, w.heapIdx)
	}
}

// touchLocked records that w had an event: it may have packets to send
// and a new deadline (ep.mu held).
func (ep *Endpoint) touchLocked(w *QP) {
	if w.gone {
		return
	}
	if !w.active {
		w.active = true
		ep.active.Push(w)
	}
	ep.dirtyLocked(w)
}

// dirtyLocked marks w's deadline for a refresh in armLocked.
func (ep *Endpoint) dirtyLocked(w *QP) {
	if !w.dirty {
		w.dirty = true
		ep.dirty = append(ep.dirty, w)
	}
}

// armLocked refreshes the deadlines of the QPs touched and sets the timer
// to the earliest QP deadline, or to when held packets must leave
// (Options.ReplyHold), or a lent socket return to the read loop
// (direct.go), if that is earlier.
func (ep *Endpoint) armLocked() {
	for i, w := range ep.dirty {
		ep.dirty[i] = nil
		w.dirty = false
		if w.gone {
			continue
		}
		ep.timers.setDeadline(w, w.q.Deadline())
	}
	ep.dirty = ep.dirty[:0]
	var next time.Time
	if len(ep.timers) > 0 {
		next = ep.timers[0].due
	}
	// near: next is a held ACK's deadline or the lease, ReplyHold from
	// an event that has just happened.
	near := false
	if ep.held && (next.IsZero() || ep.heldDue.Before(next)) {
		next, near = ep.heldDue, true
	}
	if ep.lent && !ep.inline && (next.IsZero() || ep.lentDue.Before(next)) {
		next, near = ep.lentDue, true
	}
	if next.IsZero() {
		return
	}
	if !ep.timerAt.IsZero() && !next.Before(ep.timerAt) {
		// Armed at or before next: a fire then finds nothing due and
		// re-arms. Moved later only to a held ACK's deadline or the
		// lease, when it is armed more than half a ReplyHold before
		// it. A steady exchange renews those every round trip: the
		// timer, left where the first of them put it, would fire for
		// nothing once per ReplyHold, each fire a goroutine, the
		// Endpoint's lock and a re-arm; moved later every few round
		// trips, it does not fire (the runtime may still wake a
		// sleeping thread at the earlier time to move the timer in its
		// heap, but runs nothing of ours then). Not to a QP's deadline,
		// often milliseconds away: where no socket is lent, each
		// round trip would move the timer out to it when the held ACK
		// leaves and back in when the next one is held, two resets per
		// round trip.
		if !near || ep.opts.ReplyHold <= 0 || next.Sub(ep.timerAt) <= ep.opts.ReplyHold/2 {
			return
		}
	}
	ep.timerAt = next
	wait := next.Sub(ep.clock.Now())
	if ep.timer == nil {
		ep.timer = ep.clock.AfterFunc(wait, ep.onTimer)
	} else {
		ep.timer.Reset(wait)
	}
}

// timerSlack: how far ahead of a fire the heap's stale entries are
// refreshed (the lazy heap), so that the entries of QPs that posted
// within a millisecond of each other take one fire, not one each.
const timerSlack = time.Millisecond

// onTimer runs the timeouts of the QPs whose deadline passed.
func (ep *Endpoint) onTimer() {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		return
	}
	now := ep.clock.Now()
	ep.timerAt = time.Time{}
	timedOut := false
	limit := now.Add(timerSlack)
	for len(ep.timers) > 0 {
		w := ep.timers[0]
		if now.Before(w.due) {
			// Not due. A stale entry (its QP's deadline went later or
			// away) due within timerSlack is refreshed with this fire
			// instead of firing the timer for nothing at its time; a
			// real deadline keeps its own fire.
			if limit.Before(w.due) {
				break
			}
			if d := w.q.Deadline(); !d.IsZero() && !w.due.Before(d) {
				break
			}
			heap.Pop(&ep.timers)
			ep.touchLocked(w) // back at its deadline, if any
			continue
		}
		heap.Pop(&ep.timers)
		if d := w.q.Deadline(); !d.IsZero() && !now.Before(d) {
			w.q.HandleTimeout(now)
			timedOut = true
		}
		ep.touchLocked(w) // back in the heap at its next deadline, if any
	}
	if ep.lent && !ep.inline && !now.Before(ep.lentDue) {
		// Lent, and no goroutine came back to Wait to read it.
		ep.unlendLocked()
	}
	if ep.held && !timedOut && now.Before(ep.heldDue) {
		// Armed for an earlier deadline: what is held waits for its
		// reply until its own.
		ep.signalLocked()
		ep.armLocked()
		return
	}
	ep.flushLocked(now)
}

// dropLocked takes a destroyed QP out of the schedule (ep.mu held): out
// of the heap now, out of the active queue and the dirty list when they
// next reach it.
func (ep *Endpoint) dropLocked(w *QP) {
	w.gone = true
	if w.heapIdx >= 0 {
		heap.Remove(&ep.timers, w.heapIdx)
	}
}
