package transport

import (
	"context"
	"errors"
	"os"
	"time"
)

// Direct reads: the socket read by the goroutine that waits.
//
// The read loop reads the Conn and wakes the goroutines in CQ.Wait whose
// CQs got completions. In a ping-pong that is two wake-ups per message:
// the network poller wakes the read loop, and the read loop wakes the
// waiter (with more than one Go processor, often by waking another
// thread). When the read loop has just woken a waiter, and no other
// goroutine is left parked in Wait, it lends the socket to CQ.Wait
// instead of reading on: the next goroutine that finds its CQ empty
// reads the Conn itself, handles the batch as the read loop would (for
// every QP and CQ of the Endpoint) and returns what its CQ got, woken by
// the network poller alone. The read loop takes the socket back:
//
//   - when a goroutine leaves Wait while others are parked in it, so
//     that none of them waits on a socket nobody reads;
//   - when no goroutine has read it for Options.ReplyHold (the
//     application went away to do something else; the Endpoint's timer,
//     which Go may fire a millisecond late in an idle process);
//   - when a read from Wait fails, and at Close.
//
// Only one goroutine reads at a time, with the read loop's batch
// (ep.rxds), so that nothing changes for the QPs: every batch is handled
// whole under ep.mu, in the order read. A goroutine reading in Wait
// whose ctx ends is woken by a read deadline in the past (the Conn's
// kick), set from a context.AfterFunc registered once per ctx.Done
// channel; so is one whose CQ got completions another goroutine's call
// or the timer produced (signalLocked). Direct reads need a Conn that can be kicked (the Linux UDP
// Conn with nothing around it), Options.ReplyHold above zero, and no QP
// with a local ACK timeout under minHoldTimeout (a lent socket may go
// unread for ReplyHold plus the timer's lateness).

// kickConn is a Conn whose blocked read can be woken (directReader).
type kickConn interface {
	// kick makes the read in progress, or the next, fail with
	// os.ErrDeadlineExceeded; unkick undoes it.
	kick()
	unkick()
}

// lendableLocked says whether the read loop may lend the socket now.
func (ep *Endpoint) lendableLocked() bool {
	return ep.kicker != nil && ep.opts.ReplyHold > 0 && ep.shortQPs == 0 && !ep.closed && !ep.closing
}

// lendLocked lends the socket to CQ.Wait until ReplyHold from now, if no
// goroutine takes it first.
func (ep *Endpoint) lendLocked(now time.Time) {
	ep.lent, ep.lentDue = true, now.Add(ep.opts.ReplyHold)
	ep.lends++
	ep.armLocked()
}

// unlendLocked gives the socket back to the read loop. No goroutine may
// be reading it (ep.inline), since they share the batch.
func (ep *Endpoint) unlendLocked() {
	if !ep.lent || ep.inline {
		return
	}
	ep.lent = false
	select {
	case ep.loopWake <- struct{}{}:
	default:
	}
}

// leftWaitLocked runs when a goroutine leaves CQ.Wait (its channel off
// the waiters): the lent socket stays lent until ReplyHold after its
// last read (or the lend), unless other goroutines are parked in Wait,
// which the read loop then serves.
func (ep *Endpoint) leftWaitLocked() {
	if !ep.lent || ep.inline {
		return
	}
	if ep.closed || ep.closing {
		ep.unlendLocked() // the read loop reads, finds the Conn closed and ends
		return
	}
	for _, c := range ep.waiting {
		if len(c.waiters) > 0 {
			ep.unlendLocked()
			return
		}
	}
	// The lease runs from the last read (readDirectLocked) or the lend,
	// whose armLocked armed the timer for it already.
}

// readDirectLocked reads one batch from the lent socket and handles it,
// from CQ.Wait (ep.mu held, released while reading). It returns ctx's
// error if ctx ended while it read, and ErrClosed once the Endpoint is
// closed; the caller polls its CQ either way.
func (ep *Endpoint) readDirectLocked(ctx context.Context, c *CQ) {
	ep.inline, ep.inlineCQ = true, c
	ep.inlineDone = ctx.Done()
	if done := ep.inlineDone; done != nil && done != ep.kickDone {
		if ep.kickStop != nil {
			ep.kickStop()
		}
		ep.kickDone, ep.kickStop = done, context.AfterFunc(ctx, func() { ep.kickReader(done) })
	}
	ds := ep.rxds
	ep.mu.Unlock()
	n, err := ep.read(ds)
	ep.mu.Lock()
	ep.inline, ep.inlineCQ, ep.inlineDone = false, nil, nil
	// A kick was for this read: undone before the batch's handling
	// releases ep.mu (to write), when another reader may read.
	ep.unkickLocked()
	switch {
	case err == nil:
		ep.stats.DirectBatches++
		now := ep.clock.Now()
		// The lease restarts: ReplyHold for a goroutine to read again.
		ep.lentDue = now.Add(ep.opts.ReplyHold)
		ep.handleBatchLocked(now, ds[:n])
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Kicked: the caller looks at its CQ and ctx again. It read
		// until now, so the lease restarts, and is armed again: a fire
		// while it read left it out, and the caller may not come back.
		ep.lentDue = ep.clock.Now().Add(ep.opts.ReplyHold)
		ep.armLocked()
	default:
		// Closed, or a failure: the read loop reads again, and logs
		// and stops on the same error.
		ep.unlendLocked()
		return
	}
	if ep.closed || ep.closing {
		ep.unlendLocked()
	}
}

// kickReader wakes the goroutine reading in CQ.Wait, if its ctx is the
// one whose Done channel is done (a context.AfterFunc): a ctx of another
// Wait that ended (a context.WithTimeout per call, cancelled after it)
// wakes nobody.
func (ep *Endpoint) kickReader(done <-chan struct{}) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.inlineDone == done {
		ep.kickLocked()
	}
}

// kickLocked wakes the goroutine reading in CQ.Wait, if any: its ctx
// ended, or its CQ got completions from elsewhere than its read (a send
// completed on a post from another goroutine, a timeout, a Modify).
func (ep *Endpoint) kickLocked() {
	if ep.inline && !ep.kicked {
		ep.kicked = true
		ep.kicker.kick()
	}
}

// unkickLocked undoes a kick once its reader has returned, so that the
// next read (the read loop's, or another Wait's) blocks again.
func (ep *Endpoint) unkickLocked() {
	if ep.kicked {
		ep.kicked = false
		ep.kicker.unkick()
	}
}
