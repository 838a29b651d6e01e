package main

import (
	"math"
	"os"
	"runtime/debug"
)

// switchMemoryMargin is what the switch's memory limit allows above the
// bytes its flags let it hold: the runtime, the goroutine stacks, the
// sockets' batch buffers and the datagrams in flight between them.
const switchMemoryMargin = 32 << 20

// switchMemoryLimit is the Go memory limit (runtime/debug.SetMemoryLimit,
// in bytes) of a switch whose egress queue holds buffer bytes and, with
// PFC, whose hold keeps holdBytes more while the egress is paused. The
// queue and the hold are bounded in bytes, so the live heap stays within
// them; but the collector lets the heap grow to twice the live heap
// before it runs (GOGC=100), so that a flood that keeps the hold full and
// drops the rest took the process to about twice hold + buffer (RSS over
// 700 MiB with --hold-bytes 256 MiB). The limit makes the collector run
// before the heap passes it instead.
func switchMemoryLimit(holdBytes, buffer int, pfc bool) int64 {
	// Saturating: flags near math.MaxInt64 give no limit to speak of,
	// never a wrapped, small one.
	n := int64(buffer)
	if n > math.MaxInt64-switchMemoryMargin {
		return math.MaxInt64
	}
	n += switchMemoryMargin
	if pfc {
		if int64(holdBytes) > math.MaxInt64-n {
			return math.MaxInt64
		}
		n += int64(holdBytes)
	}
	return n
}

// switchOwnsProcess says that the switch is the only work of its
// process, so that the process's memory limit is its to set: true in the
// command; the package's tests, which run switches beside senders and
// receivers in one process, set it false (and a subprocess true).
var switchOwnsProcess = true

// setSwitchMemoryLimit sets the process's memory limit to
// switchMemoryLimit unless GOMEMLIMIT already sets one (the user's
// choice wins) or the switch shares its process (switchOwnsProcess). It
// returns the limit set (0 when it set none) and a function that
// restores the previous one.
func setSwitchMemoryLimit(holdBytes, buffer int, pfc bool) (int64, func()) {
	if os.Getenv("GOMEMLIMIT") != "" || !switchOwnsProcess {
		return 0, func() {}
	}
	limit := switchMemoryLimit(holdBytes, buffer, pfc)
	prev := debug.SetMemoryLimit(limit)
	return limit, func() { debug.SetMemoryLimit(prev) }
}
