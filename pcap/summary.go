package pcap

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/roce-emu/roce-emu/bth"
)

// Summary counts what a capture holds. Maps are keyed by names so that the
// JSON form reads without a table: opcodes by ib_pack.h name
// ("RC_SEND_ONLY"), AETH kinds by bth.Syndrome.KindName ("ACK",
// "NAK_PSN_SEQ"), ECN codepoints by bth.ECN.String ("CE").
type Summary struct {
	Frames        int `json:"frames"`         // frames read
	RoCE          int `json:"roce"`           // RoCEv2 packets whose headers decoded
	Malformed     int `json:"malformed"`      // UDP to 4791 that did not decode
	NonRoCE       int `json:"non_roce"`       // frames skipped: not UDP to 4791
	BadICRC       int `json:"bad_icrc"`       // RoCE packets whose ICRC did not verify
	ICRCUnchecked int `json:"icrc_unchecked"` // RoCE packets cut short by the snapshot length, or IPv6 with extension headers
	// OtherLinkTypes counts frames skipped because their pcapng interface
	// has a link type Decoder does not handle (802.11, USB, ...), by
	// LinkType.String; they are in Frames.
	OtherLinkTypes map[string]int `json:"other_link_types"`
	// IPFragments counts frames that held an IPv4 fragment of a UDP
	// datagram and did not complete one; Reassembled counts datagrams
	// reassembled from fragments (each in the frame that completed it,
	// counted as what the datagram was), and Unreassembled those whose
	// fragments never all came (see SetUnreassembled).
	IPFragments   int            `json:"ip_fragments"`
	Reassembled   int            `json:"reassembled"`
	Unreassembled int            `json:"unreassembled"`
	Opcodes       map[string]int `json:"opcodes"`
	AETH          map[string]int `json:"aeth_kinds"`
	ECN           map[string]int `json:"ecn"`
	Flows         []*Flow        `json:"flows"` // in order of first appearance
	// FlowsNotTracked counts packets that would have started a flow
	// beyond MaxFlows: they are in the totals above, in no flow.
	FlowsNotTracked int `json:"flows_not_tracked"`
	// FlowsEvicted counts the flows EvictFlows took out of Flows, and
	// EvictedPackets the packets they held (in the totals above).
	FlowsEvicted   int `json:"flows_evicted"`
	EvictedPackets int `json:"evicted_packets"`
	// MaxFlows bounds Flows (0: DefaultMaxFlows), so that memory stays
	// bounded whatever the capture.
	MaxFlows int `json:"-"`
	// EvictFlows: a packet that starts a flow beyond MaxFlows evicts the
	// least recently seen flows (a sixteenth of MaxFlows, at least one, at
	// a time), each handed to OnEvict and counted in FlowsEvicted, and
	// starts its own; off, it is counted in FlowsNotTracked and in no
	// flow. A flow that comes back after its eviction starts again, from
	// epoch 0.
	EvictFlows bool `json:"-"`
	// OnEvict, when set, receives each evicted flow, final.
	OnEvict func(*Flow) `json:"-"`

	flowIndex map[flowKey]*Flow
	seq       uint64   // packets added to flows, the clock of Flow.lastSeen
	scratch   []uint64 // for evict
	// reads holds the RC requests flows from one address to another, to
	// find the one whose READ a response answers.
	reads map[[2]netip.Addr][]*Flow
}

