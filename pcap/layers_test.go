package pcap

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	macA = [6]byte{0x02, 0, 0, 0, 0, 0x0a}
	macB = [6]byte{0x02, 0, 0, 0, 0, 0x0b}
)

func encap4() *bth.Encap {
	return &bth.Encap{SrcMAC: macA, DstMAC: macB, Src: netip.MustParseAddr("192.0.2.1"),
		Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 0xC123, TrafficClass: bth.TrafficClass(26, bth.ECT0)}
}

func encap6() *bth.Encap {
	return &bth.Encap{SrcMAC: macA, DstMAC: macB, Src: netip.MustParseAddr("2001:db8::1"),
		Dst: netip.MustParseAddr("2001:db8::2"), SrcPort: 0xC456, TrafficClass: 0x62, FlowLabel: 0xABCDE, HopLimit: 7}
}

// samplePacket fills every header with distinct values, so that the
// opcode's own headers are told apart.
func samplePacket(op bth.Opcode, payload int) *bth.Packet {
	p := &bth.Packet{
		BTH:          bth.BTH{Opcode: op, PKey: 0xFFFF, DestQP: 0xABCDEF, PSN: 0xFFFFFF, AckReq: true},
		DETH:         bth.DETH{QKey: 0x11111111, SrcQP: 0x222222},
		RETH:         bth.RETH{VA: 0x3333333333333330, RKey: 0x44444444, DMALength: uint32(payload)},
		AtomicETH:    bth.AtomicETH{VA: 0x5555555555555550, RKey: 0x66666666, SwapAdd: 0x7777777777777777, Compare: 0x8888888888888888},
		AETH:         bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 0x999999},
		AtomicAckETH: 0xAAAAAAAAAAAAAAAA,
		ImmDt:        0xBBBBBBBB,
		IETH:         0xCCCCCCCC,
	}
	if op.Info().Payload {
		p.Payload = make([]byte, payload)
		for i := range p.Payload {
			p.Payload[i] = byte(i*7 + 1)
		}
	}
	return p
}

// wantLayers is the layer sequence gopacket must show after UDP.
func wantLayers(op bth.Opcode, payload int) []gopacket.LayerType {
	want := []gopacket.LayerType{LayerTypeBTH}
	op.Info().Ext.Each(func(e bth.Ext, _ int, _ string) { want = append(want, extLayerType(e)) })
	if op.Info().Payload && payload > 0 {
		want = append(want, gopacket.LayerTypePayload)
	}
	return want
}

func layerTypes(ls []gopacket.Layer) []gopacket.LayerType {
	var out []gopacket.LayerType
	for _, l := range ls {
		out = append(out, l.LayerType())
	}
	return out
}

// assertExt checks that pk's layer of type lt, where it has one, is an L
// that holds the extended header want.
func assertExt[L gopacket.Layer, H any](t *testing.T, pk gopacket.Packet, lt gopacket.LayerType, want H, header func(L) H) {
	t.Helper()
	if l, ok := pk.Layer(lt).(L); ok {
		assert.Equal(t, want, header(l))
	}
}

func TestLayersNewPacketEveryOpcode(t *testing.T) {
	for _, e := range []*bth.Encap{encap4(), encap6()} {
		for _, op := range bth.Opcodes() {
			for _, n := range []int{0, 1, 3, 1024} {
				p := samplePacket(op, n)
				frame, err := e.AppendFrame(nil, p)
				require.NoError(t, err)
				pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
				require.Nil(t, pk.ErrorLayer(), "%s n=%d: %v", op, n, pk.ErrorLayer())
				got := layerTypes(pk.Layers())[3:] // after Ethernet, IP, UDP
				assert.Equal(t, wantLayers(op, n), got, "%s n=%d", op, n)

				b := pk.Layer(LayerTypeBTH).(*BTH)
				assert.Equal(t, op, b.Opcode)
				assert.Equal(t, bth.PSN(0xFFFFFF), b.PSN)
				assert.Equal(t, uint32(0xABCDEF), b.DestQP)
				assert.Equal(t, uint8(bth.PadLen(len(p.Payload))), b.PadCnt)
				assert.Len(t, b.Pad, int(b.PadCnt))
				assertExt(t, pk, LayerTypeRETH, p.RETH, func(l *RETH) bth.RETH { return l.RETH })
				assertExt(t, pk, LayerTypeAETH, p.AETH, func(l *AETH) bth.AETH { return l.AETH })
				assertExt(t, pk, LayerTypeDETH, p.DETH, func(l *DETH) bth.DETH { return l.DETH })
				assertExt(t, pk, LayerTypeAtomicETH, p.AtomicETH, func(l *AtomicETH) bth.AtomicETH { return l.AtomicETH })
				assertExt(t, pk, LayerTypeAtomicAckETH, p.AtomicAckETH, func(l *AtomicAckETH) bth.AtomicAckETH { return l.AtomicAckETH })
				assertExt(t, pk, LayerTypeImmDt, p.ImmDt, func(l *ImmDt) bth.ImmDt { return l.ImmDt })
				assertExt(t, pk, LayerTypeIETH, p.IETH, func(l *IETH) bth.IETH { return l.IETH })
				if n > 0 && op.Info().Payload {
					assert.Equal(t, p.Payload, pk.ApplicationLayer().Payload())
				}
			}
		}
	}
}

