//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ccLine reads the congestion line bw prints after a run.
var ccLine = regexp.MustCompile(`congestion \(.*\): CE seen (\d+) \(np_ecn_marked_roce_packets\), CNPs sent (\d+) \(np_cnp_sent\), ` +
	`CNPs received (\d+) \(rp_cnp_handled (\d+), rp_cnp_ignored (\d+)\), rate cuts (\d+) \(CNPs coalesced into a pending cut (\d+)\)`)

type ccPrinted struct{ ce, cnpSent, cnpRecv, handled, ignored, cuts, coalesced uint64 }

func parseCCLine(t *testing.T, out string) ccPrinted {
	t.Helper()
	m := ccLine.FindStringSubmatch(out)
	require.NotNil(t, m, "no congestion line in:\n%s", out)
	var n [7]uint64
	for i := range n {
		v, err := strconv.ParseUint(m[i+1], 10, 64)
		require.NoError(t, err)
		n[i] = v
	}
	return ccPrinted{n[0], n[1], n[2], n[3], n[4], n[5], n[6]}
}

// The README's 2:1 incast recipe, run as written there (addresses and
// ports chosen free here): `roce-emu switch` with one link per sender and
// a receiver per link, two `bw` servers on the receiving host (one UDP port
// each), two `bw --dcqcn` senders, all with --roce-via towards their switch
// port, the switch stopped with Ctrl-C (SIGINT) once the senders are done.
// What the switch marked CE is what the servers saw, the CNPs the servers
// sent are what the senders received, and each sender cut its rate once
// per CNP (the paper's profile cuts at each CNP).
func TestIncastRecipe(t *testing.T) {
	const (
		swAddr   = "127.0.0.165"
		recvAddr = "127.0.0.162"
	)
	senderAddrs := []string{"127.0.0.161", "127.0.0.163"}
	var (
		udpRecv, udpSend []int
		tcp              []string
		swPorts          []uint16
		swOut, swErr     = &lockedBuffer{}, &lockedBuffer{}
		swDone           chan int
	)
	// A port found free may be taken before the switch binds it: then
	// try others.
	for attempt := 0; ; attempt++ {
		udpRecv, udpSend, tcp, swPorts = nil, nil, nil, nil
		for i := range 2 {
			udpRecv = append(udpRecv, int(freeUDPPortOn(t, recvAddr)))
			udpSend = append(udpSend, int(freeUDPPortOn(t, senderAddrs[i])))
			tcp = append(tcp, freeTCPPort(t))
			swPorts = append(swPorts, freeUDPPortOn(t, swAddr))
		}
		if udpRecv[0] == udpRecv[1] || swPorts[0] == swPorts[1] || tcp[0] == tcp[1] {
			continue
		}
		// Shell 1: the switch (a 200 Mb/s egress, so that a loaded
		// machine keeps up; until Ctrl-C).
		args := []string{"--addr", swAddr, "--rate", "200Mbps", "--kmin", "5000", "--kmax", "50000", "--pmax", "0.1", "--json"}
		for i := range 2 {
			args = append(args, "--link", fmt.Sprintf("%d=%s:%d", swPorts[i], senderAddrs[i], udpSend[i]),
				"--receiver", fmt.Sprintf("%s:%d", recvAddr, udpRecv[i]))
		}
		swOut.Reset()
		swErr.Reset()
		swDone = make(chan int, 1)
		go func() { swDone <- runSwitch(args, swOut, swErr) }()
		bound := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if strings.Count(swErr.String(), "<-> sender") == 2 { // --json: the banner on stderr
				bound = true
				break
			}
			select {
			case code := <-swDone:
				require.Less(t, attempt, 5, "switch exited with %d: %s", code, swErr.String())
				deadline = time.Time{}
			case <-time.After(10 * time.Millisecond):
			}
		}
		if bound {
			break
		}
		require.Less(t, attempt, 5, "the switch did not bind its ports: %s", swErr.String())
	}
	// Wait until the switch has installed its SIGINT handler: it does so
	// right after printing its ports; the senders take far longer.
	via := func(i int) string { return fmt.Sprintf("%s:%d", swAddr, swPorts[i]) }
	type run struct {
		out, err *lockedBuffer
		done     chan int
	}
	start := func(args []string) run {
		r := run{&lockedBuffer{}, &lockedBuffer{}, make(chan int, 1)}
		go func() { r.done <- runBW(args, r.out, r.err) }()
		return r
	}
	// Shell 2: the two servers on the receiving host.
	var servers, senders []run
	for i := range 2 {
		servers = append(servers, start([]string{"--bind", recvAddr, "--udp-port", strconv.Itoa(udpRecv[i]), "-p", tcp[i],
			"--roce-via", via(i), "--profile", "paper", "-m", "4096", "-n", "100", "--timeout", "60s"}))
	}
	for i, s := range servers {
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.out.String(), "Waiting for client"); {
			require.True(t, time.Now().Before(deadline), "server %d did not listen: %s", i, s.err.String())
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Shells 3 and 4: the senders.
	for i := range 2 {
		senders = append(senders, start([]string{"--bind", senderAddrs[i], "--udp-port", strconv.Itoa(udpSend[i]), "-p", tcp[i],
			"--roce-via", via(i), "--dcqcn", "--profile", "paper", "--line-rate", "200Mbps", "-m", "4096", "-u", "18", "-n", "100", "--timeout", "60s", recvAddr}))
	}
	for i, r := range append(append([]run{}, senders...), servers...) {
		select {
		case code := <-r.done:
			require.Equal(t, 0, code, "run %d: %s\n%s", i, r.err.String(), r.out.String())
		case <-time.After(60 * time.Second):
			t.Fatalf("run %d did not end: %s", i, r.out.String())
		}
	}
	// Ctrl-C on the switch: it prints its counters and exits.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	select {
	case code := <-swDone:
		require.Equal(t, 0, code, swErr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("the switch did not stop on SIGINT")
	}
	lines := strings.Split(strings.TrimSpace(swOut.String()), "\n")
	var st transport.SwitchStats
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &st), "switch output: %s", swOut.String())
	t.Logf("switch: %+v", st)

	var recv, send ccPrinted
	counters := regexp.MustCompile(` counters: sent \d+, received \d+, retransmitted (\d+).*out-of-sequence (\d+), duplicates (\d+)`)
	for i, r := range append(append([]run{}, senders...), servers...) {
		m := counters.FindStringSubmatch(r.out.String())
		require.NotNil(t, m, "run %d: %s", i, r.out.String())
		t.Logf("run %d (senders first): retransmitted %s, out-of-sequence %s, duplicates %s", i, m[1], m[2], m[3])
	}
	// A packet resent after the servers are gone would be marked and not
	// seen: with -u 18 nothing is resent unless lost, and nothing is lost.
	for i, r := range senders {
		m := counters.FindStringSubmatch(r.out.String())
		assert.Equal(t, "0", m[1], "sender %d resent nothing", i)
	}
	for i, s := range servers {
		c := parseCCLine(t, s.out.String())
		t.Logf("server %d: %+v", i, c)
		recv.ce += c.ce
		recv.cnpSent += c.cnpSent
	}
	for i, s := range senders {
		c := parseCCLine(t, s.out.String())
		t.Logf("sender %d: %+v", i, c)
		send.cnpRecv += c.cnpRecv
		assert.NotZero(t, c.cnpRecv, "sender %d received CNPs", i)
		assert.Zero(t, c.ignored, "sender %d: the reaction point acts on every CNP", i)
		assert.Equal(t, c.handled, c.cuts, "sender %d: one rate cut per CNP handled (paper)", i)
		assert.NotZero(t, c.cuts, "sender %d cut its rate", i)
	}
	assert.NotZero(t, st.Marked, "the switch marked CE")
	assert.Zero(t, st.Dropped, "the switch dropped nothing")
	assert.Zero(t, st.BadICRC)
	assert.Equal(t, st.Marked, recv.ce, "CE marks: the switch's vs what the servers saw")
	assert.NotZero(t, recv.cnpSent)
	assert.Equal(t, recv.cnpSent, send.cnpRecv, "CNPs: sent by the servers vs received by the senders")
	assert.GreaterOrEqual(t, st.Returned, recv.cnpSent, "the CNPs went back through the switch")
}

