package pcap

import (
	"encoding/binary"
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/roce-emu/roce-emu/bth"
)

// Layer types for RoCEv2 transport headers. The numbers are above gopacket's
// own range and below nothing else in this module.
var (
	LayerTypeBTH          = gopacket.RegisterLayerType(4791, gopacket.LayerTypeMetadata{Name: "BTH", Decoder: gopacket.DecodeFunc(decodeRoCE)})
	LayerTypeDETH         = gopacket.RegisterLayerType(4792, gopacket.LayerTypeMetadata{Name: "DETH", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeRETH         = gopacket.RegisterLayerType(4793, gopacket.LayerTypeMetadata{Name: "RETH", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeAtomicETH    = gopacket.RegisterLayerType(4794, gopacket.LayerTypeMetadata{Name: "AtomicETH", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeAETH         = gopacket.RegisterLayerType(4795, gopacket.LayerTypeMetadata{Name: "AETH", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeAtomicAckETH = gopacket.RegisterLayerType(4796, gopacket.LayerTypeMetadata{Name: "AtomicAckETH", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeImmDt        = gopacket.RegisterLayerType(4797, gopacket.LayerTypeMetadata{Name: "ImmDt", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeIETH         = gopacket.RegisterLayerType(4798, gopacket.LayerTypeMetadata{Name: "IETH", Decoder: gopacket.DecodeFunc(decodeStandalone)})
	LayerTypeCNP          = gopacket.RegisterLayerType(4799, gopacket.LayerTypeMetadata{Name: "CNP", Decoder: gopacket.DecodeFunc(decodeStandalone)})
)

func init() {
	// gopacket's UDP layer picks the next layer by destination port, then
	// by source port; decodeRoCE refuses packets whose destination port is
	// not 4791, so RoCE is classified by destination port only.
	layers.RegisterUDPPortLayerType(bth.UDPPort, LayerTypeBTH)
	// gopacket decodes 802.1Q (0x8100) and 802.1ad (0x88A8) tags, stacked
	// to any depth; 0x9100, the QinQ TPID from before 802.1ad that
	// switches still send and tshark decodes as a VLAN tag, it does not.
	if m := &layers.EthernetTypeMetadata[0x9100]; m.DecodeWith == nil || m.LayerType == 0 {
		*m = layers.EthernetTypeMetadata[layers.EthernetTypeDot1Q]
		m.Name = "QinQ"
	}
}

// extLayerType maps each extended header to its layer type.
func extLayerType(e bth.Ext) gopacket.LayerType {
	switch e {
	case bth.ExtDETH:
		return LayerTypeDETH
	case bth.ExtRETH:
		return LayerTypeRETH
	case bth.ExtAtomicETH:
		return LayerTypeAtomicETH
	case bth.ExtAETH:
		return LayerTypeAETH
	case bth.ExtAtomicAckETH:
		return LayerTypeAtomicAckETH
	case bth.ExtImmDt:
		return LayerTypeImmDt
	case bth.ExtIETH:
		return LayerTypeIETH
	case bth.ExtCNP:
		return LayerTypeCNP
	}
	return gopacket.LayerTypeZero
}

// nextAfter returns the layer that follows header `after` (0: the BTH) in a
// packet with opcode op: the next extended header, the payload, or
// LayerTypeZero when nothing follows.
func nextAfter(op bth.Opcode, after bth.Ext) gopacket.LayerType {
	info := op.Info()
	if info == nil {
		return gopacket.LayerTypeZero
	}
	// Extended headers are bits in wire order, so the next one is the
	// lowest set bit above `after`.
	rest := info.Ext &^ (after | (after - 1))
	if after == 0 {
		rest = info.Ext
	}
	if rest != 0 {
		return extLayerType(rest & -rest)
	}
	if info.Payload {
		return gopacket.LayerTypePayload
	}
	return gopacket.LayerTypeZero
}

// BTH is the Base Transport Header as a gopacket layer. Contents is the 12
// header bytes; Payload is what follows up to the pad: the extended headers
// and the data. Pad and ICRC hold the trailer.
//
// As a DecodingLayer it needs the whole UDP payload. Its NextLayerType is
// the opcode's first extended header. Extended header layers learn the
// opcode from the BTH layer they are linked to (see Layers) or, when
// decoded by gopacket.NewPacket, from the packet.
type BTH struct {
	layers.BaseLayer
	bth.BTH
	Pad  []byte
	ICRC uint32 // the CRC value; little-endian on the wire

	// udp is the UDP layer of the DecodingLayerParser this BTH is in (see
	// NewLayers), to refuse datagrams whose destination port is not 4791.
	udp *layers.UDP
}

// LayerType returns LayerTypeBTH.
func (b *BTH) LayerType() gopacket.LayerType { return LayerTypeBTH }

// CanDecode returns LayerTypeBTH.
func (b *BTH) CanDecode() gopacket.LayerClass { return LayerTypeBTH }

// NextLayerType returns the layer of the opcode's first extended header, or
// gopacket.LayerTypePayload when it has none.
func (b *BTH) NextLayerType() gopacket.LayerType { return nextAfter(b.Opcode, 0) }

// DecodeFromBytes decodes data, a whole UDP payload (BTH to ICRC). It checks
// the lengths the opcode needs as bth.Packet.Decode does, and returns its
// errors. A BTH made by NewLayers with a UDP layer first refuses, with an
// error wrapping bth.ErrNotRoCE, a datagram whose destination port is not
// 4791.
func (b *BTH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if b.udp != nil && b.udp.DstPort != bth.UDPPort {
		return fmt.Errorf("pcap: UDP destination port %d: %w", b.udp.DstPort, bth.ErrNotRoCE)
	}
	var p bth.Packet
	if err := p.Decode(data); err != nil {
		if b.BTH.Decode(data) == nil {
			b.Contents = data[:bth.BTHLen]
		}
		if isTruncated(err) {
			df.SetTruncated()
		}
		return err
	}
	b.BTH = p.BTH
	end := len(data) - bth.ICRCLen
	payEnd := end - int(p.BTH.PadCnt)
	b.BaseLayer = layers.BaseLayer{Contents: data[:bth.BTHLen], Payload: data[bth.BTHLen:payEnd]}
	b.Pad = data[payEnd:end]
	b.ICRC = p.ICRC
	return nil
}

// SerializeTo prepends the BTH and appends pad and ICRC. The buffer holds
// the extended headers and payload already (gopacket serializes from the
// innermost layer out). With opts.FixLengths PadCnt is computed from the
// payload size; otherwise PadCnt pad bytes are written as given. The ICRC
// written is the ICRC field: the IP and UDP headers it covers are not known
// yet. Call SetICRC on the finished frame to fill it in.
func (b *BTH) SerializeTo(buf gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	info := b.Opcode.Info()
	if info == nil {
		return fmt.Errorf("pcap: cannot serialize BTH with unknown opcode %#x", uint8(b.Opcode))
	}
	if opts.FixLengths {
		n := len(buf.Bytes()) - info.Ext.Len()
		if n < 0 {
			return fmt.Errorf("pcap: %s needs %s before the payload", b.Opcode, info.Ext)
		}
		b.PadCnt = uint8(bth.PadLen(n))
	}
	if err := b.Check(); err != nil {
		return err
	}
	tail, err := buf.AppendBytes(int(b.PadCnt) + bth.ICRCLen)
	if err != nil {
		return err
	}
	clear(tail)
	binary.LittleEndian.PutUint32(tail[b.PadCnt:], b.ICRC)
	hdr, err := buf.PrependBytes(bth.BTHLen)
	if err != nil {
		return err
	}
	b.BTH.Append(hdr[:0])
	return nil
}

// ext is what every extended header layer shares: its link to the BTH for
// NextLayerType.
type ext struct {
	layers.BaseLayer
	bthLayer *BTH
	op       bth.Opcode
}

func (e *ext) opcode() bth.Opcode {
	if e.bthLayer != nil {
		return e.bthLayer.Opcode
	}
	return e.op
}

func (e *ext) split(data []byte, size int, name string, df gopacket.DecodeFeedback) error {
	if len(data) < size {
		df.SetTruncated()
		return &bth.DecodeError{Err: bth.ErrTruncated, Header: name, Opcode: e.opcode(), OpcodeKnown: true, Need: size, Have: len(data)}
	}
	e.BaseLayer = layers.BaseLayer{Contents: data[:size], Payload: data[size:]}
	return nil
}

func prepend(buf gopacket.SerializeBuffer, n int) ([]byte, error) {
	b, err := buf.PrependBytes(n)
	if err != nil {
		return nil, err
	}
	return b[:0], nil
}

// RETH is the RDMA Extended Transport Header as a gopacket layer.
type RETH struct {
	ext
	bth.RETH
}

func (l *RETH) LayerType() gopacket.LayerType     { return LayerTypeRETH }
func (l *RETH) CanDecode() gopacket.LayerClass    { return LayerTypeRETH }
func (l *RETH) NextLayerType() gopacket.LayerType { return nextAfter(l.opcode(), bth.ExtRETH) }
func (l *RETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.RETHLen, "RETH", df); err != nil {
		return err
	}
	return l.RETH.Decode(data)
}
func (l *RETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.RETHLen)
	if err == nil {
		l.RETH.Append(b)
	}
	return err
}

// AETH is the ACK Extended Transport Header as a gopacket layer.
type AETH struct {
	ext
	bth.AETH
}

func (l *AETH) LayerType() gopacket.LayerType     { return LayerTypeAETH }
func (l *AETH) CanDecode() gopacket.LayerClass    { return LayerTypeAETH }
func (l *AETH) NextLayerType() gopacket.LayerType { return nextAfter(l.opcode(), bth.ExtAETH) }
func (l *AETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.AETHLen, "AETH", df); err != nil {
		return err
	}
	return l.AETH.Decode(data)
}
func (l *AETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.AETHLen)
	if err == nil {
		l.AETH.Append(b)
	}
	return err
}

// DETH is the Datagram Extended Transport Header as a gopacket layer.
type DETH struct {
	ext
	bth.DETH
}

func (l *DETH) LayerType() gopacket.LayerType     { return LayerTypeDETH }
func (l *DETH) CanDecode() gopacket.LayerClass    { return LayerTypeDETH }
func (l *DETH) NextLayerType() gopacket.LayerType { return nextAfter(l.opcode(), bth.ExtDETH) }
func (l *DETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.DETHLen, "DETH", df); err != nil {
		return err
	}
	return l.DETH.Decode(data)
}
func (l *DETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.DETHLen)
	if err == nil {
		l.DETH.Append(b)
	}
	return err
}

// ImmDt is the Immediate Data header as a gopacket layer.
type ImmDt struct {
	ext
	bth.ImmDt
}

func (l *ImmDt) LayerType() gopacket.LayerType     { return LayerTypeImmDt }
func (l *ImmDt) CanDecode() gopacket.LayerClass    { return LayerTypeImmDt }
func (l *ImmDt) NextLayerType() gopacket.LayerType { return nextAfter(l.opcode(), bth.ExtImmDt) }
func (l *ImmDt) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.ImmDtLen, "ImmDt", df); err != nil {
		return err
	}
	return l.ImmDt.Decode(data)
}
func (l *ImmDt) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.ImmDtLen)
	if err == nil {
		l.ImmDt.Append(b)
	}
	return err
}

// IETH is the Invalidate Extended Transport Header as a gopacket layer.
type IETH struct {
	ext
	bth.IETH
}

func (l *IETH) LayerType() gopacket.LayerType     { return LayerTypeIETH }
func (l *IETH) CanDecode() gopacket.LayerClass    { return LayerTypeIETH }
func (l *IETH) NextLayerType() gopacket.LayerType { return nextAfter(l.opcode(), bth.ExtIETH) }
func (l *IETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.IETHLen, "IETH", df); err != nil {
		return err
	}
	return l.IETH.Decode(data)
}
func (l *IETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.IETHLen)
	if err == nil {
		l.IETH.Append(b)
	}
	return err
}

