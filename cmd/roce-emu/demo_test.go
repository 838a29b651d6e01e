package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func freeUDPPort(t *testing.T) string {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return strings.TrimPrefix(c.LocalAddr().String(), "127.0.0.1:")
}

// tsharkHeuristicOff are Wireshark 4.0's payload guessers that throw on
// valid short RDMA payloads (RPC-over-RDMA on SENDs under 16 bytes,
// Ethernet-over-IB and Mellanox EoIB on small or empty ones). The RDMA
// payloads roce-emu sends are test data, not those protocols.
var tsharkHeuristicOff = []string{"--disable-heuristic", "rpcrdma_infiniband", "--disable-heuristic", "eth_over_ib", "--disable-heuristic", "mellanox_eoib"}

func TestDemo(t *testing.T) {
	capture := filepath.Join(t.TempDir(), "demo.pcap")
	port := freeUDPPort(t)
	var out, errb bytes.Buffer
	code := run([]string{"demo", "-n", "2", "--udp-port", port, "--pcap", capture}, &out, &errb)
	require.Equal(t, 0, code, "stderr: %s", errb.String())
	s := out.String()
	assert.Contains(t, s, "every byte and every completion checked")
	assert.Equal(t, 2*(3*6+1), strings.Count(s, "verified"), "18 rounds and the atomics, on the clean and the lossy link")
	assert.Contains(t, s, ", 0 bad ICRC")
	// The legend under the table explains every column, go-back-N included.
	legend := s[strings.Index(s, "\nloss       "):]
	for _, col := range []string{"loss", "operation", "bytes", "time", "retrans", "seqNAK", "timeout", "implied", "data"} {
		assert.Regexp(t, "(?m)^"+col+" +\\S", legend, "the legend explains %s", col)
	}
	assert.Contains(t, legend, "0 is the\n           clean round, 0.02 the lossy one")
	assert.Contains(t, legend, "go-back-N")
	assert.Contains(t, legend, "resends every packet from the first unacknowledged PSN")
	// The capture is bounded by default, and says how much it holds.
	assert.Regexp(t, `It holds all \d+ packets \([0-9.]+ MiB, under its 64.0 MiB limit, --pcap-limit\)\.|The capture stopped at its 64.0 MiB limit`, s)

	// Our decoder: every packet RoCEv2 with a valid ICRC.
	out.Reset()
	require.Equal(t, 0, run([]string{"decode", "--udp-port", port, capture}, &out, &errb))
	sum := out.String()[strings.Index(out.String(), "summary:"):]
	assert.Contains(t, sum, " 0 malformed, 0 non-RoCE skipped, 0 bad ICRC, 0 ICRC unchecked")
	assert.Contains(t, sum, "NAK_PSN_SEQ", "the lossy round made sequence NAKs")

	// tshark: no malformed packets or expert errors.
	tshark := testenv.Tool(t, "tshark", "apt-get install -y tshark")
	args := append([]string{"-r", capture, "-o", "infiniband.rroce.port:" + port, "-q", "-z", "expert,error"}, tsharkHeuristicOff...)
	o, err := exec.Command(tshark, args...).CombinedOutput()
	require.NoError(t, err, "%s", o)
	assert.NotContains(t, string(o), "Malformed", "%s", o)
	assert.NotContains(t, string(o), "Errors (", "%s", o)
	// And tshark sees as many RoCE frames as we do.
	o, err = exec.Command(tshark, "-r", capture, "-o", "infiniband.rroce.port:"+port, "-Y", "infiniband", "-T", "fields", "-e", "frame.number").Output()
	require.NoError(t, err)
	n := strings.Count(string(o), "\n")
	assert.Contains(t, sum, "summary: "+itoa(n)+" frames, "+itoa(n)+" RoCEv2 packets")
}

func itoa(n int) string { return strconv.Itoa(n) }

// --pcap-limit stops the capture before the file passes it, and the
// output says where and how much of the run it holds; decode reads every
// packet the demo says it wrote.
func TestDemoCaptureLimit(t *testing.T) {
	capture := filepath.Join(t.TempDir(), "demo.pcap")
	port := freeUDPPort(t)
	var out, errb bytes.Buffer
	code := run([]string{"demo", "-n", "1", "--udp-port", port, "--pcap", capture, "--pcap-limit", "1"}, &out, &errb)
	require.Equal(t, 0, code, "stderr: %s", errb.String())
	s := out.String()
	st, err := os.Stat(capture)
	require.NoError(t, err)
	assert.LessOrEqual(t, st.Size(), int64(1<<20), "the file keeps to the limit")
	assert.Greater(t, st.Size(), int64(1<<20)-10000, "it stops at the limit, not before")
	// Half the limit for each round: each says where it stopped.
	assert.Equal(t, 1, strings.Count(s, "^ the capture of this round stopped at 0.5 MiB during this row (--pcap-limit 1 MiB, half per round; 0 for none)"), "%s", s)
	assert.Equal(t, 1, strings.Count(s, "^ the capture of this round stopped at 1.0 MiB during this row (--pcap-limit 1 MiB, half per round; 0 for none)"), "%s", s)
	clean := s[:strings.Index(s, "\n0.02 ")]
	assert.Contains(t, clean, "^ the capture of this round stopped at 0.5 MiB", "the clean round's share ran out in the clean round")
	m := regexp.MustCompile(`The capture stopped at its 1.0 MiB limit \(--pcap-limit, half for each round; 0 for none\): it holds (\d+) of the (\d+) packets`).FindStringSubmatch(s)
	require.NotNil(t, m, "%s", s)
	written, _ := strconv.Atoi(m[1])
	all, _ := strconv.Atoi(m[2])
	assert.Less(t, written, all)
	out.Reset()
	require.Equal(t, 0, run([]string{"decode", "--udp-port", port, capture}, &out, &errb))
	assert.Contains(t, out.String(), "summary: "+itoa(written)+" frames, "+itoa(written)+" RoCEv2 packets")
	assert.Contains(t, out.String(), "NAK_PSN_SEQ", "the lossy round's share holds its first sequence NAKs")

	for _, bad := range []string{"-1", "2000000"} {
		out.Reset()
		errb.Reset()
		assert.Equal(t, 2, run([]string{"demo", "--pcap-limit", bad}, &out, &errb))
		assert.Contains(t, errb.String(), "--pcap-limit "+bad)
	}
}