// The DCQCN flags refuse bad values at once, naming the flag.
func TestCCFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		cmd  func([]string, io.Writer, io.Writer) int
		args []string
		want string
	}{
		{runBW, []string{"--dcqcn", "--profile", "cubic"}, "--profile"},
		{runBW, []string{"--param", "rpg_ai_rate"}, "--param"},
		{runBW, []string{"--param", "no_such=1"}, "unknown parameter"},
		{runBW, []string{"--line-rate", "fast"}, "--line-rate"},
		{runBW, []string{"--roce-via", "127.0.0.100"}, "--roce-via"},
		{runBW, []string{"--roce-via", "127.0.0.100:0"}, "--roce-via"},
		{runBW, []string{"-R", "--roce-via", "127.0.0.100:5001"}, "rdma_cm"},
		{runLat, []string{"--roce-via", "host:5001"}, "--roce-via"},
		{runServer, []string{"--param", "min_time_between_cnps=soon"}, "--param"},
		{runClient, []string{"--roce-via", "0.0.0.0:5001", "127.0.0.1"}, "--roce-via"},
	} {
		var stdout, stderr bytes.Buffer
		code := tc.cmd(tc.args, &stdout, &stderr)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%v", tc.args)
	}
}

// --roce-via on the pingpong commands: server and client on different UDP
// ports, each told by --roce-via where the other's RoCEv2 packets go
// (without it each would send to the peer's address at its own
// --udp-port, where nothing listens). Both run DCQCN's reaction point and
// say so.
func TestPingpongRoCEVia(t *testing.T) {
	tcp := freeTCPPort(t)
	us, uc := freeUDPPortOn(t, "127.0.0.2"), freeUDPPortOn(t, "127.0.0.1")
	r := runPair([]string{"server", "--bind", "127.0.0.2", "--udp-port", strconv.Itoa(int(us)), "-p", tcp, "-n", "50", "--timeout", "20s",
		"--roce-via", fmt.Sprintf("127.0.0.1:%d", uc), "--dcqcn", "--cnp=false"},
		[]string{"client", "--bind", "127.0.0.1", "--udp-port", strconv.Itoa(int(uc)), "-p", tcp, "-n", "50", "--timeout", "20s",
			"--roce-via", fmt.Sprintf("127.0.0.2:%d", us), "--dcqcn", "--profile", "paper", "127.0.0.1"}, "cannot reach", nil)
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	assert.Contains(t, r.cout, "50 iters in ")
	assert.Contains(t, r.cout, fmt.Sprintf("congestion (DCQCN paper at 10Gb/s, CNPs at most one per 50µs per QP, RoCEv2 via 127.0.0.2:%d): CE seen 0", us))
	assert.Contains(t, r.sout, fmt.Sprintf("congestion (DCQCN mlx5 at 10Gb/s, no CNPs (--cnp=false), RoCEv2 via 127.0.0.1:%d): CE seen 0", uc))
}
