package pcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/roce-emu/roce-emu/bth"
)

// Kind classifies a frame.
type Kind uint8

// Frame kinds.
const (
	// KindOther: not a UDP datagram to port 4791 (TCP, ARP, ICMP, other UDP,
	// IP fragments, or a frame too damaged to reach UDP).
	KindOther Kind = iota
	// KindRoCE: a UDP datagram to port 4791 whose transport headers decoded.
	KindRoCE
	// KindMalformed: a UDP datagram to port 4791 whose transport headers did
	// not decode; Record.Err says why.
	KindMalformed
	// KindFragment: an IPv4 or IPv6 fragment of a UDP datagram, held for
	// reassembly (or one that cannot be: cut by the snapshot length, or
	// too long). The frame whose fragment completes a datagram is decoded
	// as the whole datagram, with Record.Fragments set, as tshark decodes
	// it in the frame that completes it.
	KindFragment
)

// Record is one frame as Decoder sees it. Byte slices alias the frame.
type Record struct {
	Time          time.Time
	CaptureLength int // bytes in the capture
	Length        int // bytes on the wire
	Src, Dst      netip.Addr
	SrcPort       uint16
	DstPort       uint16
	TrafficClass  uint8 // IPv4 TOS or IPv6 traffic class
	ECN           bth.ECN
	HopLimit      uint8  // TTL or hop limit
	IPID          uint16 // IPv4 identification; 0 for IPv6
	DF            bool   // IPv4 don't fragment
	IPHeader      []byte
	UDPHeader     []byte
	// UDPPayload is the UDP payload the capture holds: all of it, or its
	// start when the snapshot length cut the frame.
	UDPPayload []byte
	// PayloadLen is the RoCEv2 payload length on the wire (without
	// headers, pad and ICRC) of a KindRoCE frame, also when the capture
	// holds only part of it (Packet.Payload is the part it holds); for a
	// KindMalformed frame, len(UDPPayload).
	PayloadLen int
	Packet     bth.Packet // valid when the kind is KindRoCE
	Err        error      // why a KindMalformed frame did not decode
	// ICRCChecked is false when the snapshot length cut the frame before
	// its ICRC, and for IPv6 with extension headers, which RoCEv2 does not
	// define the ICRC over.
	ICRCChecked  bool
	ICRCOK       bool
	ICRCComputed uint32 // the ICRC the headers and bytes give, when checked
	// Fragments is the number of frames holding IP fragments the
	// datagram was reassembled from (duplicates included); 0 for a
	// datagram that came whole. IPHeader is then
	// the first fragment's header with the total length of the whole
	// datagram and no MF flag or offset, as the sender computed the ICRC.
	Fragments int
}

// lengthError is a frame whose IP or UDP length fields contradict each
// other or the bytes of the frame. It wraps bth.ErrBadIPHeader.
type lengthError struct{ msg string }

func (e *lengthError) Error() string { return e.msg }
func (e *lengthError) Unwrap() error { return bth.ErrBadIPHeader }

func lengthErrorf(format string, args ...any) error {
	return &lengthError{fmt.Sprintf(format, args...)}
}

// Decoder turns frames into Records using gopacket's DecodingLayerParser for
// the link, IP and UDP layers and bth.Packet for the transport headers. It
// reuses its layers: decoding a valid RoCEv2 frame does not allocate, except
// for IPv4 options the first time and IPv6 extension header options (gopacket
// allocates those); malformed frames allocate their Record.Err. A Decoder is
// not safe for concurrent use.
//
// Frame kinds follow the lengths: a UDP datagram to the RoCEv2 port whose
// UDP length is under 8 or 0, exceeds what its IP header leaves it, or whose
// IP length exceeds the frame (or, for a frame the snapshot length cut, the
// frame's length on the wire) is KindMalformed with an error that says so.
// A frame cut by the snapshot length is KindRoCE when its transport headers
// are all present (bth.Packet.DecodePrefix): the ICRC is then unchecked and
// Record.PayloadLen is the length on the wire.
type Decoder struct {
	// Port is the UDP destination port that marks RoCEv2 (0: 4791), for
	// captures of peers that were told to use another.
	Port    uint16
	eth     layers.Ethernet
	dot1q   layers.Dot1Q
	sll     layers.LinuxSLL
	loop    layers.Loopback
	ip4     layers.IPv4
	ip6     layers.IPv6 // decodes a hop-by-hop header itself
	ip6dst  ipv6Destination
	udp     layers.UDP
	parsers map[gopacket.LayerType]*gopacket.DecodingLayerParser
	// lastFirst and lastParser cache the parser of the last frame: a
	// capture's frames mostly start with the same layer.
	lastFirst  gopacket.LayerType
	lastParser *gopacket.DecodingLayerParser
	decoded    []gopacket.LayerType
	// MaxFragmented bounds the IPv4 datagrams in reassembly at once (0:
	// DefaultMaxFragmented); the oldest is dropped for a new one.
	MaxFragmented int
	// FragmentTimeout drops a datagram in reassembly whose last fragment
	// is older, in capture time (0: DefaultFragmentTimeout).
	FragmentTimeout time.Duration
	frag            reassembler
	parserOnly      bool // tests: decode every frame with the parser
}

