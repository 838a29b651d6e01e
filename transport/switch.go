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
// directions apart by source address). A datagram that comes to sender i's
// port from neither Senders[i]'s address nor its receiver's is dropped and
// counted (SwitchStats.ForeignSource), not forwarded with a rewritten ICRC
// that would pass the receiver's checks. By default the source port is not
// checked: RoCEv2 senders send from a UDP source port per QP, flow entropy
// (rdma_get_udp_sport in Linux, used by rxe and this module's Endpoint),
// not from the port they receive at, so the switch cannot know it, and a
// process on a sender's host can send through that sender's port.
// PinSourcePorts narrows that: each destination QPN's packets must keep
// the source port of the first one.
//
// A UDP socket cannot keep the
// senders' addresses, so datagrams leave with the switch's address and
// port, and the switch rewrites each one's ICRC to match (Linux gives its
// DF datagrams IP ID 0, so the receiver can check it; on other systems the
// UDP Conn sets no DF, and the rewritten ICRC assumes an IP ID the kernel
// does not send). A datagram whose
// ICRC did not verify on arrival is given a wrong one again; senders that
// put other IP IDs on their packets (rxe) cannot be checked, and their
// packets leave with bad ICRCs.
//
// Memory is bounded by the configuration, not by what senders send: the
// egress queue by Queue.Buffer (bytes on the wire, bth.WireLen), the PFC
// hold by HoldBytes (bytes on the wire plus SwitchEntryOverhead per
// datagram), the pins by MaxPinned, and the read buffers by the number of
// ports (each reads up to 16 datagrams of up to 65,535 bytes at a time). Datagrams of any size UDP
// carries are forwarded whole, or dropped and counted as oversize when the
// egress cannot send them (EMSGSIZE: larger than the path MTU, DF set).
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
	// HoldBytes bounds the datagrams PFC holds while the egress is paused,
	// in bytes as the queue counts them (0: DefaultSwitchHoldBytes); a
	// datagram that does not fit is dropped and counted
	// (SwitchStats.HoldDrops).
	HoldBytes int
	// PinSourcePorts: through sender i's port, the packets to each
	// destination QPN must come from the UDP source port the first of
	// them came from (a QP sends from one source port), and datagrams
	// that are not RoCE from Senders[i] itself; others are dropped and
	// counted (SwitchStats.ForeignPort). At most MaxPinned QPNs are
	// pinned per port (0: DefaultSwitchMaxPinned); a packet to one more
	// is dropped and counted the same way. Pins last as long as the
	// switch: a later run whose QPs reuse a QPN from another source port
	// needs a new switch.
	PinSourcePorts bool
	MaxPinned      int
}

// DefaultSwitchMaxPinned is the default number of destination QPNs whose
// source port a Switch pins per sender port.
const DefaultSwitchMaxPinned = 4096

// DefaultSwitchHoldBytes is the default PFC hold of a Switch: 16 MiB,
// about the buffer of a shallow-buffered data-centre switch.
const DefaultSwitchHoldBytes = 16 << 20

// SwitchEntryOverhead is what the switch charges each datagram it queues
// or holds, besides its bytes on the wire: its bookkeeping in memory.
const SwitchEntryOverhead = 128

// switchReadBatch and switchMaxDatagram size a port's read buffers: the
// largest UDP payload (65,527 bytes over IPv6, 65,507 over IPv4) fits.
const (
	switchReadBatch   = 16
	switchMaxDatagram = 65535
)

