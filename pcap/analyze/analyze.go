// Package analyze rebuilds the RoCEv2 connections of a capture and tells
// what happened on each: messages (resends not counted twice), bytes, PSN
// ranges across the 2^24 wrap, go-back-N episodes (cause, first resend,
// delay, what was resent), ACK timeouts, RNR NAKs with the wait asked and
// the wait seen, implied NAKs, duplicates and re-ACKs, CE marks and CNPs,
// RTT from an AckReq request to the response that covers it, throughput over
// time, and checks of the kind Wireshark's expert info gives, with frame
// numbers. It is what `roce-emu analyze` prints.
//
// Connections. An RC or UC requester's packets are keyed by (requester IP,
// responder IP, responder QPN); the responses come back to the requester's
// QPN, which the requests do not carry: a response flow (responder IP,
// requester IP, QPN) is bound to the connection between those addresses
// whose PSNs it answers (the one connection between them, or the one whose
// PSN range holds the response's PSN), and so are CNPs. UD is keyed by
// (source IP, DETH source QPN, destination IP, destination QPN) and never
// resends. A PSN more than Config.EpochGap from a connection's PSNs starts
// a new epoch: the QPN was reused by another run. PSN arithmetic is modulo
// 2^24 (bth.PSN), unwrapped per connection to 64 bits.
//
// Behaviour follows IBTA Vol. 1 chapter 9 (9.7.5 ACK/NAK, 9.7.5.1.2
// implied NAKs, Table 45 RNR timer) and what rxe and ConnectX put on the
// wire. Memory is bounded by Config, never by the capture: at most
// MaxConnections connections (the least recently active are evicted, a
// sixteenth of MaxConnections at a time, and counted), and per connection at most MaxEvents episodes, RNR waits and
// checks, MaxSamples RTT samples (every other one dropped when full),
// MaxBins throughput bins (neighbours merged when full), and 64 pending
// AckReq PSNs and READs.
package analyze

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
)

// Config bounds and tunes an Analyzer. Zero values take the defaults.
type Config struct {
	MaxConnections int           // connections tracked at once; 4096 (beyond, the least recently active sixteenth is evicted)
	EpochGap       int           // PSNs away from a connection's that start a new epoch; pcap.EpochGap
	PathMTU        int           // the path MTU, when known; 0: inferred per connection
	MinCNPInterval time.Duration // CNPs closer than this to the previous one are counted; 0: not checked
	Bin            time.Duration // throughput bin; 1 ms
	MaxBins        int           // throughput bins per connection; 1000 (bins widen beyond)
	MaxSamples     int           // RTT samples per connection; 65536
	MaxEvents      int           // episodes, RNR waits and checks listed per connection; 1000
	// Points is how many PSN-over-time points (Connection.Points, for
	// pictures) a connection keeps: first sends thinned to fit, resends
	// and NAKs kept up to as many again; 0: none.
	Points int
}

func (c *Config) defaults() {
	if c.MaxConnections <= 0 {
		c.MaxConnections = 4096
	}
	if c.EpochGap <= 0 {
		c.EpochGap = pcap.EpochGap
	}
	if c.Bin <= 0 {
		c.Bin = time.Millisecond
	}
	if c.MaxBins <= 0 {
		c.MaxBins = 1000
	}
	if c.MaxSamples <= 0 {
		c.MaxSamples = 1 << 16
	}
	if c.MaxEvents <= 0 {
		c.MaxEvents = 1000
	}
}

const maxPending = 64 // AckReq PSNs and READs remembered per connection

type reqKey struct {
	req, resp netip.Addr
	respQPN   uint32
	srcQP     uint32 // UD
	tr        bth.Transport
}

type respKey struct {
	resp, req netip.Addr
	reqQPN    uint32
}

// Analyzer takes the frames of one capture in order. It is not safe for
// concurrent use.
type Analyzer struct {
	cfg      Config
	sum      Summary
	conns    map[reqKey]*conn
	bound    map[respKey]*conn
	done     []*conn // connections whose epoch ended
	seq      int
	start    time.Time
	last     time.Time
	started  bool
	doneKept int
	cmReqs   map[cmREQ]cmREQInfo // CM REQs waiting for their REP
	cm       map[cmKey]cmSide    // what the CM told about each direction
	cmX      map[cmXKey]*CMExchange
	cmOrder  []*CMExchange // in the order of their first REQ
	scratch  []*conn       // for evict
	// The last request and response lookups, tried before the maps: a
	// capture's packets come in runs of one connection. Cleared when a
	// connection or binding goes.
	lastReqKey  reqKey
	lastReq     *conn
	lastRespKey respKey
	lastResp    *conn
}