// FragmentsDropped returns the number of IPv4 datagrams dropped from
// reassembly before their last fragment came (timed out, evicted by
// MaxFragmented, or longer than 65535 bytes).
func (d *Decoder) FragmentsDropped() int { return d.frag.dropped }

// PendingFragments returns the number of datagrams still in reassembly.
func (d *Decoder) PendingFragments() int { return len(d.frag.pending) }

// ipv6Destination makes gopacket's IPv6 destination options header, which
// has DecodeFromBytes, a gopacket.DecodingLayer.
type ipv6Destination struct{ layers.IPv6Destination }

func (l *ipv6Destination) CanDecode() gopacket.LayerClass    { return layers.LayerTypeIPv6Destination }
func (l *ipv6Destination) NextLayerType() gopacket.LayerType { return l.NextHeader.LayerType() }

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{parsers: map[gopacket.LayerType]*gopacket.DecodingLayerParser{},
		decoded: make([]gopacket.LayerType, 0, 8)}
}

func (d *Decoder) parser(first gopacket.LayerType) *gopacket.DecodingLayerParser {
	if first == d.lastFirst && d.lastParser != nil {
		return d.lastParser
	}
	p := d.parsers[first]
	if p == nil {
		p = gopacket.NewDecodingLayerParser(first)
		// The sparse container finds a layer's decoder by indexing a
		// slice with its type, where the default map hashes it.
		dlc := gopacket.DecodingLayerContainer(gopacket.DecodingLayerSparse(nil))
		for _, l := range []gopacket.DecodingLayer{&d.eth, &d.dot1q, &d.sll, &d.loop, &d.ip4, &d.ip6, &d.ip6dst, &d.udp} {
			dlc = dlc.Put(l)
		}
		p.SetDecodingLayerContainer(dlc)
		p.IgnoreUnsupported = true
		d.parsers[first] = p
	}
	d.lastFirst, d.lastParser = first, p
	return p
}

// decodeEthernetIPv4UDP decodes the frame of nearly every RoCEv2 capture,
// Ethernet, IPv4 and UDP, with the layers and in the order the parser
// would, without its per-layer dispatch and deferred recover (a third of
// the time gopacket takes on such a frame). For any other frame, one of
// those layers refusing its bytes included, it reports false, and the
// parser decodes the frame again from its start: d.decoded and the layers
// end as the parser leaves them either way (the parser stops after UDP:
// no layer of its container follows UDP).
func (d *Decoder) decodeEthernetIPv4UDP(first gopacket.LayerType, body []byte) (ok bool) {
	if first != layers.LayerTypeEthernet || d.parserOnly {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false // the parser meets it again, and turns it into an error
		}
	}()
	nf := gopacket.NilDecodeFeedback // the parser's feedback (truncation) is not used either
	if d.eth.DecodeFromBytes(body, nf) != nil || d.eth.NextLayerType() != layers.LayerTypeIPv4 ||
		d.ip4.DecodeFromBytes(d.eth.Payload, nf) != nil || d.ip4.NextLayerType() != layers.LayerTypeUDP ||
		d.udp.DecodeFromBytes(d.ip4.Payload, nf) != nil {
		return false
	}
	d.decoded = append(d.decoded, layers.LayerTypeEthernet, layers.LayerTypeIPv4, layers.LayerTypeUDP)
	return true
}

// sll2Len is the Linux cooked capture v2 header: protocol type (2 bytes,
// an EtherType), reserved (2), interface index (4), ARPHRD type (2), packet
// type (1), address length (1), address (8).
const sll2Len = 20

