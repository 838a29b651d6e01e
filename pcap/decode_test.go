package pcap

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/google/gopacket"
	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Offsets in an Ethernet/IPv4/UDP frame from bth.Encap.
const (
	ip4At  = bth.EthernetLen
	udp4At = bth.EthernetLen + bth.IPv4Len
	roce4  = udp4At + bth.UDPLen
)

// decodeFrame decodes data, a frame that had wireLen bytes on the wire.
func decodeFrame(t *testing.T, d *Decoder, lt LinkType, data []byte, wireLen int) (Kind, *Record) {
	t.Helper()
	var r Record
	k, err := d.Decode(data, gopacket.CaptureInfo{CaptureLength: len(data), Length: wireLen}, lt, &r)
	require.NoError(t, err)
	return k, &r
}

// sll2 wraps the IP packet of an Ethernet frame in a Linux cooked v2
// header with protocol type proto.
func sll2(frame []byte, proto uint16) []byte {
	h := make([]byte, sll2Len)
	binary.BigEndian.PutUint16(h, proto)
	binary.BigEndian.PutUint32(h[4:], 3)   // interface index
	binary.BigEndian.PutUint16(h[8:], 1)   // ARPHRD_ETHER
	h[10], h[11] = 4, 6                    // outgoing, 6-byte address
	copy(h[12:], []byte{2, 0, 0, 0, 0, 1}) // address
	return append(h, frame[bth.EthernetLen:]...)
}

func TestDecoderLinuxSLL2(t *testing.T) {
	d := NewDecoder()
	for _, e := range []*bth.Encap{encap4(), encap6()} {
		p := samplePacket(bth.RCWriteOnly, 33)
		frame, err := e.AppendFrame(nil, p)
		require.NoError(t, err)
		proto := uint16(0x0800)
		if !e.IsIPv4() {
			proto = 0x86DD
		}
		f := sll2(frame, proto)
		k, r := decodeFrame(t, d, LinkTypeLinuxSLL2, f, len(f))
		require.Equal(t, KindRoCE, k, "%v", r.Err)
		assert.True(t, r.ICRCChecked)
		assert.True(t, r.ICRCOK)
		assert.Equal(t, e.Src, r.Src)
		assert.Equal(t, p.RETH, r.Packet.RETH)
		assert.Equal(t, 33, r.PayloadLen)
	}
	frame, err := encap4().AppendFrame(nil, samplePacket(bth.RCSendOnly, 3))
	require.NoError(t, err)
	k, _ := decodeFrame(t, d, LinkTypeLinuxSLL2, sll2(frame, 0x0806), len(frame)+6)
	assert.Equal(t, KindOther, k, "ARP in SLL2")
	k, _ = decodeFrame(t, d, LinkTypeLinuxSLL2, sll2(frame, 0x0800)[:19], 19)
	assert.Equal(t, KindOther, k, "shorter than the SLL2 header")

	// Link types gopacket would take for others (257 & 0xFF is Ethernet)
	// are refused.
	for _, lt := range []LinkType{257, 256 + 113, 20, 105} {
		var r Record
		_, err := d.Decode(frame, gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}, lt, &r)
		assert.ErrorIs(t, err, ErrLinkType, "link type %d", lt)
	}
}

// A frame the snapshot length cut after its transport headers is RoCE with
// an unchecked ICRC and the payload length of the wire; one cut inside them
// is malformed.
func TestDecoderSnaplenCut(t *testing.T) {
	d := NewDecoder()
	for _, op := range bth.Opcodes() {
		p := samplePacket(op, 100)
		frame, err := encap4().AppendFrame(nil, p)
		require.NoError(t, err)
		hdrEnd := roce4 + bth.BTHLen + op.Info().Ext.Len()
		for cut := udp4At; cut < len(frame); cut++ {
			k, r := decodeFrame(t, d, LinkTypeEthernet, frame[:cut], len(frame))
			switch {
			case cut < udp4At+4:
				require.Equal(t, KindOther, k, "%s cut %d: no destination port", op, cut)
			case cut < roce4:
				require.Equal(t, KindMalformed, k, "%s cut %d", op, cut)
				assert.Contains(t, r.Err.Error(), "UDP header cut after")
			case cut < hdrEnd:
				require.Equal(t, KindMalformed, k, "%s cut %d", op, cut)
				assert.ErrorIs(t, r.Err, bth.ErrTruncated)
			default:
				require.Equal(t, KindRoCE, k, "%s cut %d: %v", op, cut, r.Err)
				assert.False(t, r.ICRCChecked)
				assert.Equal(t, len(p.Payload), r.PayloadLen, "%s cut %d", op, cut)
				n := min(cut-hdrEnd, len(p.Payload))
				assert.Equal(t, string(p.Payload[:n]), string(r.Packet.Payload), "%s cut %d", op, cut)
				assert.Equal(t, p.BTH.PSN, r.Packet.BTH.PSN)
				if op.Info().Ext&bth.ExtAETH != 0 {
					assert.Equal(t, p.AETH, r.Packet.AETH)
				}
				if op.Info().Ext&bth.ExtRETH != 0 {
					assert.Equal(t, p.RETH, r.Packet.RETH)
				}
			}
		}
		// Cut after the datagram (an Ethernet FCS not captured): whole, and
		// checked.
		k, r := decodeFrame(t, d, LinkTypeEthernet, frame, len(frame)+4)
		require.Equal(t, KindRoCE, k)
		assert.True(t, r.ICRCChecked && r.ICRCOK, "%s", op)
	}

	// The summary counts the bytes of the wire.
	s := NewSummary()
	frame, err := encap4().AppendFrame(nil, samplePacket(bth.RCSendOnly, 1000))
	require.NoError(t, err)
	k, r := decodeFrame(t, d, LinkTypeEthernet, frame[:100], len(frame))
	s.Add(k, r)
	require.Len(t, s.Flows, 1)
	assert.Equal(t, 1000, s.Flows[0].PayloadBytes)
	assert.Equal(t, 1, s.ICRCUnchecked)
}

