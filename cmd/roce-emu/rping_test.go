package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rpingLine is what rping -v prints for ping i of a buffer of size bytes:
// "rdma-ping-%d: ", then letters from 'A'+i (cycling 'A'..'z'), up to
// size-1 bytes.
func rpingLine(i, size int) string {
	b := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
	c := byte(65 + i%58)
	for len(b) < size-1 {
		b = append(b, c)
		if c++; c > 122 {
			c = 65
		}
	}
	return string(b)
}

// rpingSettle gives an rping server runPair started the time to open its
// socket: a REQ before the server's socket exists is lost, resent 6 s
// later.
func rpingSettle(*lockedBuffer) { time.Sleep(300 * time.Millisecond) }

// Our rping client against our rping server: -C pings with -V, every line
// of -v as rping prints it, both sides end cleanly.
func TestRpingClientServer(t *testing.T) {
	udp := freeUDPPort(t)
	r := runPair([]string{"rping", "-s", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7175", "-v", "-S", "100", "--timeout", "60s"},
		[]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", "7175",
			"-C", "20", "-v", "-V", "-S", "100", "--timeout", "60s"}, "REJECTED", rpingSettle) // the server may not be listening yet: a REJ
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	clines := strings.Split(strings.TrimSpace(r.cout), "\n")
	slines := strings.Split(strings.TrimSpace(r.sout), "\n")
	require.Len(t, clines, 20)
	require.Len(t, slines, 20)
	for i := range 20 {
		assert.Equal(t, "ping data: "+rpingLine(i, 100), clines[i])
		assert.Equal(t, "server ping data: "+rpingLine(i, 100), slines[i])
	}
	assert.Contains(t, r.serr, "server DISCONNECT EVENT...")
	assert.Contains(t, r.cerr, "client DISCONNECT EVENT...")
}