// Flow is the traffic of one kind from one address to one destination QP
// over one transport, as a capture shows it. Requests (SEND, WRITE, READ
// request, atomics, UD datagrams), responses (ACKs, READ responses, atomic
// ACKs) and CNPs are separate flows even between the same QPs: a response
// carries the PSN of the request it answers, so it lives in the requester's
// PSN space, and a CNP carries PSN 0 and no sequence at all. RC, UC and UD
// traffic to the same QPN are separate flows too. UD flows are keyed by the
// source QPN of the DETH as well: two UD QPs of one host sending to one UD
// QP are two flows.
//
// A new epoch of a flow starts when a QPN is reused (a second run of a
// program is given the same QPN again): a PSN more than EpochGap before
// the first PSN of the flow's epoch or after its highest cannot be a
// resend or a gap the capture missed, and starts a new Flow with Epoch one
// higher.
type Flow struct {
	Src    string `json:"src"`
	Dst    string `json:"dst"`
	DestQP uint32 `json:"dqpn"`
	// SrcQP is the DETH source QPN of a UD flow.
	SrcQP *uint32 `json:"sqpn,omitempty"`
	// Epoch numbers the runs seen on the same key, from 0.
	Epoch int `json:"epoch"`
	// Kind is "requests", "responses" or "cnps".
	Kind string `json:"kind"`
	// Transport is "RC", "UC", "UD" or "CNP" (bth.Transport.String).
	Transport string `json:"transport"`
	SrcPorts  []int  `json:"sports"` // UDP source ports seen
	Packets   int    `json:"packets"`
	// FirstPSN and LastPSN are the first and the highest PSN seen (in
	// 24-bit sequence order, across the wrap: 16777214..1 is four PSNs);
	// 0 in CNP flows, whose PSNs mean nothing. The PSNs a READ request
	// uses (one per response packet) are in its requests flow's range, as
	// far as the responses in the capture show them.
	FirstPSN uint32 `json:"first_psn"`
	LastPSN  uint32 `json:"last_psn"`
	// Messages counts packets that end a message (Last or Only) and READ
	// requests and atomics, which are messages of one request packet;
	// resends are not counted again. In a UD flow every packet is a
	// message.
	Messages int `json:"messages"`
	// Retransmitted counts request and response packets whose PSN is not
	// after the highest PSN already seen in the flow: go-back-N resends and
	// duplicates. ACKs and CNPs are not counted: repeating a PSN is their
	// nature; nor are UD and UC, which never resend.
	Retransmitted int `json:"retransmitted_packets"` // analyze's name for the same count
	// Duplicates counts UC packets whose PSN is not after the highest
	// seen: UC never resends, so the path (or the capture) repeated them.
	Duplicates int `json:"duplicates"`
	// PayloadBytes adds up the payload lengths on the wire
	// (Record.PayloadLen), also of packets the capture cut short.
	PayloadBytes int `json:"payload_bytes,string"` // a byte total: a decimal string, as analyze's bytes
	ACKs         int `json:"acks"`                 // ACK syndromes on ACK and atomic ACK packets (not READ responses)
	NAKs         int `json:"naks"`                 // NAK syndromes of every code
	RNRNAKs      int `json:"rnr_naks"`             // RNR NAKs
	CNPs         int `json:"cnps"`
	CE           int `json:"ce"` // packets that arrived marked CE
	// LastMSN is the MSN of the last AETH seen, when any.
	LastMSN *uint32 `json:"last_msn,omitempty"`

	reads        []pendingRead // the latest READ requests of a requests flow
	lastACKPSN   uint32        // PSN and syndrome of the last AETH, with LastMSN
	lastSyndrome bth.Syndrome
	key          flowKey
	lastSeen     uint64 // Summary.seq of its last packet
	evicted      bool
}

// pendingRead is a READ request whose responses may extend its flow's PSN
// range: it uses PSNs psn..psn+span-1, span at most its length in 256-byte
// packets (the smallest path MTU).
type pendingRead struct {
	psn  bth.PSN
	span int
}

// maxPendingReads bounds the READ requests a flow remembers.
const maxPendingReads = 16

// DefaultMaxFlows is the number of flows a Summary tracks by default.
const DefaultMaxFlows = 65536

// EpochGap is how far (in PSNs) before a flow's first PSN or after its
// highest a packet must be to start a new epoch (a QPN reused).
const EpochGap = 1 << 20

// Flow kinds.
const (
	FlowRequests  = "requests"
	FlowResponses = "responses"
	FlowCNPs      = "cnps"
)

type flowKey struct {
	src, dst  netip.Addr
	qpn       uint32
	srcQP     uint32 // UD only
	kind      string
	transport bth.Transport
}

