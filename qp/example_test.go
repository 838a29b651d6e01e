package qp_test

import (
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// Two QPs driven by hand, sans-IO: the caller takes each packet a QP has to
// send (NextPacket), encodes it as a UDP payload, decodes it and gives it
// to the other QP (HandlePacket), with the time passed in. A 600-byte SEND
// at path MTU 256 goes out as three packets; the responder ACKs the last,
// which asks for an ACK, and both sides complete. Deadline reports when a
// QP next needs HandleTimeout: once the ACK is in, A has no timer left.
func Example() {
	addrs := [2]netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	var qps [2]*qp.QP
	var cqs [2]*qp.CQ
	var pds [2]*qp.PD
	for i := range 2 {
		pds[i] = qp.NewDevice().NewPD() // one device per host
		cqs[i] = qp.NewCQ(16)
		q, err := qp.New(qp.InitAttr{PD: pds[i], SendCQ: cqs[i], RecvCQ: cqs[i], SQSigAll: true})
		if err != nil {
			log.Fatal(err)
		}
		qps[i] = q
	}
	// Both devices number their first QP 0x11; the PSNs start at 100 and 200.
	psn := [2]bth.PSN{100, 200}
	for i, q := range qps {
		peer := qps[1-i]
		steps := []struct {
			attr qp.Attr
			mask qp.AttrMask
		}{
			{qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE}, qp.IBV_QP_STATE | qp.IBV_QP_ACCESS_FLAGS},
			{qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: qp.IBV_MTU_256, DestQPN: peer.QPN, RQPSN: psn[1-i], MaxDestRdAtomic: 1,
				MinRNRTimer: 12, AV: qp.AddressVector{Remote: netip.AddrPortFrom(addrs[1-i], bth.UDPPort)}},
				qp.IBV_QP_STATE | qp.IBV_QP_AV | qp.IBV_QP_PATH_MTU | qp.IBV_QP_DEST_QPN | qp.IBV_QP_RQ_PSN |
					qp.IBV_QP_MAX_DEST_RD_ATOMIC | qp.IBV_QP_MIN_RNR_TIMER},
			{qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: psn[i], Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
				qp.IBV_QP_STATE | qp.IBV_QP_SQ_PSN | qp.IBV_QP_TIMEOUT | qp.IBV_QP_RETRY_CNT | qp.IBV_QP_RNR_RETRY |
					qp.IBV_QP_MAX_QP_RD_ATOMIC},
		}
		for _, s := range steps {
			if err := q.Modify(&s.attr, s.mask); err != nil {
				log.Fatal(err)
			}
		}
	}

	msg := make([]byte, 600)
	smr, err := pds[0].RegMR(msg, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		log.Fatal(err)
	}
	rmr, err := pds[1].RegMR(make([]byte, 1024), qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		log.Fatal(err)
	}
	if err := qps[1].PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{rmr.SGE(0, 1024)}}); err != nil {
		log.Fatal(err)
	}
	if err := qps[0].PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(msg))}}); err != nil {
		log.Fatal(err)
	}

	now := time.Unix(0, 0)
	var out, in bth.Packet
	var wire []byte
	for moved := true; moved; {
		moved = false
		for i, q := range qps {
			for q.NextPacket(now, &out) {
				enc := bth.Encap{Src: addrs[i], Dst: addrs[1-i], SrcPort: bth.SourcePort(0, q.QPN, qps[1-i].QPN)}
				if wire, err = out.Append(wire[:0], &enc); err != nil {
					log.Fatal(err)
				}
				if _, _, err := enc.VerifyICRC(wire); err != nil {
					log.Fatal(err)
				}
				if err := in.Decode(wire); err != nil {
					log.Fatal(err)
				}
				fmt.Printf("%c->%c %-20s psn=%d ackreq=%v payload=%d\n", 'A'+i, 'B'-i, in.BTH.Opcode, in.BTH.PSN, in.BTH.AckReq, len(in.Payload))
				qps[1-i].HandlePacket(now, &in, bth.NotECT)
				moved = true
			}
		}
		now = now.Add(time.Microsecond)
	}
	wc := make([]qp.WC, 1)
	for i, who := range []string{"A", "B"} {
		cqs[i].Poll(wc)
		fmt.Printf("%s: %s %s %d bytes\n", who, wc[0].Opcode, wc[0].Status, wc[0].ByteLen)
	}
	fmt.Println("A's ACK timer armed:", !qps[0].Deadline().IsZero())
	// Output:
	// A->B RC_SEND_FIRST        psn=100 ackreq=false payload=256
	// A->B RC_SEND_MIDDLE       psn=101 ackreq=false payload=256
	// A->B RC_SEND_LAST         psn=102 ackreq=true payload=88
	// B->A RC_ACKNOWLEDGE       psn=102 ackreq=false payload=0
	// A: SEND SUCCESS 600 bytes
	// B: RECV SUCCESS 600 bytes
	// A's ACK timer armed: false
}
