package analyze

import (
	"fmt"
	"slices"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
)

// conn is one connection's state while the capture is read.
type conn struct {
	id    int
	key   reqKey
	epoch int

	reqQPN      uint32
	reqQPNKnown bool
	cmPSN       *bth.PSN // the starting PSN the CM gave this requester

	firstFrame, lastFrame int
	firstTime, lastTime   time.Time
	lastEventFrame        int // the last frame of this connection, before the current one
	lastEventTime         time.Time

	// Requests, in the requester's PSN space unwrapped to 64 bits.
	sent     bool
	firstU   int64
	high     int64   // highest PSN used (READ response PSNs included)
	highPSN  bth.PSN // high modulo 2^24
	packets  int
	bytes    uint64
	messages map[string]int
	nmsg     int
	inMsg    bth.Operation // the operation of a message begun and not ended
	// seqUnknown: PSNs are missing from the capture just before, so the
	// next packet's place in its message cannot be checked.
	seqUnknown bool
	mtu        int
	mtuFixed   bool

	resent       int
	resentBytes  uint64
	episodes     []Episode
	epNotListed  int
	ep           *Episode // the episode under way
	epNext       int64    // the PSN that continues it
	timeouts     int
	nak          *nakSeen // the last NAK or RNR NAK not yet answered by a resend
	naksPastRead int
	retrying     bool     // a NAK or implied NAK started a retry; no other starts one until progress
	impliedAt    *nakSeen // the last response that implied a NAK, not yet answered

	// Responses.
	respPackets int
	ackHigh     int64 // highest PSN acknowledged
	acks, naks  int
	rnrNaks     int
	rnr         []RNRWait
	reAcks      int
	dups        int
	implied     int
	readResent  int
	readBytes   uint64
	lastMSN     uint32
	haveMSN     bool
	msnPSN      int64     // the PSN of the response lastMSN came on
	reads       []readReq // outstanding READs and atomics, oldest first
	ackReqs     []ackReq  // AckReq PSNs waiting for a response, oldest first
	rtt         []float64
	rttKeepOdd  int // samples kept: every 2^rttKeepOdd-th once MaxSamples filled
	rttSeen     int
	maxSamples  int

	points     []Point
	maxPoints  int
	pointEvery int // first sends kept: one in pointEvery
	sends      int
	sendPoints int // PointSend points kept

	ce, ceResp int
	cnps       int
	cnpFrom    string
	lastCNP    time.Time
	cnpMin     time.Duration
	cnpUnder   int

	binWidth time.Duration
	bins     []uint64
	// binLo and binHi bound the offsets from firstTime of the last bin
	// added to, bins[binLast]: the next packet mostly falls in it too.
	binLo, binHi time.Duration
	binLast      int

	checks       []Check
	checkKinds   map[string]int
	noAckReq     int       // RC request packets sent in a row without AckReq
	noAckReqEnds int       // RC messages whose last packet had no AckReq
	unseen       []psnSpan // PSNs skipped by first transmissions: not in the capture yet
}

type nakSeen struct {
	frame int
	t     time.Time
	psn   int64 // where the requester is to resume
	rnr   bool
	code  uint8
	idx   int // RNR: index in rnr
}

type readReq struct {
	psn    int64
	length uint32
	got    uint32 // response payload seen
	atomic bool
	frame  int
	next   int64 // the next response PSN expected
}

// span returns the PSNs a READ or atomic uses: a READ one per path MTU of
// its length (of 256 bytes, the smallest, when the path MTU is not known:
// the most it may use); at least one.
func (c *conn) span(r *readReq) int64 {
	if r.atomic {
		return 1
	}
	mtu := int64(c.mtu)
	if mtu <= 0 {
		mtu = 256
	}
	return max(1, (int64(r.length)+mtu-1)/mtu)
}

type ackReq struct {
	psn int64
	t   time.Time
}

// unwrap places a 24-bit PSN in the connection's 64-bit PSN space, nearest
// to its highest PSN.
func (c *conn) unwrap(p bth.PSN) int64 { return c.high + int64(p.Diff(c.highPSN)) }

