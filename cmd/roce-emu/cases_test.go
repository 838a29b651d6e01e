package main

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The handed cases (testdata/cases) through the command.

func caseFile(name string) string { return filepath.Join("..", "..", "testdata", "cases", name) }

func TestDecodeCaseICRCByteOrder(t *testing.T) {
	f := decodeJSONFile(t, caseFile("icrc-field-byte-order-vs-tshark.pcap"))
	require.Len(t, f.Packets, 1)
	assert.Equal(t, "0x8809742c", f.Packets[0].ICRC, "wire bytes 88 09 74 2c, as tshark shows them")
	assert.True(t, *f.Packets[0].ICRCOK)
}

func TestDecodeCasePcapngOtherLinkType(t *testing.T) {
	code, out, errOut := runCLI(t, "decode", caseFile("pcapng-80211-interface-first.pcapng"))
	require.Equal(t, 0, code, errOut)
	assert.Empty(t, errOut)
	assert.Contains(t, out, "summary: 4 frames, 3 RoCEv2 packets, 0 malformed, 0 non-RoCE skipped")
	assert.Contains(t, out, "  other link types skipped: LINKTYPE_105=1\n")
	assert.Equal(t, 3, strings.Count(out, "RC_SEND_ONLY dqpn="))
	// Frame numbers count the skipped frame, as tshark's do.
	assert.Contains(t, out, "\n    4 ")
}

func TestDecodeCaseFragments(t *testing.T) {
	code, out, errOut := runCLI(t, "decode", caseFile("ipv4-fragmented-roce.pcap"))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "    2 ")
	assert.Contains(t, out, "RC_SEND_ONLY dqpn=0x000011 psn=1 ackreq=1 payload=64 ecn=Not-ECT icrc=ok reassembled=2\n")
	assert.Contains(t, out, "summary: 3 frames, 1 RoCEv2 packets, 0 malformed, 0 non-RoCE skipped, 0 bad ICRC")
	assert.Contains(t, out, "  ip fragments: 2 held, 1 datagrams reassembled, 1 never completed\n")
}

func TestDecodeCaseFlowTotals(t *testing.T) {
	for _, c := range []struct {
		file  string
		flows []string
	}{
		{"messages-count-includes-resends-psn-wrap.pcap", []string{
			"flow requests RC 10.1.0.1 > 10.1.0.2 dqpn=0x000011 packets=6 psn=16777214..1 messages=4 payload=48B retransmitted=2"}},
		{"ud-two-srcqp-one-dqp-spurious-retransmits.pcap", []string{
			"flow requests UD 10.1.0.1 > 10.1.0.2 sqpn=0x000100 dqpn=0x000200 packets=5 psn=100..104 messages=5 payload=160B retransmitted=0",
			"flow requests UD 10.1.0.1 > 10.1.0.2 sqpn=0x000101 dqpn=0x000200 packets=5 psn=7000..7004 messages=5 payload=160B retransmitted=0"}},
		{"rxe-qpn-reuse-second-run.pcap", []string{
			"flow requests RC 10.2.0.5 > 10.2.0.4 dqpn=0x000011 packets=10 psn=9209053..9209062 messages=10 payload=640B retransmitted=0",
			"flow requests RC 10.2.0.5 > 10.2.0.4 dqpn=0x000011 epoch=1 packets=10 psn=1048576..1048585 messages=10 payload=640B retransmitted=0"}},
	} {
		code, out, errOut := runCLI(t, "decode", caseFile(c.file))
		require.Equal(t, 0, code, errOut)
		for _, f := range c.flows {
			assert.Contains(t, out, "  "+f+"\n", c.file)
		}
		assert.NotContains(t, out, "retransmitted=1", c.file)
		assert.NotContains(t, out, "retransmitted=4", c.file)
	}
}

// A bad ICRC's text shows the wire value in tshark's order too.
func TestDecodeBadICRCByteOrder(t *testing.T) {
	bad := goodFrame(t, 41, 16)
	bad[len(bad)-1] ^= 0xFF
	wire := bad[len(bad)-4:]
	path := writeTemp(t, "badicrc.pcap", captureBytes(t, bad))
	code, out, _ := runCLI(t, "decode", path)
	require.Equal(t, 0, code)
	assert.Contains(t, out, fmt.Sprintf("icrc=bad(wire=%#08x ", binary.BigEndian.Uint32(wire)))
	f := decodeJSONFile(t, path)
	assert.Equal(t, fmt.Sprintf("%#08x", binary.BigEndian.Uint32(wire)), f.Packets[0].ICRC)
}

// decode marks each packet's place in its flow and filters by QP and
// opcode; the summary counts every packet.
func TestDecodeMarksAndFilters(t *testing.T) {
	code, out, _ := runCLI(t, "decode", caseFile("messages-count-includes-resends-psn-wrap.pcap"))
	require.Equal(t, 0, code)
	lines := strings.Split(out, "\n")
	for i, l := range lines[:8] {
		if i == 5 || i == 6 {
			assert.True(t, strings.HasSuffix(l, " icrc=ok [retransmission]"), l)
		} else {
			assert.NotContains(t, l, "[")
		}
	}
	f := decodeJSONFile(t, caseFile("messages-count-includes-resends-psn-wrap.pcap"))
	require.Len(t, f.Packets, 8)
	assert.Equal(t, `"retransmission"`, string(f.Packets[5].keys["mark"]))
	assert.NotContains(t, f.Packets[0].keys, "mark")

	code, out, _ = runCLI(t, "decode", "--qp", "0x22", caseFile("messages-count-includes-resends-psn-wrap.pcap"))
	require.Equal(t, 0, code)
	assert.Equal(t, 2, strings.Count(out, "RC_ACKNOWLEDGE dqpn=0x000022"))
	assert.NotContains(t, out, "RC_SEND_ONLY dqpn")
	assert.Contains(t, out, "summary: 8 frames, 8 RoCEv2 packets")

	code, out, _ = runCLI(t, "decode", "--opcode", "rc_acknowledge", caseFile("messages-count-includes-resends-psn-wrap.pcap"))
	require.Equal(t, 0, code)
	assert.Equal(t, 2, strings.Count(out, "RC_ACKNOWLEDGE dqpn="))
	code, out, _ = runCLI(t, "decode", "--qp", "256", caseFile("ud-two-srcqp-one-dqp-spurious-retransmits.pcap"))
	require.Equal(t, 0, code)
	assert.Equal(t, 5, strings.Count(out, "srcqp=0x000100}"), "a UD packet matches its DETH source QPN")

	for _, bad := range [][]string{{"--qp", "0x1000000"}, {"--qp", "x"}, {"--opcode", "RC_NOPE"}, {"--opcode", "0x7f"}} {
		code, _, errOut := runCLI(t, append(append([]string{"decode"}, bad...), caseFile("icrc-field-byte-order-vs-tshark.pcap"))...)
		assert.Equal(t, 2, code, "%v", bad)
		assert.Contains(t, errOut, bad[0])
	}
}
