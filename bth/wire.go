package bth

// The bytes a RoCEv2 packet occupies on a link, as the emulator's pacers
// and congestion points count them. One figure for every user (the QP's
// pacer in package qp, the switch port model in package cc, its simulation
// in cc/sim, the in-memory network's congestion points and the UDP switch
// in package transport), so that a simulated and an emulated link of the
// same rate carry the same packets per second.
//
// Counted: the Ethernet header without a VLAN tag (14 bytes), an IPv4
// header without options (20), the UDP header (8): FrameOverhead, 42 bytes
// around a UDP payload; and for a packet, the BTH (12) and the ICRC (4) as
// well: PacketOverhead, 58 bytes around the payload of a packet with no
// extended transport header. This is the frame as a capture shows it, from
// the destination MAC to the ICRC (IBTA Annex A17.4 encapsulation: Ethernet,
// IP, UDP to port 4791, BTH, extended headers, payload, pad, ICRC).
//
// Not counted: the Ethernet FCS (4 bytes), the preamble and start delimiter
// (8) and the minimum inter-frame gap (12), 24 bytes a real link also
// spends per frame, nor the 20 more bytes of an IPv6 header. Rates in this
// module are rates of captured frame bytes: at 1024-byte payloads an
// emulated 40 Gb/s link moves about 2% more packets per second than a real
// one. Leaving them out keeps the figure the pacer, the simulation and the
// figures in the README were made with (58 bytes per packet).
const (
	// FrameOverhead is what Ethernet, IPv4 and UDP add to a UDP payload
	// (BTH to ICRC) on the wire: 42 bytes.
	FrameOverhead = EthernetLen + IPv4Len + UDPLen
	// PacketOverhead is what a packet without extended transport headers
	// carries on the wire besides its payload: FrameOverhead, the BTH and
	// the ICRC, 58 bytes.
	PacketOverhead = FrameOverhead + BTHLen + ICRCLen
)

// WireLen returns the bytes on the wire of a UDP datagram whose payload
// (BTH to ICRC) is udpPayload bytes long: udpPayload + FrameOverhead.
func WireLen(udpPayload int) int { return udpPayload + FrameOverhead }