func (c *conn) outOfEpoch(p bth.PSN, gap int64) bool {
	u := c.unwrap(p)
	return u-c.high > gap || c.firstU-u > gap
}

func (c *conn) touch(frame int, t time.Time) {
	if c.firstFrame == 0 {
		c.firstFrame, c.firstTime = frame, t
		c.lastEventFrame, c.lastEventTime = frame, t
	} else {
		c.lastEventFrame, c.lastEventTime = c.lastFrame, c.lastTime
	}
	c.lastFrame, c.lastTime = frame, t
}

// point keeps a PSN-over-time point: first sends one in pointEvery (the
// kept ones thinned and pointEvery doubled when maxPoints are kept), the
// others (resends, NAKs) while fewer than maxPoints of them are kept.
func (c *conn) point(a *Analyzer, t time.Time, u int64, k PointKind) {
	if c.maxPoints <= 0 {
		return
	}
	if k == PointSend {
		c.sends++
		if c.pointEvery == 0 {
			c.pointEvery = 1
		}
		if c.sends%c.pointEvery != 0 {
			return
		}
		if c.sendPoints >= c.maxPoints {
			kept, i := c.points[:0], 0
			for _, p := range c.points {
				if p.Kind == PointSend {
					i++
					if i%2 == 0 {
						continue
					}
				}
				kept = append(kept, p)
			}
			c.points = kept
			c.sendPoints = (i + 1) / 2
			c.pointEvery *= 2
		}
	} else if len(c.points)-c.sendPoints >= c.maxPoints {
		return
	}
	if k == PointSend {
		c.sendPoints++
	}
	c.points = append(c.points, Point{Us: us(t.Sub(a.start)), PSN: u - c.firstU, Kind: k})
}

func (c *conn) check(a *Analyzer, frame int, severity, kind, msg string) {
	c.checkKinds[kind]++
	if len(c.checks) < a.cfg.MaxEvents {
		c.checks = append(c.checks, Check{Frame: frame, Severity: severity, Kind: kind, Message: msg})
	}
}

func (c *conn) setHigh(u int64) {
	c.highPSN = c.highPSN.Add(int(u - c.high))
	c.high = u
}

func (c *conn) addBin(a *Analyzer, t time.Time, n int) {
	d := t.Sub(c.firstTime)
	if d >= c.binLo && d < c.binHi {
		c.bins[c.binLast] += uint64(n)
		return
	}
	i := int(d / c.binWidth)
	if i < 0 {
		i = 0
	}
	for i >= a.cfg.MaxBins {
		// Widen the bins: merge neighbours.
		for j := 0; j < len(c.bins); j += 2 {
			v := c.bins[j]
			if j+1 < len(c.bins) {
				v += c.bins[j+1]
			}
			c.bins[j/2] = v
		}
		c.bins = c.bins[:(len(c.bins)+1)/2]
		c.binWidth *= 2
		i = int(t.Sub(c.firstTime) / c.binWidth)
	}
	for len(c.bins) <= i {
		c.bins = append(c.bins, 0)
	}
	c.bins[i] += uint64(n)
	c.binLast, c.binLo, c.binHi = i, time.Duration(i)*c.binWidth, time.Duration(i+1)*c.binWidth
	if d < 0 {
		c.binLo, c.binHi = 0, 0 // before the first frame (a capture out of order): not cached
	}
}

var posNames = [...]string{bth.PosNone: "REQUEST", bth.PosFirst: "FIRST", bth.PosMiddle: "MIDDLE", bth.PosLast: "LAST", bth.PosOnly: "ONLY"}

func msgKind(op bth.Operation) string {
	switch op {
	case bth.OpWrite:
		return "RDMA_WRITE"
	case bth.OpReadRequest:
		return "RDMA_READ"
	}
	return op.String()
}

