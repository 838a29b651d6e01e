package conform

import (
	"bytes"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// Cases returns the case library, in the order a run takes them.
func Cases() []Case {
	return []Case{
		{Name: "psn-sequence-error-nak-once", IBTA: "IBTA Vol. 1 ch. 9.7 (responder: a request ahead of the expected PSN is NAKed PSN sequence error, once per gap)", Peer: WriteBW, Run: psnSequenceNAKOnce},
		{Name: "first-psn-not-announced", IBTA: "IBTA Vol. 1 ch. 9.7 (responder: expected PSN set at RTR to the announced one)", Peer: WriteBW, Run: firstPSNNotAnnounced},
		{Name: "duplicate-request-reacked", IBTA: "IBTA Vol. 1 ch. 9.7 (responder: duplicate SEND/WRITE requests are acknowledged again, not executed)", Peer: WriteBW, Run: duplicateReACKed},
		{Name: "psn-half-windows", IBTA: "IBTA Vol. 1 9.7.1 and ch. 9.7 (a PSN up to 2^23 behind the expected one is a duplicate, ACKed again; one less than 2^23 ahead is a sequence error, NAKed)", Peer: WriteBW, Run: psnHalfWindows},
		{Name: "psn-wrap", IBTA: "IBTA Vol. 1 9.7.1 (PSN arithmetic modulo 2^24)", Peer: WriteBW, StartPSN: 0xFFFFFE, Run: psnWrap},
		{Name: "migreq-either-way", IBTA: "IBTA Vol. 1 9.2 (BTH MigReq) and ch. 9.7: a request is accepted with MigReq 1 or 0", Peer: WriteBW, Run: migReq},
		{Name: "cnp-accepted", IBTA: "IBTA Vol. 1 Annex A17.9.3 (RoCEv2 CNP): a CNP takes no PSN and changes nothing else", Peer: WriteBW, Run: cnpAccepted},
		{Name: "zero-length-write", IBTA: "IBTA Vol. 1 ch. 9.7 (an RDMA WRITE of zero bytes is one packet, one PSN)", Peer: WriteBW, Run: zeroLengthWrite},
		{Name: "zero-length-write-no-r-key", IBTA: "IBTA Vol. 1 C9-88, as rxe_resp.c cites it (a zero-length RDMA WRITE needs no valid R_Key or VA)", Peer: WriteBW, Run: zeroLengthNoRKey(false)},
		{Name: "zero-length-read-no-r-key", IBTA: "IBTA Vol. 1 C9-88, as rxe_resp.c cites it (a zero-length RDMA READ needs no valid R_Key or VA)", Peer: ReadBW, Run: zeroLengthNoRKey(true)},
		{Name: "zero-length-read", IBTA: "IBTA Vol. 1 ch. 9.7 (an RDMA READ of zero bytes is answered by one READ response Only, one PSN)", Peer: ReadBW, Run: zeroLengthRead},
		{Name: "write-mtu-minus-1", IBTA: "IBTA Vol. 1 ch. 9.7 (an Only packet carries at most the path MTU)", Peer: WriteBW, Run: writeOnlySize(-1)},
		{Name: "write-mtu", IBTA: "IBTA Vol. 1 ch. 9.7 (an Only packet carries at most the path MTU)", Peer: WriteBW, Run: writeOnlySize(0)},
		{Name: "write-mtu-plus-1", IBTA: "IBTA Vol. 1 ch. 9.7 (a packet longer than the path MTU is NAKed invalid request)", Peer: WriteBW, Run: writeOnlySize(+1)},
		{Name: "r-key-violation", IBTA: "IBTA Vol. 1 ch. 9.7 and ch. 10 (memory protection: an invalid R_Key is NAKed remote access error; the QP goes to the error state)", Peer: WriteBW, Run: accessViolation(false)},
		{Name: "bounds-violation", IBTA: "IBTA Vol. 1 ch. 9.7 and ch. 10 (memory protection: an access beyond the region is NAKed remote access error; the QP goes to the error state)", Peer: WriteBW, Run: accessViolation(true)},
		{Name: "read-bounds-violation", IBTA: "IBTA Vol. 1 ch. 9.7 and ch. 10 (memory protection: a READ beyond the region is NAKed remote access error, nothing is returned)", Peer: ReadBW, Run: readBounds},
		{Name: "duplicate-read-reexecuted", IBTA: "IBTA Vol. 1 ch. 9.7 (responder: a duplicate READ is executed again, with its own length)", Peer: ReadBW, Run: duplicateRead},
		{Name: "write-segmented", IBTA: "IBTA Vol. 1 ch. 9.7 (a WRITE of several packets: First with the RETH and Middle carry exactly the MTU, Last the rest)", Peer: WriteBW, Run: writeSegmented},
		{Name: "write-middle-short", IBTA: "IBTA Vol. 1 ch. 9.7 (a Middle packet shorter than the MTU is NAKed invalid request)", Peer: WriteBW, Run: writeMiddleShort},
		{Name: "write-middle-without-first", IBTA: "IBTA Vol. 1 ch. 9.7 (opcode sequence: a Middle with no First is NAKed invalid request)", Peer: WriteBW, Run: middleWithoutFirst},
		{Name: "read-response-segmented", IBTA: "IBTA Vol. 1 ch. 9.7 (a READ of several MTUs: responses First and Last with an AETH, Middle without, one PSN each)", Peer: ReadBW, Run: readSegmented},
		{Name: "duplicate-write-not-reexecuted", IBTA: "IBTA Vol. 1 ch. 9.7 (responder: a duplicate WRITE is acknowledged, not executed again)", Peer: ReadBW, Run: duplicateWriteNotReexecuted},
		{Name: "rnr-nak-no-receive-wqe", IBTA: "IBTA Vol. 1 ch. 9.7 (RNR NAK: a SEND finding no receive WQE is RNR NAKed; the QP stays usable)", Peer: WriteBW, Run: rnrNoReceive},
		{Name: "max-rd-atomic-exceeded", IBTA: "IBTA Vol. 1 9.7.5.1 (responder resources: a READ or atomic beyond max_dest_rd_atomic outstanding is NAKed invalid request)", Peer: ReadBW, Run: rdAtomicExceeded},
		{Name: "misaligned-atomic-cmp-swap", IBTA: "IBTA Vol. 1 9.4.5 (atomic operations: the VA must be 8-byte aligned) and ch. 9.7 (NAK invalid request)", Peer: AtomicBW, Run: misalignedAtomic(bth.RCCompareSwap)},
		{Name: "misaligned-atomic-fetch-add", IBTA: "IBTA Vol. 1 9.4.5 (atomic operations: the VA must be 8-byte aligned) and ch. 9.7 (NAK invalid request)", Peer: AtomicBW, Run: misalignedAtomic(bth.RCFetchAdd)},
		{Name: "implied-nak-read-response", IBTA: "IBTA Vol. 1 9.7.5.1 (requester: a READ response past an outstanding READ means its response was lost: an implied NAK, resend from that READ)", Peer: ReadBWBidir, Run: impliedNAK(false)},
		{Name: "implied-nak-ack", IBTA: "IBTA Vol. 1 9.7.5.1 (requester: an ACK past an outstanding READ means its response was lost: an implied NAK, resend from that READ)", Peer: ReadBWBidir, Run: impliedNAK(true)},
		{Name: "go-back-n", IBTA: "IBTA Vol. 1 ch. 9.7 (requester: after a PSN sequence error NAK, resend from the NAKed PSN, each packet as before)", Peer: Pingpong, Run: goBackN},
		{Name: "duplicate-send-not-redelivered", IBTA: "IBTA Vol. 1 ch. 9.7 (responder: a duplicate SEND is acknowledged, not delivered again)", Peer: Pingpong, Run: duplicateSend},
		{Name: "ghost-ack-ignored", IBTA: "IBTA Vol. 1 ch. 9.7 (requester: an ACK for a PSN not yet sent is ignored)", Peer: Pingpong, Run: ghostACK},
		{Name: "rnr-timer-code-0", IBTA: "IBTA Vol. 1 Table 45 (RNR NAK timer code 0 is 655.36 ms) and ch. 9.7 (requester waits it before resending)", Peer: Pingpong, Run: rnrTimerZero},
		{Name: "write-permission-violation", IBTA: "IBTA Vol. 1 ch. 9.7 and ch. 10 (access rights: an RDMA WRITE to a QP that enables no remote WRITE is NAKed remote access error; the QP goes to the error state)", Peer: Pingpong, Run: permissionViolation(false)},
		{Name: "read-permission-violation", IBTA: "IBTA Vol. 1 ch. 9.7 and ch. 10 (access rights: an RDMA READ from a QP that enables no remote READ is NAKed remote access error, nothing is returned; the QP goes to the error state)", Peer: Pingpong, Run: permissionViolation(true)},
		{Name: "retry-exhaustion", IBTA: "IBTA Vol. 1 ch. 9.7 (requester: retry_cnt retransmissions after ACK timeouts, then no more)", Peer: Pingpong, Run: retryExhaustion},
	}
}

// pattern returns n bytes that differ from case to case and packet to
// packet.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*13)
	}
	return b
}

