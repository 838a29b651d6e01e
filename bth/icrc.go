package bth

import (
	"encoding/binary"
	"hash/crc32"
)

var ones8 = [8]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

// ICRC computes the invariant CRC of a RoCEv2 packet (IBTA Annex A17.8).
//
// ip is the IPv4 header (options included) or the 40-byte IPv6 fixed header
// the packet travels in, udp the 8-byte UDP header, and pkt the packet from
// the BTH to the end of the pad, without the ICRC. The CRC-32 (IEEE, as
// zlib's) runs over 8 bytes of 0xFF, the IP header with the variant fields
// set to ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow
// label, hop limit), the UDP header with checksum 0xFFFF, the BTH with byte 4
// (FECN, BECN, reserved) 0xFF, and the rest of pkt. The result goes on the
// wire little-endian (binary.LittleEndian.PutUint32), as rxe's rxe_icrc.c
// writes it.
//
// It returns ErrBadIPHeader when ip is not an IPv4 or IPv6 header of the
// length it claims, when udp is not 8 bytes, or when pkt is shorter than a
// BTH. It does not allocate.
func ICRC(ip, udp, pkt []byte) (uint32, error) {
	if len(udp) != 8 || len(pkt) < BTHLen || len(ip) == 0 {
		return 0, ErrBadIPHeader
	}
	if len(ip) == 20 && ip[0] == 0x45 {
		// IPv4 without options, the usual case: the masked headers are
		// five words, read in place.
		return crc32.Update(ipv4HeaderCRC(ip, udp, pkt), crc32.IEEETable, pkt[BTHLen:]), nil
	}
	// The masked headers are copied to a stack buffer and go through
	// update, which keeps them off the heap (crc32.Update would make its
	// argument escape); the 8 bytes of ones are a constant start.
	var h [8 + 60 + UDPLen + BTHLen]byte
	n := 0
	switch ip[0] >> 4 {
	case 4:
		ihl := int(ip[0]&0x0F) * 4
		if ihl < 20 || len(ip) != ihl {
			return 0, ErrBadIPHeader
		}
		n = copy(h[:], ip)
		h[1] = 0xFF               // TOS
		h[8] = 0xFF               // TTL
		h[10], h[11] = 0xFF, 0xFF // header checksum
	case 6:
		if len(ip) != IPv6Len {
			return 0, ErrBadIPHeader
		}
		n = copy(h[:], ip)
		// Version nibble, then traffic class and flow label all ones.
		h[0] |= 0x0F
		h[1], h[2], h[3] = 0xFF, 0xFF, 0xFF
		h[7] = 0xFF // hop limit
	default:
		return 0, ErrBadIPHeader
	}
	n += copy(h[n:], udp)
	h[n-2], h[n-1] = 0xFF, 0xFF // UDP checksum
	n += copy(h[n:], pkt[:BTHLen])
	h[n-BTHLen+4] = 0xFF // FECN, BECN, reserved
	crc := update(crcOnes8, h[:n])
	return crc32.Update(crc, crc32.IEEETable, pkt[BTHLen:]), nil
}

// crcOnes8 is the CRC-32 of the 8 bytes of ones the ICRC starts with.
var crcOnes8 = crc32.ChecksumIEEE(ones8[:])

// slicing8 are the tables of the slicing-by-8 CRC-32 (IEEE), built from
// the standard library's table.
var slicing8 = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := range 256 {
		c := t[0][i]
		for j := 1; j < 8; j++ {
			c = t[0][c&0xFF] ^ c>>8
			t[j][i] = c
		}
	}
	return t
}()

