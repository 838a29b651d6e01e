package bth

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// Seeds are only bytes this package's encoder makes: one UDP payload (BTH to
// ICRC) per opcode and payload size. The capture
// testdata/rxe-rc-pingpong-send-unacked-retransmit.pcapng is not used as a
// seed: the bth package does not parse pcap files.

// seedPackets returns the encoded UDP payload of every opcode with payload
// sizes 0 and 5 (where the opcode carries payload), IPv4 and IPv6.
func seedPackets(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, op := range Opcodes() {
		sizes := []int{0}
		if op.Info().Payload {
			sizes = append(sizes, 5)
		}
		for _, enc := range testEncaps {
			e := enc.e
			for _, n := range sizes {
				p := samplePacket(op, n)
				b, err := p.Append(nil, &e)
				if err != nil {
					tb.Fatalf("encode %s: %v", op, err)
				}
				out = append(out, b)
			}
		}
	}
	return out
}

// headerOffset returns where header h starts in a packet of opcode op, or -1.
func headerOffset(op Opcode, h Ext) int {
	off, at := BTHLen, -1
	op.Info().Ext.Each(func(x Ext, size int, _ string) {
		if x == h {
			at = off
		}
		off += size
	})
	return at
}

var headerExt = map[string]Ext{
	"RETH": ExtRETH, "AETH": ExtAETH, "DETH": ExtDETH, "ImmDt": ExtImmDt, "IETH": ExtIETH,
	"AtomicETH": ExtAtomicETH, "AtomicAckETH": ExtAtomicAckETH,
}