func (c *conn) request(a *Analyzer, frame int, rec *pcap.Record) {
	p := &rec.Packet
	h := &p.BTH
	info := h.Opcode.Info()
	t := rec.Time
	c.touch(frame, t)
	c.packets++
	if rec.ECN == bth.CE {
		c.ce++
	}
	c.addBin(a, t, rec.PayloadLen)
	c.checkPacket(a, frame, rec, info)
	if c.key.tr == bth.TransportUD {
		if !c.sent {
			c.sent, c.firstU = true, int64(h.PSN)
			c.high, c.highPSN = int64(h.PSN), h.PSN
		} else if u := c.unwrap(h.PSN); u > c.high {
			c.setHigh(u)
		}
		c.newMessage(info)
		c.bytes += uint64(rec.PayloadLen)
		return
	}
	if !c.sent {
		c.sent = true
		c.high, c.highPSN = int64(h.PSN)-1, h.PSN.Add(-1)
		c.firstU = int64(h.PSN)
		if c.cmPSN != nil && *c.cmPSN != h.PSN {
			c.check(a, frame, "warning", "CM starting PSN", fmt.Sprintf("first PSN %d, the CM's starting PSN %d", h.PSN, *c.cmPSN))
		}
	}
	u := c.unwrap(h.PSN)
	if u > c.high {
		// After a READ whose PSNs are not known yet (no path MTU and no
		// responses seen), the next request may come up to its longest
		// span later.
		gapOK := false
		if n := len(c.reads); n > 0 && c.reads[n-1].psn == c.high && !c.reads[n-1].atomic {
			gapOK = u <= c.reads[n-1].psn+c.span(&c.reads[n-1])
		}
		if u > c.high+1 && !gapOK {
			c.check(a, frame, "warning", "PSN sequence",
				fmt.Sprintf("PSN %d after %d: %d PSNs not in the capture", h.PSN, c.highPSN, u-c.high-1))
			c.seqUnknown = true
			if len(c.unseen) < maxUnseen {
				c.unseen = append(c.unseen, psnSpan{c.high + 1, u - 1})
			}
		}
		c.flushEpisode(a)
		if c.impliedAt != nil {
			// The requester went back for an implied NAK, but the
			// responses it lacked came in before it resent anything (they
			// were on the wire behind the response that implied the NAK),
			// so it has gone on to new PSNs: that go-back resent nothing.
			c.supersede(a)
		}
		c.point(a, t, u, PointSend)
		c.checkOpcodeSequence(a, frame, info)
		if c.key.tr == bth.TransportRC {
			c.checkAckReq(a, frame, h.AckReq, info)
		}
		c.setHigh(u)
		c.bytes += uint64(rec.PayloadLen)
		c.newMessage(info)
		if info.Op == bth.OpReadRequest || info.Op == bth.OpCompareSwap || info.Op == bth.OpFetchAdd {
			r := readReq{psn: u, next: u, atomic: info.Op != bth.OpReadRequest, frame: frame}
			if !r.atomic {
				r.length = p.RETH.DMALength
				if c.mtu > 0 {
					c.setHigh(u + c.span(&r) - 1)
				}
			}
			c.reads = append(c.reads, r)
			if len(c.reads) > maxPending {
				c.reads = c.reads[1:]
			}
		}
		if h.AckReq && c.key.tr == bth.TransportRC {
			c.ackReqs = append(c.ackReqs, ackReq{u, t})
			if len(c.ackReqs) > maxPending {
				c.ackReqs = c.ackReqs[1:]
			}
		}
		return
	}
	// A PSN sent before.
	c.point(a, t, u, PointResend)
	unseen := c.takeUnseen(u)
	if unseen {
		// Its first transmission is not in the capture: a message that
		// ends here is seen for the first time.
		c.newMessage(info)
		c.bytes += uint64(rec.PayloadLen)
	}
	if c.key.tr != bth.TransportRC {
		if !unseen {
			c.dups++ // UC never resends: a duplicate on the path
		}
		return // or reordered on the path
	}
	c.resent++
	c.resentBytes += uint64(rec.PayloadLen)
	// Karn: no RTT sample for PSNs sent again.
	c.ackReqs = slices.DeleteFunc(c.ackReqs, func(r ackReq) bool { return r.psn >= u })
	if u <= c.ackHigh {
		c.dups++
	}
	// A new episode: resends begin, go back or jump again, or a NAK or an
	// implied NAK restarts them where they would have gone on anyway.
	if c.ep == nil || u != c.epNext || (c.nak != nil && c.nak.psn == u) || c.impliedAt != nil {
		e := Episode{FirstResendFrame: frame, FromPSN: uint32(h.PSN), ResendFrom: posNames[info.Pos]}
		if c.nak != nil && c.nak.psn != u {
			c.nak = nil // not what this resend answers
		}
		switch {
		case c.nak != nil && c.nak.rnr:
			e.Cause, e.StartFrame, e.DelayUs = "RNR_NAK", c.nak.frame, us(t.Sub(c.nak.t))
			w := &c.rnr[c.nak.idx]
			w.SeenUs, w.ResendSeen = e.DelayUs, true
		case c.nak != nil:
			e.Cause, e.StartFrame, e.DelayUs = "NAK", c.nak.frame, us(t.Sub(c.nak.t))
		case c.impliedAt != nil:
			e.Cause, e.StartFrame, e.DelayUs = "implied_NAK", c.impliedAt.frame, us(t.Sub(c.impliedAt.t))
		default:
			e.Cause, e.StartFrame, e.DelayUs = "timeout", c.lastEventFrame, us(t.Sub(c.lastEventTime))
			c.timeouts++
		}
		c.nak, c.impliedAt = nil, nil
		c.flushEpisode(a)
		c.ep = &e
	}
	// A resent packet goes on (or begins) the message it belongs to: the
	// opcode sequence of the next new PSN follows it.
	c.seqUnknown = false
	c.trackMessage(info)
	c.ep.PacketsResent++
	c.ep.BytesResent += uint64(rec.PayloadLen)
	c.epNext = u + 1
	if info.Op == bth.OpReadRequest {
		c.epNext = u + c.span(&readReq{length: p.RETH.DMALength})
	}
}

