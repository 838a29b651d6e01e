package conform

import (
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// The cases of READ and atomic resources: the responder's limit
// (max_dest_rd_atomic), atomic alignment, and the requester's implied NAK.

// maxOutReadsProbed bounds the READs max-rd-atomic-exceeded sends in one
// burst: a peer that grants more than this is not probed.
const maxOutReadsProbed = 1024

// impliedNAKBound is how soon the peer must resend the READ an implied NAK
// showed lost: well before perftest's ACK timeout (timeout 14, 67.1 ms),
// after which a resend shows only that the timer ran out.
const impliedNAKBound = 30 * time.Millisecond

// rdAtomicBursts is how many times max-rd-atomic-exceeded sends its
// burst before it fails the peer: a responder may have answered the first
// READs in full, freeing their resources, before the last one arrived
// (roce-emu does when the burst reaches it in two reads of its socket:
// with 3 bursts its own Self failed the case in 1 of 20 -race runs of
// TestSelfPassesEveryCase on a busy machine, 2026-12-01).
const rdAtomicBursts = 5

// rdAtomicExceeded sends one READ more than the peer's responder takes at
// once (its max_dest_rd_atomic, perftest's out_reads), in one burst: all
// of them outstanding. The one beyond the limit must be NAKed invalid
// request; a NAK of one within it fails, and so does an answer with data
// to the one beyond, each of rdAtomicBursts times.
func rdAtomicExceeded(t *T) {
	n := t.PeerOutReads
	if n > maxOutReadsProbed {
		t.NotApplicable("the peer takes %d READs at once; the prober sends at most %d in a burst", n, maxOutReadsProbed)
		return
	}
	for try := 1; ; try++ {
		ps := make([]*bth.Packet, n+1)
		for i := range ps {
			ps[i] = t.read(0, 8)
		}
		fs := t.send(ps...)
		if fs == nil {
			return
		}
		beyond := ps[n].BTH.PSN
		seen, a := t.Until(t.Wait, func(f *Frame) bool { return isAcknowledge(f) || f.Pkt.BTH.PSN == beyond })
		switch {
		case a == nil:
			t.Failf(fs[n:], "no answer to READ %d of %d sent at once (max_dest_rd_atomic %d) within %v", n+1, n+1, n, t.Wait)
		case syn(a) == bth.SyndromeInvalidReq && a.Pkt.BTH.PSN == beyond:
			// The READs within the limit are answered, each in full,
			// before the NAK of the one beyond it (responses go in PSN
			// order, IBTA 9.7.5.1.1).
			if i := unanswered(seen, ps[:n]); i >= 0 {
				t.Failf([]*Frame{fs[i], a}, "READ %d of %d, within the peer's max_dest_rd_atomic %d, got no 8-byte READ response before the NAK of READ %d", i+1, n+1, n, n+1)
				return
			}
			t.Evidence(fs[n], a)
			t.Logf("NAKed in burst %d, after the %d READs within the limit were answered", try, n)
		case a.Pkt.BTH.PSN != beyond || a.Pkt.BTH.Opcode == bth.RCAcknowledge:
			t.Failf([]*Frame{fs[n], a}, "got %s, want NAK_INV_REQ for PSN %d (READ %d, beyond max_dest_rd_atomic %d)", a, beyond, n+1, n)
		case try < rdAtomicBursts:
			continue // answered: perhaps a resource was free by then
		default:
			t.Failf([]*Frame{fs[n], a}, "READ %d, beyond the peer's max_dest_rd_atomic %d, was answered %s with %d bytes, want NAK_INV_REQ (in each of %d bursts)", n+1, n, a, len(a.Pkt.Payload), rdAtomicBursts)
		}
		return
	}
}

// unanswered is the index of the first of reqs (8-byte READs) that no
// READ response Only of 8 bytes at its PSN among seen answers, or -1.
func unanswered(seen []*Frame, reqs []*bth.Packet) int {
	got := make(map[bth.PSN]bool, len(reqs))
	for _, f := range seen {
		if f.Pkt.BTH.Opcode == bth.RCReadResponseOnly && len(f.Pkt.Payload) == 8 {
			got[f.Pkt.BTH.PSN] = true
		}
	}
	for i, r := range reqs {
		if !got[r.BTH.PSN] {
			return i
		}
	}
	return -1
}

// atomic builds a CMP_AND_SWP or FETCH_AND_ADD to the region's offset off.
func (t *T) atomic(op bth.Opcode, off uint64) *bth.Packet {
	p := t.Request(op, nil)
	p.AtomicETH = bth.AtomicETH{VA: t.VA + off, RKey: t.RKey, SwapAdd: 1}
	return p
}

// misalignedAtomic sends an aligned FETCH_AND_ADD, which must be answered
// with an ATOMIC Acknowledge (or the peer takes no atomics: n/a), then op
// at an address 4 bytes off the 8-byte alignment: NAK invalid request.
func misalignedAtomic(op bth.Opcode) func(t *T) {
	return func(t *T) {
		ok := t.send(t.atomic(bth.RCFetchAdd, 8))
		if ok == nil {
			return
		}
		_, a := t.Until(t.Wait, func(f *Frame) bool {
			return isAcknowledge(f) || f.Pkt.BTH.Opcode == bth.RCAtomicAcknowledge
		})
		switch {
		case a != nil && a.Pkt.BTH.Opcode == bth.RCAcknowledge && !syn(a).IsACK():
			t.NotApplicable("the peer's QP or region takes no atomics: an aligned FETCH_AND_ADD got %s", a)
			return
		case a == nil || a.Pkt.BTH.Opcode != bth.RCAtomicAcknowledge || a.Pkt.BTH.PSN != ok[0].Pkt.BTH.PSN:
			t.Failf(append(ok, a), "an aligned FETCH_AND_ADD was not answered by an ATOMIC Acknowledge at PSN %d within %v", ok[0].Pkt.BTH.PSN, t.Wait)
			return
		}
		p := t.atomic(op, 12)
		f := t.send(p)
		if f != nil {
			t.wantNAK(f[0], p.BTH.PSN, bth.NAKInvalidRequest, opName(op)+" to a VA 4 bytes off 8-byte alignment")
		}
	}
}

// peerReads waits for the first n READ requests of ib_read_bw -b's; nil,
// and the case n/a, when fewer came.
func (t *T) peerReads(n int) []*Frame {
	var reads []*Frame
	t.Until(t.Wait, func(f *Frame) bool {
		if f.Pkt.BTH.Opcode == bth.RCReadRequest {
			reads = append(reads, f)
		}
		return len(reads) == n
	})
	if len(reads) < n {
		t.NotApplicable("not run: the peer sent %d READ requests within %v, the case needs %d outstanding", len(reads), t.Wait, n)
		t.notRun = true
		return nil
	}
	return reads
}

// impliedNAK lets the peer's first READ go unanswered and answers its
// second, with the first packet of its READ response or (ack) with an ACK
// at its PSN: past the first READ, which the peer must then take as lost
// and resend at once, with the same RETH. Only a resend that arrives
// after the skip was sent counts: one before it (the peer's ACK timer
// ran out while the prober answered) proves nothing either way. A peer
// whose ACK timer is shorter than impliedNAKBound can pass on its timer
// alone (docs/conform.md).
func impliedNAK(ack bool) func(t *T) {
	return func(t *T) {
		reads := t.peerReads(2)
		if reads == nil {
			return
		}
		a, b := reads[0], reads[1]
		resp := t.Ack(b.Pkt.BTH.PSN, 1)
		if !ack {
			n := int(b.Pkt.RETH.DMALength)
			op := bth.RCReadResponseOnly
			if n > t.MTU {
				op, n = bth.RCReadResponseFirst, t.MTU
			}
			resp = &bth.Packet{BTH: bth.BTH{Opcode: op, PSN: b.Pkt.BTH.PSN}, AETH: resp.AETH, Payload: pattern(n, 8)}
		}
		skip := t.send(resp)
		if skip == nil {
			return
		}
		_, again := t.Until(t.Wait, func(f *Frame) bool {
			return isRequest(f) && f.Pkt.BTH.PSN == a.Pkt.BTH.PSN && !f.At.Before(skip[0].At)
		})
		var took time.Duration
		if again != nil {
			took = again.At.Sub(skip[0].At)
		}
		switch {
		case again == nil:
			t.Failf([]*Frame{a, b, skip[0]}, "after %s past the READ at PSN %d the peer did not resend it within %v", skip[0], a.Pkt.BTH.PSN, t.Wait)
		case took > impliedNAKBound:
			t.Failf([]*Frame{a, skip[0], again}, "the READ at PSN %d was resent %v after %s, later than %v: its ACK timer, not the implied NAK", a.Pkt.BTH.PSN, took, skip[0], impliedNAKBound)
		case again.Pkt.BTH.Opcode != bth.RCReadRequest || again.Pkt.RETH != a.Pkt.RETH:
			t.Failf([]*Frame{a, again}, "the READ at PSN %d was resent as %s with RETH %+v, want a READ request with RETH %+v", a.Pkt.BTH.PSN, again, again.Pkt.RETH, a.Pkt.RETH)
		default:
			t.Evidence(a, b, skip[0], again)
			t.Logf("resent after %v", took.Round(time.Microsecond))
		}
	}
}