// rping --json on both sides: stdout is one JSON object in the shape of
// server's and client's (program, role, size, iters, bytes as a string,
// seconds, the QP's counters and the socket's, 64-bit counts as strings);
// -v's ping data goes to stderr instead.
func TestRpingJSON(t *testing.T) {
	udp := freeUDPPort(t)
	r := runPair([]string{"rping", "-s", "--json", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7176", "-S", "100", "--timeout", "60s"},
		[]string{"rping", "-c", "--json", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", "7176",
			"-C", "5", "-v", "-V", "-S", "100", "--timeout", "60s"}, "REJECTED", rpingSettle) // the server may not be listening yet: a REJ
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	assert.Contains(t, r.cerr, "ping data: "+rpingLine(4, 100), "-v goes to stderr under --json")
	for _, tc := range []struct {
		role string
		out  string
	}{{"client", r.cout}, {"server", r.sout}} {
		require.Equal(t, 1, strings.Count(tc.out, "\n"), "%s: one line of JSON: %s", tc.role, tc.out)
		var j struct {
			Program  string            `json:"program"`
			Role     string            `json:"role"`
			Size     int               `json:"size"`
			Iters    int               `json:"iters"`
			Bytes    string            `json:"bytes"`
			Seconds  float64           `json:"seconds"`
			Counters map[string]string `json:"counters"`
			Endpoint map[string]string `json:"endpoint"`
		}
		require.NoError(t, json.Unmarshal([]byte(tc.out), &j), "%s: %s", tc.role, tc.out)
		assert.Equal(t, "rping", j.Program)
		assert.Equal(t, tc.role, j.Role)
		assert.Equal(t, 100, j.Size)
		assert.Equal(t, 5, j.Iters, tc.role)
		assert.Equal(t, "1000", j.Bytes, tc.role)
		assert.Greater(t, j.Seconds, 0.0)
		sent, err := strconv.ParseUint(j.Counters["sent_pkts"], 10, 64)
		require.NoError(t, err, "%s: sent_pkts %q", tc.role, j.Counters["sent_pkts"])
		assert.NotZero(t, sent, tc.role)
		assert.Equal(t, "0", j.Counters["retransmitted_pkts"], tc.role)
		tx, err := strconv.ParseUint(j.Endpoint["tx_datagrams"], 10, 64)
		require.NoError(t, err, tc.role)
		assert.GreaterOrEqual(t, tx, sent, tc.role)
	}
}

// A client whose server does not listen on the port gets the REJ at once.
func TestRpingNoServer(t *testing.T) {
	udp := freeUDPPort(t)
	s := goRun([]string{"rping", "-s", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7176", "--timeout", "2s"})
	time.Sleep(200 * time.Millisecond)
	var cout, cerr bytes.Buffer
	start := time.Now()
	code := run([]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", "9", "-C", "1"}, &cout, &cerr)
	took := time.Since(start)
	assert.Equal(t, 1, code)
	assert.Contains(t, cerr.String(), "RDMA_CM_EVENT_REJECTED, error 8")
	assert.Less(t, took, 4*time.Second, "answered by a REJ, not by the REQ's 4 s timeout")
	s.wait()
	assert.Contains(t, s.err.String(), "context deadline exceeded", "the server waited for a client until --timeout")
}

func TestRpingBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"rping"},
		{"rping", "-s", "-c"},
		{"rping", "-c"},
		{"rping", "-c", "-a", "nowhere"},
		{"rping", "-s", "-S", "10"},
		{"rping", "-s", "-S", "65536"},
		{"rping", "-s", "-C", "-1"},
		{"rping", "-s", "-p", "70000"},
		{"rping", "-s", "extra"},
	} {
		var o, e bytes.Buffer
		code := run(args, &o, &e)
		assert.Equal(t, 2, code, "%v", args)
		assert.NotEmpty(t, e.String(), "%v", args)
	}
}

// rping -c against a roce-emu that runs no rdma_cm (the pingpong server)
// gets the REJ (invalid service ID) at once, instead of resending its REQ
// until it times out; the server says why on stderr.
func TestRpingAgainstPingpongServer(t *testing.T) {
	udp := freeUDPPort(t)
	tcp := freeTCPPort(t)
	s := goRun([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "--timeout", "3s"})
	time.Sleep(300 * time.Millisecond)
	var cout, cerr bytes.Buffer
	start := time.Now()
	code := run([]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-C", "1"}, &cout, &cerr)
	took := time.Since(start)
	assert.Equal(t, 1, code)
	assert.Contains(t, cerr.String(), "RDMA_CM_EVENT_REJECTED, error 8")
	assert.Less(t, took, 4*time.Second, "answered by a REJ, not by the REQ's 4 s timeout")
	s.wait()
	assert.Contains(t, s.err.String(), "CM REQ (rdma_cm: rping -c, perftest -R) came to QP1 and was rejected")
}

// rping -s answers REQs it cannot serve with a REJ before any REP (a GID
// that is not its address: invalid GID; a UC REQ: consumer defined) and
// goes on to serve the next client, instead of exiting.
func TestRpingServerSurvivesBadREQs(t *testing.T) {
	udp := freeUDPPort(t)
	s := startServer(t, []string{"rping", "-s", "-d", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7178", "-v", "--timeout", "60s"}, "listening on")

	port, err := strconv.Atoi(udp)
	require.NoError(t, err)
	c, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), uint16(port)), transport.UDPOptions{})
	require.NoError(t, err)
	ep := transport.NewEndpoint(c, transport.Options{})
	defer ep.Close()
	g := transporttest.NewGSI(t, ep)
	server := netip.MustParseAddr("127.0.0.2")
	for i, tc := range []struct {
		mut    func(*cm.REQ)
		reason cm.RejectReason
	}{
		{func(r *cm.REQ) { r.Primary.RemoteGID = netip.MustParseAddr("127.0.0.9") }, cm.RejInvalidGID},
		{func(r *cm.REQ) { r.TransportServiceType = cm.ServiceUC }, cm.RejConsumer},
	} {
		m := cm.NewManager(cm.Config{})
		_, err := m.Dial(time.Unix(0, 0), cm.DialParams{Local: netip.MustParseAddr("127.0.0.3"), Remote: server,
			ServiceID: cm.ServiceID(cm.PortSpaceTCP, 7178), SrcPort: 40000, QPN: 0x20})
		require.NoError(t, err)
		o, ok := m.PollMAD()
		require.True(t, ok)
		h, msg, err := cm.DecodeMAD(o.MAD[:])
		require.NoError(t, err)
		req := msg.(*cm.REQ)
		tc.mut(req)
		b, err := cm.AppendMAD(nil, h.TransactionID, req)
		require.NoError(t, err)
		g.Send(server, b)
		ans, ok := g.Recv(10 * time.Second)
		require.True(t, ok, "case %d: no answer", i)
		_, msg, err = cm.DecodeMAD(ans.MAD)
		require.NoError(t, err)
		rej, isREJ := msg.(*cm.REJ)
		require.True(t, isREJ, "case %d: %v, not a REJ", i, msg.Attr())
		assert.Equal(t, tc.reason, rej.Reason, "case %d", i)
	}

	var cout, cerr bytes.Buffer
	ccode := run([]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", "7178",
		"-C", "3", "-v", "-V", "--timeout", "60s"}, &cout, &cerr)
	scode := s.wait()
	require.Equal(t, 0, ccode, "client: %s", cerr.String())
	require.Equal(t, 0, scode, "server: %s", s.err.String())
	assert.Equal(t, 3, strings.Count(cout.String(), "ping data: "))
	assert.Contains(t, s.out.String(), "REQs refused (GID 1, transport 1, private data 0")
}

