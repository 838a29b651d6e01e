package qp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// BenchmarkRCWrite moves 16 KiB RDMA WRITEs (64 packets at path MTU 256,
// so that copying data costs little) from one QP to another and the ACKs
// back, handing packets over without encoding them: the cost of the two
// QPs alone, reported per request packet.
func BenchmarkRCWrite(b *testing.B) {
	benchRC(b, IBV_WR_RDMA_WRITE)
}

// BenchmarkRCRead moves 16 KiB RDMA READs (64 response packets at path
// MTU 256) from one QP's memory to the other's, handing packets over
// without encoding them: the cost of the two QPs alone, reported per
// response packet.
func BenchmarkRCRead(b *testing.B) {
	benchRC(b, IBV_WR_RDMA_READ)
}

// benchRC runs BenchmarkRCWrite (op IBV_WR_RDMA_WRITE: the data packets are
// the requests) or BenchmarkRCRead (op IBV_WR_RDMA_READ: the data packets
// are the responses) between two connected QPs, 16 KiB a work request at
// path MTU 256, and reports ns per data packet.
func benchRC(b *testing.B, op WROpcode) {
	const size, mtu = 16 << 10, 256
	remote, unit, what := IBV_ACCESS_REMOTE_WRITE, "request", "WRITEs"
	if op == IBV_WR_RDMA_READ {
		remote, unit, what = IBV_ACCESS_REMOTE_READ, "response", "READs"
	}
	var qps [2]*QP
	var cqs [2]*CQ
	var pds [2]*PD
	for i := range 2 {
		pds[i] = NewDevice().NewPD()
		cqs[i] = NewCQ(64)
		q, err := New(InitAttr{PD: pds[i], SendCQ: cqs[i], RecvCQ: cqs[i], QPN: uint32(0x11 + i)})
		if err != nil {
			b.Fatal(err)
		}
		qps[i] = q
	}
	for i, q := range qps {
		access := IBV_ACCESS_LOCAL_WRITE | remote
		if err := q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: access}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS); err != nil {
			b.Fatal(err)
		}
		if err := q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_256, DestQPN: uint32(0x12 - i), RQPSN: 0x100, MaxDestRdAtomic: 1,
			MinRNRTimer: 1, AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.1:4791")}},
			IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER); err != nil {
			b.Fatal(err)
		}
		if err := q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC); err != nil {
			b.Fatal(err)
		}
	}
	lmr, err := pds[0].RegMR(make([]byte, size), IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		b.Fatal(err)
	}
	rmr, err := pds[1].RegMR(make([]byte, size), IBV_ACCESS_LOCAL_WRITE|remote)
	if err != nil {
		b.Fatal(err)
	}
	a, r := qps[0], qps[1]
	now := time.Unix(1700000000, 0)
	var p bth.Packet
	wc := make([]WC, 4)
	requests, responses := 0, 0
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if err := a.PostSend(SendWR{Opcode: op, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{lmr.SGE(0, size)},
			RemoteAddr: rmr.VA, RKey: rmr.RKey}); err != nil {
			b.Fatal(err)
		}
		for cqs[0].Len() == 0 {
			for a.NextPacket(now, &p) {
				r.HandlePacket(now, &p, bth.NotECT)
				requests++
			}
			for r.NextPacket(now, &p) {
				a.HandlePacket(now, &p, bth.NotECT)
				responses++
			}
			now = now.Add(time.Microsecond)
		}
		if n := cqs[0].Poll(wc); n != 1 || wc[0].Status != IBV_WC_SUCCESS {
			b.Fatalf("completion %+v", wc[:n])
		}
	}
	data := requests
	if op == IBV_WR_RDMA_READ {
		data = responses
	}
	if data != b.N*size/mtu {
		b.Fatalf("%d %s packets for %d %s of 64 packets", data, unit, b.N, what)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(data), "ns/pkt")
}
