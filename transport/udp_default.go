//go:build !linux

package transport

import "net/netip"

// ListenUDP opens a Conn on addr (port 0 means 4791, or any free port with
// UDPOptions.EphemeralPort). On this system it is the portable Conn on
// net.UDPConn: see the BUG note on what it cannot do.
func ListenUDP(addr netip.AddrPort, opts UDPOptions) (Conn, error) {
	return listenStd(addr, opts)
}
