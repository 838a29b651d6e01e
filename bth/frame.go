package bth

import (
	"encoding/binary"
	"net/netip"
	"strconv"
)

// UDPPort is the IANA UDP destination port of RoCEv2 (Annex A17.2.1). Every
// RoCEv2 packet, ACKs and read responses included, goes to it; the source
// port is flow entropy.
const UDPPort = 4791

// ECN is the two-bit explicit congestion notification codepoint of the IP
// header (RFC 3168).
type ECN uint8

// ECN codepoints.
const (
	NotECT ECN = 0 // not ECN-capable
	ECT1   ECN = 1
	ECT0   ECN = 2
	CE     ECN = 3 // congestion experienced
)

// String returns "Not-ECT", "ECT(1)", "ECT(0)" or "CE", as Wireshark does.
func (e ECN) String() string {
	switch e & 3 {
	case NotECT:
		return "Not-ECT"
	case ECT1:
		return "ECT(1)"
	case ECT0:
		return "ECT(0)"
	}
	return "CE"
}

// TrafficClass returns the IPv4 TOS / IPv6 traffic class byte for a DSCP
// (0-63) and an ECN codepoint: dscp<<2 | ecn.
func TrafficClass(dscp uint8, ecn ECN) uint8 { return dscp<<2 | uint8(ecn&3) }

// SourcePort returns the UDP source port Linux gives a RoCEv2 flow
// (rdma_get_udp_sport in include/rdma/ib_verbs.h, used by rxe, irdma and
// hns): a 20-bit flow label, or when it is 0 a hash of the local and remote
// QPNs, folded to 14 bits and put in the range 0xC000-0xFFFF.
func SourcePort(flowLabel, localQPN, remoteQPN uint32) uint16 {
	fl := uint64(flowLabel & 0xFFFFF)
	if fl == 0 {
		fl = uint64(localQPN) * uint64(remoteQPN)
		fl ^= fl >> 20
		fl ^= fl >> 40
		fl &= 0xFFFFF
	}
	return uint16((fl&0x3FFF)^((fl&0xFC000)>>14)) | 0xC000
}

// Encap describes the Ethernet, IP and UDP headers a RoCEv2 packet travels
// in. Src and Dst are both IPv4 (an IPv4-mapped IPv6 address counts as
// IPv4, as an IPv4-mapped GID means an IPv4 header in RoCEv2) or both IPv6.
//
// The zero values of DstPort and HopLimit mean 4791 and 64. IPv4 headers
// get DF set, no options and ID as given (0 by default, what Linux puts on a
// DF datagram from an unconnected UDP socket); UDP checksums are 0, as rxe
// sends them, IPv6 included: rxe writes 0 there too and its tunnel socket
// accepts zero IPv6 UDP checksums (RFC 6935 allows them for tunnels), though
// Wireshark flags them as illegal.
type Encap struct {
	SrcMAC, DstMAC [6]byte
	Src, Dst       netip.Addr
	SrcPort        uint16 // UDP source port; see SourcePort. 0 is allowed (ConnectX CNPs)
	DstPort        uint16 // UDP destination port; 0 means UDPPort
	TrafficClass   uint8  // IPv4 TOS or IPv6 traffic class: DSCP<<2 | ECN
	HopLimit       uint8  // IPv4 TTL or IPv6 hop limit; 0 means 64
	FlowLabel      uint32 // IPv6 flow label, 20 bits
	ID             uint16 // IPv4 identification
}

// IPv4Len, IPv6Len, UDPLen and EthernetLen are the header sizes Encap writes.
const (
	EthernetLen = 14
	IPv4Len     = 20
	IPv6Len     = 40
	UDPLen      = 8
)

// IsIPv4 reports whether e describes an IPv4 header.
func (e *Encap) IsIPv4() bool { return e.Src.Unmap().Is4() }

func (e *Encap) check() error {
	s, d := e.Src.Unmap(), e.Dst.Unmap()
	if !s.IsValid() || !d.IsValid() || s.Is4() != d.Is4() {
		return ErrBadIPHeader
	}
	return nil
}

// IPHeaderLen returns 20 for IPv4 and 40 for IPv6.
func (e *Encap) IPHeaderLen() int {
	if e.IsIPv4() {
		return IPv4Len
	}
	return IPv6Len
}

// AppendIPUDP appends the IP and UDP headers for a UDP payload of udpPayload
// bytes (a whole RoCEv2 packet, ICRC included) to b, with the IPv4 header
// checksum filled in. It returns ErrBadIPHeader when Src and Dst are not
// both valid addresses of one family, or the datagram would exceed 65535
// bytes.
func (e *Encap) AppendIPUDP(b []byte, udpPayload int) ([]byte, error) {
	return e.appendIPUDP(b, udpPayload, true)
}