// flushEpisode files the episode under way.
func (c *conn) flushEpisode(a *Analyzer) {
	if c.ep == nil {
		return
	}
	if len(c.episodes) < a.cfg.MaxEvents {
		c.episodes = append(c.episodes, *c.ep)
	} else {
		c.epNotListed++
	}
	c.ep = nil
}

// maxUnseen bounds the PSN spans a connection remembers as missing from
// the capture (older gaps are not tracked past it).
const maxUnseen = 64

// psnSpan is a range of unwrapped PSNs, both ends included.
type psnSpan struct{ from, to int64 }

// takeUnseen reports whether u lies in a span of PSNs whose first
// transmission the capture lacks, and removes it from the span.
func (c *conn) takeUnseen(u int64) bool {
	for i := range c.unseen {
		g := &c.unseen[i]
		if u < g.from || u > g.to {
			continue
		}
		switch {
		case g.from == g.to:
			c.unseen = append(c.unseen[:i], c.unseen[i+1:]...)
		case u == g.from:
			g.from++
		case u == g.to:
			g.to--
		default:
			rest := psnSpan{u + 1, g.to}
			g.to = u - 1
			if len(c.unseen) < maxUnseen {
				c.unseen = append(c.unseen, rest)
			}
		}
		return true
	}
	return false
}

func (c *conn) newMessage(info *bth.OpInfo) {
	if info.Ends() || info.Op == bth.OpReadRequest || info.Op == bth.OpCompareSwap || info.Op == bth.OpFetchAdd {
		c.messages[msgKind(info.Op)]++
		c.nmsg++
	}
}

// checkOpcodeSequence checks that a new packet continues the message
// under way (IBTA 9.8.3): Middle and Last follow a First or Middle of the
// same operation; First and Only do not interrupt a message.
func (c *conn) checkOpcodeSequence(a *Analyzer, frame int, info *bth.OpInfo) {
	if c.seqUnknown {
		c.seqUnknown = false
		c.trackMessage(info)
		return
	}
	switch info.Pos {
	case bth.PosMiddle, bth.PosLast:
		if c.inMsg != info.Op {
			c.check(a, frame, "error", "opcode sequence", fmt.Sprintf("%s without a %s FIRST before it", info.Short, info.Op))
		}
	default:
		if c.inMsg != 0 {
			c.check(a, frame, "error", "opcode sequence", fmt.Sprintf("%s while a %s message is not finished", info.Short, c.inMsg))
		}
	}
	c.trackMessage(info)
}

