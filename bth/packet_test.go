package bth

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Test fixtures shared by packet_test.go, fuzz_test.go and alloc_test.go.

var (
	testEncap4 = Encap{
		SrcMAC:       [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x01},
		DstMAC:       [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x02},
		Src:          netip.MustParseAddr("192.0.2.1"),
		Dst:          netip.MustParseAddr("192.0.2.2"),
		SrcPort:      0xC123,
		TrafficClass: TrafficClass(26, ECT0),
		ID:           0x1234,
	}
	testEncap6 = Encap{
		SrcMAC:       [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x01},
		DstMAC:       [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x02},
		Src:          netip.MustParseAddr("2001:db8::1"),
		Dst:          netip.MustParseAddr("2001:db8::2"),
		SrcPort:      0xE001,
		TrafficClass: 0xAB,
		FlowLabel:    0x12345,
		HopLimit:     7,
	}
	testEncaps = []struct {
		name string
		e    Encap
	}{{"IPv4", testEncap4}, {"IPv6", testEncap6}}
)

// extSizes are the extended header sizes of docs/wire-format.md section 2, by hand.
var extSizes = map[Ext]int{
	ExtDETH: 8, ExtRETH: 16, ExtAtomicETH: 28, ExtAETH: 4, ExtAtomicAckETH: 8,
	ExtImmDt: 4, ExtIETH: 4, ExtCNP: 16,
}

func handExtLen(e Ext) int {
	n := 0
	for h, size := range extSizes {
		if e&h != 0 {
			n += size
		}
	}
	return n
}

// handPad is the number of pad bytes for n payload bytes, worked the long way.
func handPad(n int) int { return (4 - n%4) % 4 }

func testPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(0xC3 + 29*i)
	}
	return b
}

// samplePacket fills every header with non-trivial values (24-bit maxima,
// all flag bits) so that a field that is dropped or misplaced shows.
func samplePacket(op Opcode, n int) Packet {
	return Packet{
		BTH: BTH{
			Opcode: op, SE: true, MigReq: true, PKey: 0xFFFF, FECN: true, BECN: true,
			Resv6: 0x2A, DestQP: 0xFFFFFF, AckReq: true, Resv7: 0x55, PSN: 0xFFFFFF,
		},
		DETH:         DETH{QKey: GSIQKey, Resv: 0xA5, SrcQP: 0xFFFFFF},
		RETH:         RETH{VA: 0xFEDCBA9876543210, RKey: 0xDEADBEEF, DMALength: 0xFFFFFFFF},
		AtomicETH:    AtomicETH{VA: 0xFFFFFFFFFFFFFFF8, RKey: 0x80000001, SwapAdd: 0xAAAAAAAAAAAAAAAA, Compare: 0x5555555555555555},
		AETH:         AETH{Syndrome: SyndromeACKNoCredits, MSN: 0xFFFFFF},
		AtomicAckETH: 0xFFFFFFFFFFFFFFFE,
		ImmDt:        0x01020304,
		IETH:         0xCAFEBABE,
		Payload:      testPayload(n),
	}
}

func payloadSizes(op Opcode) []int {
	if op.Info().Payload {
		return []int{0, 1, 2, 3, 4, 5}
	}
	return []int{0}
}

// splitFrame cuts an Ethernet frame made by AppendFrame into its parts.
func splitFrame(t testing.TB, frame []byte, v6 bool) (eth, ip, udp, roce []byte) {
	t.Helper()
	ipLen := IPv4Len
	if v6 {
		ipLen = IPv6Len
	}
	require.GreaterOrEqual(t, len(frame), 14+ipLen+8+BTHLen+ICRCLen)
	return frame[:14], frame[14 : 14+ipLen], frame[14+ipLen : 14+ipLen+8], frame[14+ipLen+8:]
}

