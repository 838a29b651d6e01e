package analyze

import "time"

// Report is what Analyzer found in one capture: one entry per connection
// (per requester: a connection whose two sides both send requests shows as
// two entries, requester and responder swapped, since each requester has
// its own PSN space), in order of first frame, and the capture's totals.
// Counts that may exceed 2^53 (byte totals) are JSON strings.
type Report struct {
	File        string        `json:"file,omitempty"`
	Connections []*Connection `json:"connections"`
	Summary     Summary       `json:"summary"`
}

// Summary holds the capture's totals.
type Summary struct {
	Frames         int            `json:"frames"`
	RoCE           int            `json:"roce"`
	Malformed      int            `json:"malformed"`
	NonRoCE        int            `json:"non_roce"`
	OtherLinkTypes map[string]int `json:"other_link_types"` // frames of other pcapng link types, skipped
	IPFragments    int            `json:"ip_fragments"`     // frames holding IPv4 fragments not completing a datagram
	Reassembled    int            `json:"reassembled"`      // datagrams reassembled from fragments
	BadICRC        int            `json:"bad_icrc"`
	DurationUs     float64        `json:"duration_us"` // first frame to last
	Connections    int            `json:"connections"` // in Report.Connections
	// EvictedConnections were dropped, unreported, to keep the number of
	// connections tracked at Config.MaxConnections.
	EvictedConnections int `json:"evicted_connections"`
	// UnmatchedResponses and UnmatchedCNPs are packets no connection in the
	// capture could own (the requests they answer are not in it).
	UnmatchedResponses int `json:"unmatched_responses"`
	UnmatchedCNPs      int `json:"unmatched_cnps"`
	// UnmatchedCNPsTo counts unmatched CNPs by the QP they were sent to,
	// "IP/0xQPN" (the notified requester), for up to MaxConnections QPs.
	UnmatchedCNPsTo      map[string]int `json:"unmatched_cnps_to"`
	Messages             int            `json:"messages"`
	Bytes                uint64         `json:"bytes,string"`
	RetransmittedPackets int            `json:"retransmitted_packets"`
	GBNEpisodes          int            `json:"gbn_episodes"`
	Timeouts             int            `json:"timeouts"`
	NAKs                 int            `json:"naks"`
	RNRNAKs              int            `json:"rnr_naks"`
	CEMarked             int            `json:"ce_marked"`
	CNPs                 int            `json:"cnps"`
	Checks               int            `json:"checks"`
	// CNPPorts are the CNPs by the address that sent them (the
	// notification point's port), all QPs together, for up to
	// MaxConnections addresses: how many, the shortest interval, and how
	// many intervals were under Config.MinCNPInterval.
	CNPPorts map[string]*CNPPort `json:"cnp_ports"`
	// CM lists the communication-manager exchanges (rdma_cm's REQ, REP,
	// RTU, REJ, DREQ, DREP over QP1), up to MaxConnections, in the order
	// of their first REQ; CMNotTracked counts the REQs past that.
	CM           []CMExchange `json:"cm"`
	CMNotTracked int          `json:"cm_not_tracked"`
}

// CNPPort is the CNP stream one address sent.
type CNPPort struct {
	CNPs          int     `json:"cnps"`
	IntervalMinUs float64 `json:"interval_min_us"`
	UnderMin      int     `json:"under_min_interval"`
	last          time.Time
}