// NewSummary returns an empty Summary.
func NewSummary() *Summary {
	return &Summary{Opcodes: map[string]int{}, AETH: map[string]int{}, ECN: map[string]int{},
		OtherLinkTypes: map[string]int{}, Flows: []*Flow{}, flowIndex: map[flowKey]*Flow{},
		reads: map[[2]netip.Addr][]*Flow{}}
}

// AddOtherLinkType counts a frame skipped because its link type is not one
// Decoder handles (Decoder.Decode returned ErrLinkType).
func (s *Summary) AddOtherLinkType(lt LinkType) {
	s.Frames++
	s.OtherLinkTypes[lt.String()]++
}

// SetUnreassembled records the IPv4 datagrams whose fragments never all
// came: those the decoder dropped and those still pending at the end
// (Decoder.FragmentsDropped + Decoder.PendingFragments).
func (s *Summary) SetUnreassembled(n int) { s.Unreassembled = n }

// Mark is what a packet is in its flow, as decode marks it.
type Mark uint8

// Marks.
const (
	MarkNone Mark = iota
	// MarkRetransmission: an RC request or READ response whose PSN is not
	// after the flow's highest (a go-back-N resend or a duplicate).
	MarkRetransmission
	// MarkDuplicate: a UC packet whose PSN is not new (UC never resends),
	// or an ACK repeating the flow's last ACK (PSN and MSN).
	MarkDuplicate
	// MarkOutOfOrder: an RC or UC request more than one PSN after the
	// flow's highest: the packets between are not in the capture (lost
	// before the capture point, or reordered).
	MarkOutOfOrder
)

// String returns "", "retransmission", "duplicate" or "out-of-order".
func (m Mark) String() string {
	switch m {
	case MarkRetransmission:
		return "retransmission"
	case MarkDuplicate:
		return "duplicate"
	case MarkOutOfOrder:
		return "out-of-order"
	}
	return ""
}