// refICRC computes the ICRC the long way from docs/wire-format.md section 3, without
// the package: 8 bytes of 0xFF, masked IP header, UDP header with checksum
// 0xFFFF, BTH with byte 4 = 0xFF, then the rest.
func refICRC(ip, udp, pkt []byte) uint32 {
	var buf []byte
	buf = append(buf, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	m := append([]byte(nil), ip...)
	if m[0]>>4 == 4 {
		m[1] = 0xFF               // TOS
		m[8] = 0xFF               // TTL
		m[10], m[11] = 0xFF, 0xFF // header checksum
	} else {
		m[0] |= 0x0F // traffic class high nibble
		m[1] = 0xFF  // traffic class low nibble, flow label
		m[2] = 0xFF
		m[3] = 0xFF
		m[7] = 0xFF // hop limit
	}
	buf = append(buf, m...)
	u := append([]byte(nil), udp...)
	u[6], u[7] = 0xFF, 0xFF
	buf = append(buf, u...)
	p := append([]byte(nil), pkt...)
	p[4] = 0xFF
	buf = append(buf, p...)
	return crc32.ChecksumIEEE(buf)
}

// refIPv4Checksum is the RFC 1071 checksum, written here independently.
func refIPv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// checkCarried compares the headers op carries and checks the others stayed
// zero in d (decoded into a zero Packet).
func checkCarried(t *testing.T, ext Ext, want, d *Packet) {
	t.Helper()
	if ext&ExtDETH != 0 {
		assert.Equal(t, want.DETH, d.DETH, "DETH")
	} else {
		assert.Zero(t, d.DETH, "DETH not carried")
	}
	if ext&ExtRETH != 0 {
		assert.Equal(t, want.RETH, d.RETH, "RETH")
	} else {
		assert.Zero(t, d.RETH, "RETH not carried")
	}
	if ext&ExtAtomicETH != 0 {
		assert.Equal(t, want.AtomicETH, d.AtomicETH, "AtomicETH")
	} else {
		assert.Zero(t, d.AtomicETH, "AtomicETH not carried")
	}
	if ext&ExtAETH != 0 {
		assert.Equal(t, want.AETH, d.AETH, "AETH")
	} else {
		assert.Zero(t, d.AETH, "AETH not carried")
	}
	if ext&ExtAtomicAckETH != 0 {
		assert.Equal(t, want.AtomicAckETH, d.AtomicAckETH, "AtomicAckETH")
	} else {
		assert.Zero(t, d.AtomicAckETH, "AtomicAckETH not carried")
	}
	if ext&ExtImmDt != 0 {
		assert.Equal(t, want.ImmDt, d.ImmDt, "ImmDt")
	} else {
		assert.Zero(t, d.ImmDt, "ImmDt not carried")
	}
	if ext&ExtIETH != 0 {
		assert.Equal(t, want.IETH, d.IETH, "IETH")
	} else {
		assert.Zero(t, d.IETH, "IETH not carried")
	}
}

// flipExpect says what VerifyICRC must report after bits mask of byte i of
// ip|udp|roce are flipped: nil for masked (variant) fields, ErrBadIPHeader
// when the IP version or header length no longer parse, ErrBadICRC for all
// else.
func flipExpect(i int, mask byte, v6 bool) error {
	ipLen := IPv4Len
	if v6 {
		ipLen = IPv6Len
	}
	switch {
	case i < ipLen && !v6:
		switch i {
		case 0: // version / IHL
			return ErrBadIPHeader
		case 1, 8, 10, 11: // TOS, TTL, header checksum
			return nil
		}
	case i < ipLen && v6:
		switch i {
		case 0:
			if mask&0xF0 != 0 { // version
				return ErrBadIPHeader
			}
			return nil // traffic class high nibble
		case 1, 2, 3, 7: // traffic class, flow label, hop limit
			return nil
		}
	case i < ipLen+UDPLen:
		if i-ipLen >= 6 { // UDP checksum
			return nil
		}
	case i-ipLen-UDPLen == 4: // BTH byte 4: FECN, BECN, reserved
		return nil
	}
	return ErrBadICRC
}

func TestPacketRoundTripEveryOpcode(t *testing.T) {
	for _, op := range Opcodes() {
		info := op.Info()
		for _, enc := range testEncaps {
			e := enc.e
			v6 := enc.name == "IPv6"
			for _, n := range payloadSizes(op) {
				t.Run(fmt.Sprintf("%s/%s/%d", op, enc.name, n), func(t *testing.T) {
					p := samplePacket(op, n)
					pad := handPad(n)
					extLen := handExtLen(info.Ext)
					wantLen := BTHLen + extLen + n + pad + ICRCLen

					frame, err := e.AppendFrame(nil, &p)
					require.NoError(t, err)
					eth, ip, udp, roce := splitFrame(t, frame, v6)
					require.Len(t, roce, wantLen)
					assert.Equal(t, wantLen, p.Len())

					// Packet.Append gives the same UDP payload, after a prefix.
					prefix := []byte{9, 8, 7}
					got, err := p.Append(append([]byte(nil), prefix...), &e)
					require.NoError(t, err)
					assert.Equal(t, prefix, got[:3])
					assert.Equal(t, roce, got[3:])

					// Ethernet, IP and UDP headers.
					assert.Equal(t, e.DstMAC[:], eth[0:6])
					assert.Equal(t, e.SrcMAC[:], eth[6:12])
					if v6 {
						assert.Equal(t, []byte{0x86, 0xDD}, eth[12:14])
						assert.Equal(t, uint16(UDPLen+wantLen), binary.BigEndian.Uint16(ip[4:]), "IPv6 payload length")
					} else {
						assert.Equal(t, []byte{0x08, 0x00}, eth[12:14])
						assert.Equal(t, uint16(IPv4Len+UDPLen+wantLen), binary.BigEndian.Uint16(ip[2:]), "IPv4 total length")
						assert.Equal(t, refIPv4Checksum(append(append(append([]byte(nil), ip[:10]...), 0, 0), ip[12:]...)),
							binary.BigEndian.Uint16(ip[10:]), "IPv4 checksum")
					}
					assert.Equal(t, uint16(4791), binary.BigEndian.Uint16(udp[2:]), "UDP dst port")
					assert.Equal(t, uint16(UDPLen+wantLen), binary.BigEndian.Uint16(udp[4:]), "UDP length")

					// Decode into a zero Packet.
					var d Packet
					require.NoError(t, d.Decode(roce))
					wantBTH := p.BTH
					wantBTH.PadCnt = uint8(pad)
					assert.Equal(t, wantBTH, d.BTH)
					assert.Equal(t, uint8(pad), d.BTH.PadCnt, "PadCnt == (-len)&3")
					assert.Equal(t, PSN(0xFFFFFF), d.BTH.PSN)
					checkCarried(t, info.Ext, &p, &d)
					assert.Len(t, d.Payload, n)
					assert.Equal(t, p.Payload, d.Payload)
					assert.Equal(t, make([]byte, pad), roce[BTHLen+extLen+n:BTHLen+extLen+n+pad], "pad bytes are zero")
					if info.Ext&ExtCNP != 0 {
						assert.Equal(t, make([]byte, 16), roce[BTHLen:BTHLen+16], "CNP reserved bytes are zero")
					}

					// ICRC: on the wire little-endian, equal to the
					// independent computation and to VerifyICRC's.
					crc := refICRC(ip, udp, roce[:len(roce)-4])
					assert.Equal(t, crc, d.ICRC)
					assert.Equal(t, crc, binary.LittleEndian.Uint32(roce[len(roce)-4:]))
					gotCRC, wantCRC, err := VerifyICRC(ip, udp, roce)
					require.NoError(t, err)
					assert.Equal(t, crc, gotCRC)
					assert.Equal(t, crc, wantCRC)
					c2, err := e.ICRC(roce[:len(roce)-4])
					require.NoError(t, err)
					assert.Equal(t, crc, c2)
					c3, err := ICRC(ip, udp, roce[:len(roce)-4])
					require.NoError(t, err)
					assert.Equal(t, crc, c3)

					checkFlips(t, frame, v6, crc)
					checkTruncations(t, roce, BTHLen+extLen+ICRCLen, pad)
				})
			}
		}
	}
}

// checkFlips flips bits of every byte of ip|udp|roce and checks VerifyICRC.
func checkFlips(t *testing.T, frame []byte, v6 bool, crc uint32) {
	t.Helper()
	region := len(frame) - EthernetLen
	for i := 0; i < region; i++ {
		for _, mask := range []byte{0x01, 0x40, 0x80, 0xFF} {
			f := append([]byte(nil), frame...)
			f[EthernetLen+i] ^= mask
			_, ip, udp, roce := splitFrame(t, f, v6)
			_, want, err := VerifyICRC(ip, udp, roce)
			exp := flipExpect(i, mask, v6)
			if !errors.Is(err, exp) || (exp == nil && err != nil) {
				t.Errorf("flip byte %d of ip|udp|roce by %#02x: VerifyICRC error %v, want %v", i, mask, err, exp)
			}
			if exp == nil && want != crc {
				t.Errorf("flip byte %d by %#02x (a masked field) changed the ICRC: %#08x, was %#08x", i, mask, want, crc)
			}
		}
	}
}

// checkTruncations decodes every prefix of roce: below minLen (headers and
// ICRC) it must be ErrTruncated; from minLen on it may succeed or report
// ErrPadCnt; it must never panic.
func checkTruncations(t *testing.T, roce []byte, minLen, pad int) {
	t.Helper()
	for i := 0; i < len(roce); i++ {
		var d Packet
		var err error
		require.NotPanics(t, func() { err = d.Decode(roce[:i]) }, "Decode(pkt[:%d])", i)
		if i < minLen {
			if !errors.Is(err, ErrTruncated) {
				t.Errorf("Decode(pkt[:%d]) = %v, want ErrTruncated", i, err)
				continue
			}
			var de *DecodeError
			if assert.True(t, errors.As(err, &de)) {
				assert.Equal(t, i, de.Have, "Have for [:%d]", i)
				assert.Greater(t, de.Need, i, "Need for [:%d]", i)
				assert.LessOrEqual(t, de.Need, minLen, "Need for [:%d]", i)
			}
			continue
		}
		rest := i - minLen
		if pad > rest {
			assert.ErrorIs(t, err, ErrPadCnt, "Decode(pkt[:%d])", i)
		} else if assert.NoError(t, err, "Decode(pkt[:%d])", i) {
			assert.Len(t, d.Payload, rest-pad)
		}
	}
}

func TestDecodeMinimal(t *testing.T) {
	// A hand-made RC SEND_ONLY with no payload: 12 bytes of BTH and 4 of ICRC.
	b := []byte{
		0x04, 0x00, 0xFF, 0xFF, 0x00, 0x12, 0x34, 0x56, 0x80, 0x00, 0x01, 0x00,
		0x11, 0x22, 0x33, 0x44,
	}
	var d Packet
	require.NoError(t, d.Decode(b))
	assert.Equal(t, RCSendOnly, d.BTH.Opcode)
	assert.Equal(t, uint32(0x123456), d.BTH.DestQP)
	assert.True(t, d.BTH.AckReq)
	assert.Equal(t, PSN(0x100), d.BTH.PSN)
	assert.Empty(t, d.Payload)
	assert.Equal(t, uint32(0x44332211), d.ICRC, "ICRC is read little-endian")
}

func TestDecodeUnexpectedPayload(t *testing.T) {
	for _, op := range Opcodes() {
		if op.Info().Payload {
			continue
		}
		p := samplePacket(op, 0)
		roce, err := p.Append(nil, &testEncap4)
		require.NoError(t, err)
		for _, extra := range []int{1, 2, 3, 4, 8} {
			b := append([]byte(nil), roce[:len(roce)-4]...)
			b = append(b, make([]byte, extra)...)
			b = append(b, roce[len(roce)-4:]...)
			var d Packet
			err := d.Decode(b)
			assert.ErrorIs(t, err, ErrUnexpectedPayload, "%s with %d extra bytes", op, extra)
		}
	}
	// The ACK of the task, by hand: BTH, AETH, 4 extra bytes, ICRC.
	ack := []byte{
		0x11, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x05,
		0x1F, 0x00, 0x00, 0x01,
		0xDE, 0xAD, 0xBE, 0xEF,
		0x00, 0x00, 0x00, 0x00,
	}
	var d Packet
	err := d.Decode(ack)
	require.ErrorIs(t, err, ErrUnexpectedPayload)
	require.NoError(t, d.Decode(append(ack[:16:16], 0, 0, 0, 0)))
	assert.Equal(t, AETH{Syndrome: 0x1F, MSN: 1}, d.AETH)
}

func TestDecodePadCnt(t *testing.T) {
	// RC SEND_ONLY, PadCnt 3 (byte 1 = 0x30), then n bytes, then the ICRC.
	mk := func(padCnt byte, n int) []byte {
		b := []byte{0x04, padCnt << 4, 0xFF, 0xFF, 0, 0, 0, 0x11, 0, 0, 0, 0}
		b = append(b, testPayload(n)...)
		return append(b, 1, 2, 3, 4)
	}
	var d Packet
	assert.ErrorIs(t, d.Decode(mk(3, 1)), ErrPadCnt, "PadCnt 3 with 1 byte after the headers")
	assert.ErrorIs(t, d.Decode(mk(3, 2)), ErrPadCnt)
	assert.ErrorIs(t, d.Decode(mk(1, 0)), ErrPadCnt)
	require.NoError(t, d.Decode(mk(3, 3)))
	assert.Empty(t, d.Payload)
	require.NoError(t, d.Decode(mk(3, 4)))
	assert.Equal(t, testPayload(1), d.Payload)
	require.NoError(t, d.Decode(mk(0, 4)))
	assert.Equal(t, testPayload(4), d.Payload)

	var de *DecodeError
	require.True(t, errors.As(d.Decode(mk(3, 1)), &de))
	assert.Equal(t, ErrPadCnt, de.Err)
	assert.Equal(t, RCSendOnly, de.Opcode)
}

func TestDecodeTVer(t *testing.T) {
	p := samplePacket(RCSendOnly, 4)
	roce, err := p.Append(nil, &testEncap4)
	require.NoError(t, err)
	for _, tver := range []byte{1, 2, 0xF} {
		b := append([]byte(nil), roce...)
		b[1] = b[1]&0xF0 | tver
		var d Packet
		err := d.Decode(b)
		assert.ErrorIs(t, err, ErrTVer, "TVer %d", tver)
		assert.Equal(t, tver, d.BTH.TVer, "BTH still decoded")
		assert.Equal(t, RCSendOnly, d.BTH.Opcode)
	}
}

func TestDecodeUnknownOpcode(t *testing.T) {
	known := map[Opcode]bool{}
	for _, op := range Opcodes() {
		known[op] = true
	}
	b := make([]byte, 64)
	b[2], b[3] = 0xFF, 0xFF
	b[5], b[6], b[7] = 0x12, 0x34, 0x56
	for _, op := range []Opcode{0x15, 0x40, 0x60, 0x80, 0xFF} {
		b[0] = byte(op)
		var d Packet
		err := d.Decode(b)
		assert.ErrorIs(t, err, ErrUnknownOpcode, "%#x", uint8(op))
		assert.Equal(t, op, d.BTH.Opcode, "BTH still decoded")
		assert.Equal(t, uint32(0x123456), d.BTH.DestQP)
	}
	for i := 0; i < 256; i++ {
		if known[Opcode(i)] {
			continue
		}
		b[0] = byte(i)
		var d Packet
		assert.ErrorIs(t, d.Decode(b), ErrUnknownOpcode, "%#x", i)
	}
}

func TestDecodeErrorMessages(t *testing.T) {
	var d Packet
	err := d.Decode(make([]byte, 5))
	assert.EqualError(t, err, "bth: packet truncated in BTH: need 12 bytes, have 5")
	b := make([]byte, 20)
	b[0] = 0x15
	assert.EqualError(t, d.Decode(b), "bth: unknown opcode in BTH (opcode 0x15)")
	b[0] = byte(RCWriteFirst)
	assert.EqualError(t, d.Decode(b), "bth: packet truncated in RETH (opcode RC_RDMA_WRITE_FIRST): need 28 bytes, have 20")
}

func TestAppendHeadersRefuses(t *testing.T) {
	cases := []struct {
		name string
		p    Packet
		err  error
	}{
		{"PSN > 24 bits", Packet{BTH: BTH{Opcode: RCSendOnly, PSN: 0x1000000}}, ErrFieldRange},
		{"DestQP > 24 bits", Packet{BTH: BTH{Opcode: RCSendOnly, DestQP: 0x1000000}}, ErrFieldRange},
		{"MSN > 24 bits on ACK", Packet{BTH: BTH{Opcode: RCAcknowledge}, AETH: AETH{MSN: 0x1000000}}, ErrFieldRange},
		{"MSN > 24 bits on READ response", Packet{BTH: BTH{Opcode: RCReadResponseLast}, AETH: AETH{MSN: 0xFFFFFFFF}}, ErrFieldRange},
		{"SrcQP > 24 bits on UD", Packet{BTH: BTH{Opcode: UDSendOnly}, DETH: DETH{SrcQP: 0x1000000}}, ErrFieldRange},
		{"TVer > 4 bits", Packet{BTH: BTH{Opcode: RCSendOnly, TVer: 0x10}}, ErrFieldRange},
		{"payload on ACK", Packet{BTH: BTH{Opcode: RCAcknowledge}, Payload: []byte{1}}, ErrUnexpectedPayload},
		{"payload on READ request", Packet{BTH: BTH{Opcode: RCReadRequest}, Payload: []byte{1, 2, 3, 4}}, ErrUnexpectedPayload},
		{"payload on CNP", Packet{BTH: BTH{Opcode: CNP}, Payload: []byte{0}}, ErrUnexpectedPayload},
		{"payload on FetchAdd", Packet{BTH: BTH{Opcode: RCFetchAdd}, Payload: []byte{0}}, ErrUnexpectedPayload},
		{"unknown opcode", Packet{BTH: BTH{Opcode: 0x15}}, ErrUnknownOpcode},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// b has spare capacity filled with a sentinel: nothing may be
			// written, and b must come back as it was.
			back := make([]byte, 3, 128)
			copy(back, []byte{1, 2, 3})
			for i := 3; i < cap(back); i++ {
				back[:cap(back)][i] = 0xEE
			}
			p := c.p

			out, err := p.AppendHeaders(back)
			assert.ErrorIs(t, err, c.err)
			assert.Equal(t, []byte{1, 2, 3}, out)
			assert.Equal(t, cap(back), cap(out))
			assert.Same(t, &back[0], &out[0], "same backing array")
			assert.Equal(t, bytes.Repeat([]byte{0xEE}, cap(back)-3), back[3:cap(back)], "spare capacity untouched")

			out, err = p.AppendTransport(back)
			assert.ErrorIs(t, err, c.err)
			assert.Equal(t, []byte{1, 2, 3}, out)
			assert.Same(t, &back[0], &out[0])

			out, err = p.Append(back, &testEncap4)
			assert.ErrorIs(t, err, c.err)
			assert.Equal(t, []byte{1, 2, 3}, out)
			assert.Same(t, &back[0], &out[0])
			assert.Equal(t, bytes.Repeat([]byte{0xEE}, cap(back)-3), back[3:cap(back)], "spare capacity untouched")

			out, err = testEncap6.AppendFrame(back, &p)
			assert.ErrorIs(t, err, c.err)
			assert.Equal(t, []byte{1, 2, 3}, out)
		})
	}
	// The maxima are accepted.
	ok := Packet{BTH: BTH{Opcode: RCAcknowledge, PSN: 0xFFFFFF, DestQP: 0xFFFFFF}, AETH: AETH{MSN: 0xFFFFFF}}
	_, err := ok.AppendHeaders(nil)
	assert.NoError(t, err)
	// An MSN the opcode does not carry is not checked.
	send := Packet{BTH: BTH{Opcode: RCSendOnly}, AETH: AETH{MSN: 0xFFFFFFFF}, DETH: DETH{SrcQP: 0xFFFFFFFF}}
	_, err = send.AppendHeaders(nil)
	assert.NoError(t, err)
}