// Connection is one requester's traffic to one responder QP, and the
// responses and CNPs that come back. Requester and Responder are
// "IP/0xQPN"; a requester's QPN is known only from the responses or CNPs
// sent to it ("IP/?" when the capture has none).
type Connection struct {
	Transport  string  `json:"transport"` // "RC", "UC" or "UD"
	Requester  string  `json:"requester"`
	Responder  string  `json:"responder"`
	Epoch      int     `json:"epoch"` // runs seen on the same QPNs, from 0 (a QPN reused)
	FirstFrame int     `json:"first_frame"`
	LastFrame  int     `json:"last_frame"`
	StartUs    float64 `json:"start_us"` // from the capture's first frame
	DurationUs float64 `json:"duration_us"`
	// Packets counts request packets (first sends and resends);
	// ResponsePackets the ACKs, NAKs, READ responses and atomic ACKs.
	Packets         int `json:"packets"`
	ResponsePackets int `json:"response_packets"`
	// Messages counts messages once each (resends are not new messages),
	// by opcode boundaries: a Last or Only packet, a READ request, an
	// atomic. MessagesByKind splits them by operation ("SEND",
	// "RDMA_WRITE", "RDMA_READ", "COMPARE_SWAP", "FETCH_ADD").
	Messages       int            `json:"messages"`
	MessagesByKind map[string]int `json:"messages_by_kind"`
	// Bytes is the payload of first sends; ReadBytes that of first READ
	// responses.
	Bytes     uint64 `json:"bytes,string"`
	ReadBytes uint64 `json:"read_bytes,string"`
	// PSN is the range of PSNs the requester used (READs' response PSNs
	// included), across the 2^24 wrap: Count PSNs from First to Last.
	PSN *PSNRange `json:"psn,omitempty"`
	// PathMTU is Config.PathMTU, or the largest FIRST or MIDDLE payload
	// seen (those are exactly the path MTU); 0 when none was seen.
	PathMTU              int       `json:"path_mtu"`
	RetransmittedPackets int       `json:"retransmitted_packets"`
	RetransmittedBytes   uint64    `json:"retransmitted_bytes,string"`
	GBNEpisodes          []Episode `json:"gbn_episodes"`
	// EpisodesNotListed counts episodes beyond Config.MaxEvents.
	EpisodesNotListed int `json:"gbn_episodes_not_listed"`
	// Timeouts counts episodes started by the requester's ACK timeout (no
	// NAK before the resend).
	Timeouts int `json:"timeouts"`
	ACKs     int `json:"acks"` // ACK syndromes on ACK and atomic ACK packets
	NAKs     int `json:"naks"` // NAKs of every code but RNR
	// NAKsPastRead counts NAKs that came past a READ or atomic whose
	// response was missing: the requester takes them as implied NAKs.
	NAKsPastRead int `json:"naks_past_incomplete_read"`
	RNRNAKs      int `json:"rnr_naks"`
	// RNRWaits lists each RNR NAK with the wait its timer code asks and the
	// wait seen to the resend.
	RNRWaits []RNRWait `json:"rnr_waits"`
	// ImpliedNAKs counts READ and atomic requests left unanswered when a
	// response to a later request came (IBTA 9.7.5.1.2).
	ImpliedNAKs int `json:"implied_naks"`
	// Duplicates counts resent request packets whose PSN was ACKed already
	// (spurious resends). ReACKs counts ACKs that acknowledge nothing new:
	// their PSN is not past the highest PSN an earlier ACK, NAK or
	// response in the capture acknowledged. A responder sends them when it
	// answers duplicate SENDs and WRITEs whose PSNs it had acknowledged,
	// with an ACK for the last PSN it took (IBTA 9.7.5, rxe's
	// duplicate_request). The first answer to duplicates whose first
	// sending no ACK covered yet (its ACK coalesced away, or lost before
	// the capture point) acknowledges them for the first time and is not
	// counted here. ACKs counts every ACK, re-ACKs included. Duplicate
	// READs are answered by READ responses (ReadResent).
	Duplicates  int `json:"duplicates"`
	ReACKs      int `json:"re_acks"`
	ReadResent  int `json:"read_responses_resent"`
	RTT         RTT `json:"rtt_us"`
	CEMarked    int `json:"ce_marked"`           // request packets that arrived CE
	CEResponses int `json:"ce_marked_responses"` // responses that arrived CE
	// CNPs counts CNPs to the requester's QP; CNPFrom is the side that sent
	// them, the notification point ("IP" of the responder when it is the
	// one that saw the marks).
	CNPs           int     `json:"cnps"`
	CNPFrom        string  `json:"cnp_from,omitempty"`
	CNPIntervalMin float64 `json:"cnp_interval_min_us"`
	// CNPsUnderMin counts CNP intervals under Config.MinCNPInterval.
	CNPsUnderMin int `json:"cnps_under_min_interval"`
	// Throughput is the request payload (first sends and resends) per bin
	// of BinUs microseconds from StartUs.
	BinUs      float64 `json:"bin_us"`
	Throughput []Bin   `json:"throughput"`
	// Checks are what Wireshark would put in its expert info, with frame
	// numbers (up to Config.MaxEvents; ChecksByKind counts all).
	Checks       []Check        `json:"checks"`
	ChecksByKind map[string]int `json:"checks_by_kind"`
	// CMStartingPSN is the starting PSN the CM (a REQ and its REP) gave
	// this requester, when the capture holds them; a first PSN other than
	// it is a "CM starting PSN" check.
	CMStartingPSN *uint32 `json:"cm_starting_psn,omitempty"`
	// Points are the PSNs over time, for pictures (Config.Points).
	Points []Point `json:"-"`
}

