package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func freeTCPPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// Our client against our server, as rc_pingpong would run them.
func TestPingpongClientServer(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	r := runPair([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-n", "200", "-s", "5000", "--timeout", "20s"},
		[]string{"client", "--bind", "127.0.0.1", "--udp-port", udp, "-p", tcp, "-n", "200", "-s", "5000", "--timeout", "20s", "127.0.0.1"}, "cannot reach", nil)
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	for _, o := range []string{r.cout, r.sout} {
		assert.Contains(t, o, "  local address:  LID 0x0000, QPN 0x")
		assert.Contains(t, o, "2000000 bytes in ")
		assert.Contains(t, o, "200 iters in ")
		assert.NotContains(t, o, "warning")
	}
	assert.Contains(t, r.cout, "GID ::ffff:127.0.0.1")
	assert.Contains(t, r.cout, "remote address: LID 0x0000")
	assert.Contains(t, r.cout, "GID ::ffff:127.0.0.2")
}

func TestPingpongBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"client"},
		{"client", "-m", "1000", "x"},
		{"client", "-n", "0", "x"},
		{"client", "-g", "3", "x"},
		{"server", "--loss", "2"},
		{"server", "--fault", "explode"},
		{"server", "--bind", "not-an-ip"},
		{"server", "--bind", "::"},
		{"server", "--bind", "0.0.0.0"},
		{"server", "--bind", "::ffff:0.0.0.0"},
		{"server", "--bind", "ff02::1"},
		{"client", "--bind", "224.0.0.1", "x"},
		{"server", "extra"},
	} {
		var o, e bytes.Buffer
		code := run(args, &o, &e)
		assert.NotEqual(t, 0, code, "%v", args)
		assert.NotEmpty(t, e.String(), "%v", args)
		assert.NotContains(t, e.String(), "panic", "%v", args)
	}
}

// runPingpongPair runs our server and our client against each other with
// extra flags for each, and returns their outputs.
func runPingpongPair(t *testing.T, serverArgs, clientArgs []string) (sout, cout string) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := []string{"--udp-port", udp, "-p", tcp, "-n", "20", "-s", "10000", "--timeout", "20s"}
	r := runPair(append(append([]string{"server", "--bind", "127.0.0.2"}, common...), serverArgs...),
		append(append(append([]string{"client", "--bind", "127.0.0.1"}, common...), clientArgs...), "127.0.0.1"), "cannot reach", nil)
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	return r.sout, r.cout
}

// rc_pingpong's --chk: the client marks the first byte of each page with
// 0, the server checks the marks at the end and names the pages without
// one, in rc_pingpong's words. 10000 bytes span pages 0, 1 and 2.
func TestPingpongCheck(t *testing.T) {
	sout, cout := runPingpongPair(t, []string{"-c"}, []string{"-c", "-e"})
	assert.NotContains(t, sout, "invalid data")
	assert.NotContains(t, sout, "warning", "the page marks are what rc_pingpong sends")
	assert.NotContains(t, cout, "warning")
	assert.Contains(t, sout, "20 iters in ")

	sout, _ = runPingpongPair(t, []string{"-c"}, nil)
	assert.Contains(t, sout, "invalid data in page 0\ninvalid data in page 1\ninvalid data in page 2\n", "a client without -c leaves no marks")
	assert.NotContains(t, sout, "warning")
}

// The Endpoint's repeated send error (here EMSGSIZE, as a path MTU above
// the link's gives with DF set) is printed once, with what to change.
func TestWarnOnce(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(&warnOnce{w: &b})
	err := &net.OpError{Op: "sendmmsg", Net: "udp", Err: os.NewSyscallError("sendmmsg", syscall.EMSGSIZE)}
	for range 3 {
		log.Warn("send failed", "err", err)
	}
	log.Info("not shown")
	log.Error("read failed; endpoint stops", "err", io.EOF)
	assert.Equal(t, "roce-emu: send failed, err: sendmmsg udp: sendmmsg: message too long (a packet is larger than the link allows: lower the path MTU -m; roce-emu sets Don't Fragment) (said once)\n"+
		"roce-emu: read failed; endpoint stops, err: EOF (said once)\n", b.String())
}