func TestLayersDecodingLayerParser(t *testing.T) {
	var eth layers.Ethernet
	var ip4 layers.IPv4
	var ip6 layers.IPv6
	var udp layers.UDP
	var pay gopacket.Payload
	rl := NewLayers(&udp)
	dl := append([]gopacket.DecodingLayer{&eth, &ip4, &ip6, &udp, &pay}, rl.DecodingLayers()...)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, dl...)
	decoded := make([]gopacket.LayerType, 0, 16)
	for _, op := range bth.Opcodes() {
		p := samplePacket(op, 5)
		frame, err := encap4().AppendFrame(nil, p)
		require.NoError(t, err)
		require.NoError(t, parser.DecodeLayers(frame, &decoded), "%s", op)
		assert.Equal(t, wantLayers(op, 5), decoded[3:], "%s", op)
		if op.Info().Payload {
			assert.Equal(t, p.Payload, []byte(pay))
		}
		if op.Info().Ext&bth.ExtAtomicETH != 0 {
			assert.Equal(t, p.AtomicETH, rl.AtomicETH.AtomicETH)
		}
		allocs := testing.AllocsPerRun(50, func() { _ = parser.DecodeLayers(frame, &decoded) })
		assert.Zero(t, allocs, "%s: DecodingLayerParser with our layers allocates", op)
	}
}

// SerializeLayers with our layers, then SetICRC, gives the same bytes as
// bth.Encap.AppendFrame.
func TestLayersSerialize(t *testing.T) {
	for _, op := range bth.Opcodes() {
		p := samplePacket(op, 7)
		e := encap4()
		want, err := e.AppendFrame(nil, p)
		require.NoError(t, err)

		ip := &layers.IPv4{Version: 4, IHL: 5, TOS: e.TrafficClass, Flags: layers.IPv4DontFragment, TTL: 64,
			Protocol: layers.IPProtocolUDP, SrcIP: net.IP(e.Src.AsSlice()), DstIP: net.IP(e.Dst.AsSlice())}
		udp := &layers.UDP{SrcPort: layers.UDPPort(e.SrcPort), DstPort: bth.UDPPort}
		require.NoError(t, udp.SetNetworkLayerForChecksum(ip))
		ls := []gopacket.SerializableLayer{
			&layers.Ethernet{SrcMAC: net.HardwareAddr(macA[:]), DstMAC: net.HardwareAddr(macB[:]), EthernetType: layers.EthernetTypeIPv4},
			ip, udp, &BTH{BTH: p.BTH},
		}
		op.Info().Ext.Each(func(x bth.Ext, _ int, _ string) {
			switch x {
			case bth.ExtDETH:
				ls = append(ls, &DETH{DETH: p.DETH})
			case bth.ExtRETH:
				ls = append(ls, &RETH{RETH: p.RETH})
			case bth.ExtAtomicETH:
				ls = append(ls, &AtomicETH{AtomicETH: p.AtomicETH})
			case bth.ExtAETH:
				ls = append(ls, &AETH{AETH: p.AETH})
			case bth.ExtAtomicAckETH:
				ls = append(ls, &AtomicAckETH{AtomicAckETH: p.AtomicAckETH})
			case bth.ExtImmDt:
				ls = append(ls, &ImmDt{ImmDt: p.ImmDt})
			case bth.ExtIETH:
				ls = append(ls, &IETH{IETH: p.IETH})
			case bth.ExtCNP:
				ls = append(ls, &CNPLayer{})
			}
		})
		if len(p.Payload) > 0 {
			ls = append(ls, gopacket.Payload(p.Payload))
		}
		buf := gopacket.NewSerializeBuffer()
		require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...))
		got := buf.Bytes()
		// RoCEv2 senders put 0 in the UDP checksum (rxe does); gopacket
		// computed one. It is masked in the ICRC either way.
		got[bth.EthernetLen+bth.IPv4Len+6], got[bth.EthernetLen+bth.IPv4Len+7] = 0, 0
		require.NoError(t, SetICRC(got))
		assert.Equal(t, want, got, "%s", op)
	}
}

