package main

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --busy-poll gives the Endpoint a 50 us busy-poll budget; --no-gso and
// --no-gro reach the UDP Conn's options; --reply-hold 0 turns the hold
// off (the library's -1).
func TestDatapathFlags(t *testing.T) {
	for _, c := range []struct {
		args         []string
		busy         time.Duration
		noGSO, noGRO bool
		hold         time.Duration
	}{
		{nil, 0, false, false, 100 * time.Microsecond},
		{[]string{"--busy-poll"}, 50 * time.Microsecond, false, false, 100 * time.Microsecond},
		{[]string{"--no-gso", "--no-gro"}, 0, true, true, 100 * time.Microsecond},
		{[]string{"--no-gro"}, 0, false, true, 100 * time.Microsecond},
		{[]string{"--reply-hold", "0"}, 0, false, false, -1},
		{[]string{"--reply-hold", "20us"}, 0, false, false, 20 * time.Microsecond},
	} {
		var n netFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		n.register(fs, "127.0.0.1")
		require.NoError(t, fs.Parse(c.args))
		assert.Equal(t, c.busy, n.endpointOptions().BusyPoll, "%v", c.args)
		assert.Equal(t, c.hold, n.endpointOptions().ReplyHold, "%v", c.args)
		o := n.udpOptions()
		assert.Equal(t, c.noGSO, o.NoGSO, "%v", c.args)
		assert.Equal(t, c.noGRO, o.NoGRO, "%v", c.args)
	}
}

// The UDP checksum is computed by default on a loopback --bind (IPv4 and
// IPv6), where GSO needs it, and not elsewhere; --udp-checksum given
// decides either way.
func TestUDPChecksumDefault(t *testing.T) {
	for _, c := range []struct {
		bind string
		args []string
		want bool
	}{
		{"127.0.0.1", nil, true},
		{"127.0.0.2", nil, true},
		{"::1", nil, true},
		{"::ffff:127.0.0.1", nil, true},
		{"192.0.2.1", nil, false},
		{"2001:db8::1", nil, false},
		{"fe80::1%lo", nil, false},
		{"127.0.0.1", []string{"--udp-checksum=false"}, false},
		{"192.0.2.1", []string{"--udp-checksum"}, true},
		{"2001:db8::1", []string{"--udp-checksum=true"}, true},
	} {
		var n netFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		n.register(fs, c.bind)
		require.NoError(t, fs.Parse(c.args))
		assert.Equal(t, c.want, n.udpOptions().ComputeUDPChecksum, "--bind %s %v", c.bind, c.args)
	}
	var n netFlags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	n.register(fs, "127.0.0.1")
	assert.Error(t, fs.Parse([]string{"--udp-checksum=maybe"}))
}

// bw and lat set GOMAXPROCS to 1 unless told: --gomaxprocs wins, a
// GOMAXPROCS environment variable is kept without it; out of range is a
// usage error.
func TestPerfGOMAXPROCS(t *testing.T) {
	assert.Equal(t, 1, perfGOMAXPROCS(false, perfProcs, ""))
	assert.Equal(t, 0, perfGOMAXPROCS(false, perfProcs, "4"), "the environment's is kept")
	assert.Equal(t, 2, perfGOMAXPROCS(true, 2, "4"), "the flag wins")
	assert.Equal(t, 0, perfGOMAXPROCS(true, 0, ""), "0: Go's default")
	for _, bad := range []string{"abc", "-3", "0", "1.5"} {
		assert.Equal(t, 1, perfGOMAXPROCS(false, perfProcs, bad), "GOMAXPROCS=%s, which Go ignores, is ignored", bad)
	}
	for _, args := range [][]string{{"bw", "--gomaxprocs", "-1"}, {"lat", "--gomaxprocs", "1025"}} {
		var o, e strings.Builder
		assert.Equal(t, 2, run(args, &o, &e), "%v", args)
		assert.Contains(t, e.String(), "--gomaxprocs")
	}
}

// --cpuprofile writes a CPU profile of the run (pprof's gzip-compressed
// protocol buffer) on one side; a file that cannot be created fails the
// run before it starts.
func TestPerfCPUProfile(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "client.prof")
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := []string{"bw", "--udp-port", udp, "-p", tcp, "--timeout", "30s", "-s", "4096", "-n", "100"}
	r := runPair(append(slices.Clone(common), "--bind", "127.0.0.2"),
		append(slices.Clone(common), "--bind", "127.0.0.1", "--cpuprofile", prof, "127.0.0.2"), "cannot reach", nil)
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	b, err := os.ReadFile(prof)
	require.NoError(t, err)
	require.Greater(t, len(b), 2)
	assert.Equal(t, []byte{0x1f, 0x8b}, b[:2], "a gzip stream, as pprof writes")

	var o, e strings.Builder
	assert.Equal(t, 1, run([]string{"bw", "--cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir", "x.prof")}, &o, &e))
	assert.Contains(t, e.String(), "--cpuprofile")
}

// --unacked-psns sets the RC requester's window: a small one (8 PSNs of
// a 64-packet message) still runs the test to the end, each window's
// last packet asking for its ACK, with no ACK timeout; the window is
// named in the congestion line.
func TestPerfUnackedPSNs(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := []string{"bw", "--udp-port", udp, "-p", tcp, "--timeout", "30s", "-s", "65536", "-n", "50", "-m", "1024"}
	r := runPair(append(slices.Clone(common), "--bind", "127.0.0.2"),
		append(slices.Clone(common), "--bind", "127.0.0.1", "--unacked-psns", "8", "127.0.0.2"), "cannot reach", nil)
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	assert.Contains(t, r.cout, "window of 8 unacknowledged PSNs")
	assert.Contains(t, r.cout, "ACK timeouts 0")
	assert.Contains(t, r.cout, "retransmitted 0")
	assert.NotContains(t, r.sout, "window of", "the server's window is its own (the default)")
}
