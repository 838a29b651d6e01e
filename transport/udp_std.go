package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// BUG(transport): On systems other than Linux the UDP Conn cannot do what
// the Linux one does with socket options and control messages: received
// datagrams carry no TOS (Datagram.TOSKnown is false, so no ECN and no CE
// marks reach DCQCN); every datagram is sent with the socket's
// UDPOptions.TOS and TTL, not its own Datagram.TOS and TTL; DF is not set,
// so the IP ID is not 0 and peers cannot verify the ICRC assuming it
// (ICRCAssumeID0); the UDP checksum is always computed (SO_NO_CHECK and
// UDP_NO_CHECK6_TX, hence UDPOptions.ComputeUDPChecksum, have no
// counterpart) and IPv6 datagrams with checksum 0, as rxe sends them, are
// dropped by the kernel (no UDP_NO_CHECK6_RX); the kernel may put a flow
// label on IPv6 datagrams (no IPV6_AUTOFLOWLABEL). BatchSize is ignored,
// and so are NoGSO and NoGRO: it has no UDP GSO or GRO (Offloads reports
// none); and BusyPoll: its reads always wait (an Endpoint's
// Options.BusyPoll still spins on its CQs).

// stdConn is the portable Conn on net.UDPConn, ListenUDP on systems other
// than Linux (udp_default.go; wireguard-go's conn/bind_std.go split is the
// model): one socket bound to the receive port and one per extra source
// port, one datagram per system call. It builds everywhere, so that its
// tests run on Linux too.
type stdConn struct {
	local netip.AddrPort
	v6    bool
	opts  UDPOptions

	mu     sync.Mutex
	closed bool                    // guarded by mu: no socket is opened after Close
	extra  map[uint16]*net.UDPConn // by port, the receive socket included
	main   *net.UDPConn

	rmu  sync.Mutex
	wmu  sync.Mutex
	rbuf []byte // every read lands here first (64 KiB: any UDP payload)
}

// listenStd opens a portable Conn on addr, with ListenUDP's defaults.
func listenStd(addr netip.AddrPort, opts UDPOptions) (Conn, error) {
	addr, err := listenAddr(addr, &opts)
	if err != nil {
		return nil, err
	}
	c := &stdConn{local: addr, v6: !addr.Addr().Unmap().Is4(), opts: opts, extra: map[uint16]*net.UDPConn{}}
	s, err := c.open(addr.Port())
	if err != nil {
		return nil, err
	}
	c.main = s
	c.local = netip.AddrPortFrom(addr.Addr(), uint16(s.LocalAddr().(*net.UDPAddr).Port))
	c.extra[c.local.Port()] = s
	return c, nil
}

func (c *stdConn) open(port uint16) (*net.UDPConn, error) {
	network := "udp4"
	if c.v6 {
		network = "udp6"
	}
	uc, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.local.Addr().Unmap(), port)))
	if err != nil {
		return nil, err
	}
	err = errors.Join(uc.SetReadBuffer(c.opts.SocketBuffer), uc.SetWriteBuffer(c.opts.SocketBuffer))
	if c.v6 {
		p := ipv6.NewConn(uc)
		err = errors.Join(err, p.SetTrafficClass(int(c.opts.TOS)), p.SetHopLimit(int(c.opts.TTL)))
	} else {
		p := ipv4.NewConn(uc)
		err = errors.Join(err, p.SetTOS(int(c.opts.TOS)), p.SetTTL(int(c.opts.TTL)))
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("transport: socket options on %s port %d: %w", c.local.Addr(), port, err)
	}
	return uc, nil
}

func (c *stdConn) LocalAddr() netip.AddrPort { return c.local }

// SourcePort opens (once) a socket bound to want on the local address. If
// the port is taken it falls back to the receive port.
func (c *stdConn) SourcePort(want uint16) uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.extra[want]; ok {
		return want
	}
	if want == 0 || c.closed {
		return c.local.Port()
	}
	s, err := c.open(want)
	if err != nil {
		return c.local.Port()
	}
	c.extra[want] = s
	return want
}

func (c *stdConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var err error
	for p, s := range c.extra {
		if e := s.Close(); e != nil && err == nil && p == c.local.Port() {
			err = e
		}
	}
	return err
}

// ReadBatch reads one datagram into ds[0].Data's capacity (a slot with no
// capacity gets a copy from a buffer of the Conn's own).
func (c *stdConn) ReadBatch(ds []Datagram) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	d := &ds[0]
	// Every datagram is read whole into a buffer larger than any UDP
	// payload: a read into a smaller slot would cut it silently here
	// (and fail with WSAEMSGSIZE on Windows). One that does not fit the
	// slot is handed on empty, to be counted as malformed, as the Linux
	// Conn does with MSG_TRUNC.
	if c.rbuf == nil {
		c.rbuf = make([]byte, 1<<16)
	}
	n, src, err := c.main.ReadFromUDPAddrPort(c.rbuf)
	if err != nil {
		return 0, err
	}
	switch {
	case cap(d.Data) == 0:
		d.Data = append(d.Data[:0], c.rbuf[:n]...)
	case n > cap(d.Data):
		d.Data = d.Data[:0]
	default:
		d.Data = append(d.Data[:0], c.rbuf[:n]...)
	}
	// A GID has no zone, and the QP's remote address came from a GID:
	// link-local sources are compared without theirs.
	d.Src = netip.AddrPortFrom(src.Addr().Unmap().WithZone(""), src.Port())
	d.Dst = c.local
	d.TOS, d.TOSKnown, d.TTL = 0, false, 0
	return 1, nil
}

// WriteBatch sends each datagram from the socket of its source port (the
// receive socket when there is none), one system call each.
func (c *stdConn) WriteBatch(ds []Datagram) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i := range ds {
		c.mu.Lock()
		s := c.extra[ds[i].Src.Port()]
		c.mu.Unlock()
		if s == nil {
			s = c.main
		}
		dst := withZone(c.local.Addr(), ds[i].Dst)
		if !c.v6 {
			dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
		}
		if _, err := s.WriteToUDPAddrPort(ds[i].Data, dst); err != nil {
			return i, err
		}
	}
	return len(ds), nil
}
