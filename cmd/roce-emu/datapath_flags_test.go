package main

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --busy-poll gives the Endpoint a 50 us busy-poll budget; --no-gso and
// --no-gro reach the UDP Conn's options.
func TestDatapathFlags(t *testing.T) {
	for _, c := range []struct {
		args         []string
		busy         time.Duration
		noGSO, noGRO bool
	}{
		{nil, 0, false, false},
		{[]string{"--busy-poll"}, 50 * time.Microsecond, false, false},
		{[]string{"--no-gso", "--no-gro"}, 0, true, true},
		{[]string{"--no-gro"}, 0, false, true},
	} {
		var n netFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		n.register(fs, "127.0.0.1")
		require.NoError(t, fs.Parse(c.args))
		assert.Equal(t, c.busy, n.endpointOptions().BusyPoll, "%v", c.args)
		o := n.udpOptions()
		assert.Equal(t, c.noGSO, o.NoGSO, "%v", c.args)
		assert.Equal(t, c.noGRO, o.NoGRO, "%v", c.args)
	}
}
