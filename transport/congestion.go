package transport

import (
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// CongestionPoint is a switch egress port in front of one address of an
// in-memory Network, run by package cc's port model (cc.Port): datagrams
// to that address leave one at a time at the port's line rate,
// ECN-capable ones are marked CE by WRED, and a full buffer drops them, or
// with PFC the senders' datagrams wait (as if their links were paused)
// until the queue falls to XON. Sizes are frames on the wire (bth.WireLen).
type CongestionPoint struct {
	port      *cc.Port
	held      []Datagram // PFC: waiting to enter the queue
	MaxHeld   int
	Delivered uint64
}

// AddCongestionPoint puts a congestion point in front of dst.
func (n *Network) AddCongestionPoint(dst netip.AddrPort, cfg cc.QueueConfig, seed uint64) (*CongestionPoint, error) {
	port, err := cc.NewPort(cfg, seed)
	if err != nil {
		return nil, err
	}
	if dst.Port() == 0 {
		dst = netip.AddrPortFrom(dst.Addr(), bth.UDPPort)
	}
	cp := &CongestionPoint{port: port}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cps == nil {
		n.cps = map[netip.AddrPort]*CongestionPoint{}
	}
	n.cps[dst] = cp
	return cp, nil
}

// Queue returns the congestion point's port (depth and counters). Read it
// only while the network is quiet, or under synctest.
func (cp *CongestionPoint) Queue() *cc.Port { return cp.port }

// admitLocked runs one datagram into the port; n.mu is held.
func (n *Network) admitLocked(cp *CongestionPoint, d Datagram) {
	if cp.port.Paused() {
		cp.held = append(cp.held, d)
		cp.MaxHeld = max(cp.MaxHeld, len(cp.held))
		return
	}
	size := bth.WireLen(len(d.Data))
	now := time.Now()
	departAt, queued, ce := cp.port.Arrive(now, size, d.TOS&3 != 0)
	if !queued {
		n.Lost++
		n.pool.put(d.Data)
		return
	}
	if ce {
		d.TOS |= 3
	}
	ect := d.TOS&3 != 0
	n.scheduleLocked(d, departAt.Sub(now), func(d *Datagram) {
		// Runs with n.mu held, when the datagram leaves the port.
		if ce, _ := cp.port.Depart(size, ect); ce {
			d.TOS |= 3
		}
		cp.Delivered++
		for len(cp.held) > 0 && !cp.port.Paused() {
			h := cp.held[0]
			cp.held = cp.held[1:]
			n.admitLocked(cp, h)
		}
	})
}
