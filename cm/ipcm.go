package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Port spaces of the RDMA IP CM service IDs (IBTA Annex A11.2.1; Linux
// enum rdma_ucm_port_space).
const (
	PortSpaceIPoIB = 0x0002
	PortSpaceTCP   = 0x0106 // RDMA_PS_TCP: rping, perftest -R, most programs
	PortSpaceUDP   = 0x0111
	PortSpaceIB    = 0x013F
)

// ServiceIDPrefix is the high 40 bits that mark an RDMA IP CM service ID
// (IBTA A11.2.1: 0x0000000001, then the 8-bit protocol and the 16-bit
// port). Linux writes the prefix's last byte and the protocol together as
// the 16-bit port space (RDMA_PS_TCP 0x0106).
const ServiceIDPrefix = 0x0000000001

// ServiceID returns the service ID of an RDMA IP CM port: the port space
// (0x01 then the protocol) in bits 31-16 and the port in bits 15-0 (IBTA
// A11.2.1; Linux cma_get_service_id). ServiceID(PortSpaceTCP, 7174) is
// rping's default, 0x0000000001061C06.
func ServiceID(portSpace, port uint16) uint64 {
	return uint64(portSpace)<<16 | uint64(port)
}

// ParseServiceID splits an RDMA IP CM service ID into its port space and
// port. ok is false when the high 40 bits are not 0x0000000001.
func ParseServiceID(id uint64) (portSpace, port uint16, ok bool) {
	return uint16(id >> 16), uint16(id), id>>24 == ServiceIDPrefix
}

// IPHeaderLen is the size of the IP CM header at the start of a REQ's
// private data; what follows is the application's private data (56 bytes
// in a REQ).
const IPHeaderLen = 36

// IPHeader is the RDMA IP CM private data header of a REQ (IBTA Annex
// A11.6.1, Table 558; Linux struct cma_hdr), 36 bytes:
//
//	0 MajV:4 MinV:4  1 IPV:4 reserved:4  2 SrcPort:16
//	4 source address (16)  20 destination address (16)
//
// An IPv4 address sits in the last 4 bytes of its 16 (12 zero bytes
// first, as Linux writes it); IPV is 4 or 6. The destination port is not
// here: it is the low 16 bits of the service ID.
type IPHeader struct {
	Src netip.AddrPort // the active side's address and its (ephemeral) port
	Dst netip.Addr     // the passive side's address
}

// Append appends the 36-byte header. Src and Dst must both be IPv4 or
// both IPv6 (an IPv4-mapped IPv6 address counts as IPv4); otherwise it
// returns ErrFieldRange.
func (h *IPHeader) Append(b []byte) ([]byte, error) {
	src, dst := h.Src.Addr().Unmap(), h.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return b, fmt.Errorf("%w: IP CM header addresses %v and %v are not of one family", ErrFieldRange, src, dst)
	}
	ver := byte(6)
	if src.Is4() {
		ver = 4
	}
	b = append(b, 0x00, ver<<4)
	b = binary.BigEndian.AppendUint16(b, h.Src.Port())
	for _, a := range [2]netip.Addr{src, dst} {
		if a.Is4() {
			v4 := a.As4()
			b = append(b, make([]byte, 12)...)
			b = append(b, v4[:]...)
		} else {
			v6 := a.As16()
			b = append(b, v6[:]...)
		}
	}
	return b, nil
}

// Decode reads the header from the start of private data. It returns
// ErrTruncated when fewer than 36 bytes are given, ErrNotIPCM when the
// major version is not 0, the IP version is not 4 or 6, or an IPv6 header
// holds one IPv4-mapped address and one IPv6 address. Two IPv4-mapped
// addresses in an IPv6 header are read as IPv4 addresses.
func (h *IPHeader) Decode(pd []byte) error {
	if len(pd) < IPHeaderLen {
		return fmt.Errorf("%w: %d bytes of private data, the IP CM header needs %d", ErrTruncated, len(pd), IPHeaderLen)
	}
	if pd[0]>>4 != 0 {
		return fmt.Errorf("%w: major version %d", ErrNotIPCM, pd[0]>>4)
	}
	port := binary.BigEndian.Uint16(pd[2:])
	switch pd[1] >> 4 {
	case 4:
		h.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(pd[16:20])), port)
		h.Dst = netip.AddrFrom4([4]byte(pd[32:36]))
	case 6:
		src, dst := netip.AddrFrom16([16]byte(pd[4:20])), netip.AddrFrom16([16]byte(pd[20:36]))
		switch {
		case src.Is4In6() && dst.Is4In6():
			// IPv4 endpoints written as IPv4-mapped IPv6 addresses.
			src, dst = src.Unmap(), dst.Unmap()
		case src.Is4In6() || dst.Is4In6():
			return fmt.Errorf("%w: IPv6 header with an IPv4-mapped and an IPv6 address (%v, %v)", ErrNotIPCM, src, dst)
		}
		h.Src = netip.AddrPortFrom(src, port)
		h.Dst = dst
	default:
		return fmt.Errorf("%w: IP version %d", ErrNotIPCM, pd[1]>>4)
	}
	return nil
}