// trackMessage notes whether a message is under way after a packet.
func (c *conn) trackMessage(info *bth.OpInfo) {
	switch info.Pos {
	case bth.PosFirst, bth.PosMiddle:
		c.inMsg = info.Op
	default:
		c.inMsg = 0
	}
}

// maxNoAckReq is the run of RC request packets without AckReq that the
// AckReq check reports: rxe's window of unacknowledged PSNs
// (RXE_MAX_UNACKED_PSNS, qp.MaxUnackedPSNs). A requester that fills its
// window without asking for an ACK waits for its ACK timer, since a
// responder need not acknowledge a request that does not ask.
const maxNoAckReq = 128

// checkAckReq checks a first transmission against the AckReq policy of
// rxe (rxe_req.c: AckReq on the last packet of every message, and after
// RXE_MAX_PKT_PER_ACK packets without one) and of the ConnectX and Huawei
// captures in the project's testdata, which set it on every message's
// last packet. IBTA 9.2 makes AckReq the requester's request for an
// acknowledgment; a responder may coalesce ACKs for requests without it.
func (c *conn) checkAckReq(a *Analyzer, frame int, ackReq bool, info *bth.OpInfo) {
	if ackReq {
		c.noAckReq = 0
		return
	}
	c.noAckReq++
	if info.Ends() || info.Pos == bth.PosNone { // READ requests and atomics are one packet
		// The first is listed; the rest are counted (ChecksByKind).
		c.noAckReqEnds++
		if c.noAckReqEnds == 1 {
			c.check(a, frame, "warning", "AckReq policy", fmt.Sprintf("%s ends a message without AckReq (rxe, ConnectX and Huawei NICs ask for an ACK at every message's end; later ones are counted, not listed)", info.Short))
		} else {
			c.checkKinds["AckReq policy"]++
		}
	}
	if c.noAckReq == maxNoAckReq {
		c.check(a, frame, "warning", "AckReq policy", fmt.Sprintf("%d request packets in a row without AckReq: a requester whose window is %d PSNs (rxe's) waits for its ACK timer", maxNoAckReq, maxNoAckReq))
	}
}

// checkPacket checks pad count and payload against the path MTU.
func (c *conn) checkPacket(a *Analyzer, frame int, rec *pcap.Record, info *bth.OpInfo) {
	h := &rec.Packet.BTH
	n := rec.PayloadLen
	if (n+int(h.PadCnt))%4 != 0 {
		c.check(a, frame, "error", "pad count", fmt.Sprintf("payload %d + pad %d is not a multiple of 4", n, h.PadCnt))
	}
	if h.PadCnt != 0 && (info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle) {
		c.check(a, frame, "warning", "pad count", fmt.Sprintf("pad %d on a %s packet (only the last packet of a message is padded)", h.PadCnt, posNames[info.Pos]))
	}
	if info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle {
		if !c.mtuFixed && n > c.mtu {
			c.mtu = n
		}
		if c.mtu > 0 && n != c.mtu {
			c.check(a, frame, "error", "path MTU", fmt.Sprintf("%s payload %d, not the path MTU %d", posNames[info.Pos], n, c.mtu))
		}
	} else if c.mtu > 0 && n > c.mtu {
		c.check(a, frame, "error", "path MTU", fmt.Sprintf("payload %d exceeds the path MTU %d", n, c.mtu))
	}
}