// fuzzHeader fuzzes one header decoder: it must never panic, fail exactly
// when the input is shorter than the header (with ErrTruncated), and when it
// succeeds re-encoding must give back the bytes it read.
func fuzzHeader(f *testing.F, name string) {
	c := codecByName(f, name)
	for _, pkt := range seedPackets(f) {
		if name == "BTH" {
			f.Add(pkt)
			continue
		}
		if at := headerOffset(Opcode(pkt[0]), headerExt[name]); at >= 0 {
			f.Add(pkt[at:])
		} else {
			f.Add(pkt)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := c.decode(data)
		if len(data) < c.size {
			var de *DecodeError
			if !errors.Is(err, ErrTruncated) || !errors.As(err, &de) {
				t.Fatalf("%s.Decode(%d bytes) = %v, want a *DecodeError wrapping ErrTruncated", name, len(data), err)
			}
			if de.Need != c.size || de.Have != len(data) {
				t.Fatalf("%s.Decode(%d bytes): Need %d Have %d", name, len(data), de.Need, de.Have)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s.Decode(%d bytes) = %v", name, len(data), err)
		}
		enc := c.append(v, nil)
		if !bytes.Equal(enc, data[:c.size]) {
			t.Fatalf("%s re-encoded as % x, read from % x", name, enc, data[:c.size])
		}
		v2, err := c.decode(enc)
		if err != nil || !reflect.DeepEqual(v, v2) {
			t.Fatalf("%s decode(encode(v)) = %+v, %v; want %+v", name, v2, err, v)
		}
	})
}

func FuzzBTH(f *testing.F)          { fuzzHeader(f, "BTH") }
func FuzzRETH(f *testing.F)         { fuzzHeader(f, "RETH") }
func FuzzAETH(f *testing.F)         { fuzzHeader(f, "AETH") }
func FuzzDETH(f *testing.F)         { fuzzHeader(f, "DETH") }
func FuzzImmDt(f *testing.F)        { fuzzHeader(f, "ImmDt") }
func FuzzIETH(f *testing.F)         { fuzzHeader(f, "IETH") }
func FuzzAtomicETH(f *testing.F)    { fuzzHeader(f, "AtomicETH") }
func FuzzAtomicAckETH(f *testing.F) { fuzzHeader(f, "AtomicAckETH") }

var decodeSentinels = []error{ErrTruncated, ErrUnknownOpcode, ErrTVer, ErrPadCnt, ErrUnexpectedPayload}

// samePacket compares two Packets field by field, the payload by content.
func samePacket(a, b Packet) bool {
	pa, pb := a.Payload, b.Payload
	a.Payload, b.Payload = nil, nil
	return reflect.DeepEqual(a, b) && bytes.Equal(pa, pb)
}

func FuzzPacket(f *testing.F) {
	for _, pkt := range seedPackets(f) {
		f.Add(pkt)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var p Packet
		err := p.Decode(data)
		checkPrefixes(t, data, &p, err)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode error %T %v is not a *DecodeError", err, err)
			}
			ok := false
			for _, s := range decodeSentinels {
				ok = ok || errors.Is(err, s)
			}
			if !ok {
				t.Fatalf("Decode error %v wraps no decode sentinel", err)
			}
			_ = err.Error() // must not panic either
			return
		}

		info := p.BTH.Opcode.Info()
		if info == nil {
			t.Fatalf("Decode accepted unknown opcode %#x", uint8(p.BTH.Opcode))
		}
		if p.BTH.TVer != 0 {
			t.Fatalf("Decode accepted TVer %d", p.BTH.TVer)
		}
		off := BTHLen + info.Ext.Len()
		pad := int(p.BTH.PadCnt)
		if off+len(p.Payload)+pad+ICRCLen != len(data) {
			t.Fatalf("headers %d + payload %d + pad %d + ICRC 4 != %d bytes", off, len(p.Payload), pad, len(data))
		}
		if !info.Payload && len(p.Payload) != 0 {
			t.Fatalf("%s decoded with %d payload bytes", p.BTH.Opcode, len(p.Payload))
		}
		// The payload aliases the input and lies inside it, capacity too.
		if len(p.Payload) > 0 && &p.Payload[0] != &data[off] {
			t.Fatalf("payload does not alias data[%d:]", off)
		}
		if off+cap(p.Payload) > len(data) {
			t.Fatalf("payload capacity %d reaches past the input", cap(p.Payload))
		}
		if p.ICRC != binary.LittleEndian.Uint32(data[len(data)-4:]) {
			t.Fatalf("ICRC %#x is not the last 4 bytes read little-endian", p.ICRC)
		}

		// Re-encode the headers and payload, put the same ICRC bytes back,
		// decode again: the same Packet. The encoder derives PadCnt from
		// the payload length, so a PadCnt that is not (-len)&3 on the
		// wire (which Decode accepts) comes back canonical.
		enc, err := p.AppendTransport(nil)
		if err != nil {
			t.Fatalf("AppendTransport of a decoded packet: %v", err)
		}
		enc = append(enc, data[len(data)-4:]...)
		var q Packet
		if err := q.Decode(enc); err != nil {
			t.Fatalf("decode of re-encoded packet: %v\n% x", err, enc)
		}
		want := p
		canonical := int(p.BTH.PadCnt) == PadLen(len(p.Payload))
		want.BTH.PadCnt = uint8(PadLen(len(p.Payload)))
		if !samePacket(want, q) {
			t.Fatalf("round trip changed the packet:\n got %+v\nwant %+v", q, want)
		}
		// When the input was canonical (PadCnt (-len)&3, zero pad, zero
		// CNP reserved bytes), the bytes are the same too.
		zeroPad := bytes.Count(data[off+len(p.Payload):len(data)-4], []byte{0}) == pad
		zeroCNP := info.Ext&ExtCNP == 0 || bytes.Count(data[BTHLen:BTHLen+CNPReservedLen], []byte{0}) == CNPReservedLen
		if canonical && zeroPad && zeroCNP && !bytes.Equal(enc, data) {
			t.Fatalf("canonical packet re-encoded differently:\n got % x\nwant % x", enc, data)
		}
	})
}

