package qp

import (
	"encoding/binary"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// completer retires what the requester sent (IBTA 9.7.5.1-2 "requester
// behavior" for responses, rxe's rxe_comp.c): it takes ACKs, NAKs, READ
// responses and atomic ACKs, places READ and atomic results, writes send
// completions, runs the local ACK timer and the transport and RNR retry
// counters, and starts go-back-N through the requester. It exists for
// services with acknowledgements (RC).
type completer struct {
	q         *QP
	psn       bth.PSN // oldest PSN not yet acknowledged
	retryLeft uint8
	rnrLeft   uint8
	// respPos is the place (First/Middle/Last/Only) of the last READ
	// response packet accepted, to check their order; PosNone when none
	// is in progress.
	respPos      bth.Position
	retransmitAt time.Time
	// retrying is set when a NAK or a gap started go-back-N; until the
	// peer acknowledges something new, further NAKs and gaps (which the
	// retransmission itself provokes) do not start another (rxe's
	// comp.started_retry). A timeout always does.
	retrying bool
}

// armTimer starts the local ACK timer unless it runs (IBTA 9.7.6.1.3).
func (c *completer) armTimer(now time.Time) {
	if c.retransmitAt.IsZero() {
		if d := LocalAckTimeout(c.q.attr.Timeout); d > 0 {
			c.retransmitAt = now.Add(d)
		}
	}
}

// onTimeout runs the local ACK timer when it expired at or before now:
// one transport retry, then go-back-N from the oldest unacknowledged PSN.
func (c *completer) onTimeout(now time.Time) {
	r := &c.q.req
	if c.retransmitAt.IsZero() || now.Before(c.retransmitAt) {
		return
	}
	c.retransmitAt = time.Time{}
	if r.sendPSN == c.psn || len(r.sq) == 0 {
		return
	}
	c.q.Counters.LocalAckTimeoutErr++
	if !c.retryOrFail(IBV_WC_RETRY_EXC_ERR) {
		return
	}
	c.restart(c.psn)
}

// retryOrFail spends one transport retry. When none is left it fails the
// oldest send WQE with status and moves the QP to ERR, and returns false.
func (c *completer) retryOrFail(status WCStatus) bool {
	if c.retryLeft == 0 {
		c.q.Counters.RetryExceededErr++
		c.failHead(status)
		return false
	}
	if c.retryLeft != 7 || c.q.strict {
		c.retryLeft--
	}
	return true
}

// failHead completes the oldest send WQE with an error status and moves
// the QP to ERR, flushing the rest.
func (c *completer) failHead(status WCStatus) {
	q := c.q
	if len(q.req.sq) > 0 {
		w := q.req.pop()
		q.scq.push(WC{WRID: w.wr.WRID, Status: status, Opcode: w.wcOpcode(), QPNum: q.QPN})
	}
	q.toError(&QPError{Status: status})
}

// nakRetry starts go-back-N from psn after a NAK, unless one such retry
// is already under way (see completer.retrying). It reports whether it
// started one.
func (c *completer) nakRetry(psn bth.PSN) bool {
	if c.retrying {
		return false
	}
	if c.retryOrFail(IBV_WC_RETRY_EXC_ERR) {
		c.retrying = true
		c.restart(psn)
		return true
	}
	return false
}

// impliedNak acts on a response that shows an earlier one was lost (a
// response past a READ or atomic without its response, or a READ response
// past a missing one; IBTA 9.7.5.1.x, mlx5's implied_nak_seq_err): the
// packet is dropped and go-back-N starts from the oldest unacknowledged
// PSN, unless a retry is already under way.
func (c *completer) impliedNak() {
	if c.retrying {
		c.q.Counters.ImpliedNakDuringRetry++
		return
	}
	if c.nakRetry(c.psn) {
		c.q.Counters.ImpliedNakSeqErr++
	}
}

// restart rewinds the requester to psn (go-back-N).
func (c *completer) restart(psn bth.PSN) {
	c.q.Counters.CompleterRetry++
	c.respPos = bth.PosNone
	c.q.req.rewind(psn)
}

// complete finishes the oldest send WQE successfully.
func (c *completer) complete(w *sendWQE) {
	q := c.q
	r := &q.req
	r.pop()
	if w.readOrAtomic() {
		r.rdAtomic--
	}
	c.psn = w.lastPSN().Next()
	r.skipAcked(c.psn)
	if q.sigAll || w.wr.Flags&IBV_SEND_SIGNALED != 0 {
		q.scq.push(WC{WRID: w.wr.WRID, Status: IBV_WC_SUCCESS, Opcode: w.wcOpcode(), ByteLen: uint32(w.length), QPNum: q.QPN})
	}
}

// ackTo acknowledges every PSN before psn inside the head WQE.
func (c *completer) ackTo(psn bth.PSN) {
	c.psn = psn
	c.q.req.skipAcked(psn)
}

// progress records that the remote side acknowledged something new: the
// retry counters reset and the ACK timer restarts (rxe reset_retry_counters).
func (c *completer) progress(now time.Time) {
	q := c.q
	c.retryLeft = q.attr.RetryCnt
	c.rnrLeft = q.attr.RNRRetry
	c.retrying = false
	c.retransmitAt = time.Time{}
	if q.req.sendPSN != c.psn && len(q.req.sq) > 0 {
		c.armTimer(now)
	}
}

// handle takes one response for this QP's requests (IBTA 9.7.5.1,
// rxe_comp.c). A response it cannot use is dropped and counted.
func (c *completer) handle(now time.Time, p *bth.Packet, info *bth.OpInfo) {
	q := c.q
	r := &q.req
	psn := p.BTH.PSN
	// Nothing outstanding, or a PSN never sent: stale or bogus.
	if len(r.sq) == 0 || !r.sq[0].started || !r.sentAny || !psn.Before(r.sentHigh) {
		q.Counters.UnexpectedResponse++
		return
	}
	if psn.Before(c.psn) {
		q.Counters.DuplicateResponse++
		return
	}
	progressed := false
	// A response past a SEND/WRITE acknowledges it; past a READ or atomic
	// whose response did not come, it means the response was lost.
	for len(r.sq) > 0 && r.sq[0].started && psn.After(r.sq[0].lastPSN()) {
		w := r.sq[0]
		if w.readOrAtomic() {
			c.impliedNak()
			return
		}
		c.complete(w)
		progressed = true
	}
	if len(r.sq) == 0 || !r.sq[0].started {
		if progressed {
			c.progress(now)
		}
		return
	}
	w := r.sq[0]
	if info.Ext&bth.ExtAETH != 0 && p.AETH.Syndrome.Kind() != bth.KindACK {
		c.handleNAK(now, p, progressed)
		return
	}
	switch info.Op {
	case bth.OpAcknowledge:
		if w.readOrAtomic() {
			// An ACK does not answer a READ or atomic; wait for its
			// response.
			if !progressed {
				q.Counters.ResponseMismatch++
			}
			break
		}
		if psn == w.lastPSN() {
			c.complete(w)
		} else {
			c.ackTo(psn.Next())
		}
		progressed = true
	case bth.OpAtomicAcknowledge:
		if psn != w.firstPSN || (w.wr.Opcode != IBV_WR_ATOMIC_CMP_AND_SWP && w.wr.Opcode != IBV_WR_ATOMIC_FETCH_AND_ADD) {
			q.Counters.ResponseMismatch++
			break
		}
		var v [8]byte
		binary.LittleEndian.PutUint64(v[:], uint64(p.AtomicAckETH))
		if !w.sgl.copyIn(v[:], 0) {
			c.failHead(IBV_WC_LOC_PROT_ERR)
			return
		}
		c.complete(w)
		progressed = true
	case bth.OpReadResponse:
		if w.wr.Opcode != IBV_WR_RDMA_READ {
			q.Counters.ResponseMismatch++
			break
		}
		if psn != c.psn {
			// A response packet is missing: ask again for the rest.
			c.impliedNak()
			break
		}
		if !c.acceptReadResponse(p, info, w) {
			break
		}
		progressed = true
	}
	if progressed {
		c.progress(now)
	}
}

// acceptReadResponse places one in-sequence READ response packet into the
// WQE's local memory. It checks the packet's place in the response
// (First/Middle/Last or Only) and its length against the MTU and the
// request; a packet that fails is dropped and the read is retried.
func (c *completer) acceptReadResponse(p *bth.Packet, info *bth.OpInfo, w *sendWQE) bool {
	q := c.q
	mtu := q.attr.PathMTU.Bytes()
	k := int(p.BTH.PSN.Diff(w.firstPSN))
	off := k * mtu
	want := min(mtu, w.length-off)
	pos := info.Pos
	okPos := false
	switch c.respPos {
	case bth.PosNone, bth.PosLast, bth.PosOnly:
		// A new response starts with First/Only, or, after a restart in
		// the middle, with Middle/Last (rxe replays that way).
		okPos = pos == bth.PosFirst || pos == bth.PosOnly || k > 0
	default:
		okPos = pos == bth.PosMiddle || pos == bth.PosLast
	}
	lastPkt := k == w.npkts-1
	if !okPos || len(p.Payload) != want || (pos == bth.PosLast || pos == bth.PosOnly) != lastPkt {
		q.Counters.ReadResponseMalformed++
		return false
	}
	if !w.sgl.copyIn(p.Payload, off) {
		c.failHead(IBV_WC_LOC_PROT_ERR) // the destination was deregistered
		return false
	}
	c.respPos = pos
	c.ackTo(p.BTH.PSN.Next())
	if lastPkt {
		c.respPos = bth.PosNone
		c.complete(w)
	}
	return true
}

// handleNAK acts on a NAK or RNR NAK for PSN psn (IBTA 9.7.5.2.x): a NAK
// implicitly acknowledges every PSN before it.
func (c *completer) handleNAK(now time.Time, p *bth.Packet, progressed bool) {
	q := c.q
	r := &q.req
	psn := p.BTH.PSN
	syn := p.AETH.Syndrome
	// Everything before psn is acknowledged; whole SEND/WRITE WQEs before
	// it complete.
	for len(r.sq) > 0 && r.sq[0].started && !r.sq[0].readOrAtomic() && r.sq[0].lastPSN().Before(psn) {
		c.complete(r.sq[0])
		progressed = true
	}
	if len(r.sq) > 0 && r.sq[0].started && psn.After(c.psn) && !r.sq[0].readOrAtomic() {
		c.ackTo(psn)
		progressed = true
	}
	if progressed {
		c.progress(now)
	}
	switch syn.Kind() {
	case bth.KindRNRNAK:
		q.Counters.RNRNakRetryErr++
		if c.rnrLeft == 0 {
			q.Counters.RetryRNRExceeded++
			c.failHead(IBV_WC_RNR_RETRY_EXC_ERR)
			return
		}
		if c.rnrLeft != 7 {
			c.rnrLeft--
		}
		r.rnrPSN = psn
		r.rnrUntil = now.Add(bth.RNRTimer(syn.Value()))
		c.retransmitAt = time.Time{}
	case bth.KindNAK:
		switch syn.NAKCode() {
		case bth.NAKPSNSequenceError:
			q.Counters.PacketSeqErr++
			c.nakRetry(psn)
		case bth.NAKInvalidRequest:
			q.Counters.ReqRemoteInvalidReq++
			c.failHead(IBV_WC_REM_INV_REQ_ERR)
		case bth.NAKRemoteAccessError:
			q.Counters.ReqRemoteAccessErr++
			c.failHead(IBV_WC_REM_ACCESS_ERR)
		case bth.NAKRemoteOperationalErr:
			q.Counters.ReqRemoteOpErr++
			c.failHead(IBV_WC_REM_OP_ERR)
		default:
			q.Counters.ReqRemoteInvalidReq++
			c.failHead(IBV_WC_REM_INV_RD_REQ_ERR)
		}
	default:
		q.Counters.ReservedSyndrome++
	}
}
