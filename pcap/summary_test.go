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

// With EvictFlows, a flow beyond MaxFlows evicts the least recently seen
// one (not the oldest), which is handed to OnEvict with its counts and
// counted; the others keep their order. A READ's requests flow evicted
// takes its READs with it: a later response finds nothing to extend.
func TestSummaryEvictFlows(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	s.MaxFlows, s.EvictFlows = 2, true
	var evicted []*Flow
	s.OnEvict = func(f *Flow) { evicted = append(evicted, f) }
	qpns := func(fs []*Flow) []uint32 {
		var out []uint32
		for _, f := range fs {
			out = append(out, f.DestQP)
		}
		return out
	}
	addPacket(t, s, a, b, sendTo(0x80, bth.RCSendOnly, 1))
	addPacket(t, s, a, b, sendTo(0x81, bth.RCSendOnly, 1))
	addPacket(t, s, a, b, sendTo(0x80, bth.RCSendOnly, 2)) // 0x81 is now the least recent
	addPacket(t, s, a, b, sendTo(0x82, bth.RCSendOnly, 1))
	assert.Equal(t, []uint32{0x80, 0x82}, qpns(s.Flows))
	assert.Equal(t, []uint32{0x81}, qpns(evicted))
	assert.Equal(t, 1, evicted[0].Packets)
	addPacket(t, s, a, b, sendTo(0x81, bth.RCSendOnly, 2)) // back: a new flow; 0x80 goes
	assert.Equal(t, []uint32{0x82, 0x81}, qpns(s.Flows))
	assert.Equal(t, []uint32{0x81, 0x80}, qpns(evicted))
	assert.Equal(t, 2, evicted[1].Packets)
	assert.Equal(t, 2, s.FlowsEvicted)
	assert.Equal(t, 3, s.EvictedPackets)
	assert.Zero(t, s.FlowsNotTracked)
	assert.Equal(t, 5, s.RoCE)
	assert.Equal(t, uint32(2), s.Flows[1].FirstPSN, "0x81 started again")

	// A READ request flow, evicted: its response extends nothing.
	r := NewSummary()
	r.MaxFlows, r.EvictFlows = 1, true
	read := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadRequest, PKey: bth.DefaultPKey, DestQP: 0x90, PSN: 10},
		RETH: bth.RETH{VA: 0x1000, RKey: 1, DMALength: 4096}}
	addPacket(t, r, a, b, read)
	addPacket(t, r, a, b, sendTo(0x91, bth.RCSendOnly, 1))
	hk := [2]netip.Addr{netip.MustParseAddr(a), netip.MustParseAddr(b)}
	require.Len(t, r.reads[hk], 1, "the evicted flow's READs are gone")
	assert.Equal(t, uint32(0x91), r.reads[hk][0].DestQP)
	resp := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadResponseLast, PKey: bth.DefaultPKey, DestQP: 0x33, PSN: 12},
		AETH: bth.AETH{Syndrome: bth.ACKSyndrome(31), MSN: 1}, Payload: make([]byte, 16)}
	addPacket(t, r, b, a, resp)
	assert.Equal(t, 2, r.FlowsEvicted)
	assert.Len(t, r.Flows, 1)
	assert.Empty(t, r.reads, "no requests flow left")
}