// A connection attempt given up tells the peer with a REJ, as Linux's
// rdma_destroy_id at exit: rping -c whose --timeout ends while its REQ is
// unanswered sends a REJ (timeout); rping -s stopped by SIGINT while its
// REP waits for the RTU sends a REJ (consumer defined) and says so.
func TestRpingGivingUpSendsREJ(t *testing.T) {
	sigs := useFakeSignals(t)
	udp := freeUDPPort(t)
	port, err := strconv.Atoi(udp)
	require.NoError(t, err)
	c, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), uint16(port)), transport.UDPOptions{})
	require.NoError(t, err)
	ep := transport.NewEndpoint(c, transport.Options{})
	defer ep.Close()
	g := transporttest.NewGSI(t, ep)
	recv := func(what string) cm.Message {
		t.Helper()
		m, ok := g.Recv(10 * time.Second)
		require.True(t, ok, "no %s came", what)
		_, msg, err := cm.DecodeMAD(m.MAD)
		require.NoError(t, err)
		return msg
	}

	// The client's REQ goes unanswered until its --timeout.
	var cout, cerr bytes.Buffer
	ccode := run([]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.3", "-p", "7179",
		"--timeout", "300ms"}, &cout, &cerr)
	assert.Equal(t, 1, ccode, "client: %s", cerr.String())
	req, ok := recv("REQ").(*cm.REQ)
	require.True(t, ok, "a REQ first")
	msg := recv("REJ")
	for {
		if _, again := msg.(*cm.REQ); !again {
			break
		}
		msg = recv("REJ")
	}
	rej, ok := msg.(*cm.REJ)
	require.True(t, ok, "a REJ, not %v", msg.Attr())
	assert.Equal(t, cm.RejTimeout, rej.Reason)
	assert.Equal(t, req.LocalCommID, rej.LocalCommID)

	// The server's REP waits for an RTU that never comes; SIGINT.
	s := startServer(t, []string{"rping", "-s", "-d", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7179", "--timeout", "60s"}, "listening on")
	server := netip.MustParseAddr("127.0.0.2")
	m := cm.NewManager(cm.Config{})
	_, err = m.Dial(time.Unix(0, 0), cm.DialParams{Local: netip.MustParseAddr("127.0.0.3"), Remote: server,
		ServiceID: cm.ServiceID(cm.PortSpaceTCP, 7179), SrcPort: 40000, QPN: 0x20})
	require.NoError(t, err)
	o, ok := m.PollMAD()
	require.True(t, ok)
	g.Send(server, o.MAD[:])
	rep, ok := recv("REP").(*cm.REP)
	require.True(t, ok, "a REP")
	sigs.send(t, 1, os.Interrupt)
	scode := s.wait()
	assert.Equal(t, 130, scode, "server: %s", s.err.String())
	assert.Contains(t, s.err.String(), "interrupted by SIGINT: 1 rdma_cm connection attempt(s) given up, the peer told with a REJ")
	rej, ok = recv("REJ").(*cm.REJ)
	require.True(t, ok, "a REJ")
	assert.Equal(t, cm.RejConsumer, rej.Reason)
	assert.Equal(t, rep.LocalCommID, rej.LocalCommID)
}

// rping -c whose DREP is lost (the server answered and exited) waits for
// it at most cmDisconnectWait, not through all the DREQ's retries, says
// so and ends well: the pings were done.
func TestRpingClientLostDREP(t *testing.T) {
	udp := freeUDPPort(t)
	s := startServer(t, []string{"rping", "-s", "-d", "--bind", "127.0.0.2", "--udp-port", udp, "-p", "7180", "--timeout", "60s"}, "listening on")
	var cout, cerr bytes.Buffer
	// The client's second CM MAD in is the DREP (the first the REP).
	ccode := run([]string{"rping", "-c", "--bind", "127.0.0.1", "--udp-port", udp, "-a", "127.0.0.2", "-p", "7180",
		"-C", "2", "-V", "--fault", "drop:dir=in,opcode=UD_SEND_ONLY,nth=2", "--timeout", "60s"}, &cout, &cerr)
	scode := s.wait()
	assert.Equal(t, 0, scode, "server: %s", s.err.String())
	require.Equal(t, 0, ccode, "client: %s", cerr.String())
	assert.Contains(t, cerr.String(), "client DISCONNECT: no DREP from the server within 2s; disconnected without it")
}