// checkPrefixes checks DecodePrefix against Decode on cuts of data: the
// whole of it is Decode; a cut inside the headers is ErrTruncated (or the
// BTH error Decode gives); a cut after them decodes the same headers, and
// the payload present is the start of Decode's; an invalid packet stays
// invalid however it is cut.
func checkPrefixes(t *testing.T, data []byte, p *Packet, err error) {
	var q Packet
	qerr := q.DecodePrefix(data, len(data))
	if (err == nil) != (qerr == nil) || err != nil && err.Error() != qerr.Error() {
		t.Fatalf("DecodePrefix(all %d bytes) = %v, Decode = %v", len(data), qerr, err)
	}
	if err == nil && !samePacket(*p, q) {
		t.Fatalf("DecodePrefix(all bytes) = %+v, Decode = %+v", q, *p)
	}
	hdr := -1
	if info := Opcode(firstByte(data)).Info(); info != nil {
		hdr = BTHLen + info.Ext.Len()
	}
	for _, cut := range []int{0, BTHLen - 1, BTHLen, hdr - 1, hdr, hdr + 1, len(data) / 2, len(data) - 5, len(data) - 1} {
		if cut < 0 || cut >= len(data) {
			continue
		}
		var c Packet
		cerr := c.DecodePrefix(data[:cut], len(data))
		if cerr != nil {
			var de *DecodeError
			if !errors.As(cerr, &de) {
				t.Fatalf("DecodePrefix error %T %v is not a *DecodeError", cerr, cerr)
			}
			_ = cerr.Error()
		}
		switch {
		case hdr < 0 || cut < hdr:
			// Cut inside the headers, or an opcode with no headers to
			// decode: an error, ErrTruncated unless the BTH itself is bad.
			if cerr == nil {
				t.Fatalf("DecodePrefix(%d of %d bytes) inside the %d header bytes: no error", cut, len(data), hdr)
			}
			if cut < BTHLen && !errors.Is(cerr, ErrTruncated) {
				t.Fatalf("DecodePrefix(%d bytes) = %v, want ErrTruncated", cut, cerr)
			}
		case err != nil:
			if cerr == nil {
				t.Fatalf("Decode = %v but DecodePrefix(%d of %d bytes) succeeded", err, cut, len(data))
			}
			if errors.Is(cerr, ErrTruncated) != errors.Is(err, ErrTruncated) {
				t.Fatalf("Decode = %v, DecodePrefix(%d of %d bytes) = %v", err, cut, len(data), cerr)
			}
		default:
			if cerr != nil {
				t.Fatalf("Decode ok, DecodePrefix(%d of %d bytes) = %v", cut, len(data), cerr)
			}
			want := *p
			n := min(len(p.Payload), cut-hdr)
			want.Payload = p.Payload[:n]
			want.ICRC = 0
			if !samePacket(want, c) {
				t.Fatalf("DecodePrefix(%d of %d bytes) = %+v, want %+v", cut, len(data), c, want)
			}
			if cap(c.Payload) != n {
				t.Fatalf("DecodePrefix payload capacity %d, length %d", cap(c.Payload), n)
			}
		}
	}
}

func firstByte(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

func FuzzICRC(f *testing.F) {
	for _, op := range Opcodes() {
		for _, enc := range testEncaps {
			e := enc.e
			p := samplePacket(op, 0)
			if op.Info().Payload {
				p.Payload = testPayload(3)
			}
			frame, err := e.AppendFrame(nil, &p)
			if err != nil {
				f.Fatal(err)
			}
			_, ip, udp, roce := splitFrame(f, frame, enc.name == "IPv6")
			f.Add(ip, udp, roce[:len(roce)-4])
		}
	}
	f.Fuzz(func(t *testing.T, ip, udp, pkt []byte) {
		crc, err := ICRC(ip, udp, pkt)
		valid := len(udp) == 8 && len(pkt) >= BTHLen && len(ip) > 0
		if valid {
			switch ip[0] >> 4 {
			case 4:
				ihl := int(ip[0]&0x0F) * 4
				valid = ihl >= 20 && len(ip) == ihl
			case 6:
				valid = len(ip) == 40
			default:
				valid = false
			}
		}
		if valid != (err == nil) {
			t.Fatalf("ICRC(ip %d bytes, udp %d, pkt %d) error %v, valid by the documented rules: %v", len(ip), len(udp), len(pkt), err, valid)
		}
		if err != nil {
			if !errors.Is(err, ErrBadIPHeader) {
				t.Fatalf("ICRC error %v, want ErrBadIPHeader", err)
			}
		} else if want := refICRC(ip, udp, pkt); crc != want {
			t.Fatalf("ICRC = %#08x, independent computation %#08x", crc, want)
		}

		// VerifyICRC over the same bytes taken as a whole UDP payload.
		got, want, err := VerifyICRC(ip, udp, pkt)
		switch {
		case len(pkt) < BTHLen+ICRCLen:
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("VerifyICRC(%d bytes) = %v, want ErrTruncated", len(pkt), err)
			}
		case err == nil:
			if got != want || got != binary.LittleEndian.Uint32(pkt[len(pkt)-4:]) {
				t.Fatalf("VerifyICRC ok but got %#x want %#x", got, want)
			}
		case errors.Is(err, ErrBadICRC):
			if got == want {
				t.Fatalf("VerifyICRC: ErrBadICRC with equal CRCs %#x", got)
			}
		case !errors.Is(err, ErrBadIPHeader):
			t.Fatalf("VerifyICRC error %v", err)
		}
	})
}