// clone copies a sent or received packet, to send it again.
func clone(p *bth.Packet) *bth.Packet {
	c := *p
	c.Payload = append([]byte(nil), p.Payload...)
	return &c
}

func isAcknowledge(f *Frame) bool { return f.Pkt.BTH.Opcode == bth.RCAcknowledge }

// isRequest reports a request packet of the peer's (it is requester too
// on rc_pingpong).
func isRequest(f *Frame) bool {
	info := f.Pkt.BTH.Opcode.Info()
	return info != nil && f.Pkt.BTH.Opcode.Transport() == bth.TransportRC && info.Op.IsRequest()
}

func syn(f *Frame) bth.Syndrome { return f.Pkt.AETH.Syndrome }

// send sends ps as one burst; a send the prober cannot make ends the case
// as n/a.
func (t *T) send(ps ...*bth.Packet) []*Frame {
	fs, err := t.SendBatch(ps)
	if err != nil {
		t.NotApplicable("not run: the prober could not send: %v", err)
		t.notRun = true
		return nil
	}
	return fs
}

// ackFor waits for the peer's acknowledge packet (ACK or NAK) that
// answers psn or a later PSN, skipping its own requests; nil when none came
// within t.Wait.
func (t *T) ackFor(psn bth.PSN) *Frame {
	_, f := t.Until(t.Wait, func(f *Frame) bool {
		return isAcknowledge(f) && (!syn(f).IsACK() || !f.Pkt.BTH.PSN.Before(psn))
	})
	return f
}

