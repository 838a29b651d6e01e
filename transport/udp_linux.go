//go:build linux

package transport

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpConn is a Conn on kernel UDP sockets: one bound to the receive port
// (4791 by default), and one per extra source port QPs send from. Every
// socket sets DF (IP_PMTUDISC_DO), so that Linux gives its datagrams IP
// ID 0 (docs/wire-format.md section 3) and peers can verify our ICRC; each reads the
// TOS of received datagrams (IP_RECVTOS / IPV6_RECVTCLASS).
//
// Reads are recvmmsg(2) straight into the callers' buffers and writes
// sendmmsg(2) from them, with message headers, addresses and control
// messages kept in the Conn and reused: no allocation per datagram.
type udpConn struct {
	local netip.AddrPort
	v6    bool
	opts  UDPOptions
	main  *sender

	mu     sync.Mutex
	closed bool // guarded by mu: no socket is opened after Close
	extra  map[uint16]*sender

	rmu     sync.Mutex // one ReadBatch at a time
	rhdrs   []mmsghdr
	riov    []unix.Iovec
	rnames  []unix.RawSockaddrInet6
	roob    []byte
	rspare  [][]byte // for slots with no capacity of their own
	rk, rn  int      // messages offered to and filled by recvmmsg
	rerrno  syscall.Errno
	readFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool

	wmu     sync.Mutex // WriteBatch may be called from several goroutines
	whdrs   []mmsghdr
	wiov    []unix.Iovec
	wnames  []unix.RawSockaddrInet6
	woob    []byte
	wk, wn  int // messages to send and sent by sendmmsg
	werrno  syscall.Errno
	zoneIDs map[string]uint32 // interface index by zone name
}

// mmsghdr is struct mmsghdr of recvmmsg(2) and sendmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// oobLen is the control message room of one received datagram (one
// IP_TOS or IPV6_TCLASS message), and woobLen of one sent (TOS and TTL).
var (
	oobLen  = 64
	woobLen = 2 * unix.CmsgSpace(4)
)

type sender struct {
	c   *net.UDPConn
	raw syscall.RawConn
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
	c.main = s
	c.local = netip.AddrPortFrom(addr.Addr(), uint16(s.c.LocalAddr().(*net.UDPAddr).Port))
	c.extra[c.local.Port()] = s
	k := opts.BatchSize
	c.rhdrs, c.riov, c.rnames = make([]mmsghdr, k), make([]unix.Iovec, k), make([]unix.RawSockaddrInet6, k)
	c.roob, c.rspare = make([]byte, k*oobLen), make([][]byte, k)
	c.readFn, c.writeFn = c.recvmmsg, c.sendmmsg
	c.zoneIDs = map[string]uint32{}
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
	return &sender{c: uc, raw: raw}, nil
}

func (c *udpConn) LocalAddr() netip.AddrPort { return c.local }

// SourcePort opens (once) a socket bound to want on the local address. If
// the port is taken it falls back to the receive port.
func (c *udpConn) SourcePort(want uint16) uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.extra[want]; ok {
		return want
	}
	if want == 0 || c.closed {
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
	c.closed = true
	var err error
	for p, s := range c.extra {
		if e := s.c.Close(); e != nil && err == nil && p == c.local.Port() {
			err = e
		}
	}
	return err
}

// ReadBatch reads up to len(ds) (at most BatchSize) datagrams with one
// recvmmsg, each into ds[i].Data's capacity; a slot with no capacity is
// read into a buffer of the Conn's own and copied. A datagram larger than
// its buffer is handed on empty (a reader counts it as malformed).
func (c *udpConn) ReadBatch(ds []Datagram) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	k := min(len(ds), len(c.rhdrs))
	if k == 0 {
		return 0, nil
	}
	for i := range k {
		buf := ds[i].Data[:cap(ds[i].Data)]
		if len(buf) == 0 {
			if c.rspare[i] == nil {
				c.rspare[i] = make([]byte, 16<<10)
			}
			buf = c.rspare[i]
		}
		c.riov[i].Base = &buf[0]
		c.riov[i].SetLen(len(buf))
		h := &c.rhdrs[i]
		h.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&c.rnames[i])), Namelen: unix.SizeofSockaddrInet6,
			Iov: &c.riov[i], Control: &c.roob[i*oobLen]}
		h.hdr.SetIovlen(1)
		h.hdr.SetControllen(oobLen)
		h.n = 0
	}
	c.rk = k
	if err := c.main.raw.Read(c.readFn); err != nil {
		return 0, err
	}
	if c.rerrno != 0 {
		return 0, os.NewSyscallError("recvmmsg", c.rerrno)
	}
	for i := range c.rn {
		h := &c.rhdrs[i]
		d := &ds[i]
		n := int(h.n)
		switch {
		case h.hdr.Flags&unix.MSG_TRUNC != 0:
			d.Data = d.Data[:0] // too large for the buffer: handed on empty, counted as malformed
		case cap(d.Data) == 0:
			d.Data = append(d.Data[:0], c.rspare[i][:n]...)
		default:
			d.Data = d.Data[:n]
		}
		// A GID has no zone, and the QP's remote address came from a
		// GID: link-local sources are compared without theirs.
		d.Src = sockaddrAddrPort(&c.rnames[i])
		d.Dst = c.local
		d.TTL = 0
		d.TOS, d.TOSKnown = parseTOS(c.roob[i*oobLen : i*oobLen+int(h.hdr.Controllen)])
	}
	return c.rn, nil
}

