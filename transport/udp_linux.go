//go:build linux

package transport

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	// busyPoll is UDPOptions.BusyPoll in ns (Endpoint Options.BusyPoll
	// may set it later); spinSince is when the read in progress first
	// found the socket empty (zero: not yet).
	busyPoll  atomic.Int64
	spinSince time.Time
	kicked    atomic.Bool // kick or Close: a read that spins stops

	wmu sync.Mutex // WriteBatch may be called from several goroutines
	// wport, wsender: the source port WriteBatch last found in extra and
	// its sender (guarded by wmu).
	wport   uint16
	wsender *sender
	whdrs   []mmsghdr
	wiov    []unix.Iovec
	wnames  []unix.RawSockaddrInet6
	woob    []byte
	wcount  []int // datagrams in each message
	wk, wn  int   // messages to send and sent by sendmmsg
	werrno  syscall.Errno
	zoneIDs map[string]uint32 // interface index by zone name

	// GRO: recvmmsg lands in gbufs (64 KiB each, coalesced datagrams
	// whole); ReadBatch hands the segments out, message gm from offset
	// goff on, of the gn read.
	gro          bool
	gbufs        [][]byte
	gm, gn, goff int
	// gbuilt: how many of rhdrs readGRO has built; gused: how many the
	// last read filled, to reset.
	gbuilt, gused int
	gseg          int // segment size of message gm (its length if not coalesced)
	// gsrc, gtos, gtosKnown: message gm's source and TOS, parsed at its
	// first segment.
	gsrc      netip.AddrPort
	gtos      uint8
	gtosKnown bool

	gso         atomic.Bool
	gsoErrno    syscall.Errno
	gsoSends    atomic.Uint64
	gsoSegments atomic.Uint64
	groReads    atomic.Uint64
	groSegments atomic.Uint64
	offMu       sync.Mutex
	gsoOff      string // why GSO is off, guarded by offMu
	groOff      string
}

// mmsghdr is struct mmsghdr of recvmmsg(2) and sendmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// oobLen is the control message room of one received datagram (one
// IP_TOS or IPV6_TCLASS message, one UDP_GRO), and woobLen of one sent
// (TOS, TTL, UDP_SEGMENT).
var (
	oobLen  = 64
	woobLen = 2*unix.CmsgSpace(4) + unix.CmsgSpace(2)
)

// groBufLen is the size of one GRO landing buffer: the largest UDP
// payload, which bounds a coalesced datagram.
const groBufLen = 1 << 16

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
	c.busyPoll.Store(int64(max(opts.BusyPoll, 0)))
	c.zoneIDs = map[string]uint32{}
	c.initOffloads(s)
	return c, nil
}

// initOffloads turns on GSO and GRO as far as the options and the kernel
// allow, and records why either stays off.
func (c *udpConn) initOffloads(s *sender) {
	var segErr, groErr error
	s.raw.Control(func(fd uintptr) {
		// getsockopt(UDP_SEGMENT) answers on kernels with UDP GSO (4.18+).
		_, segErr = unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
		if !c.opts.NoGRO {
			groErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1)
		}
	})
	switch {
	case c.opts.NoGSO:
		c.gsoOff = "UDPOptions.NoGSO"
	case !c.opts.ComputeUDPChecksum:
		// The kernel refuses UDP_SEGMENT on a socket that sends checksum 0
		// (udp_send_skb and udp_v6_send_skb: EINVAL with sk_no_check_tx).
		c.gsoOff = "UDP checksum 0 (ComputeUDPChecksum off): the kernel refuses GSO without a checksum"
	case segErr != nil:
		c.gsoOff = fmt.Sprintf("no UDP_SEGMENT in this kernel: %v", segErr)
	default:
		c.gso.Store(true)
	}
	switch {
	case c.opts.NoGRO:
		c.groOff = "UDPOptions.NoGRO"
	case groErr != nil:
		c.groOff = fmt.Sprintf("no UDP_GRO in this kernel: %v", groErr)
	default:
		c.gro = true
	}
}

func (c *udpConn) setGSOOff(why string) {
	c.offMu.Lock()
	c.gsoOff = why
	c.offMu.Unlock()
}