// The PadCnt a caller puts in the BTH is ignored: Append derives it from the
// payload length.
func TestAppendSetsPadCnt(t *testing.T) {
	for n := 0; n < 9; n++ {
		p := Packet{BTH: BTH{Opcode: RCSendLast, PadCnt: 3}, Payload: testPayload(n)}
		b, err := p.AppendTransport(nil)
		require.NoError(t, err)
		assert.Equal(t, byte(handPad(n)<<4), b[1], "n=%d", n)
		assert.Len(t, b, BTHLen+n+handPad(n))
		assert.Equal(t, uint8(3), p.BTH.PadCnt, "the Packet itself is not modified")
	}
}

func TestPadLen(t *testing.T) {
	for _, c := range []struct{ n, pad int }{{0, 0}, {1, 3}, {2, 2}, {3, 1}, {4, 0}, {5, 3}, {1024, 0}, {1025, 3}, {4095, 1}} {
		assert.Equal(t, c.pad, PadLen(c.n), "PadLen(%d)", c.n)
	}
}

func TestPacketLenUnknownOpcode(t *testing.T) {
	p := Packet{BTH: BTH{Opcode: 0x40}}
	assert.Equal(t, 0, p.Len())
	out, err := testEncap4.AppendFrame([]byte{1}, &p)
	assert.ErrorIs(t, err, ErrUnknownOpcode)
	assert.Equal(t, []byte{1}, out)
}

