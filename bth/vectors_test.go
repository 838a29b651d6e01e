package bth

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scapy's UC SEND_ONLY vector (scapy test/contrib/roce.uts, quoted in
// docs/wire-format.md section 3): 192.168.0.7 -> 192.168.0.7, TOS 0x01, ID 1144, DF,
// TTL 64, UDP 49152 -> 4791, dQP 211, PSN 13571856, MigReq 1, PadCnt 2 and
// 20 bytes after the BTH (18 payload bytes and 2 pad bytes). IPv4 header
// checksum 0xb4d5, ICRC wire bytes 78 f3 53 f3.
func TestICRCScapyUCSendOnly(t *testing.T) {
	e := Encap{
		Src: netip.MustParseAddr("192.168.0.7"), Dst: netip.MustParseAddr("192.168.0.7"),
		SrcPort: 49152, TrafficClass: 0x01, HopLimit: 64, ID: 1144,
	}
	p := Packet{
		BTH:     BTH{Opcode: UCSendOnly, MigReq: true, PKey: 0xFFFF, DestQP: 211, PSN: 13571856},
		Payload: []byte("F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P"),
	}
	frame, err := e.AppendFrame(nil, &p)
	require.NoError(t, err)
	ip := frame[EthernetLen:]
	assert.Equal(t, uint16(0xb4d5), binary.BigEndian.Uint16(ip[10:]), "IPv4 header checksum")
	assert.Equal(t, uint16(64), binary.BigEndian.Uint16(ip[2:]), "IPv4 total length")
	roce := ip[IPv4Len+UDPLen:]
	assert.Equal(t, byte(0x60), roce[1], "SE 0, MigReq 1, PadCnt 2, TVer 0")
	assert.Equal(t, []byte{0x78, 0xf3, 0x53, 0xf3}, roce[len(roce)-4:], "ICRC wire bytes")

	// The same ICRC from the generic function given the headers, and verify.
	got, want, err := VerifyICRC(ip[:IPv4Len], ip[IPv4Len:IPv4Len+UDPLen], roce)
	require.NoError(t, err)
	assert.Equal(t, got, want)
	// scapy's UDP checksum 0xaca2 in place of our 0 changes nothing: masked.
	udp := append([]byte(nil), ip[IPv4Len:IPv4Len+UDPLen]...)
	binary.BigEndian.PutUint16(udp[6:], 0xaca2)
	_, _, err = VerifyICRC(ip[:IPv4Len], udp, roce)
	assert.NoError(t, err)
}

// The ConnectX-4 Lx CNP of docs/wire-format.md section 2 / testdata README: 10.0.17.1
// -> 10.0.18.1, TOS 0xC2, ID 0x718c, DF, TTL 64, UDP 0 -> 4791, BECN, dQP
// 0x118, PSN 0, 16 zero bytes, ICRC wire bytes 82 fd 00 2a.
func TestICRCConnectXCNP(t *testing.T) {
	e := Encap{
		Src: netip.MustParseAddr("10.0.17.1"), Dst: netip.MustParseAddr("10.0.18.1"),
		TrafficClass: TrafficClass(48, ECT0), HopLimit: 64, ID: 0x718c,
	}
	p := Packet{BTH: BTH{Opcode: CNP, PKey: 0xFFFF, BECN: true, DestQP: 0x118}}
	frame, err := e.AppendFrame(nil, &p)
	require.NoError(t, err)
	assert.Len(t, frame, 74)
	assert.Equal(t, byte(0xC2), frame[EthernetLen+1])
	assert.Equal(t, []byte{0x82, 0xfd, 0x00, 0x2a}, frame[len(frame)-4:])

	var d Packet
	require.NoError(t, d.Decode(frame[EthernetLen+IPv4Len+UDPLen:]))
	assert.Equal(t, CNP, d.BTH.Opcode)
	assert.True(t, d.BTH.BECN)
	assert.Equal(t, uint32(0x118), d.BTH.DestQP)
	assert.Equal(t, uint32(0x2a00fd82), d.ICRC)
}

func TestSourcePort(t *testing.T) {
	// Linux rdma_get_udp_sport: the result is always in 0xC000-0xFFFF, a
	// non-zero flow label is used as is, and the QPN hash is symmetric.
	assert.Equal(t, SourcePort(0, 0x11, 0x123456), SourcePort(0, 0x123456, 0x11))
	for _, c := range []struct{ fl, l, r uint32 }{{0, 0, 0}, {0, 0x11, 0x11}, {0, 0xFFFFFF, 0xFFFFFF}, {0x12345, 1, 2}} {
		p := SourcePort(c.fl, c.l, c.r)
		assert.GreaterOrEqual(t, p, uint16(0xC000))
	}
	// Worked by hand: fl = 0x11*0x11 = 0x121; 0x121 ^ 0 = 0x121 | 0xC000.
	assert.Equal(t, uint16(0xC121), SourcePort(0, 0x11, 0x11))
	// flow label 0xFC001: (0x0001 ^ 0x3F) | 0xC000.
	assert.Equal(t, uint16(0xC03E), SourcePort(0xFC001, 5, 6))
}
