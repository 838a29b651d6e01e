package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// SwitchConfig describes a userspace switch between RoCEv2 peers on real
// sockets, for hosts whose kernel has no red or netem qdisc.
//
// The switch has one UDP port per sender (Ports, 0 for any free port) on
// Addr, and one egress towards Egress (the receiver). Sender i uses
// Addr:Ports[i] as its peer's address, and the receiver's QP for that
// sender uses the same Addr:Ports[i]. Datagrams sender i sends to its port
// go through the egress port (cc.Port: line rate, WRED-ECN, tail drop or PFC hold)
// to the receiver, sent from that port; what the receiver sends to the port
// goes straight back to Senders[i], the address sender i receives at (its
// packets come from per-QP source ports, so the switch cannot learn it).
//
// Receivers, when set, gives each port a receiver of its own (one per
// port, in place of Egress): several receiving processes on one host, each
// with its own UDP port, behind one egress queue, as an N:1 incast to one
// host's NIC. The queue and its line rate are shared whatever the
// receivers.
//
// Senders and receivers must have different addresses (the switch tells
// directions apart by source address). A UDP socket cannot keep the
// senders' addresses, so datagrams leave with the switch's address and
// port, and the switch rewrites each one's ICRC to match (Linux gives its
// DF datagrams IP ID 0, so the receiver can check it; on other systems the
// UDP Conn sets no DF, and the rewritten ICRC assumes an IP ID the kernel
// does not send). A datagram whose
// ICRC did not verify on arrival is given a wrong one again; senders that
// put other IP IDs on their packets (rxe) cannot be checked, and their
// packets leave with bad ICRCs.
type SwitchConfig struct {
	Addr    netip.Addr
	Ports   []uint16
	Senders []netip.AddrPort // where each sender receives, one per port
	Egress  netip.AddrPort
	// Receivers are where each port's datagrams go (one per port); empty,
	// Egress for every port.
	Receivers []netip.AddrPort
	Queue     cc.QueueConfig
	Seed      uint64
	// MaxHeld bounds the datagrams PFC holds (default 100000); beyond it
	// they are dropped and counted.
	MaxHeld int
}

// SwitchStats are a Switch's counts.
type SwitchStats struct {
	Forwarded  uint64 `json:"forwarded"` // to the receiver
	Returned   uint64 `json:"returned"`  // from the receiver to a sender
	Marked     uint64 `json:"marked"`    // marked CE
	Dropped    uint64 `json:"dropped"`   // tail drops (and PFC hold overflow)
	Pauses     uint64 `json:"pauses"`    // PFC XOFF events
	NotRoCE    uint64 `json:"not_roce"`  // datagrams that did not decode, forwarded unchanged
	BadICRC    uint64 `json:"bad_icrc"`  // arrived with an ICRC that did not verify (assuming IP ID 0), left with a bad one
	QueueBytes int    `json:"queue_bytes"`
	QueueMax   int    `json:"queue_max_bytes"`
}

// Switch forwards between senders and one receiver through a congestion
// point. Close stops it.
type Switch struct {
	cfg   SwitchConfig
	conns []Conn
	port  *cc.Port // the egress port model

	mu       sync.Mutex
	senders  []netip.AddrPort // where each port's sender receives
	fifo     []queued         // in the egress queue, in order
	held     []queued         // PFC: waiting to enter it
	heldDrop uint64           // dropped because PFC held MaxHeld already
	stats    SwitchStats
	wake     chan struct{}
	done     chan struct{}
	wg       sync.WaitGroup
}

type queued struct {
	port     int
	d        Datagram
	size     int       // on the wire
	departAt time.Time // when its last bit leaves the egress
}