// wantACK requires an ACK (not a NAK) for psn exactly, sent as answer to
// the request frame req; it fails the case otherwise.
func (t *T) wantACK(req *Frame, psn bth.PSN, what string) bool {
	a := t.ackFor(psn)
	switch {
	case a == nil:
		t.Failf([]*Frame{req}, "%s: no ACK for PSN %d within %v", what, psn, t.Wait)
	case !syn(a).IsACK():
		t.Failf([]*Frame{req, a}, "%s: %s instead of an ACK for PSN %d", what, syn(a).KindName(), psn)
	case a.Pkt.BTH.PSN != psn:
		t.Failf([]*Frame{req, a}, "%s: ACK for PSN %d, want %d", what, a.Pkt.BTH.PSN, psn)
	default:
		t.Evidence(req, a)
		return true
	}
	return false
}

// wantNAK requires a NAK with code for psn.
func (t *T) wantNAK(req *Frame, psn bth.PSN, code bth.NAKCode, what string) *Frame {
	a := t.ackFor(psn)
	want := bth.NAKSyndrome(code)
	switch {
	case a == nil:
		t.Failf([]*Frame{req}, "%s: no %s for PSN %d within %v", what, want.KindName(), psn, t.Wait)
	case syn(a) != want || a.Pkt.BTH.PSN != psn:
		t.Failf([]*Frame{req, a}, "%s: %s for PSN %d, want %s for PSN %d", what, syn(a).KindName(), a.Pkt.BTH.PSN, want.KindName(), psn)
	default:
		t.Evidence(req, a)
		return a
	}
	return nil
}

// silent requires no acknowledge from the peer for t.Quiet.
func (t *T) silent(what string, cause ...*Frame) bool {
	for _, f := range t.Collect(t.Quiet) {
		if isAcknowledge(f) || f.Pkt.BTH.Opcode.Info() != nil && f.Pkt.BTH.Opcode.Info().Op == bth.OpReadResponse {
			t.Failf(append(cause, f), "%s: the peer answered %s", what, f)
			return false
		}
	}
	return true
}

func psnSequenceNAKOnce(t *T) {
	first := t.send(t.Write(0, pattern(64, 1)))
	if first == nil || !t.wantACK(first[0], first[0].Pkt.BTH.PSN, "the in-sequence WRITE") {
		return
	}
	gap := t.PSN
	t.PSN = gap.Next()
	ahead := t.send(t.Write(64, pattern(64, 2)), t.Write(128, pattern(64, 3)), t.Write(192, pattern(64, 4)))
	if ahead == nil {
		return
	}
	var naks []*Frame
	for _, f := range t.Collect(t.Quiet) {
		if !isAcknowledge(f) {
			continue
		}
		if syn(f).IsACK() {
			t.Failf(append(ahead, f), "a request beyond the gap at PSN %d was acknowledged (%s)", gap, f)
			return
		}
		naks = append(naks, f)
	}
	switch {
	case len(naks) == 0:
		t.Failf(ahead, "no NAK for the gap at PSN %d", gap)
		return
	case len(naks) > 1:
		t.Failf(naks, "%d NAKs for one gap at PSN %d, want 1", len(naks), gap)
		return
	case syn(naks[0]) != bth.SyndromePSNSeqErr || naks[0].Pkt.BTH.PSN != gap:
		t.Failf(naks, "got %s, want NAK_PSN_SEQ for PSN %d", naks[0], gap)
		return
	}
	t.Evidence(ahead[0], naks[0])
	// Resending from the gap must be accepted.
	t.PSN = gap
	again := t.send(t.Write(64, pattern(64, 5)), t.Write(64, pattern(64, 2)), t.Write(128, pattern(64, 3)), t.Write(192, pattern(64, 4)))
	if again == nil || !t.wantACK(again[3], again[3].Pkt.BTH.PSN, "resent from the gap") {
		return
	}
	// A new gap is a new sequence error: one more NAK.
	gap2 := t.PSN
	t.PSN = gap2.Add(2)
	ahead = t.send(t.Write(0, pattern(8, 6)))
	if ahead != nil {
		t.wantNAK(ahead[0], gap2, bth.NAKPSNSequenceError, "a second gap, after the first was filled")
	}
}

func firstPSNNotAnnounced(t *T) {
	announced := t.PSN
	t.PSN = announced.Add(5)
	w := t.send(t.Write(0, pattern(32, 1)))
	if w == nil || t.wantNAK(w[0], announced, bth.NAKPSNSequenceError, "a first request 5 PSNs past the announced one") == nil {
		return
	}
	t.PSN = announced
	w = t.send(t.Write(0, pattern(32, 1)))
	if w != nil {
		t.wantACK(w[0], announced, "the request at the announced PSN")
	}
}