// setUDPLen and setIPLen rewrite the length fields of an IPv4 frame.
func setUDPLen(f []byte, n int) []byte {
	binary.BigEndian.PutUint16(f[udp4At+4:], uint16(n))
	return f
}

func setIPLen(f []byte, n int) []byte {
	binary.BigEndian.PutUint16(f[ip4At+2:], uint16(n))
	return f
}

// Length fields that contradict each other or the frame make a complete
// frame malformed, with a message that says which.
func TestDecoderLyingLengths(t *testing.T) {
	d := NewDecoder()
	fresh := func() []byte {
		f, err := encap4().AppendFrame(nil, samplePacket(bth.RCSendOnly, 64))
		require.NoError(t, err)
		return f
	}
	n := len(fresh()) // 14 + 20 + 8 + 12 + 64 + 4
	udpLen, ipLen := n-udp4At, n-ip4At
	cases := []struct {
		name  string
		frame []byte
		wire  int
		want  string
	}{
		{"UDP length beyond the datagram", setUDPLen(fresh(), 200), n,
			"UDP length 200 exceeds the 88 bytes the IPv4 total length 108 leaves it"},
		{"UDP and IP lengths beyond the frame", setIPLen(setUDPLen(fresh(), 200), 220), n,
			"IPv4 total length 220 exceeds the 108 bytes present"},
		{"IP total length under IP + UDP length", setIPLen(fresh(), ipLen-10), n,
			"UDP length 88 exceeds the 78 bytes the IPv4 total length 98 leaves it"},
		{"IP total length beyond the frame", setIPLen(fresh(), ipLen+10), n,
			"IPv4 total length 118 exceeds the 108 bytes present"},
		{"UDP length under 8", setUDPLen(fresh(), 5), n, "UDP length 5 is less than the 8 bytes of its header"},
		{"UDP length 0", setUDPLen(fresh(), 0), n, "UDP length 0"},
		{"IP total length leaves no room for UDP", setIPLen(fresh()[:udp4At+6], bth.IPv4Len+6), udp4At + 6,
			"the IPv4 total length 26 leaves 6 bytes for the 8-byte UDP header"},
		{"IP total length beyond a frame that ends in the UDP header", setIPLen(fresh()[:udp4At+6], ipLen), udp4At + 6,
			"IPv4 total length 108 exceeds the 26 bytes present"},
		{"UDP header cut by the snapshot length", fresh()[:udp4At+6], n, "UDP header cut after 6 of its 8 bytes"},
		{"cut frame, UDP length beyond the wire", setIPLen(setUDPLen(fresh()[:70], udpLen+40), ipLen+40), n,
			"IPv4 total length 148 exceeds the 108 bytes the frame had on the wire"},
		{"cut frame, UDP length beyond its IP length", setUDPLen(fresh()[:70], udpLen+40), n,
			"UDP length 128 exceeds the 88 bytes the IPv4 total length 108 leaves it"},
	}
	for _, c := range cases {
		k, r := decodeFrame(t, d, LinkTypeEthernet, c.frame, c.wire)
		require.Equal(t, KindMalformed, k, c.name)
		assert.EqualError(t, r.Err, c.want, c.name)
		assert.ErrorIs(t, r.Err, bth.ErrBadIPHeader, c.name)
		assert.Equal(t, uint16(bth.UDPPort), r.DstPort, c.name)
		var s Summary = *NewSummary()
		s.Add(k, r)
		assert.Equal(t, 1, s.Malformed)
		assert.Zero(t, s.ICRCUnchecked)
	}
	// The same lies to another port are not RoCE.
	for _, f := range [][]byte{setUDPLen(fresh(), 5), setUDPLen(fresh(), 0), setUDPLen(fresh(), 200)} {
		binary.BigEndian.PutUint16(f[udp4At+2:], 5000)
		k, _ := decodeFrame(t, d, LinkTypeEthernet, f, len(f))
		assert.Equal(t, KindOther, k)
	}
	// Ethernet padding after the IP datagram is not a lie.
	f := append(fresh(), 0, 0, 0, 0, 0, 0)
	k, r := decodeFrame(t, d, LinkTypeEthernet, f, len(f))
	require.Equal(t, KindRoCE, k)
	assert.True(t, r.ICRCOK)
}

