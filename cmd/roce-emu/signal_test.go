package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeSignals replaces the commands' signal source for the test: each
// run's channel is kept, in the order the runs asked, for the test to
// deliver a signal to.
type fakeSignals struct {
	mu    sync.Mutex
	chans []chan os.Signal
}

func useFakeSignals(t *testing.T) *fakeSignals {
	f := &fakeSignals{}
	old := signalSource
	signalSource = func() (<-chan os.Signal, func()) {
		c := make(chan os.Signal, 1)
		f.mu.Lock()
		f.chans = append(f.chans, c)
		f.mu.Unlock()
		return c, func() {}
	}
	t.Cleanup(func() { signalSource = old })
	return f
}

// send delivers sig to the i-th run that asked for signals.
func (f *fakeSignals) send(t *testing.T, i int, sig os.Signal) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Greater(t, len(f.chans), i)
	f.chans[i] <- sig
}

// waitFor polls cond every 10 ms until it holds, failing after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 3000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// cmMADs returns the CM messages of a capture, in order.
func cmMADs(t *testing.T, path, udpPort string) []cm.AttrID {
	t.Helper()
	r, err := pcap.Open(path)
	require.NoError(t, err)
	defer r.Close()
	d := pcap.NewDecoder()
	port, err := strconv.Atoi(udpPort)
	require.NoError(t, err)
	d.Port = uint16(port)
	var out []cm.AttrID
	for {
		data, ci, lt, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, "the capture is whole")
		var rec pcap.Record
		kind, err := d.Decode(data, ci, lt, &rec)
		require.NoError(t, err)
		if kind == pcap.KindRoCE && rec.Packet.BTH.DestQP == 1 && rec.Packet.BTH.Opcode == bth.UDSendOnly {
			h, _, err := cm.DecodeMAD(rec.Packet.Payload)
			require.NoError(t, err)
			out = append(out, h.AttrID)
		}
	}
}

