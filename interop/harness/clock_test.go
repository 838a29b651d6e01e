package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A scenario whose guest log holds perftest's clock-calibration failure
// runs again, at most maxClockRetries times a run; other failures, and
// another scenario's log, do not count.
func TestPerftestClockFailed(t *testing.T) {
	h := &harness{out: t.TempDir()}
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(h.out, name), []byte(text), 0o644))
	}
	write("perftest-a.perftest-a-mtu1024-clean-guest.log", "Correlation coefficient r^2: 0.00296344 < 0.9\nCan't produce a report\n")
	write("perftest-b.perftest-b-mtu1024-clean-guest.log", "Failed to modify QP to RTR\n")
	write("perftest-a-q2.perftest-a-mtu1024-clean-roce-emu.log", "Correlation coefficient r^2: 0.1 < 0.9\nCan't produce a report\n")
	assert.False(t, h.perftestClockFailed("perftest-b"))
	assert.False(t, h.perftestClockFailed("perftest-a-q2"), "only the guest's logs")
	assert.False(t, h.perftestClockFailed("perftest"), "only the scenario's own logs")
	for range maxClockRetries {
		assert.True(t, h.perftestClockFailed("perftest-a"))
	}
	assert.False(t, h.perftestClockFailed("perftest-a"), "at most maxClockRetries a run")
}
