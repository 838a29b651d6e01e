package pcap

import (
	"fmt"
	"sort"

	"github.com/roce-emu/roce-emu/bth"
)

// Summary counts what a capture holds. Maps are keyed by names so that the
// JSON form reads without a table: opcodes by ib_pack.h name
// ("RC_SEND_ONLY"), AETH kinds by bth.Syndrome.KindName ("ACK",
// "NAK_PSN_SEQ"), ECN codepoints by bth.ECN.String ("CE").
type Summary struct {
	Frames        int            `json:"frames"`         // frames read
	RoCE          int            `json:"roce"`           // RoCEv2 packets whose headers decoded
	Malformed     int            `json:"malformed"`      // UDP to 4791 that did not decode
	NonRoCE       int            `json:"non_roce"`       // frames skipped: not UDP to 4791
	BadICRC       int            `json:"bad_icrc"`       // RoCE packets whose ICRC did not verify
	ICRCUnchecked int            `json:"icrc_unchecked"` // RoCE packets cut short by the snapshot length, or IPv6 with extension headers
	Opcodes       map[string]int `json:"opcodes"`
	AETH          map[string]int `json:"aeth_kinds"`
	ECN           map[string]int `json:"ecn"`
	Flows         []*Flow        `json:"flows"` // in order of first appearance

	flowIndex map[flowKey]*Flow
}

// Flow is the traffic of one kind from one address to one destination QP
// over one transport, as a capture shows it. Requests (SEND, WRITE, READ
// request, atomics, UD datagrams), responses (ACKs, READ responses, atomic
// ACKs) and CNPs are separate flows even between the same QPs: a response
// carries the PSN of the request it answers, so it lives in the requester's
// PSN space, and a CNP carries PSN 0 and no sequence at all. RC, UC and UD
// traffic to the same QPN are separate flows too.
type Flow struct {
	Src    string `json:"src"`
	Dst    string `json:"dst"`
	DestQP uint32 `json:"dqpn"`
	// Kind is "requests", "responses" or "cnps".
	Kind string `json:"kind"`
	// Transport is "RC", "UC", "UD" or "CNP" (bth.Transport.String).
	Transport string `json:"transport"`
	SrcPorts  []int  `json:"sports"` // UDP source ports seen
	Packets   int    `json:"packets"`
	// FirstPSN and LastPSN are the first and the highest PSN seen (in
	// 24-bit sequence order); 0 in CNP flows, whose PSNs mean nothing.
	FirstPSN uint32 `json:"first_psn"`
	LastPSN  uint32 `json:"last_psn"`
	// Messages counts packets that end a message (Last or Only) and READ
	// requests and atomics, which are messages of one request packet.
	Messages int `json:"messages"`
	// Retransmitted counts request and response packets whose PSN is not
	// after the highest PSN already seen in the flow: go-back-N resends and
	// duplicates. ACKs and CNPs are not counted: repeating a PSN is their
	// nature.
	Retransmitted int `json:"retransmitted"`
	// PayloadBytes adds up the payload lengths on the wire
	// (Record.PayloadLen), also of packets the capture cut short.
	PayloadBytes int `json:"payload_bytes"`
	ACKs         int `json:"acks"`     // ACK syndromes (on ACKs, atomic ACKs and READ responses)
	NAKs         int `json:"naks"`     // NAK syndromes of every code
	RNRNAKs      int `json:"rnr_naks"` // RNR NAKs
	CNPs         int `json:"cnps"`
	CE           int `json:"ce"` // packets that arrived marked CE
	// LastMSN is the MSN of the last AETH seen, when any.
	LastMSN *uint32 `json:"last_msn,omitempty"`
}

// Flow kinds.
const (
	FlowRequests  = "requests"
	FlowResponses = "responses"
	FlowCNPs      = "cnps"
)

type flowKey struct {
	src, dst  string
	qpn       uint32
	kind      string
	transport bth.Transport
}

// NewSummary returns an empty Summary.
func NewSummary() *Summary {
	return &Summary{Opcodes: map[string]int{}, AETH: map[string]int{}, ECN: map[string]int{},
		Flows: []*Flow{}, flowIndex: map[flowKey]*Flow{}}
}

// Add counts one decoded frame.
func (s *Summary) Add(k Kind, rec *Record) {
	s.Frames++
	switch k {
	case KindOther:
		s.NonRoCE++
		return
	case KindMalformed:
		s.Malformed++
		return
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
	key := flowKey{rec.Src.String(), rec.Dst.String(), p.BTH.DestQP, kind, op.Transport()}
	f := s.flowIndex[key]
	psn := uint32(p.BTH.PSN)
	if kind == FlowCNPs {
		psn = 0
	}
	if f == nil {
		f = &Flow{Src: key.src, Dst: key.dst, DestQP: key.qpn, Kind: kind, Transport: key.transport.String(),
			FirstPSN: psn, LastPSN: psn}
		s.flowIndex[key] = f
		s.Flows = append(s.Flows, f)
	} else if kind != FlowCNPs {
		if info.Op != bth.OpAcknowledge && info.Op != bth.OpAtomicAcknowledge && !p.BTH.PSN.After(bth.PSN(f.LastPSN)) {
			f.Retransmitted++
		}
		if p.BTH.PSN.After(bth.PSN(f.LastPSN)) {
			f.LastPSN = psn
		}
	}
	if !containsPort(f.SrcPorts, int(rec.SrcPort)) {
		f.SrcPorts = append(f.SrcPorts, int(rec.SrcPort))
		sort.Ints(f.SrcPorts)
	}
	f.Packets++
	f.PayloadBytes += rec.PayloadLen
	if info.Ends() || info.Op == bth.OpReadRequest || info.Op == bth.OpCompareSwap || info.Op == bth.OpFetchAdd {
		if info.Op != bth.OpReadResponse {
			f.Messages++
		}
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
			f.ACKs++
		case bth.KindRNRNAK:
			f.RNRNAKs++
		case bth.KindNAK:
			f.NAKs++
		}
		msn := p.AETH.MSN
		f.LastMSN = &msn
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
	s := fmt.Sprintf("%s %s %s > %s dqpn=%#06x packets=%d", f.Kind, f.Transport, f.Src, f.Dst, f.DestQP, f.Packets)
	if f.Kind != FlowCNPs {
		s += fmt.Sprintf(" psn=%d..%d messages=%d payload=%dB retransmitted=%d",
			f.FirstPSN, f.LastPSN, f.Messages, f.PayloadBytes, f.Retransmitted)
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