// Ctrl-C on rping -c in the middle of its pings: it sends a DREQ, gets the
// DREP, closes its capture whole, prints its counters and exits 130; the
// server sees the disconnect and ends cleanly. SIGTERM on a server waiting
// for a client: exit 143.
func TestRpingSignal(t *testing.T) {
	sigs := useFakeSignals(t)
	udp := freeUDPPort(t)
	capture := filepath.Join(t.TempDir(), "client.pcap")
	s := startServer(t, []string{"rping", "-s", "-d", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7177", "-S", "64", "--timeout", "60s"}, "listening on")
	c := goRun([]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", "7177", "-v", "-V",
		"-S", "64", "--pcap", capture, "--timeout", "60s"})
	waitFor(t, "pings", func() bool { return strings.Count(c.out.String(), "ping data:") >= 5 })
	sigs.send(t, 1, os.Interrupt)
	ccode, scode := c.wait(), s.wait()
	assert.Equal(t, 130, ccode, "client: %s", c.err.String())
	assert.Contains(t, c.err.String(), "interrupted by SIGINT: DREQ sent on 1 rdma_cm connection(s), each answered with a DREP")
	assert.Contains(t, c.err.String(), "roce-emu rping: cm counters: MADs sent 3, received 2")
	assert.Contains(t, c.err.String(), "roce-emu rping: qp counters: sent ")
	assert.Equal(t, 0, scode, "server: %s", s.err.String())
	assert.Contains(t, s.err.String(), "server DISCONNECT EVENT...")
	assert.Equal(t, []cm.AttrID{cm.AttrREQ, cm.AttrREP, cm.AttrRTU, cm.AttrDREQ, cm.AttrDREP}, cmMADs(t, capture, udp))

	// SIGTERM while the server waits for a client.
	s = startServer(t, []string{"rping", "-s", "-d", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7177", "--timeout", "60s"}, "listening on")
	sigs.send(t, 2, syscall.SIGTERM)
	scode = s.wait()
	assert.Equal(t, 143, scode, "server: %s", s.err.String())
	assert.Contains(t, s.err.String(), "interrupted by SIGTERM: no rdma_cm connection was up")
}

// Ctrl-C on bw -R in the middle of a timed run: the client sends a DREQ
// on its data QP and its exchange QP, gets both DREPs, closes its capture
// whole, prints its counters and exits 130; the server learns at once
// that the client left (it does not wait for its --timeout).
func TestPerfRDMACMSignal(t *testing.T) {
	sigs := useFakeSignals(t)
	port, udp := freeTCPPort(t), freeUDPPort(t)
	capture := filepath.Join(t.TempDir(), "client.pcap")
	common := []string{"bw", "-R", "-o", "write", "-s", "4096", "-D", "60", "--udp-port", udp, "-p", port, "--timeout", "90s"}
	s := startServer(t, append(append([]string{}, common...), "--bind", "127.0.0.2"), "Waiting for client")
	c := goRun(append(append([]string{}, common...), "--bind", "127.0.0.1", "--pcap", capture, "127.0.0.2"))
	waitFor(t, "the connection", func() bool { return strings.Contains(c.out.String(), "remote address") })
	time.Sleep(500 * time.Millisecond) // traffic runs
	sigs.send(t, 1, os.Interrupt)
	ccode, scode := c.wait(), s.wait()
	assert.Equal(t, 130, ccode, "client: %s", c.err.String())
	assert.Contains(t, c.err.String(), "roce-emu bw: interrupted by SIGINT: DREQ sent on 1 rdma_cm connection(s), each answered with a DREP")
	// The exchange's DREQ is named too: the two on the wire.
	assert.Contains(t, c.err.String(), "each answered with a DREP; the exchange's connection: DREQ sent on 1 rdma_cm connection(s), each answered with a DREP")
	assert.Contains(t, c.err.String(), "roce-emu bw: cm counters: ")
	assert.Regexp(t, `roce-emu bw: qp counters: sent [1-9]`, c.err.String())
	assert.NotEqual(t, 0, scode)
	assert.NotContains(t, s.err.String(), "deadline", "the server learnt the client left before its --timeout")
	mads := cmMADs(t, capture, udp)
	count := func(a cm.AttrID) (n int) {
		for _, m := range mads {
			if m == a {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 2, count(cm.AttrDREQ), "%v", mads)
	assert.Equal(t, 2, count(cm.AttrDREP), "%v", mads)
}

// Ctrl-C on the pingpong server waiting for its client: exit 130 with its
// capture closed whole (a pcap file with its header, readable).
func TestPingpongSignal(t *testing.T) {
	sigs := useFakeSignals(t)
	capture := filepath.Join(t.TempDir(), "server.pcap")
	var sout, serr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"server", "--bind", "127.0.0.2", "--udp-port", freeUDPPort(t), "-p", freeTCPPort(t), "--pcap", capture, "--timeout", "60s"}, &sout, &serr)
	}()
	waitFor(t, "the server to start", func() bool { return strings.Contains(sout.String(), "local address") })
	sigs.send(t, 0, os.Interrupt)
	assert.Equal(t, 130, <-code, "server: %s", serr.String())
	assert.Contains(t, serr.String(), "roce-emu server: interrupted by SIGINT: stopped")
	assert.Contains(t, serr.String(), "roce-emu server: qp counters: sent 0")
	assert.Empty(t, cmMADs(t, capture, "4791"))
}

// The CM counters line names the datagrams QP1 dropped for a Q_Key other
// than the GSI's: they never reach the CM and are counted nowhere else.
func TestCMCountersQKeyViolations(t *testing.T) {
	line := cmCounters(rdmacm.Stats{QP1: qp.Counters{QKeyViolations: 3}, CM: cm.Counters{MADsReceived: 2}})
	assert.Contains(t, line, "MADs sent 0, received 2")
	assert.True(t, strings.HasSuffix(line, ", QP1 Q_Key violations 3"), line)
}
