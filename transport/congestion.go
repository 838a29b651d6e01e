package transport

import (
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// CongestionPoint is a switch egress queue in front of one address of an
// in-memory Network (package cc's Queue): datagrams to that address leave
// one at a time at the queue's line rate, ECN-capable ones are marked CE
// by WRED, and a full buffer drops them, or with PFC the senders' datagrams
// wait (as if their links were paused) until the queue falls below XON.
type CongestionPoint struct {
	q         *cc.Queue
	rate      cc.Rate
	departAt  time.Time
	held      []Datagram // PFC: waiting to enter the queue
	MaxHeld   int
	Delivered uint64
}

// AddCongestionPoint puts a congestion point in front of dst.
func (n *Network) AddCongestionPoint(dst netip.AddrPort, cfg cc.QueueConfig, seed uint64) (*CongestionPoint, error) {
	q, err := cc.NewQueue(cfg, seed)
	if err != nil {
		return nil, err
	}
	if dst.Port() == 0 {
		dst = netip.AddrPortFrom(dst.Addr(), bth.UDPPort)
	}
	cp := &CongestionPoint{q: q, rate: cfg.LineRate}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cps == nil {
		n.cps = map[netip.AddrPort]*CongestionPoint{}
	}
	n.cps[dst] = cp
	return cp, nil
}

// Queue returns the congestion point's queue state (depth and counters).
// Read it only while the network is quiet, or under synctest.
func (cp *CongestionPoint) Queue() *cc.Queue { return cp.q }

// admitLocked runs one datagram into the queue; n.mu is held.
func (n *Network) admitLocked(cp *CongestionPoint, d Datagram) {
	if cp.q.Paused() {
		cp.held = append(cp.held, d)
		cp.MaxHeld = max(cp.MaxHeld, len(cp.held))
		return
	}
	queued, ce := cp.q.Enqueue(bth.WireLen(len(d.Data)), d.TOS&3 != 0)
	if !queued {
		n.Lost++
		return
	}
	if ce {
		d.TOS |= 3
	}
	now := time.Now()
	start := cp.departAt
	if start.Before(now) {
		start = now
	}
	cp.departAt = start.Add(cp.rate.TxTime(bth.WireLen(len(d.Data))))
	size := bth.WireLen(len(d.Data))
	n.scheduleLocked(d, cp.departAt.Sub(now), func() {
		// Runs with n.mu held, when the datagram leaves the queue.
		cp.q.Dequeue(size)
		cp.Delivered++
		for len(cp.held) > 0 && !cp.q.Paused() {
			h := cp.held[0]
			cp.held = cp.held[1:]
			n.admitLocked(cp, h)
		}
	})
}