// update is crc32.Update(crc, crc32.IEEETable, p), eight bytes at a time
// (slicing-by-8). crc32.Update hands p to an assembly routine through a
// function variable, which makes every slice passed to it escape; the
// header bytes go through here instead, so that they stay on the stack.
func update(crc uint32, p []byte) uint32 {
	crc = ^crc
	t := &slicing8
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xFF] ^ t[6][crc>>8&0xFF] ^ t[7][crc&0xFF]
		p = p[8:]
	}
	for _, b := range p {
		crc = t[0][byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// ipv4HeaderCRC is update(crcOnes8, h) over the masked headers ICRC
// copies into h, for a 20-byte IPv4 header: five 8-byte words of
// slicing-by-8, each masked as it is loaded (IPv4 TOS, TTL and checksum,
// UDP checksum, BTH byte 4), without the copy.
func ipv4HeaderCRC(ip, udp, pkt []byte) uint32 {
	le := binary.LittleEndian
	crc := ^crcOnes8
	crc = step8(crc, le.Uint64(ip[0:8])|0xFF<<8)                                             // TOS
	crc = step8(crc, le.Uint64(ip[8:16])|0xFF|0xFFFF<<16)                                    // TTL, checksum
	crc = step8(crc, uint64(le.Uint32(ip[16:20]))|uint64(le.Uint32(udp[0:4]))<<32)           // addresses, ports
	crc = step8(crc, uint64(le.Uint32(udp[4:8])|0xFFFF<<16)|uint64(le.Uint32(pkt[0:4]))<<32) // UDP checksum
	crc = step8(crc, le.Uint64(pkt[4:12])|0xFF)                                              // FECN, BECN, reserved
	return ^crc
}

// step8 runs one slicing-by-8 step of update over the 8 bytes whose
// little-endian value is w.
func step8(crc uint32, w uint64) uint32 {
	t := &slicing8
	lo, hi := uint32(w)^crc, uint32(w>>32)
	return t[0][hi>>24] ^ t[1][hi>>16&0xFF] ^ t[2][hi>>8&0xFF] ^ t[3][hi&0xFF] ^
		t[4][lo>>24] ^ t[5][lo>>16&0xFF] ^ t[6][lo>>8&0xFF] ^ t[7][lo&0xFF]
}

// VerifyICRC checks the ICRC at the end of roce, a whole UDP payload (BTH to
// ICRC), against the IP and UDP headers it arrived in. It returns the CRC
// found on the wire and the one computed; err is ErrBadICRC when they
// differ, ErrBadIPHeader for bad headers, or a *DecodeError wrapping
// ErrTruncated when roce is too short to hold a BTH and an ICRC.
func VerifyICRC(ip, udp, roce []byte) (got, want uint32, err error) {
	if len(roce) < BTHLen+ICRCLen {
		return 0, 0, &DecodeError{Err: ErrTruncated, Header: "ICRC", Need: BTHLen + ICRCLen, Have: len(roce)}
	}
	end := len(roce) - ICRCLen
	got = binary.LittleEndian.Uint32(roce[end:])
	want, err = ICRC(ip, udp, roce[:end])
	if err == nil && got != want {
		err = ErrBadICRC
	}
	return got, want, err
}

// icrcInlineMax is the longest rest of a packet (after the BTH) that
// appendICRC folds into its block with the headers; a longer one is run
// through crc32.Update after the block.
const icrcInlineMax = 256

// AppendSpare is the spare capacity, beyond the packet, that lets
// Packet.AppendScratch compute the ICRC without table lookups for the
// headers (amd64 and arm64): AppendScratch lays the masked headers out
// there before it appends the ICRC, overwriting whatever b's backing
// array held past the packet. With less it computes the same ICRC with
// the slicing tables, as Packet.Append always does; neither grows b for
// it.
const AppendSpare = 4 + IPv6Len + UDPLen + BTHLen + icrcInlineMax + 16 + ICRCLen

// appendICRC appends the ICRC of pkt, the last bytes of b (BTH to the end
// of the pad), as it travels inside the headers e describes; it is
// e.ICRC(pkt), computed otherwise. The masked headers, after 4 bytes of
// ones and before a short packet's rest, are laid out in b's spare
// capacity when scratch is set and there is room (AppendSpare; otherwise
// ICRC's way, writing nothing past the ICRC) and the CRC-32 runs over them with
// crc32.Update, whose folding with carry-less multiplication (amd64,
// arm64 has CRC instructions) takes no table lookups for whole 16-byte
// blocks of at least 64 bytes. The layout gets there with leading zeros:
// the ICRC starts from a register of ones and 8 bytes of 0xFF (the LRH's
// place), and after the first 4 the register is 0, which zeros leave at
// 0; so the CRC of zeros, then 4 bytes of 0xFF, then the rest, from a
// register of 0, is the ICRC. A packet's ICRC with the payload in cache
// otherwise took about 100 ns per small packet in a ping-pong (two 8 KiB
// slicing tables, evicted between turns), which is what this saves.
func (e *Encap) appendICRC(b []byte, pktLen int, scratch bool) ([]byte, error) {
	src, dst := e.Src.Unmap(), e.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return b, ErrBadIPHeader
	}
	if pktLen < BTHLen || pktLen > len(b) {
		return b, ErrBadIPHeader
	}
	v4 := src.Is4()
	ipLen := IPv6Len
	if v4 {
		ipLen = IPv4Len
	}
	udpLen := UDPLen + pktLen + ICRCLen
	if udpLen+ipLen > 0xFFFF {
		return b, ErrBadIPHeader
	}
	rest := pktLen - BTHLen
	inline := rest <= icrcInlineMax
	n := 4 + ipLen + UDPLen + BTHLen
	if inline {
		n += rest
	}
	total := max((n+15)&^15, 64)
	end := len(b)
	if !scratch || cap(b)-end < total+ICRCLen {
		// No room for the block: the tables' way, in place.
		crc, err := e.ICRC(b[end-pktLen:])
		if err != nil {
			return b, err
		}
		return binary.LittleEndian.AppendUint32(b, crc), nil
	}
	s := b[end : end+total]
	pkt := b[end-pktLen : end]
	z := total - n
	clear(s[:z])
	be := binary.BigEndian
	dport := e.DstPort
	if dport == 0 {
		dport = UDPPort
	}
	// The fixed-size views below let the compiler drop the bounds checks
	// of the header fields' stores.
	if v4 {
		v := (*[4 + IPv4Len + UDPLen + BTHLen]byte)(s[z:])
		a, d := src.As4(), dst.As4()
		// Four bytes of ones; the IPv4 header with TOS, TTL and the
		// header checksum ones (masked).
		be.PutUint32(v[0:], 0xFFFFFFFF)
		be.PutUint32(v[4:], 0x45FF0000|uint32(IPv4Len+udpLen))
		be.PutUint32(v[8:], uint32(e.ID)<<16|0x4000)
		be.PutUint32(v[12:], 0xFF11FFFF)
		copy(v[16:20], a[:])
		copy(v[20:24], d[:])
	} else {
		v := (*[4 + IPv6Len + UDPLen + BTHLen]byte)(s[z:])
		a, d := src.As16(), dst.As16()
		// Four bytes of ones; the IPv6 header with traffic class, flow
		// label and hop limit ones (masked).
		be.PutUint32(v[0:], 0xFFFFFFFF)
		be.PutUint32(v[4:], 0x6FFFFFFF)
		be.PutUint32(v[8:], uint32(udpLen)<<16|17<<8|0xFF)
		copy(v[12:28], a[:])
		copy(v[28:44], d[:])
	}
	h := s[z+4+ipLen:]
	u := (*[UDPLen + BTHLen]byte)(h)
	be.PutUint32(u[0:], uint32(e.SrcPort)<<16|uint32(dport))
	be.PutUint32(u[4:], uint32(udpLen)<<16|0xFFFF) // checksum masked
	// The BTH, byte 4 (FECN, BECN, reserved) ones.
	bh := (*[BTHLen]byte)(pkt)
	be.PutUint64(u[8:], be.Uint64(bh[0:])|0xFF<<24)
	be.PutUint32(u[16:], be.Uint32(bh[8:]))
	if inline {
		copy(h[UDPLen+BTHLen:], pkt[BTHLen:])
	}
	crc := crc32.Update(0xFFFFFFFF, crc32.IEEETable, s)
	if !inline {
		crc = crc32.Update(crc, crc32.IEEETable, pkt[BTHLen:])
	}
	return binary.LittleEndian.AppendUint32(b, crc), nil
}