func duplicateReACKed(t *T) {
	p := t.PSN
	ws := t.send(t.Write(0, pattern(16, 1)), t.Write(16, pattern(16, 2)), t.Write(32, pattern(16, 3)))
	if ws == nil || !t.wantACK(ws[2], p.Add(2), "three WRITEs") {
		return
	}
	dup := clone(&ws[0].Pkt)
	d := t.send(dup)
	if d == nil {
		return
	}
	a := t.ackFor(p)
	switch {
	case a == nil:
		t.Failf(d, "the duplicate of PSN %d was not acknowledged within %v", p, t.Wait)
	case !syn(a).IsACK():
		t.Failf([]*Frame{d[0], a}, "the duplicate of PSN %d got %s", p, a)
	case a.Pkt.BTH.PSN.Before(p) || a.Pkt.BTH.PSN.After(p.Add(2)):
		t.Failf([]*Frame{d[0], a}, "the duplicate of PSN %d was ACKed with PSN %d, outside [%d, %d]", p, a.Pkt.BTH.PSN, p, p.Add(2))
	default:
		t.Evidence(d[0], a)
	}
	// The expected PSN did not move back.
	w := t.send(t.Write(48, pattern(16, 4)))
	if w != nil && !t.Failed() {
		t.wantACK(w[0], p.Add(3), "the next new request after the duplicate")
	}
}

func psnWrap(t *T) {
	for i := range 4 {
		w := t.send(t.Write(uint64(8*i), pattern(8, byte(i))))
		if w == nil || !t.wantACK(w[0], w[0].Pkt.BTH.PSN, "a WRITE across the PSN wrap") {
			return
		}
	}
}

func migReq(t *T) {
	for _, mig := range []bool{true, false, true} {
		p := t.Write(0, pattern(8, 1))
		p.BTH.MigReq = mig
		w := t.send(p)
		if w == nil || !t.wantACK(w[0], p.BTH.PSN, map[bool]string{true: "MigReq 1", false: "MigReq 0"}[mig]) {
			return
		}
	}
}

func cnpAccepted(t *T) {
	w := t.send(t.Write(0, pattern(8, 1)))
	if w == nil || !t.wantACK(w[0], w[0].Pkt.BTH.PSN, "the WRITE before the CNP") {
		return
	}
	cnp := t.send(&bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, BECN: true}})
	if cnp == nil || !t.silent("after a CNP", cnp...) {
		return
	}
	t.Evidence(cnp...)
	w = t.send(t.Write(8, pattern(8, 2)))
	if w != nil {
		t.wantACK(w[0], w[0].Pkt.BTH.PSN, "the WRITE after the CNP (the CNP must take no PSN)")
	}
}

func zeroLengthWrite(t *T) {
	w := t.send(t.Write(0, nil))
	if w == nil || !t.wantACK(w[0], w[0].Pkt.BTH.PSN, "a zero-length WRITE") {
		return
	}
	w = t.send(t.Write(0, pattern(8, 1)))
	if w != nil {
		t.wantACK(w[0], w[0].Pkt.BTH.PSN, "the WRITE at the next PSN")
	}
}

// read builds a READ request of n bytes at the region's offset off; it
// takes one PSN per response packet.
func (t *T) read(off uint64, n int) *bth.Packet {
	p := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadRequest, PSN: t.PSN, AckReq: true},
		RETH: bth.RETH{VA: t.VA + off, RKey: t.RKey, DMALength: uint32(n)}}
	t.PSN = t.PSN.Add(max(1, (n+t.MTU-1)/t.MTU))
	return p
}

// readResponse waits for a READ response Only at psn and checks its size.
func (t *T) readResponse(req *Frame, psn bth.PSN, n int, what string) *Frame {
	_, f := t.Until(t.Wait, func(f *Frame) bool { return isAcknowledge(f) || !isRequest(f) && f.Pkt.BTH.Opcode != bth.CNP })
	switch {
	case f == nil:
		t.Failf([]*Frame{req}, "%s: no READ response within %v", what, t.Wait)
	case f.Pkt.BTH.Opcode != bth.RCReadResponseOnly || f.Pkt.BTH.PSN != psn || len(f.Pkt.Payload) != n:
		t.Failf([]*Frame{req, f}, "%s: got %s with %d bytes, want %s PSN %d with %d bytes", what, f, len(f.Pkt.Payload), bth.RCReadResponseOnly, psn, n)
	case !syn(f).IsACK():
		t.Failf([]*Frame{req, f}, "%s: the response's AETH is %s", what, syn(f).KindName())
	default:
		t.Evidence(req, f)
		return f
	}
	return nil
}

func zeroLengthRead(t *T) {
	r := t.send(t.read(0, 0))
	if r == nil || t.readResponse(r[0], r[0].Pkt.BTH.PSN, 0, "a zero-length READ") == nil {
		return
	}
	r = t.send(t.read(0, 8))
	if r != nil {
		t.readResponse(r[0], r[0].Pkt.BTH.PSN, 8, "the READ at the next PSN")
	}
}