// Offloads reports which offloads the Conn uses, why one is off, and
// how much they carried.
func (c *udpConn) Offloads() UDPOffloads {
	c.offMu.Lock()
	defer c.offMu.Unlock()
	o := UDPOffloads{GSO: c.gso.Load(), GRO: c.gro, GSOSends: c.gsoSends.Load(), GSOSegments: c.gsoSegments.Load(),
		GROReads: c.groReads.Load(), GROSegments: c.groSegments.Load()}
	if !o.GSO {
		o.GSOOff = c.gsoOff
	}
	o.GROOff = c.groOff
	return o
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
	// A busy-polling read stops spinning: closing the socket waits for
	// the read in progress to return.
	c.kicked.Store(true)
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
//
// With GRO on (UDPOptions.NoGRO), recvmmsg reads into the Conn's own
// buffers (BatchSize of 64 KiB, allocated at the first read), where the
// kernel may have coalesced datagrams of one source and TOS; ReadBatch
// splits each by the segment size the UDP_GRO control message gives and
// copies the segments into ds, each with that source and TOS. Segments
// that do not fit in ds are handed out by the next call, before any new
// read.
func (c *udpConn) ReadBatch(ds []Datagram) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	k := min(len(ds), len(c.rhdrs))
	if k == 0 {
		return 0, nil
	}
	if c.gro {
		return c.readGRO(ds, false)
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
	c.spinSince = time.Time{}
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

// readBatchAliased is ReadBatch, except that with GRO on each ds[i].Data
// is set to the segment in the Conn's own buffer instead of a copy of it
// (capacity cut to its length): valid until the next read, and not to be
// written. The Endpoint's read loop, which is done with a batch before it
// reads the next, saves a copy of every datagram so. With GRO off it is
// ReadBatch: recvmmsg fills ds[i].Data's capacity.
func (c *udpConn) readBatchAliased(ds []Datagram) (int, error) {
	if !c.gro {
		return c.ReadBatch(ds)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if min(len(ds), len(c.rhdrs)) == 0 {
		return 0, nil
	}
	return c.readGRO(ds, true)
}

// readGRO is ReadBatch with GRO on: segments left from the last read
// first, else one recvmmsg into the GRO buffers. With alias, ds[i].Data
// are the segments themselves (readBatchAliased).
func (c *udpConn) readGRO(ds []Datagram, alias bool) (int, error) {
	if c.gm >= c.gn {
		if c.gbufs == nil {
			// On first use: a Conn that only sends never needs them.
			slab := make([]byte, c.opts.BatchSize*groBufLen)
			c.gbufs = make([][]byte, len(slab)/groBufLen)
			for i := range c.gbufs {
				c.gbufs[i] = slab[i*groBufLen : (i+1)*groBufLen : (i+1)*groBufLen]
			}
		}
		k := min(len(ds), len(c.gbufs))
		// The headers point at the Conn's own buffers, so they are built
		// once; a read changes only the lengths and flags of the
		// messages it fills, which are reset for the next (a read that
		// found nothing changed none).
		reset := c.gused
		if k > c.gbuilt {
			reset, c.gbuilt = k, k
		}
		for i := range reset {
			c.riov[i].Base = &c.gbufs[i][0]
			c.riov[i].SetLen(groBufLen)
			h := &c.rhdrs[i]
			h.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&c.rnames[i])), Namelen: unix.SizeofSockaddrInet6,
				Iov: &c.riov[i], Control: &c.roob[i*oobLen]}
			h.hdr.SetIovlen(1)
			h.hdr.SetControllen(oobLen)
			h.n = 0
		}
		c.gused = 0
		c.rk = k
		c.spinSince = time.Time{}
		if err := c.main.raw.Read(c.readFn); err != nil {
			return 0, err
		}
		if c.rerrno != 0 {
			return 0, os.NewSyscallError("recvmmsg", c.rerrno)
		}
		c.gm, c.gn, c.goff = 0, c.rn, 0
		c.gused = c.rn
	}
	filled := 0
	for filled < len(ds) && c.gm < c.gn {
		h := &c.rhdrs[c.gm]
		n := int(h.n)
		oob := c.roob[c.gm*oobLen : c.gm*oobLen+int(h.hdr.Controllen)]
		if c.goff == 0 {
			// A message's segments share its source, TOS and segment
			// size: parsed once, at its first segment.
			c.gseg = n
			if seg, ok := parseGRO(oob); ok && seg > 0 && seg < n {
				c.gseg = seg
				c.groReads.Add(1)
				c.groSegments.Add(uint64((n + seg - 1) / seg))
			}
			c.gsrc = sockaddrAddrPort(&c.rnames[c.gm])
			c.gtos, c.gtosKnown = parseTOS(oob)
		}
		d := &ds[filled]
		seg := c.gbufs[c.gm][c.goff:min(c.goff+c.gseg, n)]
		switch {
		case h.hdr.Flags&unix.MSG_TRUNC != 0:
			// Larger than the GRO buffer, hence than any UDP payload:
			// handed on empty, counted as malformed.
			d.Data = d.Data[:0]
			seg = seg[:0]
			c.goff = n
		case alias:
			d.Data = seg[:len(seg):len(seg)]
		case cap(d.Data) == 0:
			d.Data = append(d.Data[:0], seg...)
		case len(seg) > cap(d.Data):
			d.Data = d.Data[:0] // too large for the slot: handed on empty, counted as malformed
		default:
			d.Data = append(d.Data[:0], seg...)
		}
		c.goff += len(seg)
		d.Src = c.gsrc
		d.Dst = c.local
		d.TTL = 0
		d.TOS, d.TOSKnown = c.gtos, c.gtosKnown
		filled++
		if c.goff >= n {
			c.gm, c.goff = c.gm+1, 0
		}
	}
	return filled, nil
}

