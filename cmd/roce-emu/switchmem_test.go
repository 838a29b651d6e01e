package main

import (
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The tests run switches beside senders and receivers in this process:
// a memory limit sized for the switch alone would make the collector run
// for all of them (TestIncastRecipe's senders timed out their ACKs).
func init() { switchOwnsProcess = false }

func TestSwitchMemoryLimit(t *testing.T) {
	switchOwnsProcess = true
	defer func() { switchOwnsProcess = false }()
	assert.Equal(t, int64(12<<20+32<<20), switchMemoryLimit(256<<20, 12<<20, false), "no hold without PFC")
	assert.Equal(t, int64(256<<20+12<<20+32<<20), switchMemoryLimit(256<<20, 12<<20, true))

	t.Setenv("GOMEMLIMIT", "")
	before := debug.SetMemoryLimit(-1)
	limit, restore := setSwitchMemoryLimit(8<<20, 4<<20, true)
	assert.Equal(t, int64(44<<20), limit)
	assert.Equal(t, int64(44<<20), debug.SetMemoryLimit(-1))
	restore()
	assert.Equal(t, before, debug.SetMemoryLimit(-1))

	t.Setenv("GOMEMLIMIT", "1GiB") // the user's own limit stays
	limit, restore = setSwitchMemoryLimit(8<<20, 4<<20, true)
	assert.Zero(t, limit)
	assert.Equal(t, before, debug.SetMemoryLimit(-1))
	restore()

	t.Setenv("GOMEMLIMIT", "")
	switchOwnsProcess = false // a switch sharing its process
	limit, restore = setSwitchMemoryLimit(8<<20, 4<<20, true)
	assert.Zero(t, limit)
	assert.Equal(t, before, debug.SetMemoryLimit(-1))
	restore()
}

// TestSwitchHelperProcess is the switch of TestSwitchPFCFloodRSS, run in
// a process of its own so that its RSS can be read.
func TestSwitchHelperProcess(t *testing.T) {
	args := os.Getenv("ROCE_EMU_SWITCH_HELPER")
	if args == "" {
		t.Skip("run by TestSwitchPFCFloodRSS")
	}
	switchOwnsProcess = true // alone in its process, as the command
	os.Exit(run(strings.Fields(args), os.Stdout, os.Stderr))
}

// Byte flags near math.MaxInt64 give no limit to speak of, never a
// wrapped small one (or a negative one, which SetMemoryLimit ignores).
func TestSwitchMemoryLimitSaturates(t *testing.T) {
	assert.Equal(t, int64(math.MaxInt64), switchMemoryLimit(math.MaxInt64, math.MaxInt64, true))
	assert.Equal(t, int64(math.MaxInt64), switchMemoryLimit(1<<20, math.MaxInt64, false))
	assert.Equal(t, int64(math.MaxInt64), switchMemoryLimit(math.MaxInt64-1<<20, 1<<20, true))
	assert.Equal(t, int64(math.MaxInt64-1), switchMemoryLimit(math.MaxInt64-1-(1<<20)-switchMemoryMargin, 1<<20, true))
}
