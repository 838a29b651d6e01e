package main

import (
	"bytes"
	"net"
	"os/exec"
	"path/filepath"
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