func duplicateRead(t *T) {
	r := t.send(t.read(0, 64))
	if r == nil {
		return
	}
	first := t.readResponse(r[0], r[0].Pkt.BTH.PSN, 64, "a READ of 64 bytes")
	if first == nil {
		return
	}
	dup := clone(&r[0].Pkt)
	d := t.send(dup)
	if d == nil {
		return
	}
	again := t.readResponse(d[0], dup.BTH.PSN, 64, "the duplicate READ")
	if again == nil {
		return
	}
	if !bytes.Equal(again.Pkt.Payload, first.Pkt.Payload) {
		t.Failf([]*Frame{first, again}, "the duplicate READ returned other bytes")
		return
	}
	shorter := clone(&r[0].Pkt)
	shorter.RETH.DMALength = 32
	d = t.send(shorter)
	if d == nil {
		return
	}
	short := t.readResponse(d[0], shorter.BTH.PSN, 32, "the duplicate READ with length 32")
	if short == nil {
		return
	}
	if !bytes.Equal(short.Pkt.Payload, first.Pkt.Payload[:32]) {
		t.Failf([]*Frame{first, short}, "the shorter duplicate READ returned other bytes")
		return
	}
	r = t.send(t.read(64, 8))
	if r != nil {
		t.readResponse(r[0], r[0].Pkt.BTH.PSN, 8, "the next new READ")
	}
}

func writeOnlySize(delta int) func(t *T) {
	return func(t *T) {
		n := t.MTU + delta
		w := t.send(t.Write(0, pattern(n, 1)))
		if w == nil {
			return
		}
		if delta > 0 {
			t.wantNAK(w[0], w[0].Pkt.BTH.PSN, bth.NAKInvalidRequest, "a WRITE Only of MTU+1 bytes")
			return
		}
		t.wantACK(w[0], w[0].Pkt.BTH.PSN, "a WRITE Only of MTU"+map[bool]string{true: "-1", false: ""}[delta < 0]+" bytes")
	}
}

func accessViolation(bounds bool) func(t *T) {
	return func(t *T) {
		p := t.Write(0, pattern(64, 1))
		what := "a WRITE with an R_Key the peer never gave"
		if bounds {
			p.RETH.VA += 1 << 40
			what = "a WRITE 1 TiB past the region's start"
		} else {
			p.RETH.RKey ^= 0x5A5A5A00
		}
		w := t.send(p)
		if w == nil || t.wantNAK(w[0], p.BTH.PSN, bth.NAKRemoteAccessError, what) == nil {
			return
		}
		// The QP is in the error state: a valid request gets no answer.
		ok := t.send(t.Write(0, pattern(8, 2)))
		if ok != nil {
			t.silent("a valid WRITE after the remote access error (the QP should be in the error state)", ok...)
		}
	}
}

func rnrNoReceive(t *T) {
	p := t.Request(bth.RCSendOnly, pattern(16, 1))
	s := t.send(p)
	if s == nil {
		return
	}
	a := t.ackFor(p.BTH.PSN)
	switch {
	case a == nil:
		t.Failf(s, "no RNR NAK for a SEND with no receive WQE posted, within %v", t.Wait)
		return
	case syn(a).Kind() != bth.KindRNRNAK || a.Pkt.BTH.PSN != p.BTH.PSN:
		t.Failf([]*Frame{s[0], a}, "got %s, want RNR_NAK for PSN %d", a, p.BTH.PSN)
		return
	}
	t.Evidence(s[0], a)
	t.Logf("RNR NAK timer code %d (%v)", syn(a).Value(), bth.RNRTimer(syn(a).Value()))
	// The QP goes on: the PSN still expected is the SEND's.
	t.PSN = p.BTH.PSN
	w := t.send(t.Write(0, pattern(8, 2)))
	if w != nil {
		t.wantACK(w[0], p.BTH.PSN, "a WRITE at the RNR NAKed PSN")
	}
}

// peerMessage sends a SEND to rc_pingpong's server and collects the
// SEND it answers with, up to its last packet; msg is nil when it did not
// come (the case has failed).
func (t *T) peerMessage() (sent *Frame, msg []*Frame) {
	s := t.send(t.Request(bth.RCSendOnly, pattern(64, 9)))
	if s == nil {
		return nil, nil
	}
	_, last := t.Until(t.Wait, func(f *Frame) bool {
		if isRequest(f) && f.Pkt.BTH.Opcode.Info().Op == bth.OpSend {
			msg = append(msg, f)
			return f.Pkt.BTH.Opcode.Info().Ends()
		}
		return false
	})
	if last == nil {
		t.Failf(append(s, msg...), "rc_pingpong's server did not answer a SEND with a whole SEND within %v", t.Wait)
		return nil, nil
	}
	if msg[0].Pkt.BTH.PSN != t.PeerPSN {
		t.Failf(msg[:1], "the peer's first request has PSN %d, not the %d it announced", msg[0].Pkt.BTH.PSN, t.PeerPSN)
		return nil, nil
	}
	return s[0], msg
}