func (c *conn) response(a *Analyzer, frame int, rec *pcap.Record) {
	p := &rec.Packet
	h := &p.BTH
	info := h.Opcode.Info()
	t := rec.Time
	c.touch(frame, t)
	c.respPackets++
	if rec.ECN == bth.CE {
		c.ceResp++
	}
	u := c.unwrap(h.PSN)
	// MSNs grow with the PSNs they answer: a response to a later PSN than
	// any before (a resent response carries the MSN of its time) has an
	// MSN no lower than theirs.
	if info.Ext&bth.ExtAETH != 0 && u > c.msnPSN {
		if c.haveMSN && bth.PSN(p.AETH.MSN).Before(bth.PSN(c.lastMSN)) {
			c.check(a, frame, "warning", "MSN order", fmt.Sprintf("MSN %d after %d", p.AETH.MSN, c.lastMSN))
		}
		c.lastMSN, c.haveMSN, c.msnPSN = p.AETH.MSN, true, u
	}
	syn := p.AETH.Syndrome
	if back, ok := c.pastIncomplete(u, info); ok {
		// A response past a READ or atomic whose response (or part of it)
		// did not come shows it lost: an implied NAK (IBTA 9.7.5.1.2).
		// The requester drops the packet and goes back, unless a retry is
		// under way already (rxe's completer; qp's).
		if !c.retrying {
			c.implied++
			c.retrying = true
			c.supersede(a)
			c.impliedAt = &nakSeen{frame: frame, t: t, psn: back}
		}
		c.countAETH(info, syn)
		if info.Op == bth.OpAcknowledge && syn.Kind() == bth.KindNAK {
			c.naksPastRead++
		}
		return
	}
	switch info.Op {
	case bth.OpReadResponse:
		c.checkPacket(a, frame, rec, info)
		r := c.readAt(u)
		if r == nil || u < r.next {
			c.readResent++
			return
		}
		r.next = u + 1
		r.got += uint32(rec.PayloadLen)
		c.readBytes += uint64(rec.PayloadLen)
		if u > c.high {
			c.setHigh(u) // the PSNs a READ uses are the requester's
		}
		if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
			c.covered(u, t)
		}
		if info.Ends() {
			if r.got != r.length {
				c.check(a, frame, "error", "READ length",
					fmt.Sprintf("READ of frame %d asked %d bytes, its responses carried %d", r.frame, r.length, r.got))
			}
			c.completeReads(u)
			c.acked(u, t)
		} else {
			c.acked(u-1, t)
		}
		c.progress()
		return
	case bth.OpAtomicAcknowledge:
		c.acks++
		c.completeReads(u)
		c.acked(u, t)
		return
	}
	c.countAETH(info, syn)
	switch syn.Kind() {
	case bth.KindACK:
		if u <= c.ackHigh {
			c.reAcks++
		}
		c.acked(u, t)
	case bth.KindRNRNAK:
		c.acked(u-1, t)
		w := RNRWait{Frame: frame, TimerCode: syn.Value(), AskedUs: us(bth.RNRTimer(syn.Value())), SeenUs: -1}
		if len(c.rnr) < a.cfg.MaxEvents {
			c.rnr = append(c.rnr, w)
			c.supersede(a)
			c.nak = &nakSeen{frame: frame, t: t, psn: u, rnr: true, code: syn.Value(), idx: len(c.rnr) - 1}
		}
	case bth.KindNAK:
		c.point(a, t, u, PointNAK)
		c.acked(u-1, t)
		if syn.NAKCode() == bth.NAKPSNSequenceError && !c.retrying {
			c.retrying = true
			c.supersede(a)
			c.nak = &nakSeen{frame: frame, t: t, psn: u, code: uint8(syn.NAKCode())}
		}
	}
}

// supersede files the go-back-N that a NAK, RNR NAK or implied NAK still
// waiting for its resend started, when another comes first: the requester
// went back (and counts a retry) but resent nothing before going back
// again. It shows as an episode with no resend (FirstResendFrame 0).
func (c *conn) supersede(a *Analyzer) {
	var n *nakSeen
	cause := "NAK"
	switch {
	case c.nak != nil && c.nak.rnr:
		n, cause = c.nak, "RNR_NAK"
	case c.nak != nil:
		n = c.nak
	case c.impliedAt != nil:
		n, cause = c.impliedAt, "implied_NAK"
	default:
		return
	}
	c.flushEpisode(a)
	c.ep = &Episode{Cause: cause, StartFrame: n.frame, FromPSN: uint32(bth.PSN(0).Add(int(n.psn))), ResendFrom: "none"}
	if n.psn < 0 {
		c.ep.FromPSN = 0
	}
	c.flushEpisode(a)
	c.nak, c.impliedAt = nil, nil
}

