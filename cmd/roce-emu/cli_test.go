package main

import (
	"context"
	"encoding/json"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cliCase is one command line, the exit code it must end with and a line
// it must print (on stdout when out, else on stderr), whole or, with
// prefix, its start.
type cliCase struct {
	name   string
	args   []string
	code   int
	out    bool
	line   string
	prefix bool
}

func checkCLI(t *testing.T, c cliCase) {
	t.Helper()
	code, stdout, stderr := runCLI(t, c.args...)
	assert.Equal(t, c.code, code, "exit code; stdout %q, stderr %q", stdout, stderr)
	text := stderr
	if c.out {
		text = stdout
	}
	for _, l := range strings.Split(text, "\n") {
		if l == c.line || (c.prefix && strings.HasPrefix(l, c.line)) {
			return
		}
	}
	t.Errorf("no line %q in %q (stdout %q)", c.line, text, stdout)
}

// Flags anywhere, as getopt takes them: before, between and after the
// positional arguments; "--" ends the flags. 127.0.0.9 refuses the TCP
// connection, so a command that got its host and -p says where it failed.
func TestCLIFlagsAnywhere(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	refused := func(cmd string) string {
		if cmd == "client" {
			return "roce-emu client: cannot reach the server's address exchange at 127.0.0.9:" + tcp + ": dial tcp 127.0.0.9:" + tcp + ": connect: connection refused"
		}
		return "roce-emu " + cmd + ": cannot reach the server at 127.0.0.9 port " + tcp + ": dial tcp 127.0.0.9:" + tcp + ": connect: connection refused"
	}
	for _, c := range []cliCase{
		{name: "client host first", args: []string{"client", "127.0.0.9", "-n", "10", "-p", tcp, "--udp-port", udp}, code: 1, line: refused("client")},
		{name: "client host last", args: []string{"client", "-n", "10", "-p", tcp, "--udp-port", udp, "127.0.0.9"}, code: 1, line: refused("client")},
		{name: "client host between", args: []string{"client", "-n", "10", "127.0.0.9", "-p", tcp, "--udp-port", udp}, code: 1, line: refused("client")},
		{name: "client two hosts", args: []string{"client", "127.0.0.9", "-p", tcp, "127.0.0.8"}, code: 2, line: "roce-emu client: give the server's host name or address"},
		{name: "client -- ends flags", args: []string{"client", "-p", tcp, "--udp-port", udp, "--", "127.0.0.9", "-n"}, code: 2, line: "roce-emu client: give the server's host name or address"},
		{name: "client bad flag after host", args: []string{"client", "127.0.0.9", "--nosuch"}, code: 2, line: "flag provided but not defined: -nosuch"},
		{name: "bw host first, perftest flags after", args: []string{"bw", "127.0.0.9", "-d", "rxe0", "-x", "3", "-F", "-p", tcp, "--udp-port", udp}, code: 1, line: refused("bw")},
		{name: "bw -- then host", args: []string{"bw", "-p", tcp, "--udp-port", udp, "--", "127.0.0.9"}, code: 1, line: refused("bw")},
		{name: "lat host first", args: []string{"lat", "127.0.0.9", "-o", "send", "-s", "64", "-p", tcp, "--udp-port", udp}, code: 1, line: refused("lat")},
		{name: "server argument after flags", args: []string{"server", "-p", tcp, "extra", "-n", "3"}, code: 2, line: `roce-emu server: unexpected argument "extra"`},
		{name: "rping argument", args: []string{"rping", "-s", "extra", "-C", "1"}, code: 2, line: `roce-emu rping: unexpected argument "extra"`},
		{name: "switch argument", args: []string{"switch", "extra", "--json"}, code: 2, line: `roce-emu switch: unexpected argument "extra"`},
		{name: "demo argument", args: []string{"demo", "extra", "-n", "1"}, code: 2, line: `roce-emu demo: unexpected argument "extra"`},
		{name: "dcqcn argument", args: []string{"dcqcn", "extra", "--json"}, code: 2, line: `roce-emu dcqcn: unexpected argument "extra"`},
		{name: "conform host first", args: []string{"conform", "127.0.0.9", "127.0.0.8", "--self"}, code: 2, line: "roce-emu conform: --self takes no HOST", prefix: true},
		{name: "decode file first", args: []string{"decode", "no-such.pcap", "--qp", "0x11"}, code: 1, line: "roce-emu decode: open no-such.pcap", prefix: true},
		{name: "decode -- file", args: []string{"decode", "--json", "--", "-x.pcap"}, code: 1, line: "roce-emu decode: open -x.pcap", prefix: true},
		{name: "analyze file first", args: []string{"analyze", "no-such.pcap", "--json"}, code: 1, line: "roce-emu analyze: open no-such.pcap", prefix: true},
	} {
		t.Run(c.name, func(t *testing.T) { checkCLI(t, c) })
	}
}

func TestCLIHelpVersion(t *testing.T) {
	version := "roce-emu github.com/roce-emu/roce-emu "
	for _, c := range []cliCase{
		{name: "help", args: []string{"help"}, code: 0, out: true, line: "usage: roce-emu COMMAND [flags] [args]"},
		{name: "--help", args: []string{"--help"}, code: 0, out: true, line: "usage: roce-emu COMMAND [flags] [args]"},
		{name: "help client", args: []string{"help", "client"}, code: 0, out: true, line: "usage: roce-emu client [flags] HOST"},
		{name: "client -h", args: []string{"client", "-h"}, code: 0, line: "usage: roce-emu client [flags] HOST"},
		{name: "help bw", args: []string{"help", "bw"}, code: 0, out: true, line: "usage: roce-emu bw [flags] [HOST]"},
		{name: "help lat lists perftest flags", args: []string{"help", "lat"}, code: 0, out: true, line: "  -d device", prefix: true},
		{name: "help decode", args: []string{"help", "decode"}, code: 0, out: true, line: "usage: roce-emu decode [--json] [--udp-port PORT] [--qp QPN] [--opcode OPCODE] FILE..."},
		{name: "help switch", args: []string{"help", "switch"}, code: 0, out: true, line: "usage: roce-emu switch --receiver ADDR:PORT --link PORT=SENDER:PORT [--link ...] [flags]"},
		{name: "help unknown", args: []string{"help", "nosuch"}, code: 2, line: `roce-emu help: unknown command "nosuch"; run 'roce-emu help' for the list`},
		{name: "version", args: []string{"version"}, code: 0, out: true, line: version, prefix: true},
		{name: "--version", args: []string{"--version"}, code: 0, out: true, line: version, prefix: true},
		{name: "version extra", args: []string{"version", "x"}, code: 2, line: `roce-emu version: unexpected argument "x"`},
	} {
		t.Run(c.name, func(t *testing.T) { checkCLI(t, c) })
	}
	_, out, _ := runCLI(t, "version")
	assert.True(t, strings.HasSuffix(strings.TrimSpace(out), " "+runtime.Version()), "ends with the Go version: %q", out)
	assert.Contains(t, out, "(devel)", "a test binary has no module version")
}

// An address in use gets one line that names what holds it and what to
// do.
func TestCLIAddressInUse(t *testing.T) {
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer u.Close()
	udp := strings.TrimPrefix(u.LocalAddr().String(), "127.0.0.1:")
	l, err := net.Listen("tcp", ":0")
	require.NoError(t, err)
	defer l.Close()
	tcp := strings.TrimPrefix(l.Addr().String(), "[::]:")
	for _, c := range []cliCase{
		{name: "bw udp", args: []string{"bw", "127.0.0.9", "--udp-port", udp}, code: 1,
			line: "roce-emu bw: cannot listen on 127.0.0.1 UDP port " + udp + ": listen udp4 127.0.0.1:" + udp + ": bind: address already in use (" + udpInUse + ")"},
		{name: "server udp", args: []string{"server", "--udp-port", udp}, code: 1,
			line: "roce-emu server: cannot listen on 127.0.0.1 UDP port " + udp + ": listen udp4 127.0.0.1:" + udp + ": bind: address already in use (" + udpInUse + ")"},
		{name: "bw tcp", args: []string{"bw", "-p", tcp, "--udp-port", freeUDPPort(t), "--timeout", "5s"}, code: 1,
			line: "roce-emu bw: cannot listen on TCP port " + tcp + ": listen tcp :" + tcp + ": bind: address already in use (" + tcpInUse + ")"},
		{name: "server tcp", args: []string{"server", "-p", tcp, "--udp-port", freeUDPPort(t), "--timeout", "5s"}, code: 1,
			line: "roce-emu server: cannot listen for the address exchange on TCP port " + tcp + ": listen tcp :" + tcp + ": bind: address already in use (" + tcpInUse + ")"},
	} {
		t.Run(c.name, func(t *testing.T) { checkCLI(t, c) })
	}
}

// startCLI runs a command line in the background; the channel gets its
// exit code.
func startCLI(args []string) (stdout, stderr *lockedBuffer, done chan int) {
	stdout, stderr = &lockedBuffer{}, &lockedBuffer{}
	done = make(chan int, 1)
	go func() { done <- run(args, stdout, stderr) }()
	return stdout, stderr, done
}

// waitFor waits until b holds s, failing after 10 s or when the command
// ends first.
func waitForOutput(t *testing.T, b, errb *lockedBuffer, done chan int, s string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(b.String(), s); {
		select {
		case code := <-done:
			t.Fatalf("ended with %d before printing %q: %s %s", code, s, b.String(), errb.String())
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no %q in %q", s, b.String())
	}
}

// Sides that run different tests: perftest's exchange carries neither the
// operation nor the size, so the symptoms are caught at once and named,
// instead of minutes of RNR NAKs or a bare REM_ACCESS_ERR.
func TestCLIPerftestMismatch(t *testing.T) {
	for _, c := range []struct {
		name           string
		server, client []string
		sline, cline   string // a line each side prints (sline "" : none checked)
	}{
		{"write server, send client", []string{"bw", "-o", "write", "-s", "4096"}, []string{"bw", "-o", "send", "-s", "4096"},
			`roce-emu bw: the peer sends SENDs, which this side's -o write -s 4096 posts no receive for \(\d+ RNR NAKs sent\): start both sides with the same -o`,
			`roce-emu bw: the peer answers this side's -o send -s 4096 with RNR NAKs \(\d+ of \d+ packets back\): it posts no receives, as a side of -o write, read or atomic: start both sides with the same -o`},
		{"read server, send client", []string{"bw", "-o", "read", "-s", "4096"}, []string{"bw", "-o", "send", "-s", "4096"},
			`roce-emu bw: the peer sends SENDs, which this side's -o read -s 4096 posts no receive for \(\d+ RNR NAKs sent\): start both sides with the same -o`,
			`roce-emu bw: the peer answers this side's -o send -s 4096 with RNR NAKs \(\d+ of \d+ packets back\): it posts no receives, as a side of -o write, read or atomic: start both sides with the same -o`},
		{"smaller server", []string{"bw", "-o", "write", "-s", "4096"}, []string{"bw", "-o", "write", "-s", "65536"}, "",
			`roce-emu bw: after 0 of 1000 completions: work completion REM_ACCESS_ERR .* \(the peer refused a request of -s 65536 with a remote access error: its buffer is smaller, or it runs another -o: start both sides with the same -o and -s\)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			common := []string{"-p", tcp, "--udp-port", udp, "--timeout", "20s"}
			sout, serr, sdone := startCLI(append(append(c.server, common...), "--bind", "127.0.0.2"))
			waitForOutput(t, sout, serr, sdone, "Waiting for client to connect")
			start := time.Now()
			code, _, cerr := runCLI(t, append(append(c.client, common...), "--bind", "127.0.0.1", "127.0.0.2")...)
			assert.Equal(t, 1, code)
			assert.Regexp(t, "(?m)^"+c.cline+"$", cerr)
			assert.Equal(t, 1, <-sdone)
			if c.sline != "" {
				assert.Regexp(t, "(?m)^"+c.sline+"$", serr.String())
			}
			assert.Less(t, time.Since(start), 5*time.Second, "said at once, not at --timeout")
		})
	}
}

// --json on server, client, bw and lat: stdout is one JSON object (the
// text goes to stderr), 64-bit counts are strings, rates carry their unit.
func TestCLIJSON(t *testing.T) {
	for _, c := range []struct {
		name           string
		server, client []string
		ready          string
		check          func(t *testing.T, role string, m map[string]any)
	}{
		{"pingpong", []string{"server", "-n", "50"}, []string{"client", "-n", "50"}, "local address", func(t *testing.T, role string, m map[string]any) {
			assert.Equal(t, "ibv_rc_pingpong", m["program"])
			assert.Equal(t, role, m["role"])
			assert.Equal(t, "409600", m["bytes"], "4096 bytes x 50 x 2, as a string")
			assert.Greater(t, m["bandwidth_mbit_per_sec"], 0.0)
			assert.Greater(t, m["usec_per_iter"], 0.0)
			require.IsType(t, map[string]any{}, m["counters"])
			assert.Equal(t, "250", m["counters"].(map[string]any)["sent_pkts"], "5 packets a message at MTU 1024, 50 messages")
			require.IsType(t, map[string]any{}, m["endpoint"])
			assert.Equal(t, "250", m["endpoint"].(map[string]any)["rx_datagrams"])
		}},
		{"bw", []string{"bw", "-o", "write", "-n", "50", "-s", "4096"}, []string{"bw", "-o", "write", "-n", "50", "-s", "4096"}, "Waiting for client", func(t *testing.T, role string, m map[string]any) {
			assert.Equal(t, "MB/sec", m["bw_unit"])
			require.IsType(t, map[string]any{}, m["perftest"])
			p := m["perftest"].(map[string]any)
			assert.Equal(t, "RDMA_Write_BW_Test", p["test_info"].(map[string]any)["test"])
			assert.Equal(t, 4096.0, p["results"].(map[string]any)["MsgSize"])
			k := "sent_pkts"
			if role == "server" {
				k = "rcvd_pkts"
			}
			assert.Equal(t, "200", m["counters"].(map[string]any)[k], "4 packets a WRITE at MTU 1024, 50 WRITEs")
		}},
		{"lat", []string{"lat", "-o", "send", "-n", "20", "-s", "64"}, []string{"lat", "-o", "send", "-n", "20", "-s", "64"}, "Waiting for client", func(t *testing.T, role string, m map[string]any) {
			assert.NotContains(t, m, "bw_unit")
			p := m["perftest"].(map[string]any)
			assert.Equal(t, "Send_Latency_Test", p["test_info"].(map[string]any)["test"])
			require.IsType(t, map[string]any{}, m["counters"])
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			common := []string{"-p", tcp, "--udp-port", udp, "--timeout", "20s", "--json"}
			sout, serr, sdone := startCLI(append(append(c.server, common...), "--bind", "127.0.0.2"))
			waitForOutput(t, serr, sout, sdone, c.ready)
			time.Sleep(50 * time.Millisecond)
			code, cout, cerr := runCLI(t, append(append(c.client, common...), "--bind", "127.0.0.1", "127.0.0.2")...)
			require.Equal(t, 0, code, cerr)
			require.Equal(t, 0, <-sdone, serr.String())
			for _, side := range []struct{ role, out string }{{"client", cout}, {"server", sout.String()}} {
				assert.Equal(t, 1, strings.Count(side.out, "\n"), "one line of JSON on stdout: %q", side.out)
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(side.out), &m), side.out)
				c.check(t, side.role, m)
			}
			assert.Contains(t, cerr, "local", "the text went to stderr")
		})
	}
}

// On a terminal the line is redrawn every second with the QP's counters
// and cleared at the end (here in a synctest bubble, its clock fake).
func TestCLIProgressDrawn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{})
		src := p.A.Reg(make([]byte, 5000))
		dst := p.B.Reg(make([]byte, 5000))
		p.A.PostWrite(1, src, dst)
		p.A.WaitOK(1)
		var b lockedBuffer
		stop := watchProgress(context.Background(), true, &b, p.A.QP)
		time.Sleep(2500 * time.Millisecond)
		stop()
		assert.Equal(t, "\r\x1b[K    1 s: packets sent 5, received 1, resent 0\r"+
			"\r\x1b[K    2 s: packets sent 5, received 1, resent 0\r"+
			"\r\x1b[K", b.String())

		b.Reset()
		stop = watchProgress(context.Background(), false, &b, p.A.QP)
		time.Sleep(2500 * time.Millisecond)
		stop()
		assert.Empty(t, b.String(), "off a terminal: nothing")
	})
}

// demo --json: a row per line of the table, the totals and counters, all
// 64-bit counts as strings; the table itself goes to stderr.
func TestCLIDemoJSON(t *testing.T) {
	code, out, errOut := runCLI(t, "demo", "-n", "1", "--pcap", "", "--json", "--udp-port", freeUDPPort(t))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "every byte and every completion checked", "the text on stderr")
	assert.Equal(t, 1, strings.Count(out, "\n"))
	var rec struct {
		Rows []map[string]any `json:"rows"`
		demoRecord
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Len(t, rec.Rows, 38, "2 rounds of 3 operations x 6 sizes and the atomics")
	first, atomics := rec.Rows[0], rec.Rows[18]
	assert.Equal(t, "SEND", first["operation"])
	assert.Equal(t, 1.0, first["size"])
	assert.Equal(t, 0.0, first["loss"])
	assert.IsType(t, "", first["retransmitted_pkts"])
	assert.Contains(t, first, "bandwidth_gbit_per_sec")
	assert.Equal(t, "FETCH_ADD+CMP_SWP", atomics["operation"])
	assert.NotContains(t, atomics, "bandwidth_gbit_per_sec", "no rate for atomics, as the table's -")
	assert.Equal(t, 0.02, rec.Rows[19]["loss"])
	assert.Equal(t, 40, rec.Messages)
	assert.Equal(t, strconv.Itoa(2*(1+1023+1024+1025+65536+1<<20)*3), rec.Bytes)
	assert.IsType(t, "", rec.Requester["sent_pkts"])
	assert.IsType(t, "", rec.Endpoint["rx_datagrams"])
	assert.Empty(t, rec.Capture)
}

// A requester window a QP cannot take is refused before anything starts,
// with the flag named and the range given.
func TestCLIUnackedPSNsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"bw", "--bind", "127.0.0.1", "--unacked-psns", "0"},
		{"lat", "--bind", "127.0.0.1", "--unacked-psns", "-3"},
		{"client", "--bind", "127.0.0.1", "--unacked-psns", "4194305", "127.0.0.2"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		assert.Equal(t, 2, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, "--unacked-psns "+args[4]+": give the RC requester's window in PSNs, 1 to 4194304 (rxe's is 128)", "%v", args)
		assert.Empty(t, stdout, "%v: nothing runs", args)
	}
}

// Durations a run cannot use are refused before anything starts, with
// the flag named: a negative --exchange-timeout turned the bound off, and
// a --peer-timeout under 10ns panicked (a ticker of interval 0).
func TestCLIDurationFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"server", "--bind", "127.0.0.1", "--exchange-timeout", "-1s"}, "--exchange-timeout -1s: must not be negative (0: no bound)"},
		{[]string{"bw", "--bind", "127.0.0.1", "--exchange-timeout", "-5m"}, "--exchange-timeout -5m0s: must not be negative (0: no bound)"},
		{[]string{"client", "--bind", "127.0.0.1", "--peer-timeout", "5ns", "127.0.0.2"}, "--peer-timeout 5ns: give 0 (never) or at least 1ms"},
		{[]string{"lat", "--bind", "127.0.0.1", "--peer-timeout", "-1s"}, "--peer-timeout -1s: give 0 (never) or at least 1ms"},
		{[]string{"rping", "-s", "--bind", "127.0.0.1", "--peer-timeout", "500us"}, "--peer-timeout 500µs: give 0 (never) or at least 1ms"},
	} {
		code, stdout, stderr := runCLI(t, c.args...)
		assert.Equal(t, 2, code, "%v: %s", c.args, stderr)
		assert.Contains(t, stderr, c.want, "%v", c.args)
		assert.Empty(t, stdout, "%v: nothing runs", c.args)
	}
}