// New returns an Analyzer.
func New(cfg Config) *Analyzer {
	cfg.defaults()
	return &Analyzer{cfg: cfg, conns: map[reqKey]*conn{}, bound: map[respKey]*conn{},
		sum:    Summary{OtherLinkTypes: map[string]int{}, UnmatchedCNPsTo: map[string]int{}, CNPPorts: map[string]*CNPPort{}},
		cmReqs: map[cmREQ]cmREQInfo{}, cm: map[cmKey]cmSide{}, cmX: map[cmXKey]*CMExchange{}}
}

// AddOtherLinkType counts frame, skipped because its link type is not one
// pcap.Decoder handles.
func (a *Analyzer) AddOtherLinkType(lt pcap.LinkType) {
	a.sum.Frames++
	a.sum.OtherLinkTypes[lt.String()]++
}

// Add takes frame number frame (from 1, as tshark numbers them), decoded
// as k into rec.
func (a *Analyzer) Add(frame int, k pcap.Kind, rec *pcap.Record) {
	a.sum.Frames++
	if !a.started {
		a.start, a.started = rec.Time, true
	}
	if rec.Time.After(a.last) {
		a.last = rec.Time
	}
	switch k {
	case pcap.KindOther:
		a.sum.NonRoCE++
		return
	case pcap.KindMalformed:
		a.sum.Malformed++
		return
	case pcap.KindFragment:
		a.sum.IPFragments++
		return
	}
	if rec.Fragments > 0 {
		a.sum.Reassembled++
	}
	a.sum.RoCE++
	badICRC := rec.ICRCChecked && !rec.ICRCOK
	if badICRC {
		a.sum.BadICRC++
	}
	p := &rec.Packet
	info := p.BTH.Opcode.Info()
	var c *conn
	switch info.Op {
	case bth.OpCNP:
		a.cnpPort(rec)
		c = a.cnpConn(rec)
		if c == nil {
			a.sum.UnmatchedCNPs++
			to := fmt.Sprintf("%s/%#06x", rec.Dst, p.BTH.DestQP)
			if _, ok := a.sum.UnmatchedCNPsTo[to]; ok || len(a.sum.UnmatchedCNPsTo) < a.cfg.MaxConnections {
				a.sum.UnmatchedCNPsTo[to]++
			}
			return
		}
		c.cnp(a, frame, rec)
	case bth.OpAcknowledge, bth.OpAtomicAcknowledge, bth.OpReadResponse:
		c = a.respConn(rec)
		if c == nil {
			a.sum.UnmatchedResponses++
			return
		}
		c.response(a, frame, rec)
	default:
		if info.Ext&bth.ExtDETH != 0 {
			a.cmMAD(frame, rec.Time, rec.Src, rec.Dst, p)
		}
		c = a.reqConn(frame, rec)
		c.request(a, frame, rec)
	}
	if badICRC {
		c.check(a, frame, "error", "ICRC", fmt.Sprintf("ICRC %#08x, the packet gives %#08x", p.ICRC, rec.ICRCComputed))
	}
}

// cnpPort counts a CNP in the stream of the address that sent it.
func (a *Analyzer) cnpPort(rec *pcap.Record) {
	k := rec.Src.String()
	p := a.sum.CNPPorts[k]
	if p == nil {
		if len(a.sum.CNPPorts) >= a.cfg.MaxConnections {
			return
		}
		p = &CNPPort{}
		a.sum.CNPPorts[k] = p
	}
	p.CNPs++
	if p.CNPs > 1 {
		d := us(rec.Time.Sub(p.last))
		if p.CNPs == 2 || d < p.IntervalMinUs {
			p.IntervalMinUs = d
		}
		if a.cfg.MinCNPInterval > 0 && rec.Time.Sub(p.last) < a.cfg.MinCNPInterval {
			p.UnderMin++
		}
	}
	p.last = rec.Time
}