// firstLayer picks the layer a frame of link type lt starts with and the
// bytes it starts at; LayerTypeZero when there is none Decoder knows.
func firstLayer(lt LinkType, data []byte) (gopacket.LayerType, []byte) {
	switch lt {
	case LinkTypeEthernet:
		return layers.LayerTypeEthernet, data
	case LinkTypeLinuxSLL:
		return layers.LayerTypeLinuxSLL, data
	case LinkTypeLinuxSLL2:
		if len(data) < sll2Len {
			return gopacket.LayerTypeZero, nil
		}
		switch layers.EthernetType(binary.BigEndian.Uint16(data)) {
		case layers.EthernetTypeIPv4:
			return layers.LayerTypeIPv4, data[sll2Len:]
		case layers.EthernetTypeIPv6:
			return layers.LayerTypeIPv6, data[sll2Len:]
		}
	case LinkTypeNull, LinkTypeLoop:
		return layers.LayerTypeLoopback, data
	case LinkTypeIPv4:
		return layers.LayerTypeIPv4, data
	case LinkTypeIPv6:
		return layers.LayerTypeIPv6, data
	case LinkTypeRaw, LinkTypeRawDLT:
		if len(data) > 0 && data[0]>>4 == 6 {
			return layers.LayerTypeIPv6, data
		}
		return layers.LayerTypeIPv4, data
	}
	return gopacket.LayerTypeZero, nil
}

// offset returns where sub, a slice of frame, starts in it.
func offset(frame, sub []byte) int { return cap(frame) - cap(sub) }