func goBackN(t *T) {
	_, msg := t.peerMessage()
	if msg == nil {
		return
	}
	if len(msg) < 3 {
		t.NotApplicable("the peer's SEND is %d packets; go-back-N needs 3 (rc_pingpong -s at least 2 MTU + 1)", len(msg))
		return
	}
	lost := msg[1].Pkt.BTH.PSN
	nak := t.send(t.NAK(lost, bth.SyndromePSNSeqErr, 0))
	if nak == nil {
		return
	}
	t.Evidence(msg[1], nak[0])
	want := msg[1:]
	var resent []*Frame
	_, _ = t.Until(t.Wait, func(f *Frame) bool {
		if isRequest(f) {
			resent = append(resent, f)
		}
		return len(resent) == len(want)
	})
	if len(resent) < len(want) {
		t.Failf(append(nak, resent...), "after a NAK for PSN %d the peer resent %d packets within %v, want %d", lost, len(resent), t.Wait, len(want))
		return
	}
	for i, f := range resent {
		o := want[i]
		if f.Pkt.BTH.PSN != o.Pkt.BTH.PSN || f.Pkt.BTH.Opcode != o.Pkt.BTH.Opcode || !bytes.Equal(f.Pkt.Payload, o.Pkt.Payload) {
			t.Failf([]*Frame{nak[0], o, f}, "resent packet %d is %s with %d bytes, want %s with %d bytes and the same payload",
				i+1, f, len(f.Pkt.Payload), o, len(o.Pkt.Payload))
			return
		}
		if info := f.Pkt.BTH.Opcode.Info(); info.Ext&bth.ExtRETH != 0 && !info.Starts() {
			t.Failf([]*Frame{f}, "resent packet %d carries a RETH but is not a First or Only", i+1)
			return
		}
	}
	t.Evidence(resent[0], resent[len(resent)-1])
	t.send(t.Ack(resent[len(resent)-1].Pkt.BTH.PSN, 1))
}

func ghostACK(t *T) {
	_, msg := t.peerMessage()
	if msg == nil {
		return
	}
	last := msg[len(msg)-1].Pkt.BTH.PSN
	ghost := t.send(t.Ack(last.Add(10), 1))
	if ghost == nil {
		return
	}
	// Nothing was acknowledged: the peer must send its message again when
	// its ACK timer (timeout 14, 67 ms on rc_pingpong) runs out.
	_, again := t.Until(t.Wait, func(f *Frame) bool { return isRequest(f) && f.Pkt.BTH.PSN == t.PeerPSN })
	if again == nil {
		t.Failf(append(ghost, msg...), "after an ACK for PSN %d, which it never sent, the peer did not resend PSN %d within %v: it took the ghost ACK", last.Add(10), t.PeerPSN, t.Wait)
		return
	}
	t.Evidence(ghost[0], again)
	t.send(t.Ack(last, 1))
}

func rnrTimerZero(t *T) {
	_, msg := t.peerMessage()
	if msg == nil {
		return
	}
	first := msg[0].Pkt.BTH.PSN
	nak := t.send(t.NAK(first, bth.RNRNAKSyndrome(0), 0))
	if nak == nil {
		return
	}
	wait := bth.RNRTimer(0)
	_, again := t.Until(wait+t.Wait, func(f *Frame) bool { return isRequest(f) && f.Pkt.BTH.PSN == first })
	if again == nil {
		t.Failf(nak, "after an RNR NAK with timer code 0 the peer did not resend PSN %d within %v", first, wait+t.Wait)
		return
	}
	took := again.At.Sub(nak[0].At)
	if took < wait {
		t.Failf([]*Frame{nak[0], again}, "the peer resent PSN %d after %v, before the %v of RNR timer code 0", first, took, wait)
		return
	}
	t.Evidence(nak[0], again)
	t.Logf("resent after %v", took.Round(time.Microsecond))
	t.Collect(t.Quiet)
	t.send(t.Ack(msg[len(msg)-1].Pkt.BTH.PSN, 1))
}

func retryExhaustion(t *T) {
	const retryCnt = 7 // rc_pingpong's
	_, msg := t.peerMessage()
	if msg == nil {
		return
	}
	first := msg[0].Pkt.BTH.PSN
	// Never acknowledge; count the transmissions of the first PSN until
	// the peer goes quiet for longer than a few of its ACK timeouts.
	sends := []*Frame{msg[0]}
	gap := 4*67*time.Millisecond + t.Wait
	for {
		f, err := t.Next(gap)
		if err != nil {
			break
		}
		if isRequest(f) && f.Pkt.BTH.PSN == first {
			sends = append(sends, f)
			if len(sends) > 4*retryCnt {
				break
			}
		}
	}
	if len(sends) != retryCnt+1 {
		more := ""
		if len(sends) > 4*retryCnt {
			more = " (counting stopped)"
		}
		t.Failf(sends, "PSN %d was sent %d times%s with no ACK; rc_pingpong sets retry_cnt %d, so want %d", first, len(sends), more, retryCnt, retryCnt+1)
		return
	}
	t.Evidence(sends[0], sends[len(sends)-1])
}

func writeSegmented(t *T) {
	data := pattern(2*t.MTU+5, 3)
	first := t.Request(bth.RCWriteFirst, data[:t.MTU])
	first.RETH = bth.RETH{VA: t.VA, RKey: t.RKey, DMALength: uint32(len(data))}
	first.BTH.AckReq = false
	mid := t.Request(bth.RCWriteMiddle, data[t.MTU:2*t.MTU])
	mid.BTH.AckReq = false
	last := t.Request(bth.RCWriteLast, data[2*t.MTU:])
	ws := t.send(first, mid, last)
	if ws != nil {
		t.wantACK(ws[2], last.BTH.PSN, "a WRITE of 2 MTU + 5 bytes in three packets")
	}
}