// recvmmsg is the RawConn read function: false asks to wait until the
// socket is readable.
func (c *udpConn) recvmmsg(fd uintptr) bool {
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.rhdrs[0])), uintptr(c.rk), 0, 0, 0)
		switch e {
		case 0:
			c.rn, c.rerrno = int(n), 0
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		c.rn, c.rerrno = 0, e
		return true
	}
}

// sockaddrAddrPort reads a received sockaddr_in or sockaddr_in6 (port in
// network byte order), without its zone.
func sockaddrAddrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), ntohs(sa4.Port))
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), ntohs(sa.Port))
	}
	return netip.AddrPort{}
}

// ntohs and htons convert a port between host order and the network
// order a sockaddr holds it in.
func ntohs(p uint16) uint16 { return binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p))[:]) }
func htons(p uint16) uint16 {
	var v uint16
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&v))[:], p)
	return v
}

// parseTOS finds the IP_TOS or IPV6_TCLASS control message, checking
// every length against the buffer.
func parseTOS(oob []byte) (uint8, bool) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0, false
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS && len(data) >= 1:
			return data[0], true
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS && len(data) >= 4:
			return uint8(binary.NativeEndian.Uint32(data)), true
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return 0, false
}

// cmsgs writes into b (2*CmsgSpace(4) bytes) the control messages that
// set one datagram's TOS / traffic class and TTL / hop limit.
func (c *udpConn) cmsgs(b []byte, tos, ttl uint8) {
	level, tosType, ttlType := unix.IPPROTO_IP, unix.IP_TOS, unix.IP_TTL
	if c.v6 {
		level, tosType, ttlType = unix.IPPROTO_IPV6, unix.IPV6_TCLASS, unix.IPV6_HOPLIMIT
	}
	space := unix.CmsgSpace(4)
	clear(b)
	for i, x := range [2]struct {
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
}

// WriteBatch sends ds in order with sendmmsg, each run of datagrams from
// one source port from that port's socket (the receive socket when the
// port has none), each datagram with its own TOS and TTL.
func (c *udpConn) WriteBatch(ds []Datagram) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(ds) > len(c.whdrs) {
		k := max(len(ds), 64)
		c.whdrs, c.wiov, c.wnames = make([]mmsghdr, k), make([]unix.Iovec, k), make([]unix.RawSockaddrInet6, k)
		c.woob = make([]byte, k*woobLen)
	}
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
			s = c.main
		}
		c.mu.Unlock()
		for i := range end - sent {
			d := &ds[sent+i]
			ttl := d.TTL
			if ttl == 0 {
				ttl = c.opts.TTL
			}
			oob := c.woob[i*woobLen : (i+1)*woobLen]
			c.cmsgs(oob, d.TOS, ttl)
			namelen, err := c.sockaddr(&c.wnames[i], d.Dst)
			if err != nil {
				return sent, err
			}
			c.wiov[i].Base = nil
			if len(d.Data) > 0 {
				c.wiov[i].Base = &d.Data[0]
			}
			c.wiov[i].SetLen(len(d.Data))
			h := &c.whdrs[i]
			h.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&c.wnames[i])), Namelen: namelen, Iov: &c.wiov[i], Control: &oob[0]}
			h.hdr.SetIovlen(1)
			h.hdr.SetControllen(woobLen)
			h.n = 0
		}
		c.wk, c.wn, c.werrno = end-sent, 0, 0
		err := s.raw.Write(c.writeFn)
		// Drop the references to the caller's buffers.
		for i := range end - sent {
			c.wiov[i].Base = nil
		}
		if err == nil && c.werrno != 0 {
			err = os.NewSyscallError("sendmmsg", c.werrno)
			if c.werrno == unix.EMSGSIZE {
				err = fmt.Errorf("%w: %w", ErrTooBig, err)
			}
		}
		if err != nil {
			return sent + c.wn, err
		}
		sent = end
	}
	return sent, nil
}

// sendmmsg is the RawConn write function: it sends the wk prepared
// messages, and returns false to wait until the socket is writable.
func (c *udpConn) sendmmsg(fd uintptr) bool {
	for c.wn < c.wk {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&c.whdrs[c.wn])), uintptr(c.wk-c.wn), 0, 0, 0)
		switch e {
		case 0:
			c.wn += int(n)
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		c.werrno = e
		return true
	}
	return true
}

// sockaddr writes dst as the socket's address family wants it and returns
// its length. A link-local IPv6 destination gets the local address's zone
// when it has none (withZone), as an interface index.
func (c *udpConn) sockaddr(sa *unix.RawSockaddrInet6, dst netip.AddrPort) (uint32, error) {
	a := dst.Addr()
	if !c.v6 {
		if !a.Unmap().Is4() {
			return 0, fmt.Errorf("transport: cannot send to %s from IPv4 address %s", a, c.local.Addr())
		}
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Port: htons(dst.Port()), Addr: a.Unmap().As4()}
		return unix.SizeofSockaddrInet4, nil
	}
	dst = c.withZone(dst)
	a = dst.Addr()
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Port: htons(dst.Port()), Addr: a.As16()}
	if z := a.Zone(); z != "" {
		id, ok := c.zoneIDs[z]
		if !ok {
			if n, err := strconv.ParseUint(z, 10, 32); err == nil {
				id = uint32(n)
			} else if ifi, err := net.InterfaceByName(z); err == nil {
				id = uint32(ifi.Index)
			} else {
				return 0, fmt.Errorf("transport: zone of %s: %w", a, err)
			}
			c.zoneIDs[z] = id
		}
		sa.Scope_id = id
	}
	return unix.SizeofSockaddrInet6, nil
}

// withZone: see the function withZone.
func (c *udpConn) withZone(dst netip.AddrPort) netip.AddrPort { return withZone(c.local.Addr(), dst) }