// parseGRO finds the UDP_GRO control message (an int: the segment size
// of a coalesced datagram), checking every length against the buffer.
func parseGRO(oob []byte) (int, bool) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0, false
		}
		data := oob[unix.CmsgLen(0):l]
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4 {
			return int(int32(binary.NativeEndian.Uint32(data))), true
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return 0, false
}

// recvmmsg is the RawConn read function: false asks to wait until the
// socket is readable. With busy-polling on, an empty socket is tried
// again, the goroutine yielding in between, until the budget is spent.
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
			if c.spin() {
				continue
			}
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

// cmsgs writes into b (woobLen bytes) the control messages that set one
// message's TOS / traffic class and TTL / hop limit, and with seg > 0 its
// GSO segment size (UDP_SEGMENT), and returns their length.
func (c *udpConn) cmsgs(b []byte, tos, ttl uint8, seg int) int {
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
	if seg == 0 {
		return 2 * space
	}
	m := b[2*space:]
	h := (*unix.Cmsghdr)(unsafePointer(m))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(m[unix.CmsgLen(0):], uint16(seg))
	return 2*space + unix.CmsgSpace(2)
}

// WriteBatch sends ds in order with sendmmsg, each run of datagrams from
// one source port from that port's socket (the receive socket when the
// port has none), each datagram with its own TOS and TTL. With GSO on
// (UDPOptions.NoGSO), consecutive datagrams to one destination with one
// size (the last may be shorter), TOS and TTL leave as one message with a
// UDP_SEGMENT control message (gsoRun says how many). The count returned
// is of datagrams.
func (c *udpConn) WriteBatch(ds []Datagram) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(ds) > len(c.whdrs) {
		k := max(len(ds), 64)
		c.whdrs, c.wiov, c.wnames = make([]mmsghdr, k), make([]unix.Iovec, k), make([]unix.RawSockaddrInet6, k)
		c.woob, c.wcount = make([]byte, k*woobLen), make([]int, k)
	}
	sent := 0
	for sent < len(ds) {
		// A run of datagrams from the same source port goes in one sendmmsg.
		port := ds[sent].Src.Port()
		end := sent + 1
		for end < len(ds) && ds[end].Src.Port() == port {
			end++
		}
		s := c.wsender
		if s == nil || port != c.wport {
			c.mu.Lock()
			s = c.extra[port]
			c.mu.Unlock()
			if s != nil {
				// Senders are never removed nor replaced: the last
				// one found stays right for its port.
				c.wport, c.wsender = port, s
			} else {
				s = c.main
			}
		}
		gso := c.gso.Load()
		n, refused, err := c.sendRun(s, ds[sent:end], gso)
		sent += n
		if refused > 0 {
			// The kernel refused a UDP_SEGMENT message (EIO: no checksum
			// offload on the route; EINVAL: a segment over the MTU, or
			// GSO refused outright). Its datagrams go again one by one:
			// if they leave, GSO was at fault and stays off for good.
			var n2 int
			n2, _, err = c.sendRun(s, ds[sent:end], false)
			if n2 >= refused {
				c.gso.Store(false)
				c.setGSOOff(fmt.Sprintf("the kernel refused a UDP_SEGMENT send: %v", c.gsoErrno))
			}
			sent += n2
		}
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// maxGSOSegments and maxGSOBytes bound one UDP_SEGMENT send: the kernel
// takes at most UDP_MAX_SEGMENTS (64) segments, and the payload of the
// whole must fit one IPv4 UDP datagram (65535 - 20 - 8 bytes).
const (
	maxGSOSegments = 64
	maxGSOBytes    = 65535 - 20 - 8
)

// gsoSafe says whether datagrams to dst may be sent segmented. Not over
// IPv4 except on loopback: where the kernel (or the NIC) cuts a segmented
// IPv4 send on a real link, it numbers the segments' IP IDs from the
// first one's (0 with DF) up (inet_gso_segment in net/ipv4/af_inet.c:
// iph->id = htons(id++); fixed IDs exist for TCP only), and the ICRC
// covers the IP ID (ROCEV2.md section 3), so a peer that verifies it, as
// rxe does, would drop every segment but the first. Loopback carries the
// segmented send whole to the receiving socket, which never sees an IP
// header. IPv6 has no IP ID: its segments are the datagrams sent one by
// one would be, but for the UDP checksum.
func gsoSafe(dst netip.Addr) bool {
	a := dst.Unmap()
	return !a.Is4() || a.IsLoopback()
}

// gsoRun returns how many datagrams from ds[0] can leave in one
// UDP_SEGMENT send: same destination, TOS and TTL, the size of ds[0],
// except that the last may be shorter.
func gsoRun(ds []Datagram) int {
	size := len(ds[0].Data)
	if size == 0 {
		return 1
	}
	total, n := size, 1
	for n < len(ds) && n < maxGSOSegments {
		d := &ds[n]
		l := len(d.Data)
		if l == 0 || l > size || total+l > maxGSOBytes || d.Dst != ds[0].Dst || d.TOS != ds[0].TOS || d.TTL != ds[0].TTL {
			break
		}
		total += l
		n++
		if l < size {
			break
		}
	}
	return n
}

// sendRun sends ds, all from socket s, with one sendmmsg (more when the
// socket's buffer is full). It returns the datagrams sent and, when the
// kernel refused a UDP_SEGMENT message with EIO or EINVAL, the number of
// datagrams that message held (the ones after it are not sent).
func (c *udpConn) sendRun(s *sender, ds []Datagram, gso bool) (sent, refused int, err error) {
	m := 0
	for i := 0; i < len(ds); m++ {
		k := 1
		d := &ds[i]
		if gso && gsoSafe(d.Dst.Addr()) {
			k = gsoRun(ds[i:])
		}
		ttl := d.TTL
		if ttl == 0 {
			ttl = c.opts.TTL
		}
		oob := c.woob[m*woobLen : (m+1)*woobLen]
		seg := 0
		if k > 1 {
			seg = len(d.Data)
		}
		oobLen := c.cmsgs(oob, d.TOS, ttl, seg)
		namelen, err := c.sockaddr(&c.wnames[m], d.Dst)
		if err != nil {
			return 0, 0, err
		}
		for j := range k {
			v := &c.wiov[i+j]
			v.Base = nil
			if b := ds[i+j].Data; len(b) > 0 {
				v.Base = &b[0]
			}
			v.SetLen(len(ds[i+j].Data))
		}
		h := &c.whdrs[m]
		h.hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&c.wnames[m])), Namelen: namelen, Iov: &c.wiov[i], Control: &oob[0]}
		h.hdr.SetIovlen(k)
		h.hdr.SetControllen(oobLen)
		h.n = 0
		c.wcount[m] = k
		i += k
	}
	c.wk, c.wn, c.werrno = m, 0, 0
	err = s.raw.Write(c.writeFn)
	// Drop the references to the caller's buffers.
	for i := range ds {
		c.wiov[i].Base = nil
	}
	for _, k := range c.wcount[:c.wn] {
		sent += k
		if k > 1 {
			c.gsoSends.Add(1)
			c.gsoSegments.Add(uint64(k))
		}
	}
	if err == nil && c.werrno != 0 {
		if k := c.wcount[c.wn]; k > 1 && (c.werrno == unix.EIO || c.werrno == unix.EINVAL) {
			c.gsoErrno = c.werrno
			return sent, k, nil
		}
		err = os.NewSyscallError("sendmmsg", c.werrno)
		if c.werrno == unix.EMSGSIZE {
			err = fmt.Errorf("%w: %w", ErrTooBig, err)
		}
	}
	return sent, 0, err
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

