package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runPerfPair(t *testing.T, kind string, extra ...string) (string, string) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := append([]string{kind, "--udp-port", udp, "-p", tcp, "--timeout", "30s"}, extra...)
	var wg sync.WaitGroup
	var sout, serr bytes.Buffer
	var scode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		scode = run(append(append([]string{}, common...), "--bind", "127.0.0.2"), &sout, &serr)
	}()
	var cout, cerr bytes.Buffer
	var ccode int
	for try := 0; try < 50; try++ {
		cout.Reset()
		cerr.Reset()
		ccode = run(append(append([]string{}, common...), "--bind", "127.0.0.1", "127.0.0.1"), &cout, &cerr)
		if ccode == 0 || !strings.Contains(cerr.String(), "cannot reach") {
			break
		}
	}
	wg.Wait()
	require.Equal(t, 0, ccode, "client: %s", cerr.String())
	require.Equal(t, 0, scode, "server: %s", serr.String())
	return cout.String(), sout.String()
}

func TestBW(t *testing.T) {
	for _, op := range []string{"send", "write", "read"} {
		t.Run(op, func(t *testing.T) {
			c, s := runPerfPair(t, "bw", "-o", op, "-s", "8192", "-n", "300", "--report_gbits", "--loss", "0.01")
			assert.Contains(t, c, "BW average[Gb/sec]")
			assert.Regexp(t, `\n 8192 +300 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, c)
			if op == "send" {
				assert.Regexp(t, `\n 8192 +300 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s, "the server of a SEND test counts receives")
			}
		})
	}
}

func TestLat(t *testing.T) {
	for _, op := range []string{"send", "write", "read"} {
		t.Run(op, func(t *testing.T) {
			c, _ := runPerfPair(t, "lat", "-o", op, "-n", "50")
			assert.Contains(t, c, "t_typical[usec]")
			assert.Regexp(t, `\n 2 +50 +[0-9.]+ `, c)
		})
	}
}

func TestPerfBadFlags(t *testing.T) {
	for _, args := range [][]string{{"bw", "-o", "atomic"}, {"bw", "-s", "0"}, {"lat", "-n", "-1"}, {"bw", "a", "b"}, {"lat", "-m", "9000"}} {
		var o, e bytes.Buffer
		assert.Equal(t, 2, run(args, &o, &e), "%v", args)
		assert.NotEmpty(t, e.String())
	}
}

// A lost ACK lets the peer's reply arrive before our send completes; the
// latency test must take completions in either order.
func TestLatUnderLoss(t *testing.T) {
	for _, op := range []string{"send", "write"} {
		c, _ := runPerfPair(t, "lat", "-o", op, "-n", "60", "--fault", "drop:dir=in,opcode=ACKNOWLEDGE,nth=3", "--timeout", "30s")
		assert.Regexp(t, `\n 2 +60 +[0-9.]+ `, c, op)
	}
}

// printLat follows perftest's print_report_lat: the two largest samples
// are left out (the first exchange carries the peer's start-up) and
// t_typical is the median of the rest.
func TestPrintLatLikePerftest(t *testing.T) {
	us := time.Microsecond
	samples := []time.Duration{113000 * us, 10 * us, 12 * us, 11 * us, 13 * us, 500 * us}
	var b bytes.Buffer
	printLat(&b, 64, 7, samples)
	fields := strings.Fields(strings.Split(b.String(), "\n")[1])
	require.GreaterOrEqual(t, len(fields), 7, b.String())
	assert.Equal(t, []string{"64", "7", "10.00", "13.00", "11.50", "11.50"}, fields[:6], "bytes, iterations, t_min, t_max, t_typical, t_avg")
	b.Reset()
	printLat(&b, 64, 1, nil)
	assert.Contains(t, b.String(), "no latency sample")
}
