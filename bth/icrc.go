package bth

import (
	"encoding/binary"
	"hash/crc32"
)

var ones8 = [8]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

// ipv6First[v] is the first byte of an IPv6 header with version v and the
// traffic class's high nibble masked to ones.
var ipv6First = [16]byte{0x0F, 0x1F, 0x2F, 0x3F, 0x4F, 0x5F, 0x6F, 0x7F, 0x8F, 0x9F, 0xAF, 0xBF, 0xCF, 0xDF, 0xEF, 0xFF}

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
	// The headers go through update, which keeps them off the heap (they
	// may be a caller's stack array); the variant fields are fed as slices
	// of ones8.
	up := update
	ff := ones8[:]
	crc := up(0, ff)
	switch ip[0] >> 4 {
	case 4:
		ihl := int(ip[0]&0x0F) * 4
		if ihl < 20 || len(ip) != ihl {
			return 0, ErrBadIPHeader
		}
		crc = up(crc, ip[0:1])
		crc = up(crc, ff[:1]) // TOS
		crc = up(crc, ip[2:8])
		crc = up(crc, ff[:1]) // TTL
		crc = up(crc, ip[9:10])
		crc = up(crc, ff[:2]) // header checksum
		crc = up(crc, ip[12:ihl])
	case 6:
		if len(ip) != IPv6Len {
			return 0, ErrBadIPHeader
		}
		// Version nibble, then traffic class and flow label all ones.
		crc = up(crc, ipv6First[ip[0]>>4:ip[0]>>4+1])
		crc = up(crc, ff[:3])
		crc = up(crc, ip[4:7])
		crc = up(crc, ff[:1]) // hop limit
		crc = up(crc, ip[8:40])
	default:
		return 0, ErrBadIPHeader
	}
	crc = up(crc, udp[0:6])
	crc = up(crc, ff[:2]) // UDP checksum
	crc = up(crc, pkt[0:4])
	crc = up(crc, ff[:1]) // FECN, BECN, reserved
	crc = up(crc, pkt[5:BTHLen])
	return crc32.Update(crc, crc32.IEEETable, pkt[BTHLen:]), nil
}

// update is crc32.Update(crc, crc32.IEEETable, p) one byte at a time with
// the standard library's table. crc32.Update hands p to an assembly
// routine through a function variable, which makes every slice passed to
// it escape; the few header bytes go through here instead, so that the
// headers Encap.ICRC builds on its stack stay there.
func update(crc uint32, p []byte) uint32 {
	crc = ^crc
	for _, b := range p {
		crc = crc32.IEEETable[byte(crc)^b] ^ crc>>8
	}
	return ^crc
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
