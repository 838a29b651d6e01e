package qp

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dropCounters names every drop counter of c by its JSON name.
func dropCounters(c *Counters) map[string]uint64 {
	return map[string]uint64{
		"implied_nak_seq_err":      c.ImpliedNakSeqErr,
		"implied_nak_during_retry": c.ImpliedNakDuringRetry,
		"duplicate_response":       c.DuplicateResponse,
		"unexpected_response":      c.UnexpectedResponse,
		"response_mismatch":        c.ResponseMismatch,
		"read_response_malformed":  c.ReadResponseMalformed,
		"aeth_reserved_syndrome":   c.ReservedSyndrome,
		"out_of_sequence":          c.OutOfSequence,
		"duplicate_no_resource":    c.DuplicateNoResource,
		"resp_queue_full":          c.RespQueueFull,
		"rp_cnp_ignored":           c.RPCNPIgnored,
		"rx_opcode_err":            c.OpcodeErr,
		"pkey_violations":          c.PKeyViolations,
		"rx_qp_state_err":          c.QPStateErr,
		"out_of_buffer":            c.OutOfBuffer,
		"dropped_msg_pkts":         c.DroppedMsgPkts,
		"qkey_violations":          c.QKeyViolations,
	}
}

// Drops sums exactly the counters dropCounters lists, and each is a
// field whose JSON name is the one listed.
func TestDropsSumsTheDropCounters(t *testing.T) {
	var c Counters
	v := reflect.ValueOf(&c).Elem()
	byJSON := map[string]uint64{}
	for i := range v.NumField() {
		v.Field(i).SetUint(1 << i)
		byJSON[v.Type().Field(i).Tag.Get("json")] = 1 << i
	}
	var sum uint64
	for name, n := range dropCounters(&c) {
		require.Contains(t, byJSON, name)
		assert.Equal(t, byJSON[name], n, name)
		sum += n
	}
	assert.Equal(t, sum, c.Drops())
}

// dropQP is one QP in RTS, driven by hand: QPN 0x11, talking to QPN 0x22,
// sending from PSN 0x100 and expecting 0x200.
type dropQP struct {
	q   *QP
	mr  *MR
	now time.Time
}

func newDropQP(t *testing.T) *dropQP { return newDropQPType(t, IBV_QPT_RC) }

// dropQKey is the Q_Key of newDropQPType's UD QP.
const dropQKey = 0x11111111

// newDropQPType is newDropQP for a QP of type typ: UC in RTS with the same
// PSNs, UD in RTS with Q_Key dropQKey.
func newDropQPType(t *testing.T, typ QPType) *dropQP {
	pd := NewDevice().NewPD()
	cq := NewCQ(4096)
	q, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPN: 0x11, QPType: typ})
	require.NoError(t, err)
	all := IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
	mr, err := pd.RegMR(make([]byte, 4096), all)
	require.NoError(t, err)
	switch typ {
	case IBV_QPT_UC:
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: all}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x200,
			AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}},
			IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN))
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100}, IBV_QP_STATE|IBV_QP_SQ_PSN))
		return &dropQP{q: q, mr: mr, now: time.Unix(1700000000, 0)}
	case IBV_QPT_UD:
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, QKey: dropQKey}, IBV_QP_STATE|IBV_QP_QKEY))
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR}, IBV_QP_STATE))
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100}, IBV_QP_STATE|IBV_QP_SQ_PSN))
		return &dropQP{q: q, mr: mr, now: time.Unix(1700000000, 0)}
	}
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: all}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x200,
		MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}},
		IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
		IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC))
	return &dropQP{q: q, mr: mr, now: time.Unix(1700000000, 0)}
}

// post queues a work request and hands its packets out (and drops them).
func (d *dropQP) post(t *testing.T, op WROpcode, n int) {
	require.NoError(t, d.q.PostSend(SendWR{Opcode: op, SGEs: []SGE{d.mr.SGE(0, n)}, RemoteAddr: 0x7f0000100000, RKey: 0x1234}))
	var p bth.Packet
	for d.q.NextPacket(d.now, &p) {
	}
}

func (d *dropQP) feed(p bth.Packet) { d.q.HandlePacket(d.now, &p, bth.NotECT) }

func pkt(op bth.Opcode, psn bth.PSN) bth.Packet {
	return bth.Packet{BTH: bth.BTH{Opcode: op, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: psn}}
}

func ack(psn bth.PSN, s bth.Syndrome) bth.Packet {
	p := pkt(bth.RCAcknowledge, psn)
	p.AETH = bth.AETH{Syndrome: s}
	return p
}

