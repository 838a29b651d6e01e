package main

import (
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helperEnv marks a process that is roce-emu run by startProcess (this
// test binary again, TestHelperRoceEmu, its command line after "--"), for
// the tests that kill a peer outright.
const helperEnv = "ROCE_EMU_HELPER"

// TestHelperRoceEmu is roce-emu itself when run by startProcess; otherwise
// it does nothing.
func TestHelperRoceEmu(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	for i, a := range os.Args {
		if a == "--" {
			os.Exit(run(os.Args[i+1:], os.Stdout, os.Stderr))
		}
	}
	os.Exit(2)
}

// startProcess runs roce-emu with args in a process of its own, killed
// at the end of the test if still running.
func startProcess(t *testing.T, args []string) (cmd *exec.Cmd, stdout, stderr *lockedBuffer, done chan int) {
	t.Helper()
	stdout, stderr = &lockedBuffer{}, &lockedBuffer{}
	cmd = exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperRoceEmu$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	require.NoError(t, cmd.Start())
	done = make(chan int, 1)
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		done <- cmd.ProcessState.ExitCode()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	return cmd, stdout, stderr, done
}

// A client whose server is killed in the middle of the run ends, after
// --peer-timeout without a packet from it, with an error and one line
// naming what to check, instead of retrying for ever (retry_cnt 7 never
// runs out, the servers wait for ever and --timeout is off by default).
func TestCLIPeerKilled(t *testing.T) {
	for _, c := range []struct {
		name           string
		server, client []string
		ready          string // what the client prints once traffic runs
	}{
		{"client", []string{"server", "-n", "100000000"}, []string{"client", "-n", "100000000"}, "remote address"},
		{"bw", []string{"bw", "-D", "100"}, []string{"bw", "-D", "100"}, "remote address"},
		// The latency tests keep a time per iteration: -n sizes that.
		{"lat", []string{"lat", "-o", "send", "-n", "1000000"}, []string{"lat", "-o", "send", "-n", "1000000"}, "remote address"},
		{"lat write", []string{"lat", "-n", "1000000"}, []string{"lat", "-n", "1000000"}, "remote address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			srv, sout, serr, sdone := startProcess(t, append(c.server, "-p", tcp, "--udp-port", udp, "--bind", "127.0.0.2"))
			waitForOutput(t, sout, serr, sdone, map[bool]string{true: "local address", false: "Waiting for client"}[c.name == "client"])
			time.Sleep(100 * time.Millisecond) // listening
			cout, cerr, cdone := startCLI(append(c.client, "-p", tcp, "--udp-port", udp, "--bind", "127.0.0.1", "--peer-timeout", "2s", "127.0.0.2"))
			// Up to 30 s: the exchange before traffic is slow under -race
			// on a loaded machine.
			for deadline := time.Now().Add(30 * time.Second); !strings.Contains(cout.String(), c.ready); {
				select {
				case code := <-cdone:
					t.Fatalf("the client ended with %d before traffic: %s %s", code, cout.String(), cerr.String())
				case <-time.After(10 * time.Millisecond):
				}
				require.True(t, time.Now().Before(deadline), "no %q in %q", c.ready, cout.String())
			}
			time.Sleep(200 * time.Millisecond)
			killed := time.Now()
			require.NoError(t, srv.Process.Kill())
			<-sdone
			select {
			case code := <-cdone:
				assert.Equal(t, 1, code, "%s", cerr.String())
			case <-time.After(30 * time.Second):
				var stacks strings.Builder
				pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				t.Fatalf("the client still runs 30 s after its server was killed: %s\n%s", cerr.String(), stacks.String())
			}
			// The silence counts from the watcher's poll (every tenth of
			// the timeout) that last saw a packet, before the kill.
			assert.GreaterOrEqual(t, time.Since(killed), 2*time.Second-200*time.Millisecond, "not before --peer-timeout")
			assert.Regexp(t, `(?m)^roce-emu `+c.client[0]+`: not one RoCEv2 packet from the peer 127\.0\.0\.2 UDP port `+udp+
				` for 2s \([0-9]+ work requests outstanding, [0-9]+ ACK timeouts, [0-9]+ packets resent\): the peer has stopped or the path is dead: `+
				`check that the peer still runs, that 127\.0\.0\.2 is reachable from this side's --bind address, that both sides use the same --udp-port, `+
				`and that no firewall drops UDP port `+udp+` \(--peer-timeout sets this wait, 0 never ends it\)$`, cerr.String())
			assert.Equal(t, 1, strings.Count(cerr.String(), "not one RoCEv2 packet from the peer"), "said once: %s", cerr.String())
			assert.Contains(t, cerr.String(), errPeerSilent.Error())
		})
	}
}
