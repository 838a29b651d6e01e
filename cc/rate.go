package cc

import (
	"fmt"
	"time"
)

// Rate is a bit rate in bits per second.
type Rate float64

// Common rates.
const (
	Mbps Rate = 1e6
	Gbps Rate = 1e9
)

// String formats r with a unit, e.g. "40Gb/s" or "5Mb/s".
func (r Rate) String() string {
	switch {
	case r >= Gbps:
		return fmt.Sprintf("%.4gGb/s", float64(r/Gbps))
	case r >= Mbps:
		return fmt.Sprintf("%.4gMb/s", float64(r/Mbps))
	}
	return fmt.Sprintf("%.4gb/s", float64(r))
}

// TxTime returns how long n bytes take at rate r.
func (r Rate) TxTime(n int) time.Duration {
	if r <= 0 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(float64(n) * 8 / float64(r) * 1e9)
}
