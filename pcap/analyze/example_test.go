package analyze_test

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
	"github.com/roce-emu/roce-emu/pcap/analyze"
)

// A capture taken at the requester of three SENDs, the second of which
// (PSN 101) was lost after it left: the responder NAKs the sequence error
// at PSN 101 when 102 arrives, and the requester goes back N, resending
// 101 and 102. The analyzer pairs the two
// directions into one connection, counts three messages (resends are not
// new ones) and reports the go-back-N episode with its cause and delay.
func Example() {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	req := &bth.Encap{Src: a, Dst: b, SrcPort: 49152}
	resp := &bth.Encap{Src: b, Dst: a, SrcPort: 49152}
	send := func(psn bth.PSN) *bth.Packet {
		return &bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x12, PSN: psn, AckReq: true},
			Payload: []byte("ping")}
	}
	ack := func(psn bth.PSN, syndrome bth.Syndrome, msn uint32) *bth.Packet {
		return &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: psn},
			AETH: bth.AETH{Syndrome: syndrome, MSN: msn}}
	}
	var file bytes.Buffer
	w, err := pcap.NewWriter(&file)
	if err != nil {
		log.Fatal(err)
	}
	t := time.Unix(1700000000, 0)
	for _, f := range []struct {
		after time.Duration
		e     *bth.Encap
		p     *bth.Packet
	}{
		{0, req, send(100)},
		{5 * time.Microsecond, resp, ack(100, 0x1F, 1)},
		{5 * time.Microsecond, req, send(101)}, // lost on the way
		{1 * time.Microsecond, req, send(102)},
		{5 * time.Microsecond, resp, ack(101, bth.SyndromePSNSeqErr, 1)},
		{20 * time.Microsecond, req, send(101)},
		{1 * time.Microsecond, req, send(102)},
		{5 * time.Microsecond, resp, ack(102, 0x1F, 3)},
	} {
		t = t.Add(f.after)
		if err := w.WritePacket(t, f.e, f.p); err != nil {
			log.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		log.Fatal(err)
	}

	r, err := pcap.NewReader(&file)
	if err != nil {
		log.Fatal(err)
	}
	d, an := pcap.NewDecoder(), analyze.New(analyze.Config{})
	var rec pcap.Record
	for frame := 1; ; frame++ {
		data, ci, lt, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		k, err := d.Decode(data, ci, lt, &rec)
		if err != nil {
			log.Fatal(err)
		}
		an.Add(frame, k, &rec)
	}
	for _, c := range an.Report().Connections {
		fmt.Println(c.Transport, c.Requester, "->", c.Responder)
		fmt.Println("messages:", c.Messages, "retransmitted packets:", c.RetransmittedPackets, "NAKs:", c.NAKs)
		for _, e := range c.GBNEpisodes {
			fmt.Printf("go-back-N: cause %s, NAK in frame %d, first resend in frame %d after %.0f us, from PSN %d, %d packets resent\n",
				e.Cause, e.StartFrame, e.FirstResendFrame, e.DelayUs, e.FromPSN, e.PacketsResent)
		}
	}
	// Output:
	// RC 192.0.2.1/0x000011 -> 192.0.2.2/0x000012
	// messages: 3 retransmitted packets: 2 NAKs: 1
	// go-back-N: cause NAK, NAK in frame 5, first resend in frame 6 after 20 us, from PSN 101, 2 packets resent
}
