package qp

import "net/netip"

// WCFlags are ibv_wc_flags.
type WCFlags uint8

// Work completion flags.
const (
	// IBV_WC_GRH: the first GRHLen bytes of the receive buffer hold the
	// packet's network header (UD receives; see RecvInfo).
	IBV_WC_GRH      WCFlags = 1
	IBV_WC_WITH_IMM WCFlags = 2
	IBV_WC_WITH_INV WCFlags = 4
)

// WC is a work completion, as ibv_wc.
type WC struct {
	WRID    uint64
	Status  WCStatus
	Opcode  WCOpcode
	ByteLen uint32 // bytes received (receive completions) or transferred
	// ImmData is the immediate data as the 32-bit big-endian number on the
	// wire (ibv_wc.imm_data holds the same bytes in network order).
	ImmData uint32
	// InvalidatedRKey is the R_Key a SEND with Invalidate named.
	InvalidatedRKey uint32
	Flags           WCFlags
	QPNum           uint32
	// SrcQP is the remote QP: the connected one for RC and UC, the DETH's
	// source QPN for UD (ibv_wc.src_qp).
	SrcQP uint32
	// PKeyIndex, SLID, SL and DLIDPathBits are ibv_wc's; on RoCEv2 they
	// are 0, as rxe reports them (one P_Key at index 0, no LIDs, the SL
	// not carried).
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
	// SrcAddr is, for a UD receive, the sender's IP address and UDP port
	// from RecvInfo (ibv_wc has none: verbs programs read it from the GRH
	// or with ibv_init_ah_from_wc); invalid when not known.
	SrcAddr netip.AddrPort
}

// CQ is a completion queue with room for a fixed number of completions.
// When it is full, further completions are dropped and counted in
// Overruns: a verbs CQ overrun is a fatal error of the CQ, and a program
// that sees one has lost completions.
type CQ struct {
	ring     []WC
	head, n  int
	Overruns uint64
}

// NewCQ returns a completion queue with room for depth completions (at
// least 1).
func NewCQ(depth int) *CQ {
	if depth < 1 {
		depth = 1
	}
	return &CQ{ring: make([]WC, depth)}
}

func (cq *CQ) push(wc WC) {
	if cq.n == len(cq.ring) {
		cq.Overruns++
		return
	}
	cq.ring[(cq.head+cq.n)%len(cq.ring)] = wc
	cq.n++
}

// Poll moves up to len(wc) completions into wc, oldest first, and returns
// how many.
func (cq *CQ) Poll(wc []WC) int {
	k := 0
	for k < len(wc) && cq.n > 0 {
		wc[k] = cq.ring[cq.head]
		cq.head = (cq.head + 1) % len(cq.ring)
		cq.n--
		k++
	}
	return k
}

// Len returns the number of completions waiting.
func (cq *CQ) Len() int { return cq.n }
