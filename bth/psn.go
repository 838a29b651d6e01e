package bth

import "strconv"

// PSN is a 24-bit packet sequence number (IBTA 9.7.1). Arithmetic wraps
// modulo 2^24 and comparisons are valid while two PSNs are less than 2^23
// apart, as in rxe's psn_compare ((s32)((a - b) << 8)).
//
// The zero value is PSN 0. Only the low 24 bits are meaningful; methods mask
// their results, so a PSN built by them is always Valid.
type PSN uint32

// PSNMask keeps the 24 bits of a PSN.
const PSNMask = 0xFFFFFF

// PSNWindow is 2^23: PSNs further apart than this compare the wrong way.
const PSNWindow = 1 << 23

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return p <= PSNMask }

// Add returns p+n modulo 2^24; n may be negative.
func (p PSN) Add(n int) PSN { return PSN((uint32(p) + uint32(int32(n))) & PSNMask) }

// Next returns p+1 modulo 2^24.
func (p PSN) Next() PSN { return p.Add(1) }

// Diff returns the signed distance p-q, in the range [-2^23, 2^23).
func (p PSN) Diff(q PSN) int32 { return int32((uint32(p)-uint32(q))<<8) >> 8 }

// Before reports whether p comes before q in sequence space.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// After reports whether p comes after q in sequence space.
func (p PSN) After(q PSN) bool { return p.Diff(q) > 0 }

// Compare returns -1, 0 or +1 as p is before, equal to or after q.
func (p PSN) Compare(q PSN) int {
	switch d := p.Diff(q); {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// InRange reports whether p lies in the half-open window [first, first+n).
func (p PSN) InRange(first PSN, n int) bool {
	d := p.Diff(first)
	return d >= 0 && int(d) < n
}

// String formats p in decimal, as tshark and rxe's debug output do.
func (p PSN) String() string { return strconv.FormatUint(uint64(p), 10) }
