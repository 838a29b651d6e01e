package pcap

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// addPacket encodes p from src to dst, decodes it and adds it to s.
func addPacket(t *testing.T, s *Summary, src, dst string, p *bth.Packet) {
	t.Helper()
	e := encap4()
	e.Src, e.Dst = netip.MustParseAddr(src), netip.MustParseAddr(dst)
	if p.BTH.Opcode == bth.CNP {
		e.SrcPort = 0
	}
	frame, err := e.AppendFrame(nil, p)
	require.NoError(t, err)
	k, r := decodeFrame(t, NewDecoder(), LinkTypeEthernet, frame, len(frame))
	require.Equal(t, KindRoCE, k)
	s.Add(k, r)
}

func sendTo(qpn uint32, op bth.Opcode, psn uint32) *bth.Packet {
	return &bth.Packet{BTH: bth.BTH{Opcode: op, PKey: bth.DefaultPKey, DestQP: qpn, PSN: bth.PSN(psn), AckReq: true},
		DETH: bth.DETH{QKey: 1, SrcQP: 2}, Payload: make([]byte, 8)}
}

// A CNP from B to A's QP is not one of B's requests to that QP: it has a
// flow of its own and leaves the requests' PSN range and retransmission
// count alone.
func TestSummaryCNPFlow(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	for i := range uint32(6) {
		if i == 3 {
			cnp := &bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: 0x11}}
			addPacket(t, s, b, a, cnp)
		}
		addPacket(t, s, b, a, sendTo(0x11, bth.RCSendOnly, 0x900000+i))
	}
	require.Len(t, s.Flows, 2)
	req, cnp := s.Flows[0], s.Flows[1]
	assert.Equal(t, FlowRequests, req.Kind)
	assert.Equal(t, "RC", req.Transport)
	assert.Equal(t, 6, req.Packets)
	assert.Equal(t, uint32(0x900000), req.FirstPSN)
	assert.Equal(t, uint32(0x900005), req.LastPSN)
	assert.Zero(t, req.Retransmitted)
	assert.Zero(t, req.CNPs)
	assert.Equal(t, 48, req.PayloadBytes)

	assert.Equal(t, FlowCNPs, cnp.Kind)
	assert.Equal(t, "CNP", cnp.Transport)
	assert.Equal(t, 1, cnp.Packets)
	assert.Equal(t, 1, cnp.CNPs)
	assert.Zero(t, cnp.Retransmitted)
	assert.Zero(t, cnp.FirstPSN)
	assert.Zero(t, cnp.LastPSN)
	assert.Equal(t, "cnps CNP 192.0.2.2 > 192.0.2.1 dqpn=0x000011 packets=1 cnps=1", cnp.String())
	assert.Equal(t, "requests RC 192.0.2.2 > 192.0.2.1 dqpn=0x000011 packets=6 psn=9437184..9437189 messages=6 payload=48B retransmitted=0", req.String())

	// A second CNP, with another PSN: still no retransmission anywhere.
	cnp2 := &bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: 0x11, PSN: 77}}
	addPacket(t, s, b, a, cnp2)
	assert.Equal(t, 2, cnp.CNPs)
	assert.Zero(t, cnp.Retransmitted)
	assert.Zero(t, cnp.LastPSN)

	var j []map[string]any
	raw, err := json.Marshal(s.Flows)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &j))
	assert.Equal(t, "requests", j[0]["kind"])
	assert.Equal(t, "RC", j[0]["transport"])
	assert.Equal(t, "cnps", j[1]["kind"])
	assert.Equal(t, "CNP", j[1]["transport"])
	assert.NotContains(t, j[0], "response")
}

// RC, UC and UD traffic to the same QPN are separate flows, and so are
// requests and responses.
func TestSummaryFlowsByTransport(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	addPacket(t, s, a, b, sendTo(0x20, bth.RCSendOnly, 10))
	addPacket(t, s, a, b, sendTo(0x20, bth.UCSendOnly, 5))
	addPacket(t, s, a, b, sendTo(0x20, bth.UDSendOnly, 1))
	addPacket(t, s, a, b, sendTo(0x20, bth.RCSendOnly, 11))
	ack := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: 0x20, PSN: 11},
		AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 2}}
	addPacket(t, s, a, b, ack)
	require.Len(t, s.Flows, 4)
	var got [][2]string
	for _, f := range s.Flows {
		got = append(got, [2]string{f.Kind, f.Transport})
		assert.Zero(t, f.Retransmitted, "%s", f)
	}
	assert.Equal(t, [][2]string{{"requests", "RC"}, {"requests", "UC"}, {"requests", "UD"}, {"responses", "RC"}}, got)
	assert.Equal(t, 2, s.Flows[0].Packets)
	assert.Equal(t, uint32(11), s.Flows[0].LastPSN)
}