func writeMiddleShort(t *T) {
	data := pattern(2*t.MTU, 4)
	first := t.Request(bth.RCWriteFirst, data[:t.MTU])
	first.RETH = bth.RETH{VA: t.VA, RKey: t.RKey, DMALength: uint32(len(data))}
	first.BTH.AckReq = false
	mid := t.Request(bth.RCWriteMiddle, data[t.MTU:2*t.MTU-1])
	ws := t.send(first, mid)
	if ws != nil {
		t.wantNAK(ws[1], mid.BTH.PSN, bth.NAKInvalidRequest, "a WRITE Middle of MTU-1 bytes")
	}
}

func middleWithoutFirst(t *T) {
	w := t.send(t.Request(bth.RCWriteMiddle, pattern(t.MTU, 5)))
	if w != nil {
		t.wantNAK(w[0], w[0].Pkt.BTH.PSN, bth.NAKInvalidRequest, "a WRITE Middle with no First")
	}
}

func readSegmented(t *T) {
	n := 2*t.MTU + 1
	r := t.send(t.read(0, n))
	if r == nil {
		return
	}
	psn := r[0].Pkt.BTH.PSN
	want := []struct {
		op   bth.Opcode
		n    int
		aeth bool
	}{{bth.RCReadResponseFirst, t.MTU, true}, {bth.RCReadResponseMiddle, t.MTU, false}, {bth.RCReadResponseLast, 1, true}}
	for i, w := range want {
		_, f := t.Until(t.Wait, func(f *Frame) bool { return !isRequest(f) })
		switch {
		case f == nil:
			t.Failf(r, "response %d of a READ of %d bytes did not come within %v", i+1, n, t.Wait)
			return
		case f.Pkt.BTH.Opcode != w.op || f.Pkt.BTH.PSN != psn.Add(i) || len(f.Pkt.Payload) != w.n:
			t.Failf([]*Frame{r[0], f}, "response %d is %s with %d bytes, want %s PSN %d with %d bytes", i+1, f, len(f.Pkt.Payload), w.op, psn.Add(i), w.n)
			return
		case w.aeth && !syn(f).IsACK():
			t.Failf([]*Frame{f}, "response %d carries %s", i+1, syn(f).KindName())
			return
		}
		t.Evidence(f)
	}
	r = t.send(t.read(0, 8))
	if r != nil {
		t.readResponse(r[0], psn.Add(3), 8, "the READ after it (three PSNs later)")
	}
}

func duplicateWriteNotReexecuted(t *T) {
	old, cur := pattern(16, 0x10), pattern(16, 0x20)
	w1 := t.send(t.Write(0, old))
	if w1 == nil {
		return
	}
	a := t.ackFor(w1[0].Pkt.BTH.PSN)
	if a != nil && (syn(a) == bth.NAKSyndrome(bth.NAKRemoteAccessError) || syn(a) == bth.NAKSyndrome(bth.NAKInvalidRequest)) {
		// ib_read_bw's QP may allow no RDMA WRITE (perftest's, on rxe).
		t.NotApplicable("the peer's QP or region takes no WRITE (%s), so what is written cannot be read back", a)
		return
	}
	if a == nil || !syn(a).IsACK() || a.Pkt.BTH.PSN != w1[0].Pkt.BTH.PSN {
		t.Failf([]*Frame{w1[0], a}, "the first WRITE was not ACKed")
		return
	}
	w2 := t.send(t.Write(0, cur))
	if w2 == nil || !t.wantACK(w2[0], w2[0].Pkt.BTH.PSN, "the second WRITE to the same bytes") {
		return
	}
	dup := t.send(clone(&w1[0].Pkt))
	if dup == nil || t.ackFor(w1[0].Pkt.BTH.PSN) == nil {
		t.Failf(dup, "the duplicate of the first WRITE was not acknowledged")
		return
	}
	r := t.send(t.read(0, 16))
	if r == nil {
		return
	}
	f := t.readResponse(r[0], r[0].Pkt.BTH.PSN, 16, "a READ of the bytes written")
	if f != nil && !bytes.Equal(f.Pkt.Payload, cur) {
		t.Failf([]*Frame{dup[0], f}, "the duplicate WRITE was executed again: the bytes are the first WRITE's")
	}
}

func duplicateSend(t *T) {
	ours, msg := t.peerMessage()
	if msg == nil {
		return
	}
	last := msg[len(msg)-1].Pkt.BTH.PSN
	t.send(t.Ack(last, 1))
	t.Collect(t.Quiet) // the peer's SEND completes
	dup := t.send(clone(&ours.Pkt))
	if dup == nil || !t.wantACK(dup[0], ours.Pkt.BTH.PSN, "the duplicate SEND") {
		return
	}
	// rc_pingpong answers every message it receives: a duplicate
	// delivered again draws a new SEND.
	for _, f := range t.Collect(t.Quiet) {
		if isRequest(f) && f.Pkt.BTH.PSN.After(last) {
			t.Failf([]*Frame{dup[0], f}, "the duplicate SEND was delivered again: rc_pingpong answered it with a new SEND")
			return
		}
	}
}

