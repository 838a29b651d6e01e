// Package pcap reads and writes captures of RoCEv2 traffic and decodes them
// with gopacket (github.com/google/gopacket).
//
//   - Layers: gopacket layer types for the BTH and each extended transport
//     header, registered on UDP destination port 4791, that implement
//     gopacket.DecodingLayer and gopacket.SerializableLayer. Give NewLayers
//     the parser's UDP layer, so that the BTH refuses datagrams that are not
//     to port 4791 (gopacket's UDP layer falls back to the source port).
//   - Reader: pcap (microsecond or nanosecond, either byte order) and pcapng
//     files, through gopacket's pcapgo, behind validators that refuse the
//     lengths pcapgo would trust (ErrCorruptCapture) and tell a file cut
//     short (ErrTruncatedCapture) from one that ends. Link types have all
//     their bits (LinkType), not gopacket's 8. Open maps files of 1 MiB or
//     more on Linux (read-only; a file truncated under the mapping is a
//     read error), and checks a classic pcap file's record headers in place
//     in the mapping.
//   - Writer: a pcap file of Ethernet frames that tshark decodes as RoCEv2.
//   - Decoder: frame -> addresses, ECN, the decoded transport packet and
//     whether its ICRC verifies; Ethernet, raw IP, Linux cooked v1 and v2,
//     BSD loopback (gopacket's layers; Ethernet + IPv4 + UDP without the
//     parser's per-layer dispatch). IPv4 and IPv6 fragments are reassembled (bounded: MaxFragmented
//     datagrams at once, FragmentTimeout) and decoded in the frame that
//     completes them, as tshark does. Frames cut by the snapshot length keep their headers
//     and the payload length of the wire; frames whose IP or UDP lengths lie
//     are malformed.
//   - Summary: the counts that `roce-emu decode` prints, per flow: resends
//     not counted as messages, UD keyed by DETH source QPN, epochs when a
//     QPN is reused, frames of other pcapng link types and IP fragments
//     counted, at most MaxFlows flows (beyond them untracked, or with
//     EvictFlows the least recently seen evicted and counted); Add returns each packet's Mark in
//     its flow (retransmission, duplicate, out-of-order).
//   - Package analyze (pcap/analyze) rebuilds connections and what
//     happened on each: what `roce-emu analyze` prints.
//
// Known gap: pcapng timestamps in binary units (if_tsresol 0x80|n, 2^-n s)
// are converted by gopacket with integer factors and lose precision: up to
// 0.35 ms off at 2^-10 and 2^-20, and up to 71 ms at 2^-30. Decimal units
// (micro- and nanoseconds, what capture tools write) are exact.
package pcap
