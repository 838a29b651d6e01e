//go:build linux

package transport

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// batchConn is what ipv4.PacketConn and ipv6.PacketConn share.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// udpConn is a Conn on kernel UDP sockets: one bound to the receive port
// (4791 by default), and one per extra source port QPs send from. Every
// socket sets DF (IP_PMTUDISC_DO), so that Linux gives its datagrams IP
// ID 0 (ROCEV2.md section 3) and peers can verify our ICRC; each reads the
// TOS of received datagrams (IP_RECVTOS / IPV6_RECVTCLASS).
type udpConn struct {
	local netip.AddrPort
	v6    bool
	opts  UDPOptions
	main  *net.UDPConn
	mainB batchConn

	mu    sync.Mutex
	extra map[uint16]*sender

	rms  []ipv4.Message
	wmu  sync.Mutex // WriteBatch may be called from several goroutines
	wms  []ipv4.Message
	woob [][]byte
}

type sender struct {
	c *net.UDPConn
	b batchConn
}

// ListenUDP opens a Conn on addr (port 0 means 4791). The address must be
// one of this host's (a loopback address such as 127.0.0.2 works on Linux).
func ListenUDP(addr netip.AddrPort, opts UDPOptions) (Conn, error) {
	addr, err := listenAddr(addr, &opts)
	if err != nil {
		return nil, err
	}
	c := &udpConn{local: addr, v6: !addr.Addr().Unmap().Is4(), opts: opts, extra: map[uint16]*sender{}}
	s, err := c.open(addr.Port(), true)
	if err != nil {
		return nil, err
	}
	c.main, c.mainB = s.c, s.b
	c.local = netip.AddrPortFrom(addr.Addr(), uint16(s.c.LocalAddr().(*net.UDPAddr).Port))
	c.extra[c.local.Port()] = s
	c.rms = make([]ipv4.Message, opts.BatchSize)
	for i := range c.rms {
		c.rms[i].Buffers = [][]byte{make([]byte, 16<<10)}
		c.rms[i].OOB = make([]byte, 64)
	}
	return c, nil
}

func (c *udpConn) open(port uint16, recv bool) (*sender, error) {
	network := "udp4"
	if c.v6 {
		network = "udp6"
	}
	ua := net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.local.Addr().Unmap(), port))
	uc, err := net.ListenUDP(network, ua)
	if err != nil {
		return nil, err
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		set := func(level, opt, v int) {
			if e := unix.SetsockoptInt(int(fd), level, opt, v); e != nil && serr == nil {
				serr = fmt.Errorf("setsockopt %d/%d: %w", level, opt, e)
			}
		}
		set(unix.SOL_SOCKET, unix.SO_RCVBUF, c.opts.SocketBuffer)
		set(unix.SOL_SOCKET, unix.SO_SNDBUF, c.opts.SocketBuffer)
		noCheckTX := 1
		if c.opts.ComputeUDPChecksum {
			noCheckTX = 0
		}
		if c.v6 {
			// RoCEv2 peers send checksum 0 over IPv6 (rxe does): accept it.
			set(unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1)
			set(unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, noCheckTX)
			// Flow label 0, as rxe sends (the kernel would otherwise put a
			// flow hash there: net.ipv6.auto_flowlabels). The ICRC masks it.
			set(unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 0)
			set(unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
			set(unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(c.opts.TOS))
			set(unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, int(c.opts.TTL))
			if recv {
				set(unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1)
			}
		} else {
			set(unix.SOL_SOCKET, unix.SO_NO_CHECK, noCheckTX)
			set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			set(unix.IPPROTO_IP, unix.IP_TOS, int(c.opts.TOS))
			set(unix.IPPROTO_IP, unix.IP_TTL, int(c.opts.TTL))
			if recv {
				set(unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
			}
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		uc.Close()
		return nil, err
	}
	var b batchConn
	if c.v6 {
		b = ipv6.NewPacketConn(uc)
	} else {
		b = ipv4.NewPacketConn(uc)
	}
	return &sender{c: uc, b: b}, nil
}

func (c *udpConn) LocalAddr() netip.AddrPort { return c.local }

func (c *udpConn) withZone(dst netip.AddrPort) netip.AddrPort { return withZone(c.local.Addr(), dst) }

// SourcePort opens (once) a socket bound to want on the local address. If
// the port is taken it falls back to the receive port.
func (c *udpConn) SourcePort(want uint16) uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.extra[want]; ok {
		return want
	}
	if want == 0 {
		return c.local.Port()
	}
	s, err := c.open(want, false)
	if err != nil {
		return c.local.Port()
	}
	c.extra[want] = s
	return want
}

func (c *udpConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for p, s := range c.extra {
		if e := s.c.Close(); e != nil && err == nil && p == c.local.Port() {
			err = e
		}
	}
	return err
}

func (c *udpConn) ReadBatch(ds []Datagram) (int, error) {
	ms := c.rms
	if len(ds) < len(ms) {
		ms = ms[:len(ds)]
	}
	for i := range ms {
		ms[i].OOB = ms[i].OOB[:cap(ms[i].OOB)]
	}
	n, err := c.mainB.ReadBatch(ms, 0)
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		m := &ms[i]
		d := &ds[i]
		if m.Flags&unix.MSG_TRUNC != 0 {
			d.Data = d.Data[:0] // too large for the buffer: handed on empty, counted as malformed
		} else {
			d.Data = append(d.Data[:0], m.Buffers[0][:m.N]...)
		}
		if ua, ok := m.Addr.(*net.UDPAddr); ok {
			// A GID has no zone, and the QP's remote address came from a
			// GID: link-local sources are compared without theirs.
			ap := ua.AddrPort()
			d.Src = netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
		}
		d.Dst = c.local
		d.TOS, d.TOSKnown = parseTOS(m.OOB[:m.NN])
	}
	return n, nil
}