// NewSwitch opens the ports and starts forwarding.
func NewSwitch(cfg SwitchConfig) (*Switch, error) {
	if len(cfg.Ports) == 0 || len(cfg.Ports) != len(cfg.Senders) {
		return nil, errors.New("transport: a switch needs one port per sender, and each sender's address")
	}
	switch {
	case len(cfg.Receivers) == 0:
		cfg.Receivers = make([]netip.AddrPort, len(cfg.Ports))
		for i := range cfg.Receivers {
			cfg.Receivers[i] = cfg.Egress
		}
	case len(cfg.Receivers) != len(cfg.Ports):
		return nil, fmt.Errorf("transport: %d receivers for %d ports: give one per port, or Egress for all", len(cfg.Receivers), len(cfg.Ports))
	}
	for _, r := range cfg.Receivers {
		if !r.Addr().IsValid() || r.Port() == 0 {
			return nil, errors.New("transport: the switch's egress needs an address and a port")
		}
		for _, a := range cfg.Senders {
			if !a.Addr().IsValid() || a.Port() == 0 || a.Addr().Unmap().WithZone("") == r.Addr().Unmap().WithZone("") {
				return nil, fmt.Errorf("transport: sender address %s must have a port and differ from the receiver's", a)
			}
		}
	}
	if !cfg.Addr.IsValid() || cfg.Addr.IsUnspecified() {
		// The ICRC covers the IP addresses: the switch must know which
		// address packets arrive at and leave from.
		return nil, fmt.Errorf("transport: the switch's address %v must be a specific address, not a wildcard", cfg.Addr)
	}
	if cfg.MaxHeld == 0 {
		cfg.MaxHeld = 100000
	}
	port, err := cc.NewPort(cfg.Queue, cfg.Seed)
	if err != nil {
		return nil, err
	}
	s := &Switch{cfg: cfg, port: port, senders: cfg.Senders, wake: make(chan struct{}, 1), done: make(chan struct{})}
	for _, p := range cfg.Ports {
		c, err := ListenUDP(netip.AddrPortFrom(cfg.Addr, p), UDPOptions{EphemeralPort: true})
		if err != nil {
			s.closeConns()
			return nil, fmt.Errorf("switch port %d: %w", p, err)
		}
		s.conns = append(s.conns, c)
	}
	for i := range s.conns {
		s.wg.Add(1)
		go s.read(i)
	}
	s.wg.Add(1)
	go s.egress()
	return s, nil
}

func (s *Switch) closeConns() {
	for _, c := range s.conns {
		c.Close()
	}
}

// Close stops the switch and waits for its goroutines.
func (s *Switch) Close() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	close(s.done)
	s.closeConns()
	s.wg.Wait()
	return nil
}

// Stats returns the counters.
func (s *Switch) Stats() SwitchStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Marked, st.Pauses = s.port.Marked, s.port.Pauses
	st.Dropped = s.port.Dropped + s.heldDrop
	st.QueueBytes, st.QueueMax = s.port.Bytes(), s.port.MaxBytes
	return st
}

// Ports returns the addresses senders use.
func (s *Switch) Ports() []netip.AddrPort {
	var out []netip.AddrPort
	for _, c := range s.conns {
		out = append(out, c.LocalAddr())
	}
	return out
}

func (s *Switch) read(i int) {
	defer s.wg.Done()
	c := s.conns[i]
	ds := make([]Datagram, 64)
	for k := range ds {
		ds[k].Data = make([]byte, 0, 16<<10)
	}
	for {
		n, err := c.ReadBatch(ds)
		if err != nil {
			return
		}
		for k := range n {
			d := ds[k]
			d.Data = append([]byte(nil), d.Data...)
			// The receiver answers from its QPs' source ports, not from
			// the egress port: tell directions apart by address.
			// Received sources carry no zone (udpConn strips it), the
			// configured egress may: compare without.
			if d.Src.Addr().Unmap().WithZone("") == s.cfg.Receivers[i].Addr().Unmap().WithZone("") {
				s.back(i, d)
			} else {
				s.forward(i, d)
			}
		}
	}
}