// AtomicETH is the Atomic Extended Transport Header as a gopacket layer.
type AtomicETH struct {
	ext
	bth.AtomicETH
}

func (l *AtomicETH) LayerType() gopacket.LayerType  { return LayerTypeAtomicETH }
func (l *AtomicETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicETH }
func (l *AtomicETH) NextLayerType() gopacket.LayerType {
	return nextAfter(l.opcode(), bth.ExtAtomicETH)
}
func (l *AtomicETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.AtomicETHLen, "AtomicETH", df); err != nil {
		return err
	}
	return l.AtomicETH.Decode(data)
}
func (l *AtomicETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.AtomicETHLen)
	if err == nil {
		l.AtomicETH.Append(b)
	}
	return err
}

// AtomicAckETH is the Atomic Acknowledge Extended Transport Header as a
// gopacket layer.
type AtomicAckETH struct {
	ext
	bth.AtomicAckETH
}

func (l *AtomicAckETH) LayerType() gopacket.LayerType  { return LayerTypeAtomicAckETH }
func (l *AtomicAckETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicAckETH }
func (l *AtomicAckETH) NextLayerType() gopacket.LayerType {
	return nextAfter(l.opcode(), bth.ExtAtomicAckETH)
}
func (l *AtomicAckETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.AtomicAckETHLen, "AtomicAckETH", df); err != nil {
		return err
	}
	return l.AtomicAckETH.Decode(data)
}
func (l *AtomicAckETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, bth.AtomicAckETHLen)
	if err == nil {
		l.AtomicAckETH.Append(b)
	}
	return err
}

