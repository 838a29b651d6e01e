package pcap

import (
	"errors"
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
	UDPPayload    []byte
	Packet        bth.Packet // valid when the kind is KindRoCE
	Err           error      // why a KindMalformed frame did not decode
	ICRCChecked   bool       // false when the frame was cut short by the snapshot length
	ICRCOK        bool
	ICRCComputed  uint32 // the ICRC the headers and bytes give, when checked
}

// Decoder turns frames into Records using gopacket's DecodingLayerParser for
// the link, IP and UDP layers and bth.Packet for the transport headers. It
// reuses its layers: decoding does not allocate. A Decoder is not safe for
// concurrent use.
type Decoder struct {
	// Port is the UDP destination port that marks RoCEv2 (0: 4791), for
	// captures of peers that were told to use another.
	Port    uint16
	eth     layers.Ethernet
	dot1q   layers.Dot1Q
	sll     layers.LinuxSLL
	loop    layers.Loopback
	ip4     layers.IPv4
	ip6     layers.IPv6
	udp     layers.UDP
	parsers map[gopacket.LayerType]*gopacket.DecodingLayerParser
	decoded []gopacket.LayerType
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{parsers: map[gopacket.LayerType]*gopacket.DecodingLayerParser{},
		decoded: make([]gopacket.LayerType, 0, 8)}
}

func (d *Decoder) parser(first gopacket.LayerType) *gopacket.DecodingLayerParser {
	p := d.parsers[first]
	if p == nil {
		p = gopacket.NewDecodingLayerParser(first, &d.eth, &d.dot1q, &d.sll, &d.loop, &d.ip4, &d.ip6, &d.udp)
		p.IgnoreUnsupported = true
		d.parsers[first] = p
	}
	return p
}

// firstLayer picks the layer a frame of link type lt starts with.
func firstLayer(lt layers.LinkType, data []byte) gopacket.LayerType {
	switch lt {
	case layers.LinkTypeEthernet:
		return layers.LayerTypeEthernet
	case layers.LinkTypeLinuxSLL:
		return layers.LayerTypeLinuxSLL
	case layers.LinkTypeNull, layers.LinkTypeLoop:
		return layers.LayerTypeLoopback
	case layers.LinkTypeIPv4:
		return layers.LayerTypeIPv4
	case layers.LinkTypeIPv6:
		return layers.LayerTypeIPv6
	case layers.LinkTypeRaw, 12:
		if len(data) > 0 && data[0]>>4 == 6 {
			return layers.LayerTypeIPv6
		}
		return layers.LayerTypeIPv4
	}
	return gopacket.LayerTypeZero
}

// Decode classifies one frame of link type lt and fills rec. ci gives the
// timestamp and lengths. The returned error is ErrLinkType for a link type
// that SupportedLinkType refuses; frames that are merely not RoCE, or
// malformed, are reported through the Kind and rec.Err.
func (d *Decoder) Decode(data []byte, ci gopacket.CaptureInfo, lt layers.LinkType, rec *Record) (Kind, error) {
	*rec = Record{Time: ci.Timestamp, CaptureLength: ci.CaptureLength, Length: ci.Length}
	first := firstLayer(lt, data)
	if first == gopacket.LayerTypeZero {
		return KindOther, ErrLinkType
	}
	d.decoded = d.decoded[:0]
	// Errors from gopacket mean a layer below UDP was damaged; what was
	// decoded before it is still in d.decoded.
	_ = d.parser(first).DecodeLayers(data, &d.decoded)
	var ipOK, udpOK bool
	for _, t := range d.decoded {
		switch t {
		case layers.LayerTypeIPv4:
			ipOK = true
			rec.Src, _ = netip.AddrFromSlice(d.ip4.SrcIP.To4())
			rec.Dst, _ = netip.AddrFromSlice(d.ip4.DstIP.To4())
			rec.TrafficClass = d.ip4.TOS
			rec.HopLimit = d.ip4.TTL
			rec.IPID = d.ip4.Id
			rec.DF = d.ip4.Flags&layers.IPv4DontFragment != 0
			rec.IPHeader = d.ip4.Contents
		case layers.LayerTypeIPv6:
			ipOK = true
			rec.Src, _ = netip.AddrFromSlice(d.ip6.SrcIP)
			rec.Dst, _ = netip.AddrFromSlice(d.ip6.DstIP)
			rec.TrafficClass = d.ip6.TrafficClass
			rec.HopLimit = d.ip6.HopLimit
			rec.IPHeader = d.ip6.Contents
		case layers.LayerTypeUDP:
			udpOK = true
		}
	}
	rec.ECN = bth.ECN(rec.TrafficClass & 3)
	if !ipOK || !udpOK {
		return KindOther, nil
	}
	rec.SrcPort, rec.DstPort = uint16(d.udp.SrcPort), uint16(d.udp.DstPort)
	port := d.Port
	if port == 0 {
		port = bth.UDPPort
	}
	if rec.DstPort != port {
		return KindOther, nil
	}
	rec.UDPHeader = d.udp.Contents
	rec.UDPPayload = d.udp.Payload
	if err := rec.Packet.Decode(rec.UDPPayload); err != nil {
		rec.Err = err
		return KindMalformed, nil
	}
	if ci.CaptureLength < ci.Length || int(d.udp.Length) != len(d.udp.Contents)+len(d.udp.Payload) {
		return KindRoCE, nil // cut short: the ICRC covers bytes we do not have
	}
	_, want, err := bth.VerifyICRC(rec.IPHeader, rec.UDPHeader, rec.UDPPayload)
	rec.ICRCChecked = err == nil || errors.Is(err, bth.ErrBadICRC)
	rec.ICRCOK = err == nil
	rec.ICRCComputed = want
	return KindRoCE, nil
}