// Decode classifies one frame of link type lt and fills rec. ci gives the
// timestamp and the frame's length on the wire: a frame with fewer bytes
// than ci.Length was cut by the snapshot length. The returned error is
// ErrLinkType for a link type that SupportedLinkType refuses; frames that
// are merely not RoCE, or malformed, are reported through the Kind and
// rec.Err.
func (d *Decoder) Decode(data []byte, ci gopacket.CaptureInfo, lt LinkType, rec *Record) (Kind, error) {
	*rec = Record{}
	rec.Time, rec.CaptureLength, rec.Length = ci.Timestamp, ci.CaptureLength, ci.Length
	if !SupportedLinkType(lt) {
		return KindOther, ErrLinkType
	}
	first, body := firstLayer(lt, data)
	if first == gopacket.LayerTypeZero {
		return KindOther, nil // SLL2 of another protocol, or too short
	}
	d.ip6dst.Options = d.ip6dst.Options[:0] // gopacket only ever appends to them
	d.decoded = d.decoded[:0]
	if !d.decodeEthernetIPv4UDP(first, body) {
		// Errors from gopacket mean a layer was damaged; what was
		// decoded before it is still in d.decoded.
		_ = d.parser(first).DecodeLayers(body, &d.decoded)
	}
	var (
		ipOK, udpOK bool
		ext6        bool   // IPv6 extension headers before UDP
		ipEnd       int    // where the IP datagram ends in data, by its length field
		ipName      string // that length field, for errors
		ipLen       int
		udpBytes    []byte // what the IP layer holds after its headers
		next        gopacket.LayerType
	)
	for _, t := range d.decoded {
		switch t {
		case layers.LayerTypeIPv4:
			if d.ip4.Version != 4 {
				return KindOther, nil // gopacket does not look
			}
			ipOK = true
			rec.Src, _ = netip.AddrFromSlice(d.ip4.SrcIP.To4())
			rec.Dst, _ = netip.AddrFromSlice(d.ip4.DstIP.To4())
			rec.TrafficClass = d.ip4.TOS
			rec.HopLimit = d.ip4.TTL
			rec.IPID = d.ip4.Id
			rec.DF = d.ip4.Flags&layers.IPv4DontFragment != 0
			rec.IPHeader = d.ip4.Contents
			ipLen, ipName = int(d.ip4.Length), "IPv4 total length"
			ipEnd = offset(data, d.ip4.Contents) + ipLen
			udpBytes, next, ext6 = d.ip4.Payload, d.ip4.NextLayerType(), false
		case layers.LayerTypeIPv6:
			if d.ip6.Version != 6 {
				return KindOther, nil
			}
			ipOK = true
			rec.Src, _ = netip.AddrFromSlice(d.ip6.SrcIP)
			rec.Dst, _ = netip.AddrFromSlice(d.ip6.DstIP)
			rec.TrafficClass = d.ip6.TrafficClass
			rec.HopLimit = d.ip6.HopLimit
			rec.IPID, rec.DF = 0, false
			rec.IPHeader = d.ip6.Contents
			ipLen, ipName = int(d.ip6.Length), "IPv6 payload length"
			ipEnd = offset(data, d.ip6.Contents) + len(d.ip6.Contents) + ipLen
			udpBytes, next, ext6 = d.ip6.Payload, d.ip6.NextLayerType(), d.ip6.HopByHop != nil
		case layers.LayerTypeIPv6Destination:
			udpBytes, next, ext6 = d.ip6dst.Payload, d.ip6dst.NextHeader.LayerType(), true
		case layers.LayerTypeUDP:
			udpOK = true
		}
	}
	rec.ECN = bth.ECN(rec.TrafficClass & 3)
	if !ipOK {
		return KindOther, nil
	}
	if next == gopacket.LayerTypeFragment && rec.Src.Is4() && len(rec.IPHeader) >= 20 && d.ip4.Version == 4 {
		return d.fragment(data, ci, rec)
	}
	if next == layers.LayerTypeIPv6Fragment && !ext6 && len(udpBytes) >= 8 {
		return d.fragment6(data, ci, rec, udpBytes)
	}
	port := d.Port
	if port == 0 {
		port = bth.UDPPort
	}
	cut := len(data) < ci.Length
	have, where := len(data), "present"
	if cut {
		have, where = ci.Length, "the frame had on the wire"
	}
	if !udpOK {
		// gopacket refuses a UDP header cut short or a UDP length of 1-7:
		// to the RoCEv2 port that is a malformed RoCEv2 packet.
		if next != layers.LayerTypeUDP || len(udpBytes) < 4 || binary.BigEndian.Uint16(udpBytes[2:]) != port {
			return KindOther, nil
		}
		rec.SrcPort, rec.DstPort = binary.BigEndian.Uint16(udpBytes), port
		rec.UDPHeader = udpBytes[:min(len(udpBytes), 8)]
		switch {
		case len(udpBytes) < 8 && ipEnd > have:
			rec.Err = lengthErrorf("%s %d exceeds the %d bytes %s", ipName, ipLen, have-(ipEnd-ipLen), where)
		case len(udpBytes) < 8 && offset(data, udpBytes)+len(udpBytes) < ipEnd:
			rec.Err = lengthErrorf("UDP header cut after %d of its 8 bytes", len(udpBytes))
		case len(udpBytes) < 8:
			rec.Err = lengthErrorf("the %s %d leaves %d bytes for the 8-byte UDP header", ipName, ipLen, len(udpBytes))
		default:
			rec.Err = lengthErrorf("UDP length %d is less than the 8 bytes of its header", binary.BigEndian.Uint16(udpBytes[4:]))
		}
		return KindMalformed, nil
	}
	rec.SrcPort, rec.DstPort = uint16(d.udp.SrcPort), uint16(d.udp.DstPort)
	if rec.DstPort != port {
		return KindOther, nil
	}
	rec.UDPHeader = d.udp.Contents
	rec.UDPPayload = d.udp.Payload
	rec.PayloadLen = len(rec.UDPPayload)
	udpLen := int(d.udp.Length)
	udpOff := offset(data, d.udp.Contents)
	switch {
	case udpLen == 0:
		rec.Err = lengthErrorf("UDP length 0")
	case udpOff+udpLen > ipEnd:
		rec.Err = lengthErrorf("UDP length %d exceeds the %d bytes the %s %d leaves it", udpLen, max(ipEnd-udpOff, 0), ipName, ipLen)
	case ipEnd > have:
		rec.Err = lengthErrorf("%s %d exceeds the %d bytes %s", ipName, ipLen, have-(ipEnd-ipLen), where)
	}
	if rec.Err != nil {
		return KindMalformed, nil
	}
	if len(rec.UDPHeader)+len(rec.UDPPayload) < udpLen {
		// Cut by the snapshot length (the checks above leave no other
		// way): the headers present, the payload length on the wire.
		total := udpLen - bth.UDPLen
		if err := rec.Packet.DecodePrefix(rec.UDPPayload, total); err != nil {
			rec.Err = err
			return KindMalformed, nil
		}
		h := &rec.Packet.BTH
		rec.PayloadLen = total - bth.BTHLen - h.Opcode.Info().Ext.Len() - int(h.PadCnt) - bth.ICRCLen
		return KindRoCE, nil
	}
	if err := rec.Packet.Decode(rec.UDPPayload); err != nil {
		rec.Err = err
		return KindMalformed, nil
	}
	rec.PayloadLen = len(rec.Packet.Payload)
	if ext6 {
		return KindRoCE, nil // the ICRC is not defined over IPv6 extension headers
	}
	_, want, err := bth.VerifyICRC(rec.IPHeader, rec.UDPHeader, rec.UDPPayload)
	rec.ICRCChecked = err == nil || errors.Is(err, bth.ErrBadICRC)
	rec.ICRCOK = err == nil
	rec.ICRCComputed = want
	return KindRoCE, nil
}