// CNPLayer is the 16 reserved bytes that follow the BTH of a CNP (opcode
// 0x81, Annex A17.9.3). Reserved is what was on the wire; SerializeTo
// writes zeros.
type CNPLayer struct {
	ext
	Reserved [bth.CNPReservedLen]byte
}

func (l *CNPLayer) LayerType() gopacket.LayerType     { return LayerTypeCNP }
func (l *CNPLayer) CanDecode() gopacket.LayerClass    { return LayerTypeCNP }
func (l *CNPLayer) NextLayerType() gopacket.LayerType { return nextAfter(l.opcode(), bth.ExtCNP) }
func (l *CNPLayer) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := l.split(data, bth.CNPReservedLen, "CNP reserved", df); err != nil {
		return err
	}
	copy(l.Reserved[:], data)
	return nil
}
func (l *CNPLayer) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := buf.PrependBytes(bth.CNPReservedLen)
	if err == nil {
		clear(b)
	}
	return err
}

// Layers is a set of RoCEv2 decoding layers linked to one BTH, for a
// gopacket.DecodingLayerParser: the extended header layers read the opcode
// from l.BTH to know what follows them. Make one with NewLayers.
type Layers struct {
	BTH          BTH
	DETH         DETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	CNP          CNPLayer
}