func zeroLengthNoRKey(read bool) func(t *T) {
	return func(t *T) {
		if !read {
			w := t.Request(bth.RCWriteOnly, nil)
			w.RETH = bth.RETH{}
			if f := t.send(w); f != nil {
				t.wantACK(f[0], w.BTH.PSN, "a zero-length WRITE with R_Key 0 and VA 0")
			}
			return
		}
		r := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadRequest, PSN: t.PSN, AckReq: true}}
		t.PSN = t.PSN.Next()
		if f := t.send(r); f != nil {
			t.readResponse(f[0], r.BTH.PSN, 0, "a zero-length READ with R_Key 0 and VA 0")
		}
	}
}

func readBounds(t *T) {
	r := t.read(1<<40, 64)
	f := t.send(r)
	if f == nil {
		return
	}
	_, a := t.Until(t.Wait, func(f *Frame) bool { return !isRequest(f) })
	switch {
	case a == nil:
		t.Failf(f, "no answer to a READ 1 TiB past the region within %v", t.Wait)
	case a.Pkt.BTH.Opcode != bth.RCAcknowledge:
		t.Failf([]*Frame{f[0], a}, "a READ 1 TiB past the region was answered %s with %d bytes", a, len(a.Pkt.Payload))
	case syn(a) != bth.NAKSyndrome(bth.NAKRemoteAccessError) || a.Pkt.BTH.PSN != r.BTH.PSN:
		t.Failf([]*Frame{f[0], a}, "got %s, want NAK_REMOTE_ACCESS for PSN %d", a, r.BTH.PSN)
	default:
		t.Evidence(f[0], a)
	}
}

func psnHalfWindows(t *T) {
	w := t.send(t.Write(0, pattern(8, 1)))
	if w == nil || !t.wantACK(w[0], w[0].Pkt.BTH.PSN, "a first WRITE") {
		return
	}
	latest, next := w[0].Pkt.BTH.PSN, t.PSN
	old := t.Write(0, pattern(8, 1))
	old.BTH.PSN = next.Add(-(1 << 22))
	d := t.send(old)
	if d == nil {
		return
	}
	a := t.ackFor(old.BTH.PSN)
	switch {
	case a == nil:
		t.Failf(d, "a request 2^22 PSNs behind got no answer within %v; it is a duplicate, to be ACKed", t.Wait)
		return
	case !syn(a).IsACK() || a.Pkt.BTH.PSN.Before(old.BTH.PSN) || a.Pkt.BTH.PSN.After(latest):
		t.Failf([]*Frame{d[0], a}, "a request 2^22 PSNs behind got %s; want an ACK with a PSN from %d to %d", a, old.BTH.PSN, latest)
		return
	}
	t.Evidence(d[0], a)
	far := t.Write(0, pattern(8, 2))
	far.BTH.PSN = next.Add(1<<23 - 1)
	t.PSN = next
	f := t.send(far)
	if f == nil || t.wantNAK(f[0], next, bth.NAKPSNSequenceError, "a request 2^23-1 PSNs ahead") == nil {
		return
	}
	w = t.send(t.Write(0, pattern(8, 3)))
	if w != nil {
		t.wantACK(w[0], next, "the request at the expected PSN")
	}
}

// permissionViolation sends an RDMA WRITE or READ to rc_pingpong's QP,
// which enables no remote access (rdma-core's rc_pingpong.c sets
// qp_access_flags 0 and registers its buffer LOCAL_WRITE only), so no
// R_Key can make it valid: a remote access error NAK, and then the QP is
// in the error state.
func permissionViolation(read bool) func(t *T) {
	return func(t *T) {
		var p *bth.Packet
		what := "an RDMA WRITE to a QP with no remote access"
		if read {
			p, what = t.read(0, 64), "an RDMA READ from a QP with no remote access"
		} else {
			p = t.Write(0, pattern(64, 3))
		}
		f := t.send(p)
		if f == nil {
			return
		}
		_, a := t.Until(t.Wait, func(f *Frame) bool { return !isRequest(f) })
		switch {
		case a == nil:
			t.Failf(f, "%s: no answer within %v", what, t.Wait)
			return
		case a.Pkt.BTH.Opcode != bth.RCAcknowledge:
			t.Failf([]*Frame{f[0], a}, "%s was answered %s with %d bytes", what, a, len(a.Pkt.Payload))
			return
		case syn(a) != bth.NAKSyndrome(bth.NAKRemoteAccessError) || a.Pkt.BTH.PSN != p.BTH.PSN:
			t.Failf([]*Frame{f[0], a}, "%s: got %s, want NAK_REMOTE_ACCESS for PSN %d", what, a, p.BTH.PSN)
			return
		}
		t.Evidence(f[0], a)
		// The QP is in the error state: a SEND at the next PSN gets no
		// answer (no ACK, no SEND back).
		s := t.send(t.Request(bth.RCSendOnly, pattern(16, 4)))
		if s == nil {
			return
		}
		for _, g := range t.Collect(t.Quiet) {
			if isAcknowledge(g) || isRequest(g) {
				t.Failf(append(s, g), "a SEND after the remote access error (the QP should be in the error state): the peer answered %s", g)
				return
			}
		}
	}
}
