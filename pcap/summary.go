package pcap

import (
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
	ICRCUnchecked int            `json:"icrc_unchecked"` // RoCE packets cut short by the snapshot length
	Opcodes       map[string]int `json:"opcodes"`
	AETH          map[string]int `json:"aeth_kinds"`
	ECN           map[string]int `json:"ecn"`
}

// NewSummary returns an empty Summary.
func NewSummary() *Summary {
	return &Summary{Opcodes: map[string]int{}, AETH: map[string]int{}, ECN: map[string]int{}}
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
	op := rec.Packet.BTH.Opcode
	s.Opcodes[op.String()]++
	if op.Info().Ext&bth.ExtAETH != 0 {
		s.AETH[rec.Packet.AETH.Syndrome.KindName()]++
	}
	s.ECN[rec.ECN.String()]++
	switch {
	case !rec.ICRCChecked:
		s.ICRCUnchecked++
	case !rec.ICRCOK:
		s.BadICRC++
	}
}
