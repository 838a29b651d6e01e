// Package pcap reads and writes captures of RoCEv2 traffic and decodes them
// with gopacket (github.com/google/gopacket).
//
//   - Layers: gopacket layer types for the BTH and each extended transport
//     header, registered on UDP destination port 4791, that implement
//     gopacket.DecodingLayer and gopacket.SerializableLayer.
//   - Reader: pcap (microsecond or nanosecond, either byte order) and pcapng
//     files, through gopacket's pcapgo.
//   - Writer: a pcap file of Ethernet frames that tshark decodes as RoCEv2.
//   - Decoder: frame -> addresses, ECN, the decoded transport packet and
//     whether its ICRC verifies.
//   - Summary: the counts that `roce-emu decode` prints.
package pcap