// countAETH counts an ACK, NAK or RNR NAK as the wire shows it.
func (c *conn) countAETH(info *bth.OpInfo, syn bth.Syndrome) {
	if info.Op != bth.OpAcknowledge && info.Op != bth.OpAtomicAcknowledge {
		return
	}
	switch syn.Kind() {
	case bth.KindACK:
		c.acks++
	case bth.KindRNRNAK:
		c.rnrNaks++
	case bth.KindNAK:
		c.naks++
	}
}

// progress is new data acknowledged: a retry under way is over.
func (c *conn) progress() { c.retrying = false }

// acked moves the acknowledged PSN to u and takes RTT samples for the
// AckReq requests it covers.
func (c *conn) acked(u int64, t time.Time) {
	if u > c.ackHigh {
		c.ackHigh = u
		c.progress()
	}
	c.covered(u, t)
}

func (c *conn) covered(u int64, t time.Time) {
	i := 0
	for ; i < len(c.ackReqs) && c.ackReqs[i].psn <= u; i++ {
		c.sample(us(t.Sub(c.ackReqs[i].t)))
	}
	c.ackReqs = c.ackReqs[i:]
}

func (c *conn) sample(v float64) {
	c.rttSeen++
	if c.rttSeen&(1<<c.rttKeepOdd-1) != 0 {
		return
	}
	c.rtt = append(c.rtt, v)
	if len(c.rtt) >= c.maxSamples {
		// Full: keep every other sample from now on.
		j := 0
		for i := 0; i < len(c.rtt); i += 2 {
			c.rtt[j] = c.rtt[i]
			j++
		}
		c.rtt = c.rtt[:j]
		c.rttKeepOdd++
	}
}

// readAt returns the outstanding READ whose PSNs hold u.
func (c *conn) readAt(u int64) *readReq {
	for i := range c.reads {
		r := &c.reads[i]
		if !r.atomic && u >= r.psn && u < r.psn+c.span(r) {
			return r
		}
	}
	return nil
}

// pastIncomplete reports whether a response at u is past a READ or atomic
// whose response has not all come: past its last PSN, or a READ response
// past the next one it expects. back is where the requester goes back to:
// the next response PSN that READ or atomic expects.
func (c *conn) pastIncomplete(u int64, info *bth.OpInfo) (back int64, ok bool) {
	for i := range c.reads {
		r := &c.reads[i]
		if u < r.psn {
			return 0, false
		}
		last := r.psn + c.span(r) - 1
		if u > last {
			return r.next, true
		}
		// u is inside r.
		if info.Op == bth.OpReadResponse && !r.atomic {
			return r.next, u > r.next
		}
		return 0, false
	}
	return 0, false
}

// completeReads forgets the READs and atomics up to PSN u, answered.
func (c *conn) completeReads(u int64) {
	i := 0
	for ; i < len(c.reads) && c.reads[i].psn <= u; i++ {
	}
	c.reads = c.reads[i:]
}

func (c *conn) cnp(a *Analyzer, frame int, rec *pcap.Record) {
	t := rec.Time
	c.touch(frame, t)
	c.cnps++
	c.cnpFrom = rec.Src.String()
	if !c.lastCNP.IsZero() {
		d := t.Sub(c.lastCNP)
		if c.cnps == 2 || d < c.cnpMin {
			c.cnpMin = d
		}
		if a.cfg.MinCNPInterval > 0 && d < a.cfg.MinCNPInterval {
			c.cnpUnder++
		}
	}
	c.lastCNP = t
	h := &rec.Packet.BTH
	if !h.BECN || h.FECN {
		c.check(a, frame, "warning", "CNP fields", fmt.Sprintf("CNP with BECN=%t FECN=%t (a CNP sets BECN only)", h.BECN, h.FECN))
	}
	if r := rec.UDPPayload; len(r) >= bth.BTHLen+bth.CNPReservedLen {
		for _, b := range r[bth.BTHLen : bth.BTHLen+bth.CNPReservedLen] {
			if b != 0 {
				c.check(a, frame, "warning", "CNP fields", "CNP reserved bytes not zero")
				break
			}
		}
	}
}