// A hand-written RC RDMA WRITE ONLY with immediate, as AppendTransport must
// lay it out: BTH, RETH, ImmDt, payload, pad.
func TestAppendTransportWireBytes(t *testing.T) {
	p := Packet{
		BTH:     BTH{Opcode: RCWriteOnlyImm, SE: true, PKey: 0xFFFF, DestQP: 0x000011, AckReq: true, PSN: 0x8c84dd},
		RETH:    RETH{VA: 0x00007F0000001000, RKey: 0x00001234, DMALength: 5},
		ImmDt:   0xAABBCCDD,
		Payload: []byte{'h', 'e', 'l', 'l', 'o'},
	}
	want := []byte{
		0x0B, 0xB0, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x80, 0x8c, 0x84, 0xdd, // BTH: SE, PadCnt 3
		0x00, 0x00, 0x7F, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x05, // RETH
		0xAA, 0xBB, 0xCC, 0xDD, // ImmDt
		'h', 'e', 'l', 'l', 'o', 0, 0, 0, // payload and pad
	}
	got, err := p.AppendTransport(nil)
	require.NoError(t, err)
	assert.Equal(t, want, got)

	// And a CNP: BTH then 16 zero bytes.
	cnp := Packet{BTH: BTH{Opcode: CNP, PKey: 0xFFFF, BECN: true, DestQP: 0x118}}
	got, err = cnp.AppendTransport(nil)
	require.NoError(t, err)
	assert.Equal(t, append([]byte{0x81, 0x00, 0xFF, 0xFF, 0x40, 0x00, 0x01, 0x18, 0, 0, 0, 0}, make([]byte, 16)...), got)
}

