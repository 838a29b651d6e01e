package qp

import (
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
)

// GRHLen is the size of the slot at the start of a UD receive buffer that
// receives the packet's network header (IBTA 11.4.1.2: the GRH; on RoCEv2
// the IP header, see RecvInfo). A UD receive WQE needs room for it and the
// message; ByteLen of a UD receive completion counts it.
const GRHLen = 40

// RecvInfo is what the IP and UDP headers of a received packet said, as
// a driver learns them from its socket. UD QPs need it for the GRH slot of
// their receive completions; RC and UC QPs ignore it.
type RecvInfo struct {
	Src, Dst netip.AddrPort // the sender's and the receiver's address and UDP port
	TOS      uint8          // IPv4 TOS / IPv6 traffic class byte, ECN bits included
	HopLimit uint8          // IPv4 TTL / IPv6 hop limit as received; 0 writes 64
	// FlowLabel is the IPv6 flow label (20 bits), when the driver knows it.
	FlowLabel uint32
}

// grh fills b with the network header slot of a UD receive as rxe writes
// it on RoCEv2 (rxe_resp.c execute, union rdma_network_hdr): for IPv4, 20
// zero bytes and then the 20-byte IPv4 header; for IPv6, the 40-byte IPv6
// header. The header is rebuilt from ri and the packet's length (UDP
// payload udpLen): version, TOS, lengths, DF with ID 0 (what Linux sends
// with DF), TTL, protocol 17, checksum and addresses. It reports false,
// leaving b zero, when ri is nil or its addresses are not of one family.
func grh(b *[GRHLen]byte, ri *RecvInfo, udpLen int) bool {
	*b = [GRHLen]byte{}
	if ri == nil {
		return false
	}
	e := bth.Encap{Src: ri.Src.Addr(), Dst: ri.Dst.Addr(), SrcPort: ri.Src.Port(), DstPort: ri.Dst.Port(),
		TrafficClass: ri.TOS, HopLimit: ri.HopLimit, FlowLabel: ri.FlowLabel}
	var hdr [bth.IPv6Len + bth.UDPLen]byte
	h, err := e.AppendIPUDP(hdr[:0], udpLen)
	if err != nil {
		return false
	}
	if e.IsIPv4() {
		copy(b[GRHLen-bth.IPv4Len:], h[:bth.IPv4Len])
	} else {
		copy(b[:], h[:bth.IPv6Len])
	}
	return true
}
