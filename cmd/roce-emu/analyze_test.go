package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAnalyzeJSON(t *testing.T) {
	t.Parallel()
	wrap := caseFile("messages-count-includes-resends-psn-wrap.pcap")
	ud := caseFile("ud-two-srcqp-one-dqp-spurious-retransmits.pcap")
	code, out, errOut := runCLI(t, "analyze", "--json", wrap, ud)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 2, "one object per file")
	var rep struct {
		File        string `json:"file"`
		Connections []struct {
			Transport            string `json:"transport"`
			Requester            string `json:"requester"`
			Responder            string `json:"responder"`
			Messages             int    `json:"messages"`
			RetransmittedPackets int    `json:"retransmitted_packets"`
			Bytes                string `json:"bytes"`
			GBNEpisodes          []struct {
				Cause            string  `json:"cause"`
				StartFrame       int     `json:"start_frame"`
				FirstResendFrame int     `json:"first_resend_frame"`
				DelayUs          float64 `json:"delay_us"`
				PacketsResent    int     `json:"packets_resent"`
			} `json:"gbn_episodes"`
			RTT struct {
				P50 *float64 `json:"p50"`
				P99 *float64 `json:"p99"`
			} `json:"rtt_us"`
			CEMarked *int `json:"ce_marked"`
			CNPs     *int `json:"cnps"`
		} `json:"connections"`
		Summary map[string]any `json:"summary"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rep))
	assert.Equal(t, wrap, rep.File)
	require.Len(t, rep.Connections, 1)
	c := rep.Connections[0]
	assert.Equal(t, "RC", c.Transport)
	assert.Equal(t, "10.1.0.1/0x000022", c.Requester)
	assert.Equal(t, "10.1.0.2/0x000011", c.Responder)
	assert.Equal(t, 4, c.Messages)
	assert.Equal(t, 2, c.RetransmittedPackets)
	assert.Equal(t, "32", c.Bytes)
	require.Len(t, c.GBNEpisodes, 1)
	assert.Equal(t, "NAK", c.GBNEpisodes[0].Cause)
	assert.Equal(t, 5, c.GBNEpisodes[0].StartFrame)
	assert.Equal(t, 6, c.GBNEpisodes[0].FirstResendFrame)
	assert.Equal(t, 1.0, c.GBNEpisodes[0].DelayUs)
	assert.Equal(t, 2, c.GBNEpisodes[0].PacketsResent)
	require.NotNil(t, c.RTT.P50)
	require.NotNil(t, c.CEMarked)
	require.NotNil(t, c.CNPs)
	assert.Equal(t, 1.0, rep.Summary["gbn_episodes"])

	require.NoError(t, json.Unmarshal([]byte(lines[1]), &rep))
	require.Len(t, rep.Connections, 2)
	for _, c := range rep.Connections {
		assert.Equal(t, "UD", c.Transport)
		assert.Zero(t, c.RetransmittedPackets)
	}
}

func TestAnalyzeText(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "analyze", caseFile("rxe-qpn-reuse-second-run.pcap"))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "40 frames, 40 RoCEv2 packets, 0 malformed, 0 non-RoCE, 0 bad ICRC over 0.039000 s: 2 connections\n")
	assert.Contains(t, out, "connection 2: RC 10.2.0.5/0x000011 -> 10.2.0.4/0x000011 (epoch 1: QPN reused)\n")
	assert.Contains(t, out, "  requests: 10 packets, 10 messages SEND=10, 640 bytes, PSN 1048576..1048585 (10)\n")
	assert.Contains(t, out, "  retransmitted: 0 packets, 0 bytes, in 0 go-back-N episodes (0 after ACK timeouts), 0 duplicates\n")

	code, out, errOut = runCLI(t, "analyze", caseFile("messages-count-includes-resends-psn-wrap.pcap"))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "    NAK      frame 5 -> resend frame 6 after 1.0 us: from PSN 0 (ONLY), 2 packets, 16 bytes\n")
}

func TestAnalyzeErrors(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "analyze")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "no capture file given")

	missing := filepath.Join(t.TempDir(), "missing.pcap")
	code, _, errOut = runCLI(t, "analyze", missing)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, missing)

	code, _, errOut = runCLI(t, "analyze", "--max-connections", "0", caseFile("icrc-field-byte-order-vs-tshark.pcap"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--max-connections")

	// A capture cut inside a record: what was read is reported, then the
	// error.
	data := captureBytes(t, goodFrame(t, 1, 16), goodFrame(t, 2, 16))
	cut := writeTemp(t, "cut.pcap", data[:len(data)-5])
	code, out, errOut = runCLI(t, "analyze", cut)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "1 RoCEv2 packets")
	assert.Contains(t, errOut, "truncated")
}

func TestAnalyzePlots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, _, errOut := runCLI(t, "analyze", "--plot", dir, "--ladder", "1-8", caseFile("messages-count-includes-resends-psn-wrap.pcap"))
	require.Equal(t, 0, code, errOut)
	for _, f := range []string{"messages-count-includes-resends-psn-wrap-conn1.png", "messages-count-includes-resends-psn-wrap-ladder.png"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		assert.True(t, bytes.HasPrefix(b, []byte("\x89PNG")), f)
	}
	code, _, errOut = runCLI(t, "analyze", "--plot", dir, "--svg", caseFile("ud-two-srcqp-one-dqp-spurious-retransmits.pcap"))
	require.Equal(t, 0, code, errOut)
	b, err := os.ReadFile(filepath.Join(dir, "ud-two-srcqp-one-dqp-spurious-retransmits-conn2.svg"))
	require.NoError(t, err)
	assert.Contains(t, string(b), "<svg")

	code, _, errOut = runCLI(t, "analyze", "--ladder", "5-1", "--plot", dir, caseFile("icrc-field-byte-order-vs-tshark.pcap"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--ladder")
	code, _, errOut = runCLI(t, "analyze", "--ladder", "1-2", caseFile("icrc-field-byte-order-vs-tshark.pcap"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "needs --plot")
}

// The text report has a line per rdma_cm exchange.
func TestAnalyzeTextCM(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "analyze", filepath.Join(sharedPcaps(t), "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "CM 192.168.65.5/0x000011 -> 192.168.65.4 service 0x0000000001061d2f: REQ #1, REP #2 from QP 0x000011, RTU #3 (set up in 4112 us), DREQ #11 from the active side, DREP #12: disconnected\n")
}