// Add counts one decoded frame and returns its mark in its flow.
func (s *Summary) Add(k Kind, rec *Record) Mark {
	s.Frames++
	switch k {
	case KindOther:
		s.NonRoCE++
		return MarkNone
	case KindMalformed:
		s.Malformed++
		return MarkNone
	case KindFragment:
		s.IPFragments++
		return MarkNone
	}
	if rec.Fragments > 0 {
		s.Reassembled++
	}
	s.RoCE++
	p := &rec.Packet
	op := p.BTH.Opcode
	info := op.Info()
	s.Opcodes[op.String()]++
	s.ECN[rec.ECN.String()]++
	switch {
	case !rec.ICRCChecked:
		s.ICRCUnchecked++
	case !rec.ICRCOK:
		s.BadICRC++
	}

	kind := FlowRequests
	switch info.Op {
	case bth.OpAcknowledge, bth.OpAtomicAcknowledge, bth.OpReadResponse:
		kind = FlowResponses
	case bth.OpCNP:
		kind = FlowCNPs
	}
	tr := op.Transport()
	key := flowKey{src: rec.Src, dst: rec.Dst, qpn: p.BTH.DestQP, kind: kind, transport: tr}
	if info.Ext&bth.ExtDETH != 0 {
		key.srcQP = p.DETH.SrcQP
	}
	f := s.flowIndex[key]
	psn := p.BTH.PSN
	if kind == FlowCNPs {
		psn = 0
	}
	sequenced := kind != FlowCNPs && tr != bth.TransportUD
	isNew := true
	mark := MarkNone
	epoch := -1
	switch {
	case f == nil:
		epoch = 0
	case sequenced && newEpoch(f, psn):
		epoch = f.Epoch + 1
	}
	if epoch >= 0 {
		limit := s.MaxFlows
		if limit <= 0 {
			limit = DefaultMaxFlows
		}
		if len(s.Flows) >= limit {
			if !s.EvictFlows {
				s.FlowsNotTracked++
				return MarkNone
			}
			s.evict(max(1, limit/16))
		}
	}
	switch {
	case epoch >= 0:
		f = s.newFlow(key, psn, epoch)
	case kind != FlowCNPs:
		gap := psn.Diff(bth.PSN(f.LastPSN))
		after := gap > 0
		if after && gap > 1 && sequenced && kind == FlowRequests {
			mark = MarkOutOfOrder
			// After a READ the next request comes as many PSNs later as
			// the READ has response packets.
			if n := len(f.reads); n > 0 && f.reads[n-1].psn == bth.PSN(f.LastPSN) && int(gap) <= f.reads[n-1].span {
				mark = MarkNone
			}
		}
		if after {
			f.LastPSN = uint32(psn)
		}
		// UD never resends: every datagram is new.
		isNew = after || !sequenced
		switch {
		case isNew:
		case info.Op == bth.OpAcknowledge, info.Op == bth.OpAtomicAcknowledge:
			if f.LastMSN != nil && psn == bth.PSN(f.lastACKPSN) && p.AETH.MSN == *f.LastMSN && p.AETH.Syndrome == f.lastSyndrome {
				mark = MarkDuplicate
			}
		case tr == bth.TransportUC:
			f.Duplicates++ // UC never resends: the path repeated it
			mark = MarkDuplicate
		default:
			f.Retransmitted++
			mark = MarkRetransmission
		}
	}
	if info.Op == bth.OpReadResponse {
		s.readResponse(rec, psn)
	}
	if info.Op == bth.OpReadRequest && isNew {
		span := (int(p.RETH.DMALength) + 255) / 256
		f.reads = append(f.reads, pendingRead{psn, max(span, 1)})
		if len(f.reads) > maxPendingReads {
			f.reads = f.reads[1:]
		}
	}
	s.seq++
	f.lastSeen = s.seq
	if !containsPort(f.SrcPorts, int(rec.SrcPort)) {
		f.SrcPorts = append(f.SrcPorts, int(rec.SrcPort))
		sort.Ints(f.SrcPorts)
	}
	f.Packets++
	f.PayloadBytes += rec.PayloadLen
	if isNew && kind == FlowRequests &&
		(info.Ends() || info.Op == bth.OpReadRequest || info.Op == bth.OpCompareSwap || info.Op == bth.OpFetchAdd) {
		f.Messages++
	}
	if info.Op == bth.OpCNP {
		f.CNPs++
	}
	if rec.ECN == bth.CE {
		f.CE++
	}
	if info.Ext&bth.ExtAETH != 0 {
		syn := p.AETH.Syndrome
		s.AETH[syn.KindName()]++
		switch syn.Kind() {
		case bth.KindACK:
			if info.Op != bth.OpReadResponse {
				f.ACKs++
			}
		case bth.KindRNRNAK:
			f.RNRNAKs++
		case bth.KindNAK:
			f.NAKs++
		}
		msn := p.AETH.MSN
		f.LastMSN = &msn
		f.lastACKPSN, f.lastSyndrome = uint32(psn), syn
	}
	return mark
}

// newEpoch reports whether psn is too far from f's PSNs to belong to the
// same run: more than EpochGap before its first PSN (or, in an epoch longer
// than 2^22 PSNs, before its highest less 2^22) or after its highest.
func newEpoch(f *Flow, psn bth.PSN) bool {
	first, last := bth.PSN(f.FirstPSN), bth.PSN(f.LastPSN)
	if last.Diff(first) > 1<<22 {
		first = last.Add(-(1 << 22))
	}
	return psn.Diff(last) > EpochGap || psn.Diff(first) < -EpochGap
}

func (s *Summary) newFlow(key flowKey, psn bth.PSN, epoch int) *Flow {
	f := &Flow{Src: key.src.String(), Dst: key.dst.String(), DestQP: key.qpn, Kind: key.kind, Transport: key.transport.String(),
		FirstPSN: uint32(psn), LastPSN: uint32(psn), Epoch: epoch, key: key}
	if key.transport == bth.TransportUD && key.kind == FlowRequests {
		f.SrcQP = &key.srcQP
	}
	s.flowIndex[key] = f
	s.Flows = append(s.Flows, f)
	if key.kind == FlowRequests && key.transport == bth.TransportRC {
		hk := [2]netip.Addr{key.src, key.dst}
		list := s.reads[hk]
		if epoch > 0 {
			for i, g := range list {
				if g.Src == f.Src && g.Dst == f.Dst && g.DestQP == f.DestQP {
					list = append(list[:i:i], list[i+1:]...)
					break
				}
			}
		}
		s.reads[hk] = append(list, f)
	}
	return f
}