func TestEncapIPv4Header(t *testing.T) {
	e := Encap{
		Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"),
		SrcPort: 0xC123, TrafficClass: 0x02,
	}
	// HopLimit 0 -> TTL 64, DstPort 0 -> 4791, DF set, ID 0, checksum by hand.
	want := []byte{
		0x45, 0x02, 0x00, 0x6C, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xB6, 0x7B,
		0xC0, 0x00, 0x02, 0x01, 0xC0, 0x00, 0x02, 0x02,
		0xC1, 0x23, 0x12, 0xB7, 0x00, 0x58, 0x00, 0x00,
	}
	got, err := e.AppendIPUDP(nil, 80)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.True(t, e.IsIPv4())
	assert.Equal(t, IPv4Len, e.IPHeaderLen())

	// The checksum recomputed independently, and the header sums to 0xFFFF.
	zeroed := append([]byte(nil), got[:IPv4Len]...)
	zeroed[10], zeroed[11] = 0, 0
	assert.Equal(t, refIPv4Checksum(zeroed), binary.BigEndian.Uint16(got[10:]))
	assert.Equal(t, uint16(0), refIPv4Checksum(got[:IPv4Len]), "a valid header checksums to 0")
	assert.Equal(t, byte(0x40), got[6]&0x40, "DF")
	assert.Equal(t, byte(0), got[6]&0x20, "MF clear")

	// Explicit values are used as given.
	e.HopLimit, e.DstPort, e.ID, e.TrafficClass = 1, 1234, 0xBEEF, TrafficClass(48, CE)
	got, err = e.AppendIPUDP(nil, 80)
	require.NoError(t, err)
	assert.Equal(t, byte(1), got[8], "TTL")
	assert.Equal(t, uint16(1234), binary.BigEndian.Uint16(got[22:]))
	assert.Equal(t, uint16(0xBEEF), binary.BigEndian.Uint16(got[4:]))
	assert.Equal(t, byte(0xC3), got[1])
	zeroed = append([]byte(nil), got[:IPv4Len]...)
	zeroed[10], zeroed[11] = 0, 0
	assert.Equal(t, refIPv4Checksum(zeroed), binary.BigEndian.Uint16(got[10:]))

	// Every frame built for the round trip has a valid checksum too.
	for _, op := range Opcodes() {
		p := samplePacket(op, 0)
		f, err := testEncap4.AppendFrame(nil, &p)
		require.NoError(t, err)
		assert.Equal(t, uint16(0), refIPv4Checksum(f[EthernetLen:EthernetLen+IPv4Len]), "%s", op)
		assert.Equal(t, byte(64), f[EthernetLen+8], "TTL defaults to 64")
		assert.Equal(t, byte(0x40), f[EthernetLen+6], "DF")
	}
}

