// Package transport moves RoCEv2 packets between queue pairs: over UDP
// port 4791 (recvmmsg/sendmmsg on Linux, net.UDPConn elsewhere), or over
// an in-memory network with impairments for deterministic tests. An
// Endpoint drives the sans-IO queue pairs of package qp: it owns the Conn,
// the clock and the timers. Fault injection (WithFaults) and packet
// observation and capture (WithObserver) are Conns wrapping a Conn.
package transport

import (
	"errors"
	"net/netip"
)

// Datagram is one UDP datagram carrying a RoCEv2 packet (BTH to ICRC).
type Datagram struct {
	Data []byte
	// Src and Dst are the remote and local ends of a received datagram,
	// or the local and remote ends of one to send.
	Src, Dst netip.AddrPort
	// TOS is the IPv4 TOS / IPv6 traffic class byte: on receive, as it
	// arrived (its low two bits are the ECN codepoint) when the Conn can
	// read it; on send, the value to put on the packet.
	TOS uint8
	// TOSKnown says TOS was read from the received packet.
	TOSKnown bool
	// TTL is the IPv4 TTL or IPv6 hop limit to send with (0: the Conn's default).
	TTL uint8

	// zeroChecksum marks a datagram on the in-memory network that left
	// with UDP checksum 0 (ListenOptions).
	zeroChecksum bool
}

// Conn is a batch-first datagram connection on one local address.
// ReadBatch blocks until at least one datagram arrives and fills as many of
// ds as are ready, writing into each ds[i].Data's capacity (a slot with no
// room for the datagram gets a new buffer; UDP hands on empty a datagram
// larger than a slot that has some); WriteBatch sends ds in order and
// returns how many it sent. Both return net.ErrClosed after Close. With
// buffers large enough, the Conns of this package allocate nothing per
// datagram. A Conn that wraps another has a method Unwrap() Conn
// returning it.
type Conn interface {
	ReadBatch(ds []Datagram) (int, error)
	WriteBatch(ds []Datagram) (int, error)
	// LocalAddr is the address and port the Conn receives on.
	LocalAddr() netip.AddrPort
	// SourcePort makes the Conn able to send from UDP source port want
	// and returns the port it will actually use: a kernel socket may find
	// want taken, and then falls back to its receive port. The ICRC covers
	// the source port, so packets must be encoded with the returned one.
	SourcePort(want uint16) uint16
	Close() error
}

// ErrTooBig is returned for a datagram larger than the Conn can carry.
var ErrTooBig = errors.New("transport: datagram too large")

// innermost returns the Conn that c wraps, through every decorator (a Conn
// with an Unwrap method), or c itself.
func innermost(c Conn) Conn {
	for {
		u, ok := c.(interface{ Unwrap() Conn })
		if !ok {
			return c
		}
		c = u.Unwrap()
	}
}