// Every place the QP drops a packet (or a response it cannot queue)
// counts it in exactly one drop counter, its own.
func TestDropCauses(t *testing.T) {
	recv := func(t *testing.T, d *dropQP) {
		require.NoError(t, d.q.PostRecv(RecvWR{WRID: 1, SGEs: []SGE{d.mr.SGE(0, 4096)}}))
	}
	withPayload := func(p bth.Packet, n int) bth.Packet { p.Payload = make([]byte, n); return p }
	type dropCase struct {
		name  string // the counter's JSON name
		why   string
		setup func(t *testing.T, d *dropQP)
		drop  func() bth.Packet
	}
	cases := []dropCase{
		{"rx_opcode_err", "a UC opcode at an RC QP (the service's opcode class)", nil,
			func() bth.Packet { p := pkt(bth.UCSendOnly, 0x200); p.Payload = []byte("uc"); return p }},
		{"rx_opcode_err", "an opcode no service has", nil, func() bth.Packet { return pkt(0x1F, 0x200) }},
		{"pkey_violations", "a request with another P_Key", nil,
			func() bth.Packet { p := pkt(bth.RCSendOnly, 0x200); p.BTH.PKey = 0x1234; return p }},
		{"pkey_violations", "a CNP with another P_Key", nil,
			func() bth.Packet { p := pkt(bth.CNP, 0); p.BTH.PKey = 0x1234; return p }},
		{"rx_qp_state_err", "a request in ERR",
			func(t *testing.T, d *dropQP) {
				require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_ERR}, IBV_QP_STATE))
			},
			func() bth.Packet { return pkt(bth.RCSendOnly, 0x200) }},
		{"rx_qp_state_err", "a response in ERR",
			func(t *testing.T, d *dropQP) {
				d.post(t, IBV_WR_SEND, 8)
				require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_ERR}, IBV_QP_STATE))
			},
			func() bth.Packet { return ack(0x100, bth.SyndromeACKNoCredits) }},
		{"rp_cnp_ignored", "a CNP at a QP without congestion control", nil, func() bth.Packet { return pkt(bth.CNP, 0) }},
		{"out_of_sequence", "a request ahead of the expected PSN", nil, func() bth.Packet { return pkt(bth.RCSendOnly, 0x205) }},
		{"duplicate_no_resource", "a duplicate READ the responder never executed", nil,
			func() bth.Packet {
				p := pkt(bth.RCReadRequest, 0x1F0)
				p.RETH = bth.RETH{VA: 0x7f0000000000, RKey: 0x1234, DMALength: 8}
				return p
			}},
		{"resp_queue_full", "a READ request whose response finds the output queue full",
			func(t *testing.T, d *dropQP) {
				// A READ response cannot fill the queue (no more than
				// max_dest_rd_atomic are queued): RNR NAKs can, each
				// SEND at the expected PSN without a receive WQE getting
				// one.
				for range maxOutQueue {
					d.feed(withPayload(pkt(bth.RCSendOnly, 0x200), 8))
				}
				require.Len(t, d.q.resp.out, maxOutQueue)
			},
			func() bth.Packet { return pkt(bth.RCReadRequest, 0x200) }},
		{"unexpected_response", "an ACK with nothing outstanding", nil,
			func() bth.Packet { return ack(0x100, bth.SyndromeACKNoCredits) }},
		{"unexpected_response", "an ACK for a PSN never sent",
			func(t *testing.T, d *dropQP) { d.post(t, IBV_WR_SEND, 8) },
			func() bth.Packet { return ack(0x101, bth.SyndromeACKNoCredits) }},
		{"duplicate_response", "an ACK for a PSN already completed",
			func(t *testing.T, d *dropQP) {
				d.post(t, IBV_WR_SEND, 8)
				d.post(t, IBV_WR_SEND, 8)
				d.feed(ack(0x100, bth.SyndromeACKNoCredits))
				require.Equal(t, 1, d.q.SendQueued())
			},
			func() bth.Packet { return ack(0x100, bth.SyndromeACKNoCredits) }},
		{"response_mismatch", "an ACK inside a READ",
			func(t *testing.T, d *dropQP) { d.post(t, IBV_WR_RDMA_READ, 8) },
			func() bth.Packet { return ack(0x100, bth.SyndromeACKNoCredits) }},
		{"response_mismatch", "a READ response to a SEND",
			func(t *testing.T, d *dropQP) { d.post(t, IBV_WR_SEND, 8) },
			func() bth.Packet { return withPayload(pkt(bth.RCReadResponseOnly, 0x100), 8) }},
		{"response_mismatch", "an atomic ACK to a SEND",
			func(t *testing.T, d *dropQP) { d.post(t, IBV_WR_SEND, 8) },
			func() bth.Packet { return pkt(bth.RCAtomicAcknowledge, 0x100) }},
		{"read_response_malformed", "a READ response shorter than asked",
			func(t *testing.T, d *dropQP) { d.post(t, IBV_WR_RDMA_READ, 8) },
			func() bth.Packet { return withPayload(pkt(bth.RCReadResponseOnly, 0x100), 4) }},
		{"aeth_reserved_syndrome", "an ACK with the reserved syndrome kind",
			func(t *testing.T, d *dropQP) { d.post(t, IBV_WR_SEND, 8) },
			func() bth.Packet { return ack(0x100, bth.Syndrome(bth.KindReserved)<<5) }},
		{"implied_nak_seq_err", "an ACK past a READ whose response is missing",
			func(t *testing.T, d *dropQP) {
				d.post(t, IBV_WR_RDMA_READ, 8)
				d.post(t, IBV_WR_SEND, 8)
			},
			func() bth.Packet { return ack(0x101, bth.SyndromeACKNoCredits) }},
		{"implied_nak_during_retry", "the same, again, while the retry it started is under way",
			func(t *testing.T, d *dropQP) {
				d.post(t, IBV_WR_RDMA_READ, 8)
				d.post(t, IBV_WR_SEND, 8)
				d.feed(ack(0x101, bth.SyndromeACKNoCredits))
				require.Equal(t, uint64(1), d.q.Counters.ImpliedNakSeqErr)
			},
			func() bth.Packet { return ack(0x101, bth.SyndromeACKNoCredits) }},
	}
	// The same for UC and UD QPs.
	typed := []struct {
		dropCase
		typ QPType
	}{
		{dropCase{"out_of_buffer", "a UC SEND with no receive WQE", nil,
			func() bth.Packet { return withPayload(pkt(bth.UCSendOnly, 0x200), 8) }}, IBV_QPT_UC},
		{dropCase{"out_of_buffer", "a UD SEND with no receive WQE", nil,
			func() bth.Packet {
				p := withPayload(pkt(bth.UDSendOnly, 0), 8)
				p.DETH = bth.DETH{QKey: dropQKey, SrcQP: 0x33}
				return p
			}}, IBV_QPT_UD},
		{dropCase{"out_of_sequence", "a UC SEND Last after a gap", recv,
			func() bth.Packet { return withPayload(pkt(bth.UCSendLast, 0x203), 8) }}, IBV_QPT_UC},
		{dropCase{"dropped_msg_pkts", "a UC WRITE with an R_Key that names nothing", nil,
			func() bth.Packet {
				p := withPayload(pkt(bth.UCWriteOnly, 0x200), 8)
				p.RETH = bth.RETH{VA: 0x7f0000000000, RKey: 0x999, DMALength: 8}
				return p
			}}, IBV_QPT_UC},
		{dropCase{"dropped_msg_pkts", "a UC SEND Middle of a message abandoned after a gap",
			func(t *testing.T, d *dropQP) {
				recv(t, d)
				d.feed(withPayload(pkt(bth.UCSendFirst, 0x200), 1024))
				d.feed(withPayload(pkt(bth.UCSendMiddle, 0x202), 1024))
				require.Equal(t, uint64(1), d.q.Counters.OutOfSequence)
				require.Equal(t, 1, d.q.RecvQueued(), "the receive WQE went back to the queue")
			},
			func() bth.Packet { return withPayload(pkt(bth.UCSendMiddle, 0x203), 1024) }}, IBV_QPT_UC},
		{dropCase{"dropped_msg_pkts", "a UD SEND longer than the receive buffer",
			func(t *testing.T, d *dropQP) {
				require.NoError(t, d.q.PostRecv(RecvWR{WRID: 1, SGEs: []SGE{d.mr.SGE(0, GRHLen+4)}}))
			},
			func() bth.Packet {
				p := withPayload(pkt(bth.UDSendOnly, 0), 8)
				p.DETH = bth.DETH{QKey: dropQKey, SrcQP: 0x33}
				return p
			}}, IBV_QPT_UD},
		{dropCase{"qkey_violations", "a UD SEND with another Q_Key", recv,
			func() bth.Packet {
				p := withPayload(pkt(bth.UDSendOnly, 0), 8)
				p.DETH = bth.DETH{QKey: dropQKey + 1, SrcQP: 0x33}
				return p
			}}, IBV_QPT_UD},
		{dropCase{"rx_opcode_err", "an RC SEND at a UC QP", recv,
			func() bth.Packet { return withPayload(pkt(bth.RCSendOnly, 0x200), 8) }}, IBV_QPT_UC},
		{dropCase{"rx_opcode_err", "a UC SEND at a UD QP", recv,
			func() bth.Packet { return withPayload(pkt(bth.UCSendOnly, 0x200), 8) }}, IBV_QPT_UD},
	}
	all := make([]struct {
		dropCase
		typ QPType
	}, 0, len(cases)+len(typed))
	for _, c := range cases {
		all = append(all, struct {
			dropCase
			typ QPType
		}{c, IBV_QPT_RC})
	}
	all = append(all, typed...)
	covered := map[string]bool{}
	for _, c := range all {
		t.Run(c.typ.String()+"/"+c.name+"/"+c.why, func(t *testing.T) {
			d := newDropQPType(t, c.typ)
			if c.setup != nil {
				c.setup(t, d)
			}
			before := d.q.Counters
			sq, rq, cqLen := d.q.SendQueued(), d.q.RecvQueued(), d.q.scq.Len()
			d.feed(c.drop())
			after := d.q.Counters
			b, a := dropCounters(&before), dropCounters(&after)
			require.Contains(t, a, c.name)
			for name := range a {
				want := b[name]
				if name == c.name {
					want++
				}
				assert.Equal(t, want, a[name], "drop counter %s", name)
			}
			assert.Equal(t, before.Drops()+1, after.Drops())
			assert.Equal(t, before.ReceivedPackets+1, after.ReceivedPackets)
			assert.Equal(t, sq, d.q.SendQueued(), "no send WQE retired")
			assert.Equal(t, rq, d.q.RecvQueued(), "no receive WQE taken")
			assert.Equal(t, cqLen, d.q.scq.Len(), "no completion")
			covered[c.name] = true
		})
	}
	for name := range dropCounters(&Counters{}) {
		assert.True(t, covered[name], "no case drops a packet into %s", name)
	}
}

