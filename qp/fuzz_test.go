package qp

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// fuzzOps are the opcodes the fuzzer mostly draws from: every RC opcode,
// plus a few a QP must refuse.
var fuzzOps = append(rcOpcodes(), bth.UCSendOnly, bth.UDSendOnly, bth.CNP, 0x15)

func rcOpcodes() []bth.Opcode { return opcodesOf(bth.TransportRC) }

func opcodesOf(t bth.Transport) []bth.Opcode {
	var ops []bth.Opcode
	for _, op := range bth.Opcodes() {
		if op.Transport() == t {
			ops = append(ops, op)
		}
	}
	return ops
}

// ucFuzzOps and udFuzzOps are the same for UC and UD QPs: their own
// opcodes and a few of other classes.
var (
	ucFuzzOps = append(opcodesOf(bth.TransportUC), bth.RCSendOnly, bth.RCReadRequest, bth.UDSendOnly, bth.CNP, 0x35)
	udFuzzOps = append(opcodesOf(bth.TransportUD), bth.UDSendOnly, bth.UDSendOnlyImm, bth.UCSendOnly, bth.RCSendOnly, bth.CNP)
)

// fuzzQKey is the Q_Key of the fuzzed UD QP.
const fuzzQKey = 0x4242

// FuzzQP feeds arbitrary packet sequences, built from the input, to a QP
// that has requests of every kind outstanding and receives posted, with
// time moving on between packets. It checks that nothing panics, that
// memory outside the registered region is never written, and that the QP's
// state stays consistent. Each input runs against an RC QP, a UC QP and a
// UD QP that receives from an SRQ with its limit armed; packets come with
// or without RecvInfo, over IPv4 or IPv6.
func FuzzQP(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0, 4, 0, 0, 0, 1, 0, 4, 1})
	f.Add([]byte{0x0A, 0, 0x80, 0, 0, 16, 0, 0, 1, 0, 16, 0, 0x11, 0xF0, 0, 0x1F, 0, 0, 0, 0, 0, 0, 0, 200})
	f.Add([]byte{0x0C, 0, 0x80, 0, 0, 0, 0, 0, 1, 16, 0, 0, 0x11, 3, 0, 0x60, 0, 0, 0, 0, 0, 0, 0, 0, 0x0D, 1, 0, 0x1F, 4, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x13, 0, 0x80, 0, 0, 8, 0, 0, 1, 0, 0, 0, 0x12, 6, 0, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, 0, 0, 0x2E, 0, 0, 0, 0, 0, 0, 0, 255})
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, typ := range []QPType{IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD} {
			fuzzQP(t, typ, in)
		}
	})
}

