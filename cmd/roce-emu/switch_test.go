//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/internal/incast"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freeUDPPortOn returns a UDP port that was free on addr a moment ago.
func freeUDPPortOn(t *testing.T, addr string) uint16 {
	t.Helper()
	c, err := net.ListenPacket("udp", addr+":0")
	require.NoError(t, err)
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// `roce-emu switch`, run as the command with its flags, between two
// roce-emu senders with DCQCN and one receiver over UDP on loopback: the
// switch marks CE at its 200 Mb/s egress, the receiver's QPs send CNPs back
// through it, the senders cut their rates, and the switch's printed counters
// agree with the receiver's.
func TestSwitchCommandDCQCN(t *testing.T) {
	rc, err := transport.ListenUDP(netip.MustParseAddrPort("127.0.0.2:0"), transport.UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	recv := transport.NewEndpoint(rc, transport.Options{ICRC: transport.ICRCAssumeID0})
	defer recv.Close()
	var senders []transport.Conn
	for _, a := range []string{"127.0.0.1", "127.0.0.3"} {
		c, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), transport.UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		senders = append(senders, c)
	}
	// An address no other test uses, so that ports picked here stay free
	// (transport's tests bind ephemeral ports on 127.0.0.100).
	const swAddr = "127.0.0.151"
	var (
		ports  []uint16
		stdout = &lockedBuffer{}
		stderr = &lockedBuffer{}
		done   chan int
	)
	// A port found free may be taken before the switch binds it; then try
	// other ports.
	for attempt := 0; ; attempt++ {
		ports = []uint16{freeUDPPortOn(t, swAddr), freeUDPPortOn(t, swAddr)}
		if ports[0] == ports[1] {
			continue
		}
		args := []string{"--addr", swAddr, "--receiver", rc.LocalAddr().String(), "--rate", "200Mbps",
			"--kmin", "5000", "--kmax", "50000", "--pmax", "0.1", "--buffer", "4194304", "--duration", "3s", "--json"}
		for i, c := range senders {
			args = append(args, "--link", fmt.Sprintf("%d=%s", ports[i], c.LocalAddr()))
		}
		stdout.Reset()
		stderr.Reset()
		done = make(chan int, 1)
		go func() { done <- runSwitch(args, stdout, stderr) }()
		// The switch prints its ports once it has bound them.
		bound := false
		for deadline := time.Now().Add(10 * time.Second); !bound && time.Now().Before(deadline); {
			// With --json the banner goes to stderr: stdout is JSON alone.
			if strings.Count(stderr.String(), "<-> sender") == len(ports) {
				bound = true
				break
			}
			select {
			case code := <-done:
				if strings.Contains(stderr.String(), "address already in use") && attempt < 5 {
					t.Logf("attempt %d: %s", attempt, stderr.String())
					deadline = time.Time{}
					continue
				}
				t.Fatalf("switch exited with %d before binding: %s", code, stderr.String())
			case <-time.After(10 * time.Millisecond):
			}
		}
		if bound {
			break
		}
		require.Less(t, attempt, 5, "the switch did not bind its ports: %s", stderr.String())
	}

	params, err := cc.Profile(cc.ProfilePaper, 200*cc.Mbps)
	require.NoError(t, err)
	params.MinTimeBetweenCNPs = 20 * time.Microsecond
	var eps []*transport.Endpoint
	for _, c := range senders {
		ep := transport.NewEndpoint(c, transport.Options{ICRC: transport.ICRCAssumeID0})
		defer ep.Close()
		eps = append(eps, ep)
	}
	// Both ends of pair i talk to switch port i.
	toSwitch := func(i int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(swAddr), ports[i]) }
	ss := incast.Start(t, incast.Setup{Recv: recv, Senders: eps, Params: &params, PSN: 0x10,
		Attr: transport.ConnectAttr{Timeout: 12}, Size: 256 << 10, WRs: 4, SenderPeer: toSwitch, RecvPeer: toSwitch})
	incast.Wait(t, ss, 4)
	code := <-done
	require.Equal(t, 0, code, "stderr: %s", stderr.String())

	// The last line is the switch's counters as JSON.
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	for _, l := range lines {
		require.True(t, json.Valid([]byte(l)), "--json: every line of stdout is JSON: %q", l)
	}
	var st transport.SwitchStats
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &st), "output: %s", stdout.String())
	// The receiver's QPs wrote the data from its Endpoint's read loop, and
	// the ACKs that completed the WRITEs crossed the kernel, which the race
	// detector does not see: closing the Endpoint waits for the read loop
	// and orders its writes before the reads below.
	require.NoError(t, recv.Close())
	var marked, cnps, handled uint64
	// The receiver wrote Dst; what it wrote before the ACKs the senders
	// saw is ordered before what follows its Sync (over sockets the race
	// detector sees no order otherwise).
	recv.Sync()
	for i, s := range ss {
		// Under the receiver's lock: a late duplicate WRITE may still be
		// landing (the race detector saw one on a loaded machine).
		same := false
		recv.Locked(func() { same = bytes.Equal(s.Src, s.Dst) })
		assert.True(t, same, "sender %d data", i)
		rcnt, scnt := s.RQ.Counters(), s.Q.Counters()
		marked += rcnt.NPECNMarked
		cnps += rcnt.NPCNPSent
		handled += scnt.RPCNPHandled + scnt.RPCNPIgnored
		t.Logf("sender %d: rp_cnp_handled %d, lowest rate %v; its receiver QP: np_ecn_marked_roce_packets %d, np_cnp_sent %d",
			i, scnt.RPCNPHandled, s.Q.CCLowestRate(), rcnt.NPECNMarked, rcnt.NPCNPSent)
		assert.NotZero(t, scnt.RPCNPHandled, "sender %d handled CNPs", i)
		assert.Less(t, float64(s.Q.CCLowestRate()), 0.75*float64(params.LineRate), "sender %d cut its rate", i)
	}
	t.Logf("switch: %+v", st)
	assert.NotZero(t, st.Marked, "the switch marked CE")
	// Every CE mark the switch made reached a receiver QP (no drops, no
	// bad ICRCs on loopback), and every CNP went back through the switch.
	assert.Zero(t, st.Dropped)
	assert.Equal(t, st.Marked, marked, "CE marks: switch vs receiver")
	assert.Equal(t, cnps, handled, "CNPs sent vs handled")
	assert.GreaterOrEqual(t, st.Returned, cnps, "CNPs went back through the switch")
	assert.Zero(t, recv.Stats().BadICRC)
}

func TestSwitchBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--link", "5001=127.0.0.1:4791"}, "--receiver"},
		{[]string{"--receiver", "127.0.0.2:4791"}, "no --link"},
		{[]string{"--receiver", "127.0.0.2:4791", "--link", "5001"}, "PORT=SENDER_ADDRESS:SENDER_PORT"},
		{[]string{"--receiver", "127.0.0.2:4791", "--link", "0=127.0.0.1:4791"}, "PORT=SENDER_ADDRESS:SENDER_PORT"},
		{[]string{"--receiver", "127.0.0.2:4791", "--link", "5001=127.0.0.1:4791", "--rate", "fast"}, "--rate"},
		{[]string{"--receiver", "127.0.0.2:4791", "--link", "5001=127.0.0.1:4791", "--addr", "switch"}, "--addr"},
		{[]string{"--receiver", "127.0.0.2:4791", "--link", "5001=127.0.0.1:4791", "--kmin", "9000", "--kmax", "100"}, "roce-emu switch:"},
		{[]string{"--receiver", "127.0.0.2:4791", "--receiver", "127.0.0.2:4792", "--link", "5001=127.0.0.1:4791"}, "2 --receiver for 1 --link"},
		{[]string{"--receiver", "127.0.0.2", "--link", "5001=127.0.0.1:4791"}, "--receiver \"127.0.0.2\""},
		{[]string{"--receiver", "127.0.0.2:4791", "--link", "5001=127.0.0.1:4791", "--pfc", "--hold-bytes", "0"}, "--hold-bytes"},
	} {
		var stdout, stderr bytes.Buffer
		code := runSwitch(tc.args, &stdout, &stderr)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%v", tc.args)
		assert.Empty(t, stdout.String(), "%v: nothing runs", tc.args)
	}
}

// The command's final counters give each drop by cause: a third host's
// datagram (foreign source) and, with --pin-source-ports, one from another
// port of the sender's address (foreign port).
func TestSwitchCommandDropCauses(t *testing.T) {
	const swAddr = "127.0.0.152"
	third, err := net.ListenPacket("udp", "127.0.0.9:0")
	require.NoError(t, err)
	defer third.Close()
	other, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer other.Close()
	var stdout, stderr *lockedBuffer
	var done chan int
	var port uint16
	for attempt := 0; ; attempt++ {
		port = freeUDPPortOn(t, swAddr)
		stdout, stderr, done = &lockedBuffer{}, &lockedBuffer{}, make(chan int, 1)
		args := []string{"--addr", swAddr, "--receiver", "127.0.0.2:4791", "--link", fmt.Sprintf("%d=127.0.0.1:4791", port),
			"--pin-source-ports", "--pfc", "--hold-bytes", "1048576", "--duration", "2s"}
		go func() { done <- runSwitch(args, stdout, stderr) }()
		bound := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if strings.Contains(stdout.String(), "<-> sender") {
				bound = true
				break
			}
			if strings.Contains(stderr.String(), "address already in use") {
				break
			}
		}
		if bound {
			break
		}
		<-done
		require.Less(t, attempt, 5, "the switch did not bind its port: %s", stderr.String())
	}
	to := &net.UDPAddr{IP: net.ParseIP(swAddr), Port: int(port)}
	_, err = third.WriteTo([]byte("from a third host"), to)
	require.NoError(t, err)
	_, err = other.WriteTo([]byte("from another port"), to)
	require.NoError(t, err)
	require.Equal(t, 0, <-done, stderr.String())
	out := stdout.String()
	assert.Contains(t, out, "PFC true (hold 1048576)")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Contains(t, lines[len(lines)-1], "dropped 2 (tail 0, hold 0, foreign source 1, foreign port 1, oversize 0, send errors 0)")
}