// Point is one packet of a connection in time: a request (first send or
// resend) at its PSN, or a NAK at the PSN it asks for. PSN counts from the
// connection's first PSN, across the wrap.
type Point struct {
	Us   float64 // from the capture's first frame
	PSN  int64
	Kind PointKind
}

// PointKind tells points apart.
type PointKind uint8

// Point kinds.
const (
	PointSend PointKind = iota
	PointResend
	PointNAK
)

// PSNRange is a range of 24-bit PSNs that may wrap: First..Last, Count
// PSNs.
type PSNRange struct {
	First uint32 `json:"first"`
	Last  uint32 `json:"last"`
	Count int64  `json:"count,string"`
}

// Episode is one go-back-N (or RNR) resend episode: what started it, the
// first resend, and what was sent again until new PSNs went out.
type Episode struct {
	// Cause is "NAK" (a PSN sequence error NAK for the PSN resent),
	// "RNR_NAK", "implied_NAK" (a response to a later request left a READ
	// or atomic unanswered, IBTA 9.7.5.1.2) or "timeout" (none of those:
	// the requester's ACK timer).
	Cause string `json:"cause"`
	// StartFrame is the NAK's frame, or for a timeout the last frame of
	// the connection before the resend (the timer's last restart).
	StartFrame       int     `json:"start_frame"`
	FirstResendFrame int     `json:"first_resend_frame"`
	DelayUs          float64 `json:"delay_us"` // from StartFrame to FirstResendFrame
	FromPSN          uint32  `json:"from_psn"`
	PacketsResent    int     `json:"packets_resent"`
	BytesResent      uint64  `json:"bytes_resent,string"`
	// ResendFrom is where in its message the first resent packet is:
	// "FIRST", "MIDDLE", "LAST", "ONLY" (a whole message again) or
	// "REQUEST" (a READ request or an atomic); "none" for an episode the
	// requester began and superseded with another before resending
	// anything (FirstResendFrame 0).
	ResendFrom string `json:"resend_from"`
}

// RNRWait is one RNR NAK.
type RNRWait struct {
	Frame      int     `json:"frame"`
	TimerCode  uint8   `json:"timer_code"`
	AskedUs    float64 `json:"asked_us"` // IBTA Table 45 for TimerCode
	SeenUs     float64 `json:"seen_us"`  // to the resend; -1 when none came
	ResendSeen bool    `json:"resend_seen"`
}

// RTT is the time from a request packet with AckReq (first sends only,
// Karn's rule) to the first response that covers its PSN.
type RTT struct {
	Samples int      `json:"samples"`
	P50     *float64 `json:"p50"`
	P99     *float64 `json:"p99"`
	Min     *float64 `json:"min"`
	Max     *float64 `json:"max"`
}

// Bin is the payload one bin of the throughput series carried.
type Bin struct {
	StartUs float64 `json:"start_us"`
	Bytes   uint64  `json:"bytes,string"`
	Gbps    float64 `json:"gbps"`
}

// Check is one finding about a frame.
type Check struct {
	Frame    int    `json:"frame"`
	Severity string `json:"severity"` // "warning" or "error"
	Kind     string `json:"kind"`     // "opcode sequence", "PSN sequence", "pad count", "path MTU", "MSN order", "ICRC", "CNP fields", "READ length", "CM starting PSN"
	Message  string `json:"message"`
}
