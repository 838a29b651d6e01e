package qp

import (
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// congestion is a QP's DCQCN state (package cc): the sender (reaction
// point and pacer) of what it sends, and the notification point of what it
// receives.
type congestion struct {
	snd       *cc.Sender
	np        *cc.NotificationPoint
	paceUntil time.Time // the pacer holds the next packet until then
	cnpDue    bool      // a CNP waits to be sent
}

// newCongestion sets up DCQCN from p, or, when alg is not nil, that
// algorithm as the sender side with p's notification point and line rate.
// np, when not nil, is the port's notification point the QP shares
// (per-port CNP pacing); otherwise the QP gets its own.
func newCongestion(p *cc.Params, alg cc.Algorithm, np *cc.NotificationPoint) (*congestion, error) {
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
	if np == nil {
		np = cc.NewNotificationPoint(p.MinTimeBetweenCNPs, p.CNPAtWindowEnd)
	}
	return &congestion{snd: snd, np: np}, nil
}

// CCState returns the QP's current rate and, for DCQCN, alpha; ok is
// false when the QP has no congestion control.
func (q *QP) CCState() (rate cc.Rate, alpha float64, ok bool) {
	if q.cc == nil {
		return 0, 0, false
	}
	if a, is := q.cc.snd.Algorithm().(interface{ Alpha() float64 }); is {
		alpha = a.Alpha()
	}
	return q.cc.snd.Rate(), alpha, true
}

// CCLowestRate returns the lowest rate DCQCN has cut this QP to (the line
// rate when it never cut; 0 without congestion control).
func (q *QP) CCLowestRate() cc.Rate {
	if q.cc == nil {
		return 0
	}
	if l, is := q.cc.snd.Algorithm().(interface{ Lowest() cc.Rate }); is {
		return l.Lowest()
	}
	return q.cc.snd.Rate()
}

// notify is the notification point: a CE-marked packet this QP receives
// as the target of the data (requests at the responder, READ responses at
// the requester) makes a CNP to the sending QP, at most one per interval
// (per QP, or per port when the device's QPs share the notification
// point); with CNPAtWindowEnd the marks inside an interval make one CNP at
// its end (HandleTimeout).
func (q *QP) notify(now time.Time, ecn bth.ECN) {
	if ecn != bth.CE {
		return
	}
	q.Counters.NPECNMarked++
	// A UD QP has no one peer to notify: it counts the marks only.
	if q.cc != nil && !q.ud && q.cc.np.OnMarked(now) {
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

// pace asks the pacer whether a packet of n payload bytes may leave now.
func (q *QP) pace(now time.Time, n int) bool {
	c := q.cc
	if c == nil {
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

// ccDeadline is the earliest of the reaction point's timers and the pacer.
func (q *QP) ccDeadline() time.Time {
	if q.cc == nil {
		return time.Time{}
	}
	return earliest(earliest(q.cc.snd.Deadline(), q.cc.paceUntil), q.cc.np.Deadline())
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
