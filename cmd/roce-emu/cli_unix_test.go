//go:build unix

package main

import (
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A server waits for ever by default (perftest's and rc_pingpong's
// behaviour), says so with perftest's banner, and SIGTERM, like SIGINT,
// ends the wait with one line saying why.
func TestCLIServerWaitsAndSignals(t *testing.T) {
	for _, c := range []struct {
		args   []string
		banner string
		sig    syscall.Signal
		line   string
	}{
		{[]string{"bw", "-p", freeTCPPort(t), "--udp-port", freeUDPPort(t)}, "* Waiting for client to connect... *", syscall.SIGTERM,
			"roce-emu bw: interrupted by SIGTERM: stopped (no client came)"},
		{[]string{"lat", "-p", freeTCPPort(t), "--udp-port", freeUDPPort(t)}, "* Waiting for client to connect... *", syscall.SIGINT,
			"roce-emu lat: interrupted by SIGINT: stopped (no client came)"},
	} {
		t.Run(strings.Join(c.args[:1], " "), func(t *testing.T) {
			out, errb, done := startCLI(c.args)
			waitForOutput(t, out, errb, done, c.banner)
			select {
			case code := <-done:
				t.Fatalf("the server gave up (%d) with no --timeout: %s", code, errb.String())
			case <-time.After(200 * time.Millisecond):
			}
			sendSignal(t, c.sig)
			code := <-done
			// 128 + the signal, as a shell reports it (the exit status
			// signal.go gives every command a signal stops).
			assert.Equal(t, 128+int(c.sig), code)
			assert.Equal(t, c.line+"\n", errb.String())
		})
	}
}

// SIGTERM in the middle of a ping-pong ends both sides with their
// counters; the switch prints its final counters on SIGTERM as on SIGINT.
func TestCLISignalsPrintCounters(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	sout, serr, sdone := startCLI([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-n", "100000000"})
	waitForOutput(t, sout, serr, sdone, "local address")
	time.Sleep(50 * time.Millisecond) // listening
	cout, cerr, cdone := startCLI([]string{"client", "--bind", "127.0.0.1", "--udp-port", udp, "-p", tcp, "-n", "100000000", "127.0.0.2"})
	waitForOutput(t, cout, cerr, cdone, "remote address")
	time.Sleep(200 * time.Millisecond)
	sendSignal(t, syscall.SIGTERM)
	for _, side := range []struct {
		name string
		done chan int
		errb *lockedBuffer
	}{{"server", sdone, serr}, {"client", cdone, cerr}} {
		assert.Equal(t, 143, <-side.done, side.name) // 128 + SIGTERM
		assert.Regexp(t, `(?m)^roce-emu `+side.name+`: qp counters: sent [1-9][0-9]*, received [1-9][0-9]*, `, side.errb.String())
		assert.Regexp(t, `(?m)^roce-emu `+side.name+`: interrupted by SIGTERM: stopped \(after [1-9][0-9]* sends and [1-9][0-9]* receives: stopped by SIGTERM \(QP RTS; sent [1-9][0-9]*, received [1-9][0-9]*, `, side.errb.String())
		assert.Contains(t, side.errb.String(), "roce-emu "+side.name+": interrupted by SIGTERM: stopped (after ")
	}

	out, errb, done := startCLI([]string{"switch", "--addr", "127.0.0.100", "--link", freeUDPPort(t) + "=127.0.0.3:1", "--receiver", "127.0.0.4:2"})
	waitForOutput(t, out, errb, done, "<-> sender")
	time.Sleep(100 * time.Millisecond) // the switch listens for signals after printing its ports
	sendSignal(t, syscall.SIGTERM)
	select {
	case code := <-done:
		assert.Equal(t, 0, code)
	case <-time.After(10 * time.Second):
		t.Fatal("the switch did not stop on SIGTERM")
	}
	assert.Contains(t, out.String(), "\nforwarded 0, returned 0, marked CE 0, dropped 0 (tail 0, hold 0, foreign source 0, foreign port 0, oversize 0, send errors 0), pauses 0, not RoCE 0, bad ICRC 0, queue 0 B (max 0 B), held 0 B (max 0 B)\n")
}

// sendSignal sends sig to this process, which a command under test
// catches; the test catches it too, so that a command that has not yet
// asked for it fails the test instead of killing it.
func sendSignal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	c := make(chan os.Signal, 1)
	signal.Notify(c, sig)
	t.Cleanup(func() { signal.Stop(c) })
	require.NoError(t, syscall.Kill(syscall.Getpid(), sig))
}

// A dead RoCE path (here the sides' --udp-port differ): after the first
// ACK timeouts with nothing back, one line names what to check, long
// before --timeout.
func TestCLIDeadPath(t *testing.T) {
	for _, c := range []struct {
		name           string
		server, client []string
		ready          string
	}{
		{"bw", []string{"bw", "-o", "write"}, []string{"bw", "-o", "write"}, "Waiting for client to connect"},
		{"pingpong", []string{"server"}, []string{"client"}, "local address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tcp, sudp, cudp := freeTCPPort(t), freeUDPPort(t), freeUDPPort(t)
			sout, serr, sdone := startCLI(append(c.server, "-p", tcp, "--udp-port", sudp, "--bind", "127.0.0.2", "--timeout", "20s"))
			waitForOutput(t, sout, serr, sdone, c.ready)
			time.Sleep(50 * time.Millisecond) // listening
			cout, cerr, cdone := startCLI(append(c.client, "-p", tcp, "--udp-port", cudp, "--bind", "127.0.0.1", "--timeout", "20s", "127.0.0.2"))
			line := "ACK timeouts and not one RoCEv2 packet back from 127.0.0.2 UDP port " + cudp
			waitForOutput(t, cerr, cout, cdone, line)
			assert.Regexp(t, `(?m)^roce-emu: [3-9] ACK timeouts and not one RoCEv2 packet back from 127\.0\.0\.2 UDP port `+cudp+
				`: check that the peer receives RoCEv2 on UDP port `+cudp+` \(--udp-port, the same on both sides; rxe uses 4791\), that 127\.0\.0\.2, the address it announced, is its own and reachable from this side's --bind address, and that no firewall drops UDP port `+cudp+`$`, cerr.String())
			sendSignal(t, syscall.SIGINT)
			assert.Equal(t, 130, <-cdone) // 128 + SIGINT
			// Both sides run in this one process and get the one SIGINT:
			// the client, stopped by it, may close the exchange before the
			// server has seen the signal; then the server ends on the
			// closed exchange (exit 1, the peer named), not on SIGINT.
			if code := <-sdone; code != 130 {
				assert.Equal(t, 1, code, "server: %s", serr.String())
				assert.Contains(t, serr.String(), "the peer closed the connection", "server: exit 1 only for the exchange the client closed")
			}
			assert.Equal(t, 1, strings.Count(cerr.String(), "ACK timeouts and not one"), "said once")
		})
	}
}

// The progress line: drawn only on terminals, from the first column,
// cleared to its end, the cursor left at its start; shorter than a result
// line so that the next line overwrites it.
func TestCLIProgress(t *testing.T) {
	var b lockedBuffer
	assert.False(t, isTerminal(&b))
	f, err := os.CreateTemp(t.TempDir(), "out")
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, isTerminal(f), "a file is not a terminal")
	line := progressLine(12*time.Second+400*time.Millisecond, qp.Counters{SentPackets: 123456, ReceivedPackets: 123400, RetransmittedPkts: 7})
	assert.Equal(t, "   12 s: packets sent 123456, received 123400, resent 7", line)
	assert.Less(t, len(line), len(perfRule), "shorter than perftest's result lines")

	// Drawn while the run goes, cleared when it ends.
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	sout, serr, sdone := startCLI([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-n", "100000000"})
	waitForOutput(t, sout, serr, sdone, "local address")
	time.Sleep(50 * time.Millisecond)
	cout, cerr, cdone := startCLI([]string{"client", "--bind", "127.0.0.1", "--udp-port", udp, "-p", tcp, "-n", "100000000", "127.0.0.2"})
	waitForOutput(t, cout, cerr, cdone, "remote address")
	time.Sleep(100 * time.Millisecond)
	assert.NotContains(t, cerr.String(), "packets sent", "no progress line off a terminal")
	sendSignal(t, syscall.SIGINT)
	<-sdone
	<-cdone
}

// A server whose client stops (SIGSTOP: the TCP connection stays open, so
// only --peer-timeout can tell) ends with exit 1 and says why in one
// line, not followed by the "context canceled" of the exchange step the
// watcher interrupted.
func TestCLIServerPeerStopped(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
	}{
		{"bw", []string{"bw", "-D", "100"}},
		{"server", []string{"server", "-n", "100000000"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			sout, serr, sdone := startCLI(append(slices.Clone(c.args), "-p", tcp, "--udp-port", udp, "--bind", "127.0.0.2", "--peer-timeout", "2s"))
			waitForOutput(t, sout, serr, sdone, map[bool]string{true: "local address", false: "Waiting for client"}[c.name == "server"])
			time.Sleep(100 * time.Millisecond) // listening
			client := slices.Clone(c.args)
			if c.name == "server" {
				client[0] = "client"
			}
			cl, cout, cerr, cdone := startProcess(t, append(client, "-p", tcp, "--udp-port", udp, "--bind", "127.0.0.1", "127.0.0.2"))
			waitForOutput(t, cout, cerr, cdone, "remote address")
			waitForOutput(t, sout, serr, sdone, "remote address")
			time.Sleep(200 * time.Millisecond)
			require.NoError(t, cl.Process.Signal(syscall.SIGSTOP))
			defer func() { cl.Process.Kill(); <-cdone }()
			select {
			case code := <-sdone:
				assert.Equal(t, 1, code, "%s", serr.String())
			case <-time.After(30 * time.Second):
				t.Fatalf("the server still runs 30 s after its client stopped: %s", serr.String())
			}
			assert.Equal(t, 1, strings.Count(serr.String(), "not one RoCEv2 packet from the peer 127.0.0.1"), "said once: %s", serr.String())
			assert.NotContains(t, serr.String(), "context canceled")
			assert.Contains(t, serr.String(), errPeerSilent.Error())
		})
	}
}

// rping, either side, whose peer stops mid-run without a DREQ (SIGSTOP)
// ends at --peer-timeout with exit 1 and one line saying why, instead of
// waiting for ever (retry_cnt 7 never runs out).
func TestRpingPeerStopped(t *testing.T) {
	for _, stopped := range []string{"client", "server"} {
		t.Run("stopped "+stopped, func(t *testing.T) {
			udp := freeUDPPort(t)
			port := map[string]string{"client": "7301", "server": "7302"}[stopped]
			server := []string{"rping", "-s", "--bind", "127.0.0.2", "--udp-port", udp, "-p", port, "--peer-timeout", "2s"}
			client := []string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", port, "--peer-timeout", "2s"}
			var victim *exec.Cmd
			var vout *lockedBuffer
			var vdone, wdone chan int
			var werr *lockedBuffer
			if stopped == "client" {
				_, werr, wdone = startCLI(server)
				time.Sleep(300 * time.Millisecond) // listening
				victim, vout, _, vdone = startProcess(t, append(client, "-d"))
			} else {
				victim, vout, _, vdone = startProcess(t, append(server, "-d"))
				waitForOutput(t, vout, vout, vdone, "listening")
				_, werr, wdone = startCLI(client)
			}
			waitForOutput(t, vout, vout, vdone, "RDMA_CM_EVENT_ESTABLISHED")
			defer func() { victim.Process.Kill(); <-vdone }()
			time.Sleep(500 * time.Millisecond) // pinging
			require.NoError(t, victim.Process.Signal(syscall.SIGSTOP))
			stoppedAt := time.Now()
			select {
			case code := <-wdone:
				assert.Equal(t, 1, code, "%s", werr.String())
			case <-time.After(30 * time.Second):
				t.Fatalf("rping still runs 30 s after its peer stopped: %s", werr.String())
			}
			assert.GreaterOrEqual(t, time.Since(stoppedAt), 2*time.Second-300*time.Millisecond, "not before --peer-timeout")
			assert.Equal(t, 1, strings.Count(werr.String(), "roce-emu rping: not one RoCEv2 packet from the peer"), "said once: %s", werr.String())
			assert.Contains(t, werr.String(), errPeerSilent.Error())
			assert.NotContains(t, werr.String(), "context canceled")
		})
	}
}