// ibv_uc_pingpong between our two sides: UC QPs, nothing acknowledged.
// The RC requester's window (--unacked-psns) does nothing for UC, and the
// banner does not name it.
func TestPingpongUC(t *testing.T) {
	sout, cout := runPingpongPair(t, []string{"--connection", "UC", "-c", "--unacked-psns", "8"}, []string{"--connection", "uc", "-c", "-l", "3", "--unacked-psns", "8"})
	for _, o := range []string{sout, cout} {
		assert.NotContains(t, o, "window of", "UC has no requester's window")
		assert.Contains(t, o, "400000 bytes in ")
		assert.Contains(t, o, "20 iters in ")
		assert.NotContains(t, o, "warning")
		assert.NotContains(t, o, "invalid data")
		assert.Contains(t, o, "retransmitted 0,", "UC never retransmits")
	}
	// 20 messages of 10000 bytes at MTU 1024, 10 packets each, from each side.
	assert.Contains(t, cout, "counters: sent 200, received 200,")
}

// ibv_ud_pingpong between our two sides: one packet per message at most
// the port MTU, received after the 40-byte GRH slot.
func TestPingpongUD(t *testing.T) {
	sout, cout := runPingpongPair(t, []string{"--connection", "UD", "-s", "1024", "-c"}, []string{"--connection", "UD", "-s", "1024", "-c"})
	for _, o := range []string{sout, cout} {
		assert.Contains(t, o, "40960 bytes in ")
		assert.Contains(t, o, "20 iters in ")
		assert.Regexp(t, `local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}: GID ::ffff:127\.0\.0\.`, o, "ud_pingpong's own line")
		assert.NotContains(t, o, "warning")
		assert.NotContains(t, o, "invalid data")
		assert.Contains(t, o, "counters: sent 20, received 20,")
	}
	// Without -s, ud_pingpong's default of 1024 bytes; -m 4096 lets
	// 4096-byte datagrams through.
	sout, _ = runPingpongPair(t, []string{"--connection", "UD", "-s", "4096", "-m", "4096"}, []string{"--connection", "UD", "-s", "4096", "-m", "4096"})
	assert.Contains(t, sout, "163840 bytes in ")
	var o, e bytes.Buffer
	code := run([]string{"server", "--connection", "UD", "-s", "2048", "-m", "1024", "--udp-port", freeUDPPort(t), "-p", freeTCPPort(t)}, &o, &e)
	assert.Equal(t, 1, code)
	assert.Contains(t, e.String(), "requested size 2048 larger than the port MTU (1024)")
}

// The active MTU rxe derives from its link's MTU.
func TestLinkActiveMTU(t *testing.T) {
	for ifmtu, want := range map[int]int{1500: 1024, 9000: 4096, 65536: 4096, 1100: 512, 1104: 1024, 300: 256, 68: 256, 4176: 4096, 4175: 2048} {
		assert.Equal(t, want, linkActiveMTU(ifmtu).Bytes(), "link MTU %d", ifmtu)
	}
}

