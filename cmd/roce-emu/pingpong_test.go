package main

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"sync"
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
		{"server", "extra"},
	} {
		var o, e bytes.Buffer
		code := run(args, &o, &e)
		assert.NotEqual(t, 0, code, "%v", args)
		assert.NotEmpty(t, e.String(), "%v", args)
		assert.NotContains(t, e.String(), "panic", "%v", args)
	}
}
