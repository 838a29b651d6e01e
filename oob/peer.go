package oob

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// ErrGIDMismatch is wrapped by GIDMismatchError.
var ErrGIDMismatch = errors.New("oob: the peer's GID is not the address it connected from")

// GIDMismatchError says that the GID a peer announced in an exchange is
// not the address of the connection that carried the exchange. Neither
// rdma-core's pingpong programs nor perftest check this: a peer may
// announce any GID, and this side's RoCE packets (for a READ server, its
// READ responses, about 1,100 bytes out per byte of request) then go to
// that address, possibly a third host. A multi-homed peer (the exchange
// over one interface, RoCE over another, or RoCE over IPv6 with the
// exchange over IPv4) legitimately announces another address; callers
// let it through by not calling CheckGID.
type GIDMismatchError struct {
	GID  netip.Addr // the announced GID (IPv4 for an IPv4-mapped one)
	From netip.Addr // the address the exchange's connection came from (or went to)
	QPN  uint32     // the QP the GID was announced for
}

func (e *GIDMismatchError) Error() string {
	return fmt.Sprintf("oob: the peer at %s announced GID %s for QPN %#x: its RoCE packets would go to another address than the one it connected from",
		e.From, GIDString(e.GID), e.QPN)
}

func (e *GIDMismatchError) Unwrap() error { return ErrGIDMismatch }

// CheckGID returns a *GIDMismatchError unless gid, a GID the peer
// announced for its QP qpn, is from, the address of the peer's end of the
// exchange's connection. IPv4-mapped GIDs compare as their IPv4 address
// and zones are ignored (a GID carries none). When from is a loopback
// address, any loopback GID passes: 127.0.0.1 and 127.0.0.2 are the same
// host, and a client that connects to 127.0.0.1 for a server bound to
// 127.0.0.2 is the usual way to run both on one machine. An invalid from
// (a connection that is not IP, such as net.Pipe) checks nothing.
func CheckGID(gid, from netip.Addr, qpn uint32) error {
	if !from.IsValid() {
		return nil
	}
	g, f := gid.Unmap().WithZone(""), from.Unmap().WithZone("")
	if g == f || (g.IsLoopback() && f.IsLoopback()) {
		return nil
	}
	return &GIDMismatchError{GID: gid.Unmap(), From: f, QPN: qpn}
}

// RemoteIP returns the IP address of conn's remote end, or the zero Addr
// when conn is not a TCP or UDP connection (net.Pipe, say).
func RemoteIP(conn net.Conn) netip.Addr {
	switch a := conn.RemoteAddr().(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// LocalIP returns the IP address of conn's local end, or the zero Addr
// when conn is not a TCP or UDP connection.
func LocalIP(conn net.Conn) netip.Addr {
	switch a := conn.LocalAddr().(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