func (a *Analyzer) reqConn(frame int, rec *pcap.Record) *conn {
	p := &rec.Packet
	tr := p.BTH.Opcode.Transport()
	k := reqKey{req: rec.Src, resp: rec.Dst, respQPN: p.BTH.DestQP, tr: tr}
	if tr == bth.TransportUD {
		k.srcQP = p.DETH.SrcQP
	}
	c := a.lastReq
	if c == nil || k != a.lastReqKey {
		c = a.conns[k]
	}
	if c != nil && tr != bth.TransportUD && c.sent && c.outOfEpoch(p.BTH.PSN, int64(a.cfg.EpochGap)) {
		a.finish(c)
		c = a.newConn(k, rec, c.epoch+1)
	}
	if c == nil {
		c = a.newConn(k, rec, 0)
	}
	a.lastReqKey, a.lastReq = k, c
	return c
}

func (a *Analyzer) newConn(k reqKey, rec *pcap.Record, epoch int) *conn {
	if len(a.conns) >= a.cfg.MaxConnections {
		a.evict(max(1, a.cfg.MaxConnections/16))
	}
	a.seq++
	c := &conn{id: a.seq, key: k, epoch: epoch, mtu: a.cfg.PathMTU, mtuFixed: a.cfg.PathMTU > 0,
		messages: map[string]int{}, checkKinds: map[string]int{}, binWidth: a.cfg.Bin, maxSamples: a.cfg.MaxSamples, maxPoints: a.cfg.Points,
		ackHigh: -1 << 62, msnPSN: -1 << 62}
	if k.tr == bth.TransportUD {
		c.reqQPN, c.reqQPNKnown = k.srcQP, true
	}
	if cm, ok := a.cm[cmKey{k.req, k.resp, k.respQPN}]; ok && k.tr == bth.TransportRC {
		// The CM named the requester's QPN: its responses are bound now.
		c.reqQPN, c.reqQPNKnown = cm.reqQPN, true
		c.cmPSN = &cm.firstPSN
		a.bind(respKey{resp: k.resp, req: k.req, reqQPN: cm.reqQPN}, c)
		delete(a.cm, cmKey{k.req, k.resp, k.respQPN})
	}
	a.conns[k] = c
	return c
}

// evict forgets the n least recently active live connections (by the
// time of their last frame, then the oldest first), counted: a sixteenth
// of the table at a time, so that a capture of new connections costs a
// sort per n of them, not a scan of the table per connection.
func (a *Analyzer) evict(n int) {
	old := a.scratch[:0]
	for _, c := range a.conns {
		old = append(old, c)
	}
	slices.SortFunc(old, func(x, y *conn) int {
		if c := x.lastTime.Compare(y.lastTime); c != 0 {
			return c
		}
		return cmp.Compare(x.id, y.id)
	})
	n = min(n, len(old))
	gone := make(map[*conn]bool, n)
	for _, c := range old[:n] {
		delete(a.conns, c.key)
		gone[c] = true
	}
	for rk, b := range a.bound {
		if gone[b] {
			delete(a.bound, rk)
		}
	}
	a.sum.EvictedConnections += n
	a.forget()
	clear(old)
	a.scratch = old[:0]
}

// bind binds responses of rk to c.
func (a *Analyzer) bind(rk respKey, c *conn) {
	a.bound[rk] = c
	a.lastRespKey, a.lastResp = rk, c
}

// forget clears the lookups cached in lastReq and lastResp.
func (a *Analyzer) forget() { a.lastReq, a.lastResp = nil, nil }

// drop forgets a live connection and its bindings.
func (a *Analyzer) drop(c *conn) {
	a.forget()
	delete(a.conns, c.key)
	for rk, b := range a.bound {
		if b == c {
			delete(a.bound, rk)
		}
	}
}

// finish ends a connection's epoch: it is reported as it stands.
func (a *Analyzer) finish(c *conn) {
	a.drop(c)
	if a.doneKept >= a.cfg.MaxConnections {
		a.sum.EvictedConnections++
		return
	}
	a.doneKept++
	a.done = append(a.done, c)
}