func fuzzQP(t *testing.T, typ QPType, in []byte) {
	{
		const guard = 256
		mem := make([]byte, guard+4096+guard)
		for i := range mem {
			mem[i] = 0xA5
		}
		region := mem[guard : guard+4096]
		clear(region)
		local := make([]byte, 8192)
		pd := NewDevice().NewPD()
		mr, err := pd.RegMR(region, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_READ|IBV_ACCESS_REMOTE_ATOMIC)
		if err != nil {
			t.Fatal(err)
		}
		lmr, _ := pd.RegMR(local, IBV_ACCESS_LOCAL_WRITE)
		cq := NewCQ(64)
		var srq *SRQ
		if typ == IBV_QPT_UD {
			srq, err = pd.NewSRQ(SRQInitAttr{MaxWR: 16, SRQLimit: 2})
			if err != nil {
				t.Fatal(err)
			}
		}
		q, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPN: 0x11, MaxSendWR: 16, MaxRecvWR: 16, QPType: typ, SRQ: srq})
		if err != nil {
			t.Fatal(err)
		}
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		postRecv := func(wr RecvWR) error {
			if srq != nil {
				return srq.PostRecv(wr)
			}
			return q.PostRecv(wr)
		}
		av := AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}
		switch typ {
		case IBV_QPT_RC:
			must(q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: mr.Access}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
			must(q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x1000, MaxDestRdAtomic: 4,
				MinRNRTimer: 1, AV: av},
				IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
			must(q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x2000, Timeout: 4, RetryCnt: 3, RNRRetry: 3, MaxRdAtomic: 4},
				IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC))
			for i, op := range []WROpcode{IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ, IBV_WR_SEND_WITH_IMM} {
				n := []int{100, 3000, 2500, 8, 0, 1024}[i]
				must(q.PostSend(SendWR{WRID: uint64(i), Opcode: op, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{lmr.SGE(i*1024%4096, n)},
					RemoteAddr: 0x7f0000100000, RKey: 0x1234, CompareAdd: 1}))
			}
		case IBV_QPT_UC:
			must(q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: mr.Access}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
			must(q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x1000, AV: av},
				IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN))
			must(q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x2000}, IBV_QP_STATE|IBV_QP_SQ_PSN))
			for i, op := range []WROpcode{IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND_WITH_IMM} {
				n := []int{100, 3000, 0, 1024}[i]
				must(q.PostSend(SendWR{WRID: uint64(i), Opcode: op, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{lmr.SGE(i*1024%4096, n)},
					RemoteAddr: 0x7f0000100000, RKey: 0x1234}))
			}
		case IBV_QPT_UD:
			must(q.Modify(&Attr{State: IBV_QPS_INIT, QKey: fuzzQKey}, IBV_QP_STATE|IBV_QP_QKEY))
			must(q.Modify(&Attr{State: IBV_QPS_RTR}, IBV_QP_STATE))
			must(q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x2000}, IBV_QP_STATE|IBV_QP_SQ_PSN))
			for i, op := range []WROpcode{IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_SEND} {
				n := []int{100, 1024, 0}[i]
				must(q.PostSend(SendWR{WRID: uint64(i), Opcode: op, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{lmr.SGE(i*1024%4096, n)},
					AH: &av, RemoteQPN: 0x22 + uint32(i), RemoteQKey: uint32(i) << 31}))
			}
		}
		for i := range 3 {
			must(postRecv(RecvWR{WRID: uint64(100 + i), SGEs: []SGE{mr.SGE(i*1000, 1500)}}))
		}
		ops := fuzzOps
		switch typ {
		case IBV_QPT_UC:
			ops = ucFuzzOps
		case IBV_QPT_UD:
			ops = udFuzzOps
		}
		now := time.Unix(1700000000, 0)
		var out bth.Packet
		drain := func() {
			for k := 0; k < 10000 && q.NextPacket(now, &out); k++ {
				if _, err := out.Append(nil, &bth.Encap{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2")}); err != nil {
					t.Fatalf("QP produced a packet that does not encode: %v (%+v)", err, out.BTH)
				}
			}
		}
		drain()
		payload := make([]byte, 5000)
		for len(in) >= 12 {
			b := in[:12]
			in = in[12:]
			op := ops[int(b[0])%len(ops)]
			info := op.Info()
			p := bth.Packet{BTH: bth.BTH{Opcode: op, PKey: 0xFFFF, DestQP: 0x11, AckReq: b[2]&0x80 != 0}}
			base := q.resp.ePSN
			if info != nil && (info.Op == bth.OpAcknowledge || info.Op == bth.OpAtomicAcknowledge || info.Op == bth.OpReadResponse) {
				base = q.comp.psn
			}
			p.BTH.PSN = base.Add(int(int8(b[1])))
			p.AETH = bth.AETH{Syndrome: bth.Syndrome(b[3]), MSN: uint32(b[4])}
			n := int(binary.BigEndian.Uint16(b[4:6])) % 5000
			va := mr.VA + uint64(int64(int8(b[6]))*64)
			rkey := mr.RKey
			if b[7]&1 != 0 {
				rkey ^= 0x100
			}
			p.RETH = bth.RETH{VA: va, RKey: rkey, DMALength: uint32(binary.BigEndian.Uint16(b[8:10]))}
			p.AtomicETH = bth.AtomicETH{VA: va &^ uint64(b[10]&1*7), RKey: rkey, SwapAdd: 5, Compare: 0}
			p.AtomicAckETH = bth.AtomicAckETH(0x1122334455667788)
			if info != nil && info.Payload {
				p.Payload = payload[:n]
			}
			if b[10]&2 != 0 {
				p.BTH.PKey = 0x1234
			}
			p.DETH = bth.DETH{QKey: fuzzQKey ^ uint32(b[3]&0x80), SrcQP: uint32(b[9])}
			switch {
			case b[10]&4 == 0:
				q.HandlePacket(now, &p, bth.ECN(b[10]>>6))
			case b[10]&8 == 0:
				q.HandleReceived(now, &p, &RecvInfo{Src: netip.MustParseAddrPort("192.0.2.2:49152"),
					Dst: netip.MustParseAddrPort("192.0.2.1:4791"), TOS: b[10] >> 6, HopLimit: b[11]})
			default:
				q.HandleReceived(now, &p, &RecvInfo{Src: netip.MustParseAddrPort("[fd00::2]:49152"),
					Dst: netip.MustParseAddrPort("[fd00::1]:4791"), TOS: b[10] >> 6, HopLimit: b[11], FlowLabel: uint32(b[9]) << 12})
			}
			drain()
			now = now.Add(time.Duration(b[11]) * 10 * time.Microsecond)
			if d := q.Deadline(); !d.IsZero() && !now.Before(d) {
				q.HandleTimeout(now)
				drain()
			}
			if b[2]&0x40 != 0 {
				postRecv(RecvWR{WRID: 200, SGEs: []SGE{mr.SGE(int(b[2]&0x3F)*50, 200)}})
			}
			if srq != nil {
				if srq.Queued() > 16 {
					t.Fatalf("SRQ holds %d WQEs, more than its 16", srq.Queued())
				}
				var ev [MaxEvents]AsyncEvent
				if k := pd.Device().PollEvents(ev[:]); k > 1 {
					t.Fatalf("%d SRQ limit events from one packet", k)
				}
				if b[2]&0x20 != 0 {
					must(srq.Modify(SRQInitAttr{SRQLimit: 2}, IBV_SRQ_LIMIT))
				}
			}
			if q.State() == IBV_QPS_ERR && (q.SendQueued() != 0 || q.RecvQueued() != 0) {
				t.Fatalf("QP in ERR with %d send and %d receive WQEs left", q.SendQueued(), q.RecvQueued())
			}
			if q.State() > IBV_QPS_ERR {
				t.Fatalf("state %d", q.State())
			}
			if q.req.cur > len(q.req.sq) || q.req.rdAtomic < 0 || q.req.rdAtomic > 4 || (typ != IBV_QPT_RC && q.req.rdAtomic != 0) {
				t.Fatalf("requester bookkeeping broken: cur %d of %d, rdAtomic %d", q.req.cur, len(q.req.sq), q.req.rdAtomic)
			}
			if q.req.sendPSN.Before(q.comp.psn) {
				t.Fatalf("next PSN %d before the oldest unacknowledged %d", q.req.sendPSN, q.comp.psn)
			}
		}
		for i := range guard {
			if mem[i] != 0xA5 || mem[len(mem)-1-i] != 0xA5 {
				t.Fatalf("memory outside the registered region was written (offset %d)", i)
			}
		}
		var wc [64]WC
		for k := cq.Poll(wc[:]); k > 0; k = cq.Poll(wc[:]) {
			for _, c := range wc[:k] {
				if c.Status > IBV_WC_GENERAL_ERR {
					t.Fatalf("completion with status %d", c.Status)
				}
			}
		}
	}
}
