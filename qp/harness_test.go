package qp

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/require"
)

// wire connects two QPs through real encoding and decoding, in simulated
// time. Packets in flight wait in a queue with a delivery time; hooks may
// drop, duplicate or delay them.
type wire struct {
	t       testing.TB
	now     time.Time
	qp      [2]*QP
	cq      [2]*CQ
	pd      [2]*PD
	enc     [2]bth.Encap
	flight  []flying
	rng     *rand.Rand
	loss    float64 // random loss in both directions
	dup     float64 // random duplication
	reorder float64 // probability a packet is delayed behind later ones
	delay   time.Duration
	// drop, when set, decides per packet (after the random impairments).
	drop func(from int, p *bth.Packet) bool
	sent [2]int
	seen []seenPkt
	srq  *SRQ // QP 1's, when pairOpts.srqWR is set
	// psnOp remembers the request opcode each PSN was first sent with: a
	// retransmission must reuse it (two messages sharing a PSN is a bug).
	psnOp [2]map[bth.PSN]bth.Opcode
}

type flying struct {
	at   time.Time
	to   int
	data []byte
}

type seenPkt struct {
	from int
	op   bth.Opcode
	psn  bth.PSN
	syn  bth.Syndrome
}

type pairOpts struct {
	mtu       MTU
	psnA      bth.PSN
	psnB      bth.PSN
	access    Access
	retry     uint8
	rnrRetry  uint8
	timeout   uint8
	minRNR    uint8
	rdAtomic  uint8
	strict    bool
	sendDepth int
	typ       QPType // 0: RC; UC takes the same PSNs and MTU
	srqWR     int    // > 0: QP 1 receives from an SRQ of this depth (wire.srq)
	window    int    // InitAttr.MaxUnackedPSNs of both QPs
}

func defaultOpts() pairOpts {
	return pairOpts{mtu: IBV_MTU_1024, psnA: 0x100, psnB: 0x200,
		access: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
		retry:  7, rnrRetry: 7, timeout: 14, minRNR: 12, rdAtomic: 16}
}

func newWire(t testing.TB, o pairOpts) *wire {
	w := &wire{t: t, now: time.Unix(1700000000, 0), rng: rand.New(rand.NewPCG(1, 2)), delay: 10 * time.Microsecond}
	addr := [2]netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	qpn := [2]uint32{0x11, 0x22}
	psn := [2]bth.PSN{o.psnA, o.psnB}
	for i := range 2 {
		w.pd[i] = NewDevice().NewPD() // one device per side, as two hosts
		w.cq[i] = NewCQ(1 << 16)
		var srq *SRQ
		if i == 1 && o.srqWR > 0 {
			var err error
			srq, err = w.pd[i].NewSRQ(SRQInitAttr{MaxWR: o.srqWR, MaxSGE: 2})
			require.NoError(t, err)
			w.srq = srq
		}
		q, err := New(InitAttr{PD: w.pd[i], SendCQ: w.cq[i], RecvCQ: w.cq[i], QPN: qpn[i], MaxSendWR: max(o.sendDepth, 4096),
			MaxRecvWR: 4096, StrictRetryCount: o.strict, QPType: o.typ, SRQ: srq, MaxUnackedPSNs: o.window})
		require.NoError(t, err)
		w.qp[i] = q
		w.enc[i] = bth.Encap{Src: addr[i], Dst: addr[1-i], SrcPort: bth.SourcePort(0, qpn[i], qpn[1-i])}
	}
	for i := range 2 {
		q := w.qp[i]
		if o.typ == IBV_QPT_UC {
			require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: o.access}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
			require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: o.mtu, DestQPN: qpn[1-i], RQPSN: psn[1-i],
				AV: AddressVector{Remote: netip.AddrPortFrom(addr[1-i], 4791)}},
				IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN))
			require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: psn[i]}, IBV_QP_STATE|IBV_QP_SQ_PSN))
			continue
		}
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: o.access}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: o.mtu, DestQPN: qpn[1-i], RQPSN: psn[1-i],
			MaxDestRdAtomic: o.rdAtomic, MinRNRTimer: o.minRNR, AV: AddressVector{Remote: netip.AddrPortFrom(addr[1-i], 4791)}},
			IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
		require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: psn[i], Timeout: o.timeout, RetryCnt: o.retry,
			RNRRetry: o.rnrRetry, MaxRdAtomic: o.rdAtomic},
			IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC))
	}
	return w
}