// ipv6Ext inserts IPv6 extension headers (next header values in order)
// between the IPv6 header and the UDP header of an Ethernet frame.
func ipv6Ext(frame []byte, kinds ...byte) []byte {
	const ip6At = bth.EthernetLen
	at := ip6At + bth.IPv6Len
	out := append([]byte(nil), frame[:at]...)
	next := out[ip6At+6]
	out[ip6At+6] = kinds[0]
	for i := range kinds {
		nh := next
		if i+1 < len(kinds) {
			nh = kinds[i+1]
		}
		// 8 bytes: next header, length 0, a PadN option of 4 bytes.
		out = append(out, nh, 0, 1, 4, 0, 0, 0, 0)
	}
	out = append(out, frame[at:]...)
	pl := binary.BigEndian.Uint16(out[ip6At+4:])
	binary.BigEndian.PutUint16(out[ip6At+4:], pl+uint16(8*len(kinds)))
	return out
}

func TestDecoderIPv6ExtensionHeaders(t *testing.T) {
	d := NewDecoder()
	p := samplePacket(bth.RCSendOnly, 21)
	frame, err := encap6().AppendFrame(nil, p)
	require.NoError(t, err)
	const hopByHop, destination = 0, 60
	for _, kinds := range [][]byte{{destination}, {hopByHop}, {hopByHop, destination}, {destination, destination}} {
		f := ipv6Ext(frame, kinds...)
		k, r := decodeFrame(t, d, LinkTypeEthernet, f, len(f))
		require.Equal(t, KindRoCE, k, "%v: %v", kinds, r.Err)
		assert.False(t, r.ICRCChecked, "%v: no ICRC is defined over extension headers", kinds)
		assert.Equal(t, p.Payload, r.Packet.Payload)
		assert.Equal(t, 21, r.PayloadLen)
		assert.Equal(t, encap6().Src, r.Src)
	}
	k, r := decodeFrame(t, d, LinkTypeEthernet, frame, len(frame))
	require.Equal(t, KindRoCE, k)
	assert.True(t, r.ICRCChecked && r.ICRCOK)

	// gopacket appends destination options on every decode; the Decoder
	// keeps them from piling up.
	f := ipv6Ext(frame, destination)
	for range 100 {
		decodeFrame(t, d, LinkTypeEthernet, f, len(f))
	}
	assert.LessOrEqual(t, len(d.ip6dst.Options), 1)
}

// decodeBoth decodes frame with d and with a decoder that takes every
// frame to gopacket's parser, and requires the same kind and record.
func decodeBoth(t *testing.T, d, parser *Decoder, frame []byte, ci gopacket.CaptureInfo, lt LinkType) {
	t.Helper()
	var got, want Record
	k, err := d.Decode(frame, ci, lt, &got)
	pk, perr := parser.Decode(frame, ci, lt, &want)
	require.Equal(t, perr, err)
	require.Equal(t, pk, k, "% x", frame)
	if want.Err != nil || got.Err != nil {
		require.Error(t, got.Err)
		require.Error(t, want.Err)
		require.Equal(t, want.Err.Error(), got.Err.Error())
		got.Err, want.Err = nil, nil
	}
	require.Equal(t, want, got, "% x", frame)
}

// The Ethernet + IPv4 + UDP path that skips gopacket's parser decodes
// every frame as the parser does: each opcode's frame and the handed
// captures' frames, each cut at every length, and with each byte of its
// Ethernet, IPv4 and UDP headers and BTH changed.
func TestDecodeEthernetIPv4UDPAsParser(t *testing.T) {
	d, parser := NewDecoder(), NewDecoder()
	parser.parserOnly = true
	for _, frame := range seedFrames(t) {
		for _, wire := range []int{len(frame), len(frame) + 100} {
			ci := gopacket.CaptureInfo{CaptureLength: len(frame), Length: wire}
			decodeBoth(t, d, parser, frame, ci, LinkTypeEthernet)
		}
		if len(frame) > 200 {
			continue // the cuts and changes of the short frames cover the headers
		}
		for i := range len(frame) {
			decodeBoth(t, d, parser, frame[:i], gopacket.CaptureInfo{CaptureLength: i, Length: len(frame)}, LinkTypeEthernet)
		}
		for i := range min(len(frame), 14+20+8+12) {
			for _, v := range []byte{0, 0xFF, frame[i] ^ 0x80, frame[i] + 1} {
				b := bytes.Clone(frame)
				b[i] = v
				decodeBoth(t, d, parser, b, gopacket.CaptureInfo{CaptureLength: len(b), Length: len(b)}, LinkTypeEthernet)
			}
		}
	}
}