// evict takes the n least recently seen flows out of Flows (keeping the
// order of the others), out of the index and the READ lists, and hands
// each to OnEvict.
func (s *Summary) evict(n int) {
	n = min(n, len(s.Flows))
	if n == 0 {
		return
	}
	seen := s.scratch[:0]
	for _, f := range s.Flows {
		seen = append(seen, f.lastSeen)
	}
	slices.Sort(seen)
	cut := seen[n-1] // every packet has its own seq: exactly n flows are at or below
	s.scratch = seen[:0]
	keep := s.Flows[:0]
	lists := map[[2]netip.Addr]bool{}
	for _, f := range s.Flows {
		if f.lastSeen > cut {
			keep = append(keep, f)
			continue
		}
		f.evicted = true
		if s.flowIndex[f.key] == f {
			delete(s.flowIndex, f.key)
		}
		if f.key.kind == FlowRequests && f.key.transport == bth.TransportRC {
			lists[[2]netip.Addr{f.key.src, f.key.dst}] = true
		}
		s.FlowsEvicted++
		s.EvictedPackets += f.Packets
		if s.OnEvict != nil {
			s.OnEvict(f)
		}
	}
	clear(s.Flows[len(keep):])
	s.Flows = keep
	for hk := range lists {
		l := slices.DeleteFunc(s.reads[hk], func(f *Flow) bool { return f.evicted })
		if len(l) == 0 {
			delete(s.reads, hk)
		} else {
			s.reads[hk] = l
		}
	}
}

// readResponse extends the PSN range of the requests flow whose READ the
// response at psn answers: the RC requests flow from the response's
// destination to its source with a READ request that may use psn.
func (s *Summary) readResponse(rec *Record, psn bth.PSN) {
	for _, f := range s.reads[[2]netip.Addr{rec.Dst, rec.Src}] {
		for _, r := range f.reads {
			if psn.InRange(r.psn, r.span) {
				if psn.After(bth.PSN(f.LastPSN)) {
					f.LastPSN = uint32(psn)
				}
				return
			}
		}
	}
}

func containsPort(ports []int, p int) bool {
	for _, q := range ports {
		if q == p {
			return true
		}
	}
	return false
}

// String describes a flow on one line.
func (f *Flow) String() string {
	s := fmt.Sprintf("%s %s %s > %s", f.Kind, f.Transport, f.Src, f.Dst)
	if f.SrcQP != nil {
		s += fmt.Sprintf(" sqpn=%#06x", *f.SrcQP)
	}
	s += fmt.Sprintf(" dqpn=%#06x", f.DestQP)
	if f.Epoch > 0 {
		s += fmt.Sprintf(" epoch=%d", f.Epoch)
	}
	s += fmt.Sprintf(" packets=%d", f.Packets)
	if f.Kind != FlowCNPs {
		s += fmt.Sprintf(" psn=%d..%d messages=%d payload=%dB retransmitted=%d",
			f.FirstPSN, f.LastPSN, f.Messages, f.PayloadBytes, f.Retransmitted)
	}
	if f.Duplicates > 0 {
		s += fmt.Sprintf(" duplicates=%d", f.Duplicates)
	}
	if f.ACKs+f.NAKs+f.RNRNAKs > 0 {
		s += fmt.Sprintf(" acks=%d naks=%d rnr_naks=%d", f.ACKs, f.NAKs, f.RNRNAKs)
	}
	if f.LastMSN != nil {
		s += fmt.Sprintf(" last_msn=%d", *f.LastMSN)
	}
	if f.CNPs > 0 {
		s += fmt.Sprintf(" cnps=%d", f.CNPs)
	}
	if f.CE > 0 {
		s += fmt.Sprintf(" ce=%d", f.CE)
	}
	return s
}