// parseTOS finds the IP_TOS or IPV6_TCLASS control message.
func parseTOS(oob []byte) (uint8, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS && len(m.Data) >= 1:
			return m.Data[0], true
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_TCLASS && len(m.Data) >= 4:
			return uint8(binary.NativeEndian.Uint32(m.Data)), true
		}
	}
	return 0, false
}

// cmsgs builds the control messages that set one datagram's TOS / traffic
// class and TTL / hop limit.
func (c *udpConn) cmsgs(b []byte, tos, ttl uint8) []byte {
	level, tosType, ttlType := unix.IPPROTO_IP, unix.IP_TOS, unix.IP_TTL
	if c.v6 {
		level, tosType, ttlType = unix.IPPROTO_IPV6, unix.IPV6_TCLASS, unix.IPV6_HOPLIMIT
	}
	space := unix.CmsgSpace(4)
	if cap(b) < 2*space {
		b = make([]byte, 2*space)
	}
	b = b[:2*space]
	clear(b)
	for i, x := range []struct {
		typ int
		v   uint8
	}{{tosType, tos}, {ttlType, ttl}} {
		m := b[i*space:]
		h := (*unix.Cmsghdr)(unsafePointer(m))
		h.Level = int32(level)
		h.Type = int32(x.typ)
		h.SetLen(unix.CmsgLen(4))
		binary.NativeEndian.PutUint32(m[unix.CmsgLen(0):], uint32(x.v))
	}
	return b
}

func (c *udpConn) WriteBatch(ds []Datagram) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	sent := 0
	for sent < len(ds) {
		// A run of datagrams from the same source port goes in one sendmmsg.
		port := ds[sent].Src.Port()
		end := sent + 1
		for end < len(ds) && ds[end].Src.Port() == port {
			end++
		}
		c.mu.Lock()
		s := c.extra[port]
		if s == nil {
			s = c.extra[c.local.Port()]
		}
		c.mu.Unlock()
		run := ds[sent:end]
		if cap(c.wms) < len(run) {
			c.wms = make([]ipv4.Message, len(run))
			c.woob = make([][]byte, len(run))
		}
		ms := c.wms[:len(run)]
		for i := range run {
			tos, ttl := run[i].TOS, run[i].TTL
			if ttl == 0 {
				ttl = c.opts.TTL
			}
			c.woob[i] = c.cmsgs(c.woob[i], tos, ttl)
			ms[i] = ipv4.Message{Buffers: [][]byte{run[i].Data}, OOB: c.woob[i],
				Addr: net.UDPAddrFromAddrPort(c.withZone(run[i].Dst))}
		}
		for off := 0; off < len(ms); {
			n, err := s.b.WriteBatch(ms[off:], 0)
			if err != nil {
				return sent + off, err
			}
			off += n
		}
		sent = end
	}
	return sent, nil
}
