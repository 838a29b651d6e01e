package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWaitForFile: the console line that comes after the scenario failed
// is still seen; a console without it is given up on after the wait.
func TestWaitForFile(t *testing.T) {
	console := filepath.Join(t.TempDir(), "guest-console.log")
	require.NoError(t, os.WriteFile(console, []byte("roceemu-guest: ready\n"), 0o644))
	go func() {
		time.Sleep(700 * time.Millisecond)
		f, err := os.OpenFile(console, os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			f.WriteString("virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 5060 ms\n")
			f.Close()
		}
	}()
	assert.True(t, waitForFile(console, "NETDEV WATCHDOG", 5*time.Second), "the line written 0.7 s later")
	other := filepath.Join(t.TempDir(), "other.log")
	require.NoError(t, os.WriteFile(other, []byte("roceemu-guest: ready\n"), 0o644))
	start := time.Now()
	assert.False(t, waitForFile(other, "NETDEV WATCHDOG", time.Second))
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "it waited")
	assert.False(t, waitForFile(filepath.Join(t.TempDir(), "missing.log"), "NETDEV WATCHDOG", 0))
}