// fragment handles an IPv4 fragment (d.ip4): UDP fragments are held, and
// the one that completes a datagram decodes it.
func (d *Decoder) fragment(data []byte, ci gopacket.CaptureInfo, rec *Record) (Kind, error) {
	ip := &d.ip4
	if ip.Protocol != layers.IPProtocolUDP {
		return KindOther, nil
	}
	if len(data) < ci.Length || len(ip.Payload) != int(ip.Length)-len(ip.Contents) {
		return KindFragment, nil // cut by the snapshot length, or lengths that lie
	}
	d.fragDefaults()
	key := fragKey{rec.Src, rec.Dst, uint32(ip.Id), uint8(ip.Protocol)}
	whole, n := d.frag.fragment(key, ip.Contents, ip.Payload, int(ip.FragOffset)*8,
		ip.Flags&layers.IPv4MoreFragments != 0, ci.Timestamp)
	return d.reassembled(whole, n, ci, rec, LinkTypeIPv4)
}

// fragment6 handles an IPv6 fragment whose Fragment header (RFC 8200
// section 4.5) follows the fixed header: UDP fragments are held, and the
// one that completes a datagram decodes it, as the IPv6 datagram without
// the Fragment header.
func (d *Decoder) fragment6(data []byte, ci gopacket.CaptureInfo, rec *Record, fh []byte) (Kind, error) {
	// Next Header (1), reserved (1), offset (13 bits) | res (2) | M (1),
	// Identification (4).
	if layers.IPProtocol(fh[0]) != layers.IPProtocolUDP {
		return KindOther, nil
	}
	if len(data) < ci.Length || len(d.ip6.Payload) != int(d.ip6.Length) {
		return KindFragment, nil
	}
	d.fragDefaults()
	hdr := append(d.frag.hdr6[:0], d.ip6.Contents...)
	hdr[6] = fh[0] // the Fragment header goes: its Next Header takes its place
	off := int(binary.BigEndian.Uint16(fh[2:]) &^ 7)
	key := fragKey{rec.Src, rec.Dst, binary.BigEndian.Uint32(fh[4:]), fh[0]}
	whole, n := d.frag.fragment(key, hdr, fh[8:], off, fh[3]&1 != 0, ci.Timestamp)
	return d.reassembled(whole, n, ci, rec, LinkTypeIPv6)
}

func (d *Decoder) fragDefaults() {
	if d.frag.max == 0 {
		d.frag.max = d.MaxFragmented
		if d.frag.max <= 0 {
			d.frag.max = DefaultMaxFragmented
		}
		d.frag.timeout = d.FragmentTimeout
		if d.frag.timeout <= 0 {
			d.frag.timeout = DefaultFragmentTimeout
		}
	}
}

// reassembled decodes a datagram reassembled in the frame rec describes.
func (d *Decoder) reassembled(whole []byte, n int, ci gopacket.CaptureInfo, rec *Record, lt LinkType) (Kind, error) {
	if whole == nil {
		return KindFragment, nil
	}
	frame := *rec
	k, err := d.Decode(whole, gopacket.CaptureInfo{Timestamp: ci.Timestamp, CaptureLength: len(whole), Length: len(whole)}, lt, rec)
	rec.CaptureLength, rec.Length = frame.CaptureLength, frame.Length
	rec.Fragments = n
	if k == KindRoCE && rec.ICRCChecked && !rec.ICRCOK && !rec.DF && lt == LinkTypeIPv4 {
		// The DF bit of the datagram before fragmentation is lost: a
		// RoCEv2 sender sets it (and computes the ICRC with it), and
		// whatever fragmented the datagram cleared it. Try it set.
		rec.IPHeader[6] |= 0x40
		if _, want, err := bth.VerifyICRC(rec.IPHeader, rec.UDPHeader, rec.UDPPayload); err == nil {
			rec.ICRCOK, rec.ICRCComputed = true, want
		} else {
			rec.IPHeader[6] &^= 0x40
		}
	}
	return k, err
}