// SwitchStats are a Switch's counts. Every datagram that came in and was
// not forwarded or returned is in Dropped and in exactly one of its causes.
// In JSON the 64-bit counters are decimal strings, as tshark writes 64-bit
// fields (jq reads numbers as doubles, exact only below 2^53); the queue
// and hold depths, bounded by the configuration, are numbers.
type SwitchStats struct {
	Forwarded uint64 `json:"forwarded,string"` // to the receiver
	Returned  uint64 `json:"returned,string"`  // from the receiver to a sender
	Marked    uint64 `json:"marked,string"`    // marked CE
	Dropped   uint64 `json:"dropped,string"`   // all drops: the sum of the six causes below
	// Drops by cause: the egress buffer was full (tail drop); PFC held
	// HoldBytes already; the datagram came from neither the port's sender
	// nor the receiver, or (PinSourcePorts) from another source port of
	// the sender's address; the egress could not send it for its size
	// (EMSGSIZE); another send error.
	TailDrops     uint64 `json:"tail_drops,string"`
	HoldDrops     uint64 `json:"hold_drops,string"`
	ForeignSource uint64 `json:"foreign_source,string"`
	ForeignPort   uint64 `json:"foreign_port,string"` // with PinSourcePorts: from the sender's address, not from the pinned port (or past MaxPinned)
	Oversize      uint64 `json:"oversize,string"`
	SendErrors    uint64 `json:"send_errors,string"`
	Pauses        uint64 `json:"pauses,string"`   // PFC XOFF events
	NotRoCE       uint64 `json:"not_roce,string"` // datagrams that did not decode (shorter than a BTH and an ICRC included), forwarded unchanged
	BadICRC       uint64 `json:"bad_icrc,string"` // arrived with an ICRC that did not verify (assuming IP ID 0), left with a bad one
	QueueBytes    int    `json:"queue_bytes"`
	QueueMax      int    `json:"queue_max_bytes"`
	// HeldBytes and HeldMax are the PFC hold now and at its deepest, in
	// bytes as HoldBytes counts them.
	HeldBytes int `json:"held_bytes"`
	HeldMax   int `json:"held_max_bytes"`
}

// Switch forwards between senders and one receiver through a congestion
// point. Close stops it.
type Switch struct {
	cfg   SwitchConfig
	conns []Conn
	port  *cc.Port // the egress port model

	mu      sync.Mutex
	senders []netip.AddrPort    // where each port's sender receives
	fifo    []queued            // in the egress queue, in order
	held    []queued            // PFC: waiting to enter it
	heldB   int                 // bytes in held, as HoldBytes counts them
	pins    []map[uint32]uint16 // PinSourcePorts: per port, destination QPN -> source port
	stats   SwitchStats
	wake    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
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
	if cfg.HoldBytes < 0 {
		return nil, fmt.Errorf("transport: the switch's PFC hold %d bytes must not be negative", cfg.HoldBytes)
	}
	if cfg.HoldBytes == 0 {
		cfg.HoldBytes = DefaultSwitchHoldBytes
	}
	if cfg.MaxPinned < 0 {
		return nil, fmt.Errorf("transport: the switch's MaxPinned %d must not be negative", cfg.MaxPinned)
	}
	if cfg.MaxPinned == 0 {
		cfg.MaxPinned = DefaultSwitchMaxPinned
	}
	port, err := cc.NewPort(cfg.Queue, cfg.Seed)
	if err != nil {
		return nil, err
	}
	s := &Switch{cfg: cfg, port: port, senders: cfg.Senders, wake: make(chan struct{}, 1), done: make(chan struct{})}
	if cfg.PinSourcePorts {
		for range cfg.Ports {
			s.pins = append(s.pins, map[uint32]uint16{})
		}
	}
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
	st.TailDrops = s.port.Dropped
	st.Dropped = st.TailDrops + st.HoldDrops + st.ForeignSource + st.ForeignPort + st.Oversize + st.SendErrors
	st.QueueBytes, st.QueueMax = s.port.Bytes(), s.port.MaxBytes
	st.HeldBytes = s.heldB
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
	ds := make([]Datagram, switchReadBatch)
	for k := range ds {
		ds[k].Data = make([]byte, 0, switchMaxDatagram)
	}
	sender := s.senders[i].Addr().Unmap().WithZone("")
	egress := s.cfg.Receivers[i].Addr().Unmap().WithZone("")
	for {
		for k := range ds {
			ds[k].Data = ds[k].Data[:0]
		}
		n, err := c.ReadBatch(ds)
		if err != nil {
			return
		}
		for k := range n {
			// The receiver answers from its QPs' source ports, not from
			// the egress port: tell directions apart by address.
			// Received sources carry no zone (udpConn strips it), the
			// configured ones may: compare without.
			switch src := ds[k].Src.Addr().Unmap().WithZone(""); src {
			case egress:
				s.back(i, ds[k])
			case sender:
				if s.pins != nil && !s.pinned(i, &ds[k]) {
					s.mu.Lock()
					s.stats.ForeignPort++
					s.mu.Unlock()
					continue
				}
				s.forward(i, ds[k])
			default:
				s.mu.Lock()
				s.stats.ForeignSource++
				s.mu.Unlock()
			}
		}
	}
}