// appendIPUDP is AppendIPUDP; without sum it leaves the IPv4 header
// checksum 0, for the ICRC, which masks it (IBTA Annex A17.8).
func (e *Encap) appendIPUDP(b []byte, udpPayload int, sum bool) ([]byte, error) {
	if err := e.check(); err != nil {
		return b, err
	}
	udpLen := UDPLen + udpPayload
	if udpPayload < 0 || udpLen+e.IPHeaderLen() > 0xFFFF {
		return b, ErrBadIPHeader
	}
	ttl := e.HopLimit
	if ttl == 0 {
		ttl = 64
	}
	if e.IsIPv4() {
		start := len(b)
		s, d := e.Src.Unmap().As4(), e.Dst.Unmap().As4()
		total := IPv4Len + udpLen
		b = append(b, 0x45, e.TrafficClass, byte(total>>8), byte(total),
			byte(e.ID>>8), byte(e.ID), 0x40, 0, // DF, fragment offset 0
			ttl, 17, 0, 0)
		b = append(b, s[:]...)
		b = append(b, d[:]...)
		if sum {
			binary.BigEndian.PutUint16(b[start+10:], ipv4Checksum(b[start:start+IPv4Len]))
		}
	} else {
		s, d := e.Src.As16(), e.Dst.As16()
		fl := e.FlowLabel & 0xFFFFF
		b = append(b, 0x60|e.TrafficClass>>4, e.TrafficClass<<4|byte(fl>>16), byte(fl>>8), byte(fl),
			byte(udpLen>>8), byte(udpLen), 17, ttl)
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	}
	dport := e.DstPort
	if dport == 0 {
		dport = UDPPort
	}
	return append(b, byte(e.SrcPort>>8), byte(e.SrcPort), byte(dport>>8), byte(dport),
		byte(udpLen>>8), byte(udpLen), 0, 0), nil
}

// ICRC computes the ICRC of pkt (BTH to the end of the pad) as it will
// travel inside the headers e describes. It does not allocate.
func (e *Encap) ICRC(pkt []byte) (uint32, error) {
	var hdr [IPv6Len + UDPLen]byte
	h, err := e.appendIPUDP(hdr[:0], len(pkt)+ICRCLen, false) // the ICRC masks the IPv4 checksum
	if err != nil {
		return 0, err
	}
	n := len(h) - UDPLen
	return ICRC(h[:n], h[n:], pkt)
}

// AppendFrame appends a whole Ethernet frame carrying p to b: Ethernet II
// header (EtherType 0x0800 or 0x86DD), IP, UDP, and p with its PadCnt and
// ICRC computed. There is no Ethernet FCS. On error b is returned unchanged.
func (e *Encap) AppendFrame(b []byte, p *Packet) ([]byte, error) {
	orig := b
	n := p.Len()
	if n == 0 {
		_, err := p.AppendHeaders(nil)
		return b, err
	}
	b = append(b, e.DstMAC[:]...)
	b = append(b, e.SrcMAC[:]...)
	if e.IsIPv4() {
		b = append(b, 0x08, 0x00)
	} else {
		b = append(b, 0x86, 0xDD)
	}
	b, err := e.AppendIPUDP(b, n)
	if err != nil {
		return orig, err
	}
	b, err = p.Append(b, e)
	if err != nil {
		return orig, err
	}
	return b, nil
}

func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// String describes e briefly, for messages: "192.0.2.1:49152 -> 192.0.2.2:4791".
func (e *Encap) String() string {
	dport := e.DstPort
	if dport == 0 {
		dport = UDPPort
	}
	return netip.AddrPortFrom(e.Src, e.SrcPort).String() + " -> " +
		netip.AddrPortFrom(e.Dst, dport).String() + " tc=" + strconv.Itoa(int(e.TrafficClass))
}

// VerifyICRC checks the ICRC at the end of roce, a whole UDP payload, as if
// it travelled inside the headers e describes: what a receiver with only a
// UDP socket can do when it knows how the sender builds its IP header
// (Linux: ID 0 on a DF datagram from an unconnected socket). Errors are as
// for VerifyICRC.
func (e *Encap) VerifyICRC(roce []byte) (got, want uint32, err error) {
	if len(roce) < BTHLen+ICRCLen {
		return 0, 0, &DecodeError{Err: ErrTruncated, Header: "ICRC", Need: BTHLen + ICRCLen, Have: len(roce)}
	}
	end := len(roce) - ICRCLen
	got = binary.LittleEndian.Uint32(roce[end:])
	want, err = e.ICRC(roce[:end])
	if err == nil && got != want {
		err = ErrBadICRC
	}
	return got, want, err
}