// setBusyPoll sets the busy-poll budget (Endpoint Options.BusyPoll).
func (c *udpConn) setBusyPoll(d time.Duration) { c.busyPoll.Store(int64(max(d, 0))) }

// spin reports whether the read in progress should try the empty socket
// again: while within the busy-poll budget, after yielding the processor.
func (c *udpConn) spin() bool {
	budget := time.Duration(c.busyPoll.Load())
	if budget <= 0 || c.kicked.Load() {
		return false
	}
	now := time.Now()
	if c.spinSince.IsZero() {
		c.spinSince = now
	} else if now.Sub(c.spinSince) >= budget {
		return false
	}
	runtime.Gosched()
	return true
}

// kick makes the read in progress return os.ErrDeadlineExceeded, and the
// next until unkick (a read deadline in the past): the Endpoint wakes a
// goroutine reading in CQ.Wait whose ctx ended (direct.go).
// A busy-polling read (spin) stops spinning at once.
func (c *udpConn) kick() {
	c.kicked.Store(true)
	_ = c.main.c.SetReadDeadline(time.Unix(1, 0))
}

// unkick takes the read deadline kick set away.
func (c *udpConn) unkick() {
	c.mu.Lock()
	if !c.closed {
		c.kicked.Store(false)
	}
	c.mu.Unlock()
	_ = c.main.c.SetReadDeadline(time.Time{})
}