// Classification is by UDP destination port only: a datagram from port
// 4791 to another port is not RoCE.
func TestLayersSourcePort4791IsNotRoCE(t *testing.T) {
	e := encap4()
	e.SrcPort, e.DstPort = bth.UDPPort, 5000
	frame, err := e.AppendFrame(nil, samplePacket(bth.RCSendOnly, 8))
	require.NoError(t, err)
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	assert.Nil(t, pk.Layer(LayerTypeBTH))
	assert.NotNil(t, pk.Layer(gopacket.LayerTypePayload))

	var r Record
	k, err := NewDecoder().Decode(frame, gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}, LinkTypeEthernet, &r)
	require.NoError(t, err)
	assert.Equal(t, KindOther, k)
}

// In a DecodingLayerParser, gopacket's UDP layer falls back to the source
// port: a datagram from 4791 to 40000 would reach the BTH layer, which
// refuses it when NewLayers was given the parser's UDP layer.
func TestLayersParserSourcePort4791IsNotRoCE(t *testing.T) {
	var eth layers.Ethernet
	var ip4 layers.IPv4
	var udp layers.UDP
	var pay gopacket.Payload
	e := encap4()
	e.SrcPort, e.DstPort = bth.UDPPort, 40000
	frame, err := e.AppendFrame(nil, samplePacket(bth.RCSendOnly, 8))
	require.NoError(t, err)
	decoded := make([]gopacket.LayerType, 0, 8)

	rl := NewLayers(&udp)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, append([]gopacket.DecodingLayer{&eth, &ip4, &udp, &pay}, rl.DecodingLayers()...)...)
	err = parser.DecodeLayers(frame, &decoded)
	assert.ErrorIs(t, err, bth.ErrNotRoCE)
	assert.Equal(t, []gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeIPv4, layers.LayerTypeUDP}, decoded)

	// To port 4791 from 40000 it decodes.
	e.SrcPort, e.DstPort = 40000, bth.UDPPort
	frame, err = e.AppendFrame(nil, samplePacket(bth.RCSendOnly, 8))
	require.NoError(t, err)
	require.NoError(t, parser.DecodeLayers(frame, &decoded))
	assert.Equal(t, wantLayers(bth.RCSendOnly, 8), decoded[3:])

	// Without the UDP layer the check is off: gopacket's fallback wins.
	e.SrcPort, e.DstPort = bth.UDPPort, 40000
	frame, err = e.AppendFrame(nil, samplePacket(bth.RCSendOnly, 8))
	require.NoError(t, err)
	rl = NewLayers(nil)
	parser = gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, append([]gopacket.DecodingLayer{&eth, &ip4, &udp, &pay}, rl.DecodingLayers()...)...)
	require.NoError(t, parser.DecodeLayers(frame, &decoded))
	assert.Contains(t, decoded, LayerTypeBTH)
}

func TestLayersMalformed(t *testing.T) {
	frame, err := encap4().AppendFrame(nil, samplePacket(bth.RCWriteOnly, 0))
	require.NoError(t, err)
	// Cut the RETH short but keep IP and UDP lengths consistent.
	cut := frame[:bth.EthernetLen+bth.IPv4Len+bth.UDPLen+bth.BTHLen+6]
	fixLengths(cut)
	pk := gopacket.NewPacket(cut, layers.LayerTypeEthernet, gopacket.Default)
	require.NotNil(t, pk.ErrorLayer())
	assert.ErrorIs(t, pk.ErrorLayer().Error(), bth.ErrTruncated)

	var r Record
	k, err := NewDecoder().Decode(cut, gopacket.CaptureInfo{CaptureLength: len(cut), Length: len(cut)}, LinkTypeEthernet, &r)
	require.NoError(t, err)
	assert.Equal(t, KindMalformed, k)
	assert.ErrorIs(t, r.Err, bth.ErrTruncated)
}

// fixLengths rewrites the IPv4 total length and UDP length of an Ethernet
// frame to match its size (the IPv4 checksum is left stale).
func fixLengths(frame []byte) {
	ip := frame[bth.EthernetLen:]
	n := len(ip)
	ip[2], ip[3] = byte(n>>8), byte(n)
	u := ip[bth.IPv4Len:]
	m := len(u)
	u[4], u[5] = byte(m>>8), byte(m)
}