// The service seam: a UC opcode is valid BTH but not an RC QP's, so it
// reaches neither half; an RC QP also refuses no RC work request opcode.
func TestRCServiceSeam(t *testing.T) {
	var s service = rcService{}
	assert.Equal(t, "RC", s.name())
	for op := range 256 {
		info := s.opcodes()[op]
		if bth.Opcode(op).Transport() != bth.TransportRC {
			assert.Nil(t, info, "opcode %#x is not RC's", op)
		} else {
			assert.Equal(t, bth.Opcode(op).Info(), info, "opcode %#x", op)
		}
	}
	for op := IBV_WR_RDMA_WRITE; op <= IBV_WR_SEND_WITH_INV; op++ {
		assert.True(t, s.postable(op), "%s", op)
	}
	assert.False(t, s.postable(IBV_WR_SEND_WITH_INV+1))

	d := newDropQP(t)
	require.NoError(t, d.q.PostRecv(RecvWR{WRID: 7, SGEs: []SGE{d.mr.SGE(0, 64)}}))
	uc := pkt(bth.UCSendOnly, 0x200)
	uc.Payload = []byte("hello")
	d.feed(uc)
	assert.Equal(t, uint64(1), d.q.Counters.OpcodeErr)
	assert.Equal(t, 1, d.q.RecvQueued(), "the UC SEND took no receive WQE")
	var p bth.Packet
	assert.False(t, d.q.NextPacket(d.now, &p), "and got no ACK or NAK")
	// The same bytes as RC are received.
	rc := uc
	rc.BTH.Opcode = bth.RCSendOnly
	d.feed(rc)
	assert.Equal(t, 0, d.q.RecvQueued())
	wc := make([]WC, 1)
	require.Equal(t, 1, d.q.rcq.Poll(wc))
	assert.Equal(t, WC{WRID: 7, Opcode: IBV_WC_RECV, ByteLen: 5, QPNum: 0x11, SrcQP: 0x22}, wc[0])
	err := d.q.PostSend(SendWR{Opcode: IBV_WR_SEND_WITH_INV + 1})
	assert.ErrorIs(t, err, ErrBadWR)
	assert.ErrorContains(t, err, "RC QP")
}