// pump moves every packet the QPs have to send onto the wire.
func (w *wire) pump() bool {
	moved := false
	var p bth.Packet
	for i := range 2 {
		for w.qp[i].NextPacket(w.now, &p) {
			moved = true
			w.sent[i]++
			w.seen = append(w.seen, seenPkt{i, p.BTH.Opcode, p.BTH.PSN, p.AETH.Syndrome})
			if op := p.BTH.Opcode.Info().Op; op != bth.OpAcknowledge && op != bth.OpAtomicAcknowledge && op != bth.OpReadResponse {
				if w.psnOp[i] == nil {
					w.psnOp[i] = map[bth.PSN]bth.Opcode{}
				}
				if prev, ok := w.psnOp[i][p.BTH.PSN]; ok {
					require.Equal(w.t, prev, p.BTH.Opcode, "QP %d sent PSN %d with two opcodes", i, p.BTH.PSN)
				} else {
					w.psnOp[i][p.BTH.PSN] = p.BTH.Opcode
				}
			}
			data, err := p.Append(nil, &w.enc[i])
			require.NoError(w.t, err)
			if w.drop != nil && w.drop(i, &p) {
				continue
			}
			if w.loss > 0 && w.rng.Float64() < w.loss {
				continue
			}
			at := w.now.Add(w.delay)
			if w.reorder > 0 && w.rng.Float64() < w.reorder {
				at = at.Add(time.Duration(w.rng.IntN(50)) * time.Microsecond)
			}
			w.flight = append(w.flight, flying{at, 1 - i, data})
			if w.dup > 0 && w.rng.Float64() < w.dup {
				w.flight = append(w.flight, flying{at.Add(3 * time.Microsecond), 1 - i, append([]byte(nil), data...)})
			}
		}
	}
	return moved
}

// step delivers what is due, or advances time to the next event. It
// returns false when nothing is left to happen.
func (w *wire) step() bool {
	if w.pump() {
		return true
	}
	next := time.Time{}
	for _, f := range w.flight {
		if next.IsZero() || f.at.Before(next) {
			next = f.at
		}
	}
	for _, q := range w.qp {
		if d := q.Deadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	if next.IsZero() {
		return false
	}
	if next.After(w.now) {
		w.now = next
	}
	rest := w.flight[:0]
	var due []flying
	for _, f := range w.flight {
		if !f.at.After(w.now) {
			due = append(due, f)
		} else {
			rest = append(rest, f)
		}
	}
	w.flight = rest
	for _, f := range due {
		var p bth.Packet
		require.NoError(w.t, p.Decode(f.data))
		_, _, err := w.enc[1-f.to].VerifyICRC(f.data)
		require.NoError(w.t, err)
		w.qp[f.to].HandlePacket(w.now, &p, bth.NotECT)
	}
	for _, q := range w.qp {
		if d := q.Deadline(); !d.IsZero() && !w.now.Before(d) {
			q.HandleTimeout(w.now)
		}
	}
	return true
}

// runUntil steps until done() or nothing is left, within a step budget.
func (w *wire) runUntil(done func() bool) {
	w.t.Helper()
	for i := 0; i < 5_000_000; i++ {
		if done != nil && done() {
			return
		}
		if !w.step() {
			if done != nil {
				done() // the last step may have completed something
			}
			return
		}
	}
	w.t.Fatal("wire: step budget exhausted")
}

// poll collects completions of CQ i until n are there (running the wire).
func (w *wire) poll(i, n int) []WC {
	w.t.Helper()
	var out []WC
	buf := make([]WC, 64)
	w.runUntil(func() bool {
		k := w.cq[i].Poll(buf)
		out = append(out, buf[:k]...)
		return len(out) >= n
	})
	return out
}
