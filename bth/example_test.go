package bth_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
)

// Encode a SEND as the payload of a UDP datagram and as an Ethernet frame,
// then decode it again.
func Example() {
	e := bth.Encap{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"),
		SrcPort: bth.SourcePort(0, 0x11, 0x12), TrafficClass: bth.TrafficClass(26, bth.ECT0)}
	p := bth.Packet{
		BTH:     bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x12, PSN: 100, AckReq: true},
		Payload: []byte("hello"),
	}
	udpPayload, err := p.Append(nil, &e)
	if err != nil {
		panic(err)
	}
	frame, err := e.AppendFrame(nil, &p)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(udpPayload), len(frame))

	var q bth.Packet
	if err := q.Decode(udpPayload); err != nil {
		panic(err)
	}
	fmt.Println(q.BTH.Opcode, q.BTH.Opcode.Name(), q.BTH.PSN, q.BTH.PadCnt, string(q.Payload))
	// Output:
	// 24 66
	// RC_SEND_ONLY Reliable Connection (RC) - SEND Only 100 3 hello
}

func ExampleSyndrome_KindName() {
	for _, s := range []bth.Syndrome{0x1F, bth.RNRNAKSyndrome(14), bth.SyndromePSNSeqErr, bth.SyndromeRemoteAccess} {
		fmt.Println(s.KindName(), s.Value())
	}
	// Output:
	// ACK 31
	// RNR_NAK 14
	// NAK_PSN_SEQ 0
	// NAK_REMOTE_ACCESS 2
}

func ExamplePSN_After() {
	fmt.Println(bth.PSN(0).After(0xFFFFFF), bth.PSN(0xFFFFFF).Next())
	// Output: true 0
}

// The ICRC covers the IP and UDP headers (with the fields that change in
// flight masked) and the whole RoCEv2 packet: a receiver that knows the
// headers verifies it, and one flipped payload bit makes it fail.
func ExampleEncap_VerifyICRC() {
	e := bth.Encap{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"),
		SrcPort: bth.SourcePort(0, 0x11, 0x12), HopLimit: 64}
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: 0x12, PSN: 7, AckReq: true},
		RETH:    bth.RETH{VA: 0x1000, RKey: 0x2a, DMALength: 4},
		Payload: []byte("data")}
	udpPayload, err := p.Append(nil, &e)
	if err != nil {
		panic(err)
	}
	got, want, err := e.VerifyICRC(udpPayload)
	fmt.Printf("%d bytes, ICRC %#08x, computed %#08x, err %v\n", len(udpPayload), got, want, err)

	udpPayload[len(udpPayload)-5] ^= 1 // the last payload byte
	_, _, err = e.VerifyICRC(udpPayload)
	fmt.Println(errors.Is(err, bth.ErrBadICRC))
	// Output:
	// 36 bytes, ICRC 0x32fa3d45, computed 0x32fa3d45, err <nil>
	// true
}