// pinned reports whether a datagram from sender i's address comes from
// the source port its destination QPN is pinned to (pinning the QPN to it
// when it is the first, and there is room): RoCE packets by their
// destination QPN, anything else only from Senders[i] itself.
func (s *Switch) pinned(i int, d *Datagram) bool {
	var p bth.Packet
	if len(d.Data) < bth.BTHLen+bth.ICRCLen || p.Decode(d.Data) != nil {
		return d.Src.Port() == s.senders[i].Port()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pins := s.pins[i]
	sport, ok := pins[p.BTH.DestQP]
	if !ok {
		if len(pins) >= s.cfg.MaxPinned {
			return false
		}
		pins[p.BTH.DestQP] = d.Src.Port()
		return true
	}
	return sport == d.Src.Port()
}

// back sends a datagram from the receiver to the port's sender, unqueued,
// from the read buffer.
func (s *Switch) back(i int, d Datagram) {
	s.mu.Lock()
	to := s.senders[i]
	s.mu.Unlock()
	out := Datagram{Data: d.Data, Src: s.conns[i].LocalAddr(), Dst: to, TOS: d.TOS}
	s.fixICRC(&d, &out)
	if s.send(i, out) {
		s.mu.Lock()
		s.stats.Returned++
		s.mu.Unlock()
	}
}

// send writes one datagram from port i and counts a failure by cause.
func (s *Switch) send(i int, out Datagram) bool {
	_, err := s.conns[i].WriteBatch([]Datagram{out})
	if err == nil {
		return true
	}
	s.mu.Lock()
	switch {
	case errors.Is(err, ErrTooBig):
		s.stats.Oversize++
	default:
		s.stats.SendErrors++
	}
	s.mu.Unlock()
	return false
}

// forward puts a sender's datagram into the egress queue, or the PFC hold;
// d.Data is the read buffer, copied only when the datagram is kept.
func (s *Switch) forward(i int, d Datagram) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it := queued{port: i, d: d, size: bth.WireLen(len(d.Data))}
	if s.port.Paused() {
		cost := it.size + SwitchEntryOverhead
		if s.heldB+cost > s.cfg.HoldBytes {
			s.stats.HoldDrops++
			return
		}
		it.d.Data = append([]byte(nil), d.Data...)
		s.held = append(s.held, it)
		s.heldB += cost
		s.stats.HeldMax = max(s.stats.HeldMax, s.heldB)
		return
	}
	s.admitLocked(it, time.Now(), true)
}

// admitLocked runs a datagram into the egress port at now; s.mu is held.
// copyData: it.d.Data is a read buffer, to be copied if queued.
func (s *Switch) admitLocked(it queued, now time.Time, copyData bool) {
	departAt, ok, ce := s.port.Arrive(now, it.size, it.d.TOS&3 != 0)
	if !ok {
		return
	}
	if copyData {
		it.d.Data = append([]byte(nil), it.d.Data...)
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
			s.fifo[0] = queued{} // the array outlives the datagram
			s.fifo = s.fifo[1:]
			if ce, _ := s.port.Depart(it.size, it.d.TOS&3 != 0); ce {
				it.d.TOS |= 3
			}
			batch = append(batch, it)
			for len(s.held) > 0 && !s.port.Paused() {
				h := s.held[0]
				s.held[0] = queued{}
				s.held = s.held[1:]
				s.heldB -= h.size + SwitchEntryOverhead
				s.admitLocked(h, now, false)
			}
		}
		wait := time.Hour
		if len(s.fifo) > 0 {
			wait = s.fifo[0].departAt.Sub(now)
		}
		s.mu.Unlock()
		var sent uint64
		for k, it := range batch {
			out := Datagram{Data: it.d.Data, Src: s.conns[it.port].LocalAddr(), Dst: s.cfg.Receivers[it.port], TOS: it.d.TOS}
			s.fixICRC(&it.d, &out)
			if s.send(it.port, out) {
				sent++
			}
			batch[k] = queued{}
		}
		s.mu.Lock()
		s.stats.Forwarded += sent
		s.mu.Unlock()
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
	var p bth.Packet
	if len(out.Data) < bth.BTHLen+bth.ICRCLen || p.Decode(out.Data) != nil {
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