// respConn finds the connection a response belongs to: the one its
// (responder, requester, QPN) is bound to, or binds one.
func (a *Analyzer) respConn(rec *pcap.Record) *conn {
	rk := respKey{resp: rec.Src, req: rec.Dst, reqQPN: rec.Packet.BTH.DestQP}
	if a.lastResp != nil && rk == a.lastRespKey {
		return a.lastResp
	}
	if c := a.bound[rk]; c != nil {
		a.lastRespKey, a.lastResp = rk, c
		return c
	}
	psn := rec.Packet.BTH.PSN
	var only, holds *conn
	n, nh := 0, 0
	for k, c := range a.conns {
		if k.tr != bth.TransportRC || k.req != rk.req || k.resp != rk.resp || (c.reqQPNKnown && c.reqQPN != rk.reqQPN) {
			continue
		}
		n++
		only = c
		if c.sent {
			u := c.unwrap(psn)
			if u >= c.firstU && u <= c.high+1 {
				nh++
				if holds == nil || c.id < holds.id {
					holds = c
				}
			}
		}
	}
	var c *conn
	switch {
	case nh >= 1:
		c = holds
	case n == 1:
		c = only
	default:
		return nil
	}
	c.reqQPN, c.reqQPNKnown = rk.reqQPN, true
	a.bind(rk, c)
	return c
}

// cnpConn finds the connection whose requester a CNP is sent to: bound by
// its responses, or the one RC/UC connection from the CNP's destination to
// its source.
func (a *Analyzer) cnpConn(rec *pcap.Record) *conn {
	rk := respKey{resp: rec.Src, req: rec.Dst, reqQPN: rec.Packet.BTH.DestQP}
	if c := a.bound[rk]; c != nil {
		return c
	}
	var only *conn
	n := 0
	for k, c := range a.conns {
		if k.req != rk.req || k.resp != rk.resp {
			continue
		}
		if c.reqQPNKnown && c.reqQPN == rk.reqQPN {
			return c
		}
		if !c.reqQPNKnown {
			n++
			only = c
		}
	}
	if n != 1 {
		return nil
	}
	if only.key.tr == bth.TransportRC {
		only.reqQPN, only.reqQPNKnown = rk.reqQPN, true
		a.bind(rk, only)
	}
	return only
}

// Report returns what the capture showed. The Analyzer may take more
// frames after it.
func (a *Analyzer) Report() *Report {
	all := slices.Clone(a.done)
	for _, c := range a.conns {
		all = append(all, c)
	}
	slices.SortFunc(all, func(x, y *conn) int {
		if x.firstFrame != y.firstFrame {
			return x.firstFrame - y.firstFrame
		}
		return x.id - y.id
	})
	r := &Report{Connections: make([]*Connection, 0, len(all)), Summary: a.sum}
	r.Summary.OtherLinkTypes = maps(a.sum.OtherLinkTypes)
	r.Summary.UnmatchedCNPsTo = maps(a.sum.UnmatchedCNPsTo)
	r.Summary.CNPPorts = make(map[string]*CNPPort, len(a.sum.CNPPorts))
	for k, p := range a.sum.CNPPorts {
		q := *p
		r.Summary.CNPPorts[k] = &q
	}
	if a.started {
		r.Summary.DurationUs = us(a.last.Sub(a.start))
	}
	r.Summary.CM = make([]CMExchange, 0, len(a.cmOrder))
	for _, x := range a.cmOrder {
		e := *x
		e.State, e.reqTime = x.state(), time.Time{}
		r.Summary.CM = append(r.Summary.CM, e)
	}
	for _, c := range all {
		cr := c.report(a)
		r.Connections = append(r.Connections, cr)
		s := &r.Summary
		s.Messages += cr.Messages
		s.Bytes += cr.Bytes
		s.RetransmittedPackets += cr.RetransmittedPackets
		s.GBNEpisodes += len(cr.GBNEpisodes) + cr.EpisodesNotListed
		s.Timeouts += cr.Timeouts
		s.NAKs += cr.NAKs
		s.RNRNAKs += cr.RNRNAKs
		s.CEMarked += cr.CEMarked + cr.CEResponses
		s.CNPs += cr.CNPs
		for _, n := range cr.ChecksByKind {
			s.Checks += n
		}
	}
	r.Summary.Connections = len(r.Connections)
	return r
}

func maps(m map[string]int) map[string]int {
	o := make(map[string]int, len(m))
	for k, v := range m {
		o[k] = v
	}
	return o
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