// back sends a datagram from the receiver to the port's sender, unqueued.
func (s *Switch) back(i int, d Datagram) {
	s.mu.Lock()
	to := s.senders[i]
	s.stats.Returned++
	s.mu.Unlock()
	out := Datagram{Data: d.Data, Src: s.conns[i].LocalAddr(), Dst: to, TOS: d.TOS}
	s.fixICRC(&d, &out)
	s.conns[i].WriteBatch([]Datagram{out})
}

// forward puts a sender's datagram into the egress queue.
func (s *Switch) forward(i int, d Datagram) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it := queued{port: i, d: d, size: bth.WireLen(len(d.Data))}
	if s.port.Paused() {
		if len(s.held) >= s.cfg.MaxHeld {
			s.heldDrop++
			return
		}
		s.held = append(s.held, it)
		return
	}
	s.admitLocked(it, time.Now())
}

// admitLocked runs a datagram into the egress port at now; s.mu is held.
func (s *Switch) admitLocked(it queued, now time.Time) {
	departAt, ok, ce := s.port.Arrive(now, it.size, it.d.TOS&3 != 0)
	if !ok {
		return
	}
	if ce {
		it.d.TOS |= 3
	}
	it.departAt = departAt
	s.fifo = append(s.fifo, it)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// egress drains the queue at the line rate.
func (s *Switch) egress() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var batch []queued
	for {
		s.mu.Lock()
		now := time.Now()
		batch = batch[:0]
		// The port timed each datagram's departure when it arrived, from
		// the line's own clock: a late wake-up sends what is due at once
		// and loses no line time.
		for len(s.fifo) > 0 && !s.fifo[0].departAt.After(now) {
			it := s.fifo[0]
			s.fifo = s.fifo[1:]
			if ce, _ := s.port.Depart(it.size, it.d.TOS&3 != 0); ce {
				it.d.TOS |= 3
			}
			batch = append(batch, it)
			for len(s.held) > 0 && !s.port.Paused() {
				h := s.held[0]
				s.held = s.held[1:]
				s.admitLocked(h, now)
			}
		}
		wait := time.Hour
		if len(s.fifo) > 0 {
			wait = s.fifo[0].departAt.Sub(now)
		}
		s.stats.Forwarded += uint64(len(batch))
		s.mu.Unlock()
		for _, it := range batch {
			out := Datagram{Data: it.d.Data, Src: s.conns[it.port].LocalAddr(), Dst: s.cfg.Receivers[it.port], TOS: it.d.TOS}
			s.fixICRC(&it.d, &out)
			s.conns[it.port].WriteBatch([]Datagram{out})
		}
		timer.Reset(max(wait, 0))
		select {
		case <-s.done:
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// fixICRC rewrites the ICRC for the headers the datagram will carry. A
// datagram whose ICRC did not verify on arrival (against its sender's
// headers with IP ID 0, as Linux sends them) leaves with an ICRC that does
// not verify either: the switch must not make a damaged packet whole. in is
// where the datagram came from and to which of the switch's addresses.
func (s *Switch) fixICRC(in, out *Datagram) {
	if len(out.Data) < bth.BTHLen+bth.ICRCLen {
		return
	}
	var p bth.Packet
	if p.Decode(out.Data) != nil {
		s.mu.Lock()
		s.stats.NotRoCE++
		s.mu.Unlock()
		return
	}
	ein := bth.Encap{Src: in.Src.Addr(), Dst: in.Dst.Addr(), SrcPort: in.Src.Port(), DstPort: in.Dst.Port()}
	_, _, verr := ein.VerifyICRC(out.Data)
	e := bth.Encap{Src: out.Src.Addr(), Dst: out.Dst.Addr(), SrcPort: out.Src.Port(), DstPort: out.Dst.Port()}
	end := len(out.Data) - bth.ICRCLen
	crc, err := e.ICRC(out.Data[:end])
	if err != nil {
		return
	}
	if verr != nil {
		crc = ^crc
		s.mu.Lock()
		s.stats.BadICRC++
		s.mu.Unlock()
	}
	binary.LittleEndian.PutUint32(out.Data[end:], crc)
}
