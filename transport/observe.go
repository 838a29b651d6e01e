package transport

import (
	"net/netip"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// Event is one datagram crossing a Conn, as an Observer sees it. It and
// what it points to are valid only during the call: copy what is kept.
type Event struct {
	Dir  Direction // Out (written) or In (read)
	Time time.Time // when it crossed, from the decorator's Clock
	// Datagram is the datagram: bytes (BTH to ICRC), addresses, TOS.
	Datagram *Datagram
	// Packet is Datagram.Data decoded, or nil when it is not a RoCEv2
	// packet (bth.Packet.Decode failed).
	Packet *bth.Packet
}

// Observer is called for every datagram that crosses a Conn wrapped by
// WithObserver, one at a time and in the order of their times.
type Observer func(e *Event)

// WithObserver returns a Conn that calls obs for every datagram read from
// or written to c, each with its own time read from clock (nil means
// SystemClock) as it crosses: a datagram read when ReadBatch returns it, a
// datagram written when WriteBatch has handed it to c. gVisor's
// link/sniffer is the model. Calls are serialised, and a batch written is
// observed before anything read after it, so that the times of an
// exchange keep its order; obs must not call the Conn. Datagrams c
// refuses to write are not observed.
//
// CaptureObserver turns an Observer into a capture file writer.
func WithObserver(c Conn, clock Clock, obs Observer) Conn {
	return &observeConn{inner: c, clock: clockOr(clock), obs: obs}
}

type observeConn struct {
	inner Conn
	clock Clock
	obs   Observer

	mu  sync.Mutex
	ev  Event
	pkt bth.Packet
}

func (c *observeConn) LocalAddr() netip.AddrPort     { return c.inner.LocalAddr() }
func (c *observeConn) SourcePort(want uint16) uint16 { return c.inner.SourcePort(want) }
func (c *observeConn) Close() error                  { return c.inner.Close() }
func (c *observeConn) Unwrap() Conn                  { return c.inner }

func (c *observeConn) ReadBatch(ds []Datagram) (int, error) {
	n, err := c.inner.ReadBatch(ds)
	if n > 0 {
		c.mu.Lock()
		c.observeLocked(In, ds[:n])
		c.mu.Unlock()
	}
	return n, err
}

func (c *observeConn) WriteBatch(ds []Datagram) (int, error) {
	// The lock is held across the write, so that a reply read meanwhile
	// is observed after the datagrams that caused it.
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.inner.WriteBatch(ds)
	c.observeLocked(Out, ds[:n])
	return n, err
}

func (c *observeConn) observeLocked(dir Direction, ds []Datagram) {
	for i := range ds {
		c.ev = Event{Dir: dir, Time: c.clock.Now(), Datagram: &ds[i]}
		if c.pkt.Decode(ds[i].Data) == nil {
			c.ev.Packet = &c.pkt
		}
		c.obs(&c.ev)
	}
	c.ev = Event{}
}

// PacketWriter records datagrams as frames on the wire; *pcap.Writer
// satisfies it.
type PacketWriter interface {
	// WriteDatagram records a UDP payload carried in the headers e
	// describes, seen at ts.
	WriteDatagram(ts time.Time, e *bth.Encap, udpPayload []byte) error
}

// CaptureObserver returns an Observer that writes every datagram to w,
// with each its own time, as the Ethernet frame carrying it: IP and UDP
// headers from the datagram's addresses, TOS and TTL (0 for a read
// datagram, whose TTL the Conn does not report), localMAC and remoteMAC
// as the Ethernet addresses. Errors of w are left in w (pcap.Writer keeps
// the first and returns it from Close).
func CaptureObserver(w PacketWriter, localMAC, remoteMAC [6]byte) Observer {
	return func(e *Event) {
		d := e.Datagram
		src, dst := d.Src.Addr(), d.Dst.Addr()
		if src.Unmap().Is4() && dst.Unmap().Is4() {
			src, dst = src.Unmap(), dst.Unmap()
		}
		enc := bth.Encap{Src: src, Dst: dst, SrcPort: d.Src.Port(), DstPort: d.Dst.Port(),
			TrafficClass: d.TOS, HopLimit: d.TTL, SrcMAC: localMAC, DstMAC: remoteMAC}
		if e.Dir == In {
			enc.SrcMAC, enc.DstMAC = remoteMAC, localMAC
		}
		w.WriteDatagram(e.Time, &enc, d.Data)
	}
}