// ibv_srq_pingpong between our two sides: -q QPs share one SRQ each, 256
// address messages each way, -n exchanges in all.
func TestPingpongSRQ(t *testing.T) {
	sout, cout := runPingpongPair(t, []string{"--srq", "-c"}, []string{"--srq", "-c"})
	for _, o := range []string{sout, cout} {
		assert.Equal(t, srqPingpongQPs, strings.Count(o, "  local address:  LID 0x0000"))
		assert.Equal(t, srqPingpongQPs, strings.Count(o, "  remote address: LID 0x0000"))
		assert.Contains(t, o, "400000 bytes in ")
		assert.Contains(t, o, "20 iters in ")
		assert.NotContains(t, o, "warning")
		assert.NotContains(t, o, "invalid data")
	}
	sout, cout = runPingpongPair(t, []string{"--srq", "-q", "3", "-r", "3"}, []string{"--srq", "-q", "3", "-r", "3"})
	assert.Equal(t, 3, strings.Count(sout, "  remote address:"))
	assert.Equal(t, 3, strings.Count(cout, "  local address:"))

	// Different QP counts are refused with a reason, not left to hang.
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	r := runPair([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "--srq", "-q", "4", "--timeout", "10s"},
		[]string{"client", "--bind", "127.0.0.1", "--udp-port", udp, "-p", tcp, "--srq", "-q", "2", "--timeout", "10s", "127.0.0.1"}, "cannot reach", nil)
	assert.Equal(t, 1, r.scode)
	assert.Contains(t, r.serr, "the peer runs 2 QPs and we run 4: give both sides the same -q")
	assert.NotEmpty(t, r.cerr)
}

func TestPingpongFamilyBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"server", "--connection", "XRC"}, "want RC, UC or UD"},
		{[]string{"server", "--connection", "UD", "--srq"}, "--srq"},
		{[]string{"server", "--connection", "UC", "--srq"}, "--srq"},
		{[]string{"server", "-q", "4"}, "add --srq"},
		{[]string{"server", "--srq", "-q", "256"}, "1 to 255"},
		{[]string{"server", "--srq", "-q", "0"}, "1 to 255"},
		{[]string{"server", "--srq", "-q", "20", "-r", "10"}, "too small for 20 QPs"},
		{[]string{"server", "--srq", "-s", "0"}, "at least 1 byte"},
		{[]string{"server", "-l", "16"}, "0-15"},
	} {
		var o, e bytes.Buffer
		assert.Equal(t, 2, run(c.args, &o, &e), "%v", c.args)
		assert.Contains(t, e.String(), c.want, "%v", c.args)
	}
}

// Server and client started with different --connection types exchange
// addresses fine (the exchange carries no QP type); the first packet of
// the other service ends the receiving side at once with a hint that
// names the fix, and a side that hears nothing says what to check after
// pingpongQuiet instead of waiting for --timeout in silence.
func TestPingpongConnectionMismatch(t *testing.T) {
	for _, tc := range []struct{ server, client, serverSees, clientTimeout string }{
		{"UD", "RC", "the peer sends RC packets but this side runs UD (ibv_ud_pingpong): the peer runs ibv_rc_pingpong or ibv_srq_pingpong; start both sides with the same --connection (here --connection RC)", "7s"},
		{"RC", "UD", "the peer sends UD packets but this side runs RC (ibv_rc_pingpong): the peer runs ibv_ud_pingpong; start both sides with the same --connection (here --connection UD)", "2s"},
	} {
		t.Run(tc.server+"-"+tc.client, func(t *testing.T) {
			t.Parallel()
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			r := runPair([]string{"server", "--connection", tc.server, "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-s", "512", "--timeout", "30s"},
				[]string{"client", "--connection", tc.client, "--bind", "127.0.0.1", "--udp-port", udp, "-p", tcp, "-s", "512",
					"--timeout", tc.clientTimeout, "127.0.0.1"}, "cannot reach", nil)
			assert.Equal(t, 1, r.scode)
			assert.Contains(t, r.serr, tc.serverSees)
			assert.NotContains(t, r.serr, "deadline", "the server ended at the first packet, not at --timeout")
			assert.Equal(t, 1, r.ccode)
			if tc.client == "RC" {
				assert.Contains(t, r.cerr, "roce-emu client: no packet from the peer in 5s since the address exchange: check that both sides run the same --connection (RC, UC or UD)")
			}
		})
	}
}