func (c *conn) endpoint(ip string, qpn uint32, known bool) string {
	if !known {
		return ip + "/?"
	}
	return fmt.Sprintf("%s/%#06x", ip, qpn)
}

func (c *conn) report(a *Analyzer) *Connection {
	c.flushEpisode(a)
	r := &Connection{
		Transport:            c.key.tr.String(),
		Requester:            c.endpoint(c.key.req.String(), c.reqQPN, c.reqQPNKnown),
		Responder:            c.endpoint(c.key.resp.String(), c.key.respQPN, true),
		Epoch:                c.epoch,
		FirstFrame:           c.firstFrame,
		LastFrame:            c.lastFrame,
		StartUs:              us(c.firstTime.Sub(a.start)),
		DurationUs:           us(c.lastTime.Sub(c.firstTime)),
		Packets:              c.packets,
		ResponsePackets:      c.respPackets,
		Messages:             c.nmsg,
		MessagesByKind:       maps(c.messages),
		Bytes:                c.bytes,
		ReadBytes:            c.readBytes,
		PathMTU:              c.mtu,
		RetransmittedPackets: c.resent,
		RetransmittedBytes:   c.resentBytes,
		GBNEpisodes:          slices.Clone(c.episodes),
		EpisodesNotListed:    c.epNotListed,
		Timeouts:             c.timeouts,
		ACKs:                 c.acks,
		NAKs:                 c.naks,
		NAKsPastRead:         c.naksPastRead,
		RNRNAKs:              c.rnrNaks,
		RNRWaits:             slices.Clone(c.rnr),
		ImpliedNAKs:          c.implied,
		Duplicates:           c.dups,
		ReACKs:               c.reAcks,
		ReadResent:           c.readResent,
		RTT:                  rttOf(c.rtt, c.rttSeen),
		CEMarked:             c.ce,
		CEResponses:          c.ceResp,
		CNPs:                 c.cnps,
		CNPFrom:              c.cnpFrom,
		CNPIntervalMin:       us(c.cnpMin),
		CNPsUnderMin:         c.cnpUnder,
		BinUs:                us(c.binWidth),
		Checks:               slices.Clone(c.checks),
		ChecksByKind:         maps(c.checkKinds),
		CMStartingPSN:        (*uint32)(c.cmPSN),
		Points:               slices.Clone(c.points),
	}
	if r.GBNEpisodes == nil {
		r.GBNEpisodes = []Episode{}
	}
	if r.RNRWaits == nil {
		r.RNRWaits = []RNRWait{}
	}
	if r.Checks == nil {
		r.Checks = []Check{}
	}
	if c.sent {
		first := bth.PSN(uint32(c.firstU) & bth.PSNMask)
		if c.key.tr == bth.TransportUD {
			first = bth.PSN(c.firstU)
		}
		r.PSN = &PSNRange{First: uint32(first), Last: uint32(c.highPSN), Count: c.high - c.firstU + 1}
	}
	r.Throughput = make([]Bin, len(c.bins))
	for i, b := range c.bins {
		r.Throughput[i] = Bin{StartUs: us(c.firstTime.Sub(a.start) + time.Duration(i)*c.binWidth), Bytes: b,
			Gbps: float64(b) * 8 / float64(c.binWidth.Nanoseconds())}
	}
	return r
}

func rttOf(samples []float64, seen int) RTT {
	r := RTT{Samples: seen}
	if len(samples) == 0 {
		return r
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	q := func(f float64) *float64 {
		i := int(f*float64(len(s))+0.5) - 1
		v := s[min(max(i, 0), len(s)-1)]
		return &v
	}
	r.P50, r.P99 = q(0.5), q(0.99)
	r.Min, r.Max = &s[0], &s[len(s)-1]
	return r
}
