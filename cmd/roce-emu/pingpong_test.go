package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
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
	var wg sync.WaitGroup
	var sout, serr bytes.Buffer
	var scode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		scode = run([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-n", "200", "-s", "5000", "--timeout", "20s"}, &sout, &serr)
	}()
	var cout, cerr bytes.Buffer
	var ccode int
	for try := 0; try < 50; try++ { // the server may not be listening yet
		cout.Reset()
		cerr.Reset()
		ccode = run([]string{"client", "--bind", "127.0.0.1", "--udp-port", udp, "-p", tcp, "-n", "200", "-s", "5000", "--timeout", "20s", "127.0.0.1"}, &cout, &cerr)
		if ccode == 0 || !strings.Contains(cerr.String(), "cannot reach") {
			break
		}
	}
	wg.Wait()
	require.Equal(t, 0, ccode, "client: %s", cerr.String())
	require.Equal(t, 0, scode, "server: %s", serr.String())
	for _, o := range []string{cout.String(), sout.String()} {
		assert.Contains(t, o, "  local address:  LID 0x0000, QPN 0x")
		assert.Contains(t, o, "2000000 bytes in ")
		assert.Contains(t, o, "200 iters in ")
		assert.NotContains(t, o, "warning")
	}
	assert.Contains(t, cout.String(), "GID ::ffff:127.0.0.1")
	assert.Contains(t, cout.String(), "remote address: LID 0x0000")
	assert.Contains(t, cout.String(), "GID ::ffff:127.0.0.2")
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
	var wg sync.WaitGroup
	var so, se bytes.Buffer
	var scode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		scode = run(append(append([]string{"server", "--bind", "127.0.0.2"}, common...), serverArgs...), &so, &se)
	}()
	var co, ce bytes.Buffer
	var ccode int
	for try := 0; try < 50; try++ {
		co.Reset()
		ce.Reset()
		ccode = run(append(append(append([]string{"client", "--bind", "127.0.0.1"}, common...), clientArgs...), "127.0.0.1"), &co, &ce)
		if ccode == 0 || !strings.Contains(ce.String(), "cannot reach") {
			break
		}
	}
	wg.Wait()
	require.Equal(t, 0, ccode, "client: %s", ce.String())
	require.Equal(t, 0, scode, "server: %s", se.String())
	return so.String(), co.String()
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