func TestEncapIPv6Header(t *testing.T) {
	e := Encap{
		Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"),
		SrcPort: 0xC123, TrafficClass: 0xAB, FlowLabel: 0xFFF12345, // flow label masked to 20 bits
	}
	want := []byte{
		0x6A, 0xB1, 0x23, 0x45, 0x00, 0x58, 0x11, 0x40,
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02,
		0xC1, 0x23, 0x12, 0xB7, 0x00, 0x58, 0x00, 0x00,
	}
	got, err := e.AppendIPUDP(nil, 80)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.False(t, e.IsIPv4())
	assert.Equal(t, IPv6Len, e.IPHeaderLen())

	e.HopLimit = 255
	got, err = e.AppendIPUDP(nil, 80)
	require.NoError(t, err)
	assert.Equal(t, byte(255), got[7])
}

func TestEncapMappedIPv4(t *testing.T) {
	// An IPv4-mapped IPv6 address means an IPv4 header.
	e := Encap{Src: netip.MustParseAddr("::ffff:192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2")}
	assert.True(t, e.IsIPv4())
	got, err := e.AppendIPUDP(nil, 16)
	require.NoError(t, err)
	require.Len(t, got, IPv4Len+UDPLen)
	assert.Equal(t, []byte{192, 0, 2, 1, 192, 0, 2, 2}, got[12:20])
}

func TestEncapErrors(t *testing.T) {
	v4 := netip.MustParseAddr("192.0.2.1")
	v6 := netip.MustParseAddr("2001:db8::2")
	bad := []Encap{
		{Src: v4, Dst: v6},
		{Src: v6, Dst: v4},
		{Src: netip.MustParseAddr("::ffff:192.0.2.1"), Dst: v6},
		{Src: v4},
		{Dst: v6},
		{},
	}
	p := samplePacket(RCSendOnly, 3)
	transport, err := p.AppendTransport(nil)
	require.NoError(t, err)
	for i, e := range bad {
		b := []byte{1, 2, 3}
		out, err := e.AppendIPUDP(b, 16)
		assert.ErrorIs(t, err, ErrBadIPHeader, "case %d AppendIPUDP", i)
		assert.Equal(t, []byte{1, 2, 3}, out)

		_, err = e.ICRC(transport)
		assert.ErrorIs(t, err, ErrBadIPHeader, "case %d ICRC", i)

		out, err = p.Append(b, &e)
		assert.ErrorIs(t, err, ErrBadIPHeader, "case %d Append", i)
		assert.Equal(t, []byte{1, 2, 3}, out)

		out, err = e.AppendFrame(b, &p)
		assert.ErrorIs(t, err, ErrBadIPHeader, "case %d AppendFrame", i)
		assert.Equal(t, []byte{1, 2, 3}, out)
	}

	// Too long for an IP datagram, or a negative length.
	for _, e := range []Encap{testEncap4, testEncap6} {
		_, err := e.AppendIPUDP(nil, 0xFFFF)
		assert.ErrorIs(t, err, ErrBadIPHeader)
		_, err = e.AppendIPUDP(nil, -1)
		assert.ErrorIs(t, err, ErrBadIPHeader)
	}
	_, err = testEncap4.AppendIPUDP(nil, 0xFFFF-IPv4Len-UDPLen)
	assert.NoError(t, err, "the largest IPv4 datagram")
	_, err = testEncap4.AppendIPUDP(nil, 0xFFFF-IPv4Len-UDPLen+1)
	assert.ErrorIs(t, err, ErrBadIPHeader)
}

