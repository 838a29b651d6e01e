// Package bth encodes and decodes InfiniBand transport headers as carried by
// RoCEv2 (IBTA Vol. 1 chapter 9, Annex A17 "RoCEv2"): the Base Transport Header,
// the extended transport headers RETH, AETH, DETH, ImmDt, IETH, AtomicETH and
// AtomicAckETH, the CNP (Annex A17.9.3), and the invariant CRC that ends every
// packet. It also builds the Ethernet/IP/UDP frame around a packet.
//
// A RoCEv2 packet travels as the payload of a UDP datagram to port 4791:
//
//	+----------+---------+-----+-----+---------------+---------+---------+------+
//	| Ethernet | IPv4/v6 | UDP | BTH | extended hdrs | payload | pad 0-3 | ICRC |
//	+----------+---------+-----+-----+---------------+---------+---------+------+
//	                           |<------------- UDP payload ----------------->|
//
// Decoding never panics and does not allocate on valid packets: a packet
// that is too short for its opcode or inconsistent with it returns a
// *DecodeError (the one allocation) that wraps one of the sentinel errors in
// errors.go. Packet.DecodePrefix decodes the headers of a packet that a
// capture cut short. Encoding appends to a caller's buffer.
//
// The package imports only the standard library.
package bth