// NewLayers returns a linked set of layers for a DecodingLayerParser whose
// UDP layer is udp.
//
// RoCEv2 is told by the UDP destination port alone, but gopacket's UDP
// layer picks the layer after it by destination port and then, when that
// port is not registered, by source port: a datagram from port 4791 to port
// 40000 would reach the BTH layer. Given the parser's *layers.UDP, the BTH
// layer checks its destination port and refuses such datagrams with an
// error wrapping bth.ErrNotRoCE (DecodeLayers returns it, after the UDP
// layer). With udp nil that check is off, and such datagrams decode as
// RoCEv2 when their bytes allow.
func NewLayers(udp *layers.UDP) *Layers {
	l := &Layers{}
	l.BTH.udp = udp
	for _, e := range l.exts() {
		e.bthLayer = &l.BTH
	}
	return l
}

func (l *Layers) exts() []*ext {
	return []*ext{&l.DETH.ext, &l.RETH.ext, &l.AtomicETH.ext, &l.AETH.ext, &l.AtomicAckETH.ext,
		&l.ImmDt.ext, &l.IETH.ext, &l.CNP.ext}
}

// DecodingLayers returns the layers to add to a DecodingLayerParser.
func (l *Layers) DecodingLayers() []gopacket.DecodingLayer {
	return []gopacket.DecodingLayer{&l.BTH, &l.DETH, &l.RETH, &l.AtomicETH, &l.AETH,
		&l.AtomicAckETH, &l.ImmDt, &l.IETH, &l.CNP}
}

// newExtLayer returns an unlinked layer for one extended header.
func newExtLayer(e bth.Ext, op bth.Opcode) gopacket.DecodingLayer {
	x := ext{op: op}
	switch e {
	case bth.ExtDETH:
		return &DETH{ext: x}
	case bth.ExtRETH:
		return &RETH{ext: x}
	case bth.ExtAtomicETH:
		return &AtomicETH{ext: x}
	case bth.ExtAETH:
		return &AETH{ext: x}
	case bth.ExtAtomicAckETH:
		return &AtomicAckETH{ext: x}
	case bth.ExtImmDt:
		return &ImmDt{ext: x}
	case bth.ExtIETH:
		return &IETH{ext: x}
	}
	return &CNPLayer{ext: x}
}

// decodeRoCE is LayerTypeBTH's decoder for gopacket.NewPacket. It refuses
// datagrams whose UDP destination port is not 4791 (gopacket would also try
// the source port), then adds the BTH and every extended header layer, and
// hands the rest to gopacket.LayerTypePayload.
func decodeRoCE(data []byte, p gopacket.PacketBuilder) error {
	if pk, ok := p.(gopacket.Packet); ok {
		if udp, ok := pk.TransportLayer().(*layers.UDP); ok && udp.DstPort != bth.UDPPort {
			return p.NextDecoder(gopacket.LayerTypePayload)
		}
	}
	b := &BTH{}
	err := b.DecodeFromBytes(data, p)
	if err != nil {
		return err
	}
	p.AddLayer(b)
	rest := b.Payload
	var last gopacket.DecodingLayer = b
	for e := bth.Ext(1); e != 0 && e <= bth.ExtCNP; e <<= 1 {
		if b.Opcode.Info().Ext&e == 0 {
			continue
		}
		l := newExtLayer(e, b.Opcode)
		if err := l.DecodeFromBytes(rest, p); err != nil {
			return err
		}
		p.AddLayer(l.(gopacket.Layer))
		rest = l.LayerPayload()
		last = l
	}
	if last.NextLayerType() == gopacket.LayerTypePayload && len(rest) > 0 {
		return p.NextDecoder(gopacket.LayerTypePayload)
	}
	return nil
}

// decodeStandalone decodes an extended header met without its BTH, which
// gopacket.NewPacket never does; it exists so that every layer type has a
// decoder.
func decodeStandalone(data []byte, p gopacket.PacketBuilder) error {
	return fmt.Errorf("pcap: an extended transport header cannot be decoded without its BTH")
}

func isTruncated(err error) bool {
	de, ok := err.(*bth.DecodeError)
	return ok && de.Err == bth.ErrTruncated
}