// "On error b is returned unchanged" (Packet.Append, Encap.AppendFrame): the
// same slice, not a copy of it in a new array.
func TestAppendErrorReturnsSameSlice(t *testing.T) {
	mixed := Encap{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("2001:db8::2")}
	p := samplePacket(RCSendOnly, 8)
	b := []byte{1, 2, 3} // len == cap: any append moves it

	out, err := p.Append(b, &mixed)
	require.ErrorIs(t, err, ErrBadIPHeader)
	assert.Equal(t, []byte{1, 2, 3}, out)
	assert.Same(t, &b[0], &out[0], "Packet.Append, e.ICRC error path: returns b[:start] of the array AppendTransport grew, not b")

	out, err = mixed.AppendFrame(b, &p)
	require.ErrorIs(t, err, ErrBadIPHeader)
	assert.Equal(t, []byte{1, 2, 3}, out)
	assert.Same(t, &b[0], &out[0], "Encap.AppendFrame, AppendIPUDP error path: returns b[:start] of the array the MAC appends grew, not b")

	ack := Packet{BTH: BTH{Opcode: RCAcknowledge}, Payload: []byte{1}}
	out, err = testEncap4.AppendFrame(b, &ack)
	require.ErrorIs(t, err, ErrUnexpectedPayload)
	assert.Equal(t, []byte{1, 2, 3}, out)
	assert.Same(t, &b[0], &out[0], "Encap.AppendFrame, p.Append error path: returns b[:start] of the array the MAC appends grew, not b")
}

func TestICRCFunctionErrors(t *testing.T) {
	p := samplePacket(RCSendOnly, 4)
	frame, err := testEncap4.AppendFrame(nil, &p)
	require.NoError(t, err)
	_, ip, udp, roce := splitFrame(t, frame, false)
	pkt := roce[:len(roce)-4]

	_, err = ICRC(ip, udp[:7], pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "UDP header of 7 bytes")
	_, err = ICRC(ip, append(udp[:8:8], 0), pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "UDP header of 9 bytes")
	_, err = ICRC(ip, udp, pkt[:11])
	assert.ErrorIs(t, err, ErrBadIPHeader, "packet shorter than a BTH")
	_, err = ICRC(nil, udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "no IP header")
	_, err = ICRC(ip[:19], udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "IPv4 header shorter than its IHL")
	_, err = ICRC(append(ip[:20:20], 0, 0, 0, 0), udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "IPv4 header longer than its IHL")
	short := append([]byte(nil), ip...)
	short[0] = 0x44
	_, err = ICRC(short[:16], udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "IHL below 5")
	v5 := append([]byte(nil), ip...)
	v5[0] = 0x55
	_, err = ICRC(v5, udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "IP version 5")
	_, err = ICRC(make([]byte, 41), udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "not v4 or v6")
	v6 := make([]byte, 41)
	v6[0] = 0x60
	_, err = ICRC(v6, udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "IPv6 header of 41 bytes")
	_, err = ICRC(v6[:39], udp, pkt)
	assert.ErrorIs(t, err, ErrBadIPHeader, "IPv6 header of 39 bytes")

	// VerifyICRC on fewer bytes than a BTH and an ICRC.
	for i := 0; i < BTHLen+ICRCLen; i++ {
		_, _, err := VerifyICRC(ip, udp, roce[:i])
		assert.ErrorIs(t, err, ErrTruncated, "VerifyICRC(roce[:%d])", i)
	}
	// The smallest: a bare BTH and ICRC.
	_, _, err = VerifyICRC(ip, udp, roce[:BTHLen+ICRCLen])
	assert.ErrorIs(t, err, ErrBadICRC)
}

// IPv4 options are covered by the ICRC (only TOS, TTL and checksum are
// masked).
func TestICRCWithIPv4Options(t *testing.T) {
	p := samplePacket(RCSendOnly, 4)
	frame, err := testEncap4.AppendFrame(nil, &p)
	require.NoError(t, err)
	_, ip, udp, roce := splitFrame(t, frame, false)
	pkt := roce[:len(roce)-4]

	opt := append([]byte(nil), ip...)
	opt[0] = 0x46 // IHL 6
	opt = append(opt, 0x01, 0x01, 0x01, 0x00)
	got, err := ICRC(opt, udp, pkt)
	require.NoError(t, err)
	assert.Equal(t, refICRC(opt, udp, pkt), got)
	plain, err := ICRC(ip, udp, pkt)
	require.NoError(t, err)
	assert.NotEqual(t, plain, got)

	// The longest header, IHL 15.
	long := append([]byte(nil), ip...)
	long[0] = 0x4F
	long = append(long, bytes.Repeat([]byte{0x01}, 40)...)
	got, err = ICRC(long, udp, pkt)
	require.NoError(t, err)
	assert.Equal(t, refICRC(long, udp, pkt), got)
}

func TestTrafficClassAndECN(t *testing.T) {
	assert.Equal(t, uint8(0xC2), TrafficClass(48, ECT0))
	assert.Equal(t, uint8(0x6A), TrafficClass(26, ECT0))
	assert.Equal(t, uint8(0x03), TrafficClass(0, CE))
	assert.Equal(t, uint8(0xFD), TrafficClass(63, ECT1))
	assert.Equal(t, "Not-ECT", NotECT.String())
	assert.Equal(t, "ECT(1)", ECT1.String())
	assert.Equal(t, "ECT(0)", ECT0.String())
	assert.Equal(t, "CE", CE.String())
}

