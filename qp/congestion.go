package qp

import (
	"fmt"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// congestion is a QP's DCQCN state (package cc): the sender (reaction
// point and pacer) of what it sends, and the notification point of what it
// receives. Either may be nil: a QP with InitAttr.NP has the notification
// point alone, one with InitAttr.RPOnly the sender alone.
type congestion struct {
	snd       *cc.Sender            // nil: no reaction point, nothing paced
	np        *cc.NotificationPoint // nil: CE marks are counted, no CNP answers them
	paceUntil time.Time             // the pacer holds the next packet until then
	cnpDue    bool                  // a CNP waits to be sent
}

// newCongestion sets up DCQCN from p, or, when alg is not nil, that
// algorithm as the sender side with p's notification point and line rate.
// np, when not nil, is the port's notification point the QP shares
// (per-port CNP pacing); otherwise the QP gets its own, unless noNP.
func newCongestion(p *cc.Params, alg cc.Algorithm, np *cc.NotificationPoint, noNP bool) (*congestion, error) {
	if alg == nil {
		rp, err := cc.NewReactionPoint(*p)
		if err != nil {
			return nil, err
		}
		alg = rp
	}
	snd, err := cc.NewSender(alg, 2*(4096+bth.PacketOverhead))
	if err != nil {
		return nil, err
	}
	c := &congestion{snd: snd}
	if !noNP {
		c.np = notificationPoint(p, np)
	}
	return c, nil
}

// notificationPoint returns shared, the port's notification point, when
// it is not nil, or a notification point of the QP's own from p.
func notificationPoint(p *cc.Params, shared *cc.NotificationPoint) *cc.NotificationPoint {
	if shared != nil {
		return shared
	}
	return cc.NewNotificationPoint(p.MinTimeBetweenCNPs, p.CNPAtWindowEnd)
}

// newNotificationOnly sets up the notification point alone, from p's CNP
// rules (InitAttr.NP): shared, when not nil, is the port's.
func newNotificationOnly(p *cc.Params, shared *cc.NotificationPoint) (*congestion, error) {
	if p.MinTimeBetweenCNPs < 0 {
		return nil, fmt.Errorf("the CNP interval %v is negative", p.MinTimeBetweenCNPs)
	}
	if p.CNPAtWindowEnd && p.CNPPerPort {
		return nil, fmt.Errorf("a CNP at the window's end needs per-QP pacing (cnp_per_port off)")
	}
	return &congestion{np: notificationPoint(p, shared)}, nil
}

// CCState returns the QP's current rate and, for DCQCN, alpha; ok is
// false when the QP has no reaction point (no congestion control, or the
// notification point alone).
func (q *QP) CCState() (rate cc.Rate, alpha float64, ok bool) {
	if q.cc == nil || q.cc.snd == nil {
		return 0, 0, false
	}
	if a, is := q.cc.snd.Algorithm().(interface{ Alpha() float64 }); is {
		alpha = a.Alpha()
	}
	return q.cc.snd.Rate(), alpha, true
}

// CCLowestRate returns the lowest rate DCQCN has cut this QP to (the line
// rate when it never cut; 0 without a reaction point).
func (q *QP) CCLowestRate() cc.Rate {
	if q.cc == nil || q.cc.snd == nil {
		return 0
	}
	if l, is := q.cc.snd.Algorithm().(interface{ Lowest() cc.Rate }); is {
		return l.Lowest()
	}
	return q.cc.snd.Rate()
}

// CCCuts returns the rate cuts DCQCN's reaction point made on this QP
// (cc.ReactionPoint.Cuts) and the CNPs it handled that made no cut of
// their own, having found one pending on the rate_reduce_monitor_period
// tick (cc.ReactionPoint.CNPCoalesced). A handled CNP (rp_cnp_handled) is
// one or the other, or the cut still pending. Both are zero without a
// reaction point or with another algorithm (InitAttr.CCAlgorithm).
func (q *QP) CCCuts() (cuts, coalesced uint64) {
	if q.cc == nil || q.cc.snd == nil {
		return 0, 0
	}
	if rp, is := q.cc.snd.Algorithm().(*cc.ReactionPoint); is {
		return rp.Cuts, rp.CNPCoalesced
	}
	return 0, 0
}

// notify is the notification point: a CE-marked packet this QP receives
// as the target of the data (requests at the responder, READ responses at
// the requester) makes a CNP to the sending QP, at most one per interval
// (per QP, or per port when the device's QPs share the notification
// point); with CNPAtWindowEnd the marks inside an interval make one CNP at
// its end (HandleTimeout). Without a notification point the marks are
// counted and answered with nothing.
func (q *QP) notify(now time.Time, ecn bth.ECN) {
	if ecn != bth.CE {
		return
	}
	q.Counters.NPECNMarked++
	// A UD QP has no one peer to notify: it counts the marks only.
	if q.cc != nil && q.cc.np != nil && !q.ud && q.cc.np.OnMarked(now) {
		q.cc.cnpDue = true
	}
}

// nextCNP hands out a pending CNP (Annex A17.9.3: BECN set, DestQP the
// QP whose data was marked, PSN 0, 16 reserved bytes).
func (q *QP) nextCNP(out *bth.Packet) bool {
	if q.cc == nil || !q.cc.cnpDue {
		return false
	}
	q.cc.cnpDue = false
	q.Counters.NPCNPSent++
	*out = bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: q.attr.DestQPN}}
	return true
}

// CNPPending reports whether the QP's notification point owes a CNP: one
// due now (handed out by the next NextPacket), or one deferred to the end
// of its interval (CNPAtWindowEnd; HandleTimeout makes it due). A side
// that reports counters after a run waits for false first, so that the
// CNPs it counts as sent have all left.
func (q *QP) CNPPending() bool {
	c := q.cc
	return c != nil && (c.cnpDue || (c.np != nil && !c.np.Deadline().IsZero()))
}

// pace asks the pacer whether a packet of n payload bytes may leave now.
func (q *QP) pace(now time.Time, n int) bool {
	c := q.cc
	if c == nil || c.snd == nil {
		return true
	}
	size := n + bth.PacketOverhead
	if wait := c.snd.TimeUntilSend(now, size); wait > 0 {
		c.paceUntil = now.Add(wait)
		return false
	}
	c.paceUntil = time.Time{}
	c.snd.OnPacketSent(now, size)
	return true
}

// ccDeadline is the earliest of the reaction point's timers, the pacer and
// the notification point's window end.
func (q *QP) ccDeadline() time.Time {
	c := q.cc
	if c == nil {
		return time.Time{}
	}
	var d time.Time
	if c.snd != nil {
		d = earliest(c.snd.Deadline(), c.paceUntil)
	}
	if c.np != nil {
		d = earliest(d, c.np.Deadline())
	}
	return d
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
