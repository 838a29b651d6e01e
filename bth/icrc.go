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
	crc := crc32.Update(0, crc32.IEEETable, ones8[:])
	switch ip[0] >> 4 {
	case 4:
		ihl := int(ip[0]&0x0F) * 4
		if ihl < 20 || len(ip) != ihl {
			return 0, ErrBadIPHeader
		}
		var h [60]byte
		copy(h[:], ip)
		h[1] = 0xFF               // TOS
		h[8] = 0xFF               // TTL
		h[10], h[11] = 0xFF, 0xFF // header checksum
		crc = crc32.Update(crc, crc32.IEEETable, h[:ihl])
	case 6:
		if len(ip) != 40 {
			return 0, ErrBadIPHeader
		}
		var h [40]byte
		copy(h[:], ip)
		h[0] |= 0x0F // traffic class, high nibble
		h[1] = 0xFF  // traffic class low nibble, flow label
		h[2], h[3] = 0xFF, 0xFF
		h[7] = 0xFF // hop limit
		crc = crc32.Update(crc, crc32.IEEETable, h[:])
	default:
		return 0, ErrBadIPHeader
	}
	var u [8]byte
	copy(u[:], udp)
	u[6], u[7] = 0xFF, 0xFF
	crc = crc32.Update(crc, crc32.IEEETable, u[:])
	var bth [BTHLen]byte
	copy(bth[:], pkt)
	bth[4] = 0xFF
	crc = crc32.Update(crc, crc32.IEEETable, bth[:])
	return crc32.Update(crc, crc32.IEEETable, pkt[BTHLen:]), nil
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
