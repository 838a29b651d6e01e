package pcap_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
)

// Write a two-packet capture (an RDMA WRITE and its ACK) into memory, then
// read it back, decode each frame and summarise the flows, as `roce-emu
// decode` does.
func Example() {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	var file bytes.Buffer
	w, err := pcap.NewWriter(&file)
	if err != nil {
		log.Fatal(err)
	}
	t0 := time.Unix(1700000000, 0)
	write := bth.Packet{BTH: bth.BTH{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: 0x12, PSN: 100, AckReq: true},
		RETH: bth.RETH{VA: 0x10000, RKey: 0x2a, DMALength: 5}, Payload: []byte("hello")}
	ack := bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: 100},
		AETH: bth.AETH{Syndrome: 0x1F, MSN: 1}}
	if err := w.WritePacket(t0, &bth.Encap{Src: a, Dst: b, SrcPort: 49152, TrafficClass: bth.TrafficClass(26, bth.ECT0)}, &write); err != nil {
		log.Fatal(err)
	}
	if err := w.WritePacket(t0.Add(3*time.Microsecond), &bth.Encap{Src: b, Dst: a, SrcPort: 49152}, &ack); err != nil {
		log.Fatal(err)
	}
	if err := w.Close(); err != nil {
		log.Fatal(err)
	}

	r, err := pcap.NewReader(&file)
	if err != nil {
		log.Fatal(err)
	}
	d, s := pcap.NewDecoder(), pcap.NewSummary()
	var rec pcap.Record
	for {
		frame, ci, lt, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		k, err := d.Decode(frame, ci, lt, &rec)
		if err != nil {
			log.Fatal(err)
		}
		s.Add(k, &rec)
		p := &rec.Packet
		fmt.Printf("%v %s > %s %s psn=%d payload=%d ecn=%s icrc_ok=%v\n", rec.Time.Sub(t0), rec.Src, rec.Dst,
			p.BTH.Opcode, p.BTH.PSN, rec.PayloadLen, rec.ECN, rec.ICRCOK)
	}
	fmt.Println(r.Format(), "frames:", s.Frames, "RoCEv2:", s.RoCE, "bad ICRC:", s.BadICRC)
	for _, f := range s.Flows {
		fmt.Println(f)
	}
	// Output:
	// 0s 192.0.2.1 > 192.0.2.2 RC_RDMA_WRITE_ONLY psn=100 payload=5 ecn=ECT(0) icrc_ok=true
	// 3µs 192.0.2.2 > 192.0.2.1 RC_ACKNOWLEDGE psn=100 payload=0 ecn=Not-ECT icrc_ok=true
	// pcap frames: 2 RoCEv2: 2 bad ICRC: 0
	// requests RC 192.0.2.1 > 192.0.2.2 dqpn=0x000012 packets=1 psn=100..100 messages=1 payload=5B retransmitted=0
	// responses RC 192.0.2.2 > 192.0.2.1 dqpn=0x000011 packets=1 psn=100..100 messages=0 payload=0B retransmitted=0 acks=1 naks=0 rnr_naks=0 last_msn=1
}