func TestEncapString(t *testing.T) {
	e := Encap{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 49152}
	assert.Equal(t, "192.0.2.1:49152 -> 192.0.2.2:4791 tc=0", e.String())
	e6 := Encap{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"), SrcPort: 1, DstPort: 7, TrafficClass: 0xC2}
	assert.Equal(t, "[2001:db8::1]:1 -> [2001:db8::2]:7 tc=194", e6.String())
}

// The five-word IPv4 path of ICRC (a 20-byte header, read in place) gives
// what the reference gives over the masked copy, whatever the bytes.
func TestICRCIPv4WordsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(b []byte) {
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	for i := range 2000 {
		ip, udp := make([]byte, 20), make([]byte, 8)
		pkt := make([]byte, BTHLen+i%300)
		fill(ip)
		fill(udp)
		fill(pkt)
		ip[0] = 0x45
		got, err := ICRC(ip, udp, pkt)
		require.NoError(t, err)
		require.Equal(t, refICRC(ip, udp, pkt), got, "case %d", i)
	}
}

// TestAppendICRCBlockMatchesReference checks Packet.Append's ICRC laid
// out in the spare capacity (AppendSpare) against the independent
// refICRC, and against the same Append without spare capacity (the
// tables' way), over random headers and packet lengths on both sides of
// icrcInlineMax, IPv4 and IPv6.
func TestAppendICRCBlockMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	fill := func(b []byte) {
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	for i := range 3000 {
		var e Encap
		if i%2 == 0 {
			var a, b [4]byte
			fill(a[:])
			fill(b[:])
			e.Src, e.Dst = netip.AddrFrom4(a), netip.AddrFrom4(b)
			e.ID = uint16(rng.Uint32())
		} else {
			var a, b [16]byte
			fill(a[:])
			fill(b[:])
			a[0], b[0] = 0x20, 0x20 // not IPv4-mapped
			e.Src, e.Dst = netip.AddrFrom16(a), netip.AddrFrom16(b)
			e.FlowLabel = rng.Uint32()
		}
		e.TrafficClass, e.HopLimit = byte(rng.Uint32()), byte(rng.Uint32())
		e.SrcPort, e.DstPort = uint16(rng.Uint32()), uint16(rng.Uint32()%2)*UDPPort
		n := BTHLen + i%600
		pkt := make([]byte, n)
		fill(pkt)

		spare := append(make([]byte, 0, n+AppendSpare), pkt...)
		got, err := e.appendICRC(spare, n, true)
		require.NoError(t, err)
		require.Equal(t, n+ICRCLen, len(got), "case %d", i)
		exact := append(make([]byte, 0, n+ICRCLen), pkt...)
		tables, err := e.appendICRC(exact, n, true)
		require.NoError(t, err)
		require.Equal(t, tables, got, "case %d: spare capacity and tables disagree", i)

		h, err := e.AppendIPUDP(nil, n+ICRCLen)
		require.NoError(t, err)
		ipLen := e.IPHeaderLen()
		want := refICRC(h[:ipLen], h[ipLen:], pkt)
		require.Equal(t, want, binary.LittleEndian.Uint32(got[n:]), "case %d (%d bytes, IPv4 %v)", i, n, e.IsIPv4())
		require.Equal(t, pkt, got[:n], "case %d: the packet changed", i)
	}
}

// TestAppendICRCBlockInBatch checks that the block Append lays out past
// the packet does not reach bytes before it: packets appended one after
// another into one buffer, as the Endpoint's arena, each keep their
// bytes and ICRC.
func TestAppendICRCBlockInBatch(t *testing.T) {
	buf := make([]byte, 0, 64<<10)
	var ends []int
	var want [][]byte
	for i := range 40 {
		p := samplePacket(RCSendOnly, 0)
		p.Payload = testPayload(i * 37)
		one, err := p.Append(nil, &testEncap4)
		require.NoError(t, err)
		want = append(want, one)
		buf, err = p.AppendScratch(buf, &testEncap4)
		require.NoError(t, err)
		ends = append(ends, len(buf))
	}
	start := 0
	for i, end := range ends {
		require.Equal(t, want[i], buf[start:end], "packet %d", i)
		start = end
	}
}

// Append follows append's rule: of b's backing array it writes only
// what it appends, so a b cut from a larger buffer keeps the caller's
// bytes past it. AppendScratch gives the same bytes and writes at most
// AppendSpare bytes past them (its documented scratch room).
func TestAppendWritesOnlyWhatItAppends(t *testing.T) {
	const fillByte = 0xA5
	for _, e := range []Encap{testEncap4, testEncap6} {
		for _, op := range []Opcode{RCSendOnly, RCAcknowledge, RCWriteOnly} {
			for _, n := range []int{0, 7, 64, 256, 257, 1024} {
				if !op.Info().Payload && n > 0 {
					continue
				}
				p := samplePacket(op, n)
				want, err := p.Append(nil, &e)
				require.NoError(t, err)
				for _, scratch := range []bool{false, true} {
					big := bytes.Repeat([]byte{fillByte}, 4096)
					b := big[:100]
					var out []byte
					if scratch {
						out, err = p.AppendScratch(b, &e)
					} else {
						out, err = p.Append(b, &e)
					}
					require.NoError(t, err)
					require.Same(t, &big[0], &out[0], "appended in place")
					require.Equal(t, want, out[100:])
					keep := len(out)
					if scratch {
						keep += AppendSpare
					}
					for i, c := range big[keep:] {
						require.Equal(t, byte(fillByte), c,
							"%v %s payload %d scratch=%v: byte %d past the packet was written",
							e.Src, op, n, scratch, keep+i-len(out))
					}
				}
			}
		}
	}
}