// Refusals lists every drop counter, under its JSON name and with its
// value, and the refusals besides; counters at zero are left out.
func TestRefusals(t *testing.T) {
	var c Counters
	v := reflect.ValueOf(&c).Elem()
	byJSON := map[string]uint64{}
	for i := range v.NumField() {
		v.Field(i).SetUint(uint64(i + 1))
		byJSON[v.Type().Field(i).Tag.Get("json")] = uint64(i + 1)
	}
	got := map[string]uint64{}
	for _, x := range c.Refusals() {
		require.Contains(t, byJSON, x.Name)
		assert.Equal(t, byJSON[x.Name], x.Value, x.Name)
		got[x.Name] = x.Value
	}
	for name := range dropCounters(&c) {
		assert.Contains(t, got, name, "a drop counter")
	}
	for _, name := range []string{"resp_rd_atomic_exceeded", "resp_remote_invalid_request", "resp_remote_access_errors",
		"resp_local_length_error", "send_rnr_err", "req_remote_access_errors", "retry_exceeded_err"} {
		assert.Contains(t, got, name)
	}
	assert.Empty(t, Counters{SentPackets: 5, ReceivedPackets: 5}.Refusals())
	assert.Equal(t, []Count{{"rx_qp_state_err", 3}}, Counters{SentPackets: 5, QPStateErr: 3}.Refusals())
}
