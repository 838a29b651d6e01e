package pcap

import (
	"io"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The handed cases (testdata/cases, README in ../shared/testdata/cases):
// small captures on which decode's per-flow totals were wrong, each with
// its right answer.

func caseFile(t *testing.T, name string) string {
	return filepath.Join(testenv.ModuleRoot(t), "testdata", "cases", name)
}

// summarize reads a capture as `roce-emu decode` does: frames of other
// link types skipped and counted.
func summarize(t *testing.T, path string) (*Summary, *Decoder) {
	t.Helper()
	r, err := Open(path)
	require.NoError(t, err)
	defer r.Close()
	d := NewDecoder()
	sum := NewSummary()
	var x Record
	for {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		k, err := d.Decode(data, ci, lt, &x)
		if err != nil {
			require.ErrorIs(t, err, ErrLinkType)
			sum.AddOtherLinkType(lt)
			continue
		}
		sum.Add(k, &x)
	}
	sum.SetUnreassembled(d.FragmentsDropped() + d.PendingFragments())
	return sum, d
}

// 4 SEND_ONLYs across the PSN wrap, a NAK, the go-back-N resend of 2.
func TestCaseMessagesAcrossWrap(t *testing.T) {
	sum, _ := summarize(t, caseFile(t, "messages-count-includes-resends-psn-wrap.pcap"))
	require.Len(t, sum.Flows, 2)
	f := sum.Flows[0]
	assert.Equal(t, FlowRequests, f.Kind)
	assert.Equal(t, 4, f.Messages, "resends are not new messages")
	assert.Equal(t, 2, f.Retransmitted)
	assert.Equal(t, uint32(16777214), f.FirstPSN)
	assert.Equal(t, uint32(1), f.LastPSN, "the range runs across the wrap")
	assert.Equal(t, 6, f.Packets)
	r := sum.Flows[1]
	assert.Equal(t, 1, r.NAKs)
	assert.Equal(t, 1, r.ACKs)
	assert.Zero(t, r.Retransmitted)
}

// One SEND sent 367 times is one message.
func TestCaseOneMessageResent366Times(t *testing.T) {
	sum, _ := summarize(t, filepath.Join(testenv.ModuleRoot(t), "testdata", "rxe-rc-pingpong-send-unacked-retransmit.pcapng"))
	require.Len(t, sum.Flows, 1)
	assert.Equal(t, 1, sum.Flows[0].Messages)
	assert.Equal(t, 366, sum.Flows[0].Retransmitted)
	assert.Equal(t, 367, sum.Flows[0].Packets)
}

func TestCaseUDTwoSourceQPs(t *testing.T) {
	sum, _ := summarize(t, caseFile(t, "ud-two-srcqp-one-dqp-spurious-retransmits.pcap"))
	require.Len(t, sum.Flows, 2, "one flow per DETH source QP")
	for i, want := range []struct {
		sqpn        uint32
		first, last uint32
	}{{0x100, 100, 104}, {0x101, 7000, 7004}} {
		f := sum.Flows[i]
		require.NotNil(t, f.SrcQP)
		assert.Equal(t, want.sqpn, *f.SrcQP)
		assert.Equal(t, uint32(0x200), f.DestQP)
		assert.Equal(t, want.first, f.FirstPSN)
		assert.Equal(t, want.last, f.LastPSN)
		assert.Zero(t, f.Retransmitted, "UD never retransmits")
		assert.Equal(t, 5, f.Messages)
		assert.Equal(t, 5, f.Packets)
	}
}

func TestCaseQPNReuse(t *testing.T) {
	sum, _ := summarize(t, caseFile(t, "rxe-qpn-reuse-second-run.pcap"))
	require.Len(t, sum.Flows, 4, "requests and responses of two runs")
	for _, f := range sum.Flows {
		assert.Zero(t, f.Retransmitted, "%s", f)
		assert.Equal(t, 10, f.Packets, "%s", f)
	}
	assert.Equal(t, []int{0, 0, 1, 1}, []int{sum.Flows[0].Epoch, sum.Flows[1].Epoch, sum.Flows[2].Epoch, sum.Flows[3].Epoch})
	assert.Equal(t, uint32(9209053), sum.Flows[0].FirstPSN)
	assert.Equal(t, uint32(9209062), sum.Flows[0].LastPSN)
	assert.Equal(t, uint32(1048576), sum.Flows[2].FirstPSN)
	assert.Equal(t, uint32(1048585), sum.Flows[2].LastPSN)
	assert.Equal(t, 10, sum.Flows[0].Messages)
	assert.Equal(t, 10, sum.Flows[2].Messages)
}

func TestCasePcapngOtherLinkType(t *testing.T) {
	sum, _ := summarize(t, caseFile(t, "pcapng-80211-interface-first.pcapng"))
	assert.Equal(t, 4, sum.Frames)
	assert.Equal(t, 3, sum.RoCE)
	assert.Equal(t, map[string]int{"LINKTYPE_105": 1}, sum.OtherLinkTypes)
	require.Len(t, sum.Flows, 1)
	assert.Equal(t, 3, sum.Flows[0].Messages)
}

func TestCaseIPv4Fragments(t *testing.T) {
	sum, d := summarize(t, caseFile(t, "ipv4-fragmented-roce.pcap"))
	assert.Equal(t, 3, sum.Frames)
	assert.Equal(t, 1, sum.RoCE, "the SEND reassembled")
	assert.Equal(t, 1, sum.Reassembled)
	assert.Equal(t, 2, sum.IPFragments, "the first fragment and the lone one")
	assert.Equal(t, 1, sum.Unreassembled, "the lone non-first fragment")
	assert.Zero(t, sum.NonRoCE)
	assert.Zero(t, sum.BadICRC, "ICRC computed with DF set before fragmentation")
	assert.Equal(t, 1, d.PendingFragments())
	require.Len(t, sum.Flows, 1)
	assert.Equal(t, 64, sum.Flows[0].PayloadBytes)
}

// The rdma_cm capture's RC requests flow uses PSNs 9209053 (the WRITE) and
// 9209054..9209057 (the READ of 4 responses); its responses flow counts
// one ACK, not the READ responses' AETHs.
func TestCaptureRxeRDMACMFlows(t *testing.T) {
	sum, _ := summarize(t, sharedCapture(t, "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"))
	var req, resp *Flow
	for _, f := range sum.Flows {
		if f.Transport != "RC" {
			continue
		}
		switch f.Kind {
		case FlowRequests:
			req = f
		case FlowResponses:
			resp = f
		}
	}
	require.NotNil(t, req)
	require.NotNil(t, resp)
	assert.Equal(t, uint32(9209053), req.FirstPSN)
	assert.Equal(t, uint32(9209057), req.LastPSN, "the last PSN the READ uses")
	assert.Equal(t, 2, req.Messages)
	assert.Equal(t, 1, resp.ACKs, "READ responses are not ACKs")
	assert.Equal(t, 5, resp.Packets)
	assert.Zero(t, resp.Retransmitted)
	require.NotNil(t, resp.LastMSN)
	assert.Equal(t, uint32(2), *resp.LastMSN)
}

func TestCaptureHuaweiFlows(t *testing.T) {
	sum, _ := summarize(t, sharedCapture(t, "huawei-hns-rc-send-imm-srcport69-mtu1024.pcap"))
	byDir := map[[2]string]*Flow{}
	for _, f := range sum.Flows {
		byDir[[2]string{f.Src + ">" + f.Dst, f.Kind}] = f
		assert.Zero(t, f.Retransmitted, "%s", f)
	}
	req := byDir[[2]string{"192.168.70.6>192.168.70.4", FlowRequests}]
	require.NotNil(t, req)
	assert.Equal(t, 34, req.Messages)
	assert.Equal(t, 67, req.Packets)
	assert.Equal(t, uint32(0), req.FirstPSN)
	assert.Equal(t, uint32(66), req.LastPSN)
	acks := byDir[[2]string{"192.168.70.4>192.168.70.6", FlowResponses}]
	require.NotNil(t, acks)
	assert.Equal(t, 36, acks.ACKs)
	assert.Equal(t, uint32(34), *acks.LastMSN)
	req2 := byDir[[2]string{"192.168.70.4>192.168.70.6", FlowRequests}]
	require.NotNil(t, req2)
	assert.Equal(t, 1, req2.Messages)
	ack2 := byDir[[2]string{"192.168.70.6>192.168.70.4", FlowResponses}]
	require.NotNil(t, ack2)
	assert.Equal(t, 1, ack2.ACKs)
}

// Other members of the kinds above, built packet by packet.

func TestSummaryResendsOfMultiPacketMessages(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	// SEND of 3 packets; go-back-N from the MIDDLE; then the whole
	// message again from FIRST (a timeout); then a READ sent twice.
	for _, x := range []struct {
		op  bth.Opcode
		psn uint32
	}{{bth.RCSendFirst, 10}, {bth.RCSendMiddle, 11}, {bth.RCSendLast, 12},
		{bth.RCSendMiddle, 11}, {bth.RCSendLast, 12},
		{bth.RCSendFirst, 10}, {bth.RCSendMiddle, 11}, {bth.RCSendLast, 12},
		{bth.RCWriteOnly, 13}, {bth.RCWriteOnly, 13}} {
		addPacket(t, s, a, b, sendTo(0x30, x.op, x.psn))
	}
	read := sendTo(0x30, bth.RCReadRequest, 14)
	read.Payload = nil
	read.RETH.DMALength = 2048
	addPacket(t, s, a, b, read)
	addPacket(t, s, a, b, read)
	require.Len(t, s.Flows, 1)
	f := s.Flows[0]
	assert.Equal(t, 3, f.Messages, "SEND, WRITE, READ")
	assert.Equal(t, 7, f.Retransmitted)
	assert.Equal(t, uint32(14), f.LastPSN, "no response seen: the READ's other PSNs are unknown")

	// The READ's responses (MTU 1024: 14, 15) extend the requests range;
	// their AETHs are not ACKs of the responses flow.
	resp := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadResponseFirst, PKey: bth.DefaultPKey, DestQP: 0x40, PSN: 14},
		AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 4}, Payload: make([]byte, 1024)}
	addPacket(t, s, b, a, resp)
	resp.BTH.Opcode, resp.BTH.PSN = bth.RCReadResponseLast, 15
	addPacket(t, s, b, a, resp)
	assert.Equal(t, uint32(15), f.LastPSN)
	rf := s.Flows[1]
	assert.Zero(t, rf.ACKs)
	assert.Zero(t, rf.Messages)
	// A resent READ response (the READ came twice) is a retransmission.
	addPacket(t, s, b, a, resp)
	assert.Equal(t, 1, rf.Retransmitted)
	// An atomic ACK and a plain ACK are ACKs.
	ack := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: 0x40, PSN: 16},
		AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 5}}
	addPacket(t, s, b, a, ack)
	ack.BTH.Opcode, ack.BTH.PSN = bth.RCAtomicAcknowledge, 17
	addPacket(t, s, b, a, ack)
	assert.Equal(t, 2, rf.ACKs)
	// The WRITE after the READ continues the range.
	addPacket(t, s, a, b, sendTo(0x30, bth.RCWriteOnly, 16))
	assert.Equal(t, uint32(16), f.LastPSN)
	assert.Equal(t, 4, f.Messages)
}

func TestSummaryEpochs(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	// A go-back-N to just before the first PSN seen (the capture started
	// mid-flight) is a resend, not a new run.
	addPacket(t, s, a, b, sendTo(0x50, bth.RCSendOnly, 1000))
	addPacket(t, s, a, b, sendTo(0x50, bth.RCSendOnly, 1001))
	addPacket(t, s, a, b, sendTo(0x50, bth.RCSendOnly, 998))
	require.Len(t, s.Flows, 1)
	assert.Equal(t, 1, s.Flows[0].Retransmitted)
	// A jump forward by more than EpochGap is a new run.
	addPacket(t, s, a, b, sendTo(0x50, bth.RCSendOnly, 1001+EpochGap+1))
	require.Len(t, s.Flows, 2)
	assert.Equal(t, 1, s.Flows[1].Epoch)
	assert.Zero(t, s.Flows[1].Retransmitted)
	// UD: PSNs going back never start epochs nor count as resends.
	addPacket(t, s, a, b, sendTo(0x60, bth.UDSendOnly, 500))
	addPacket(t, s, a, b, sendTo(0x60, bth.UDSendOnly, 5))
	require.Len(t, s.Flows, 3)
	assert.Zero(t, s.Flows[2].Retransmitted)
	assert.Equal(t, 2, s.Flows[2].Messages)
}

// UC never resends: a PSN seen again is a duplicate of the path, not a
// retransmission, and not a new message.
func TestSummaryUCDuplicates(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	for _, psn := range []uint32{5, 6, 6, 7, 5} {
		addPacket(t, s, a, b, sendTo(0x70, bth.UCSendOnly, psn))
	}
	require.Len(t, s.Flows, 1)
	f := s.Flows[0]
	assert.Zero(t, f.Retransmitted)
	assert.Equal(t, 2, f.Duplicates)
	assert.Equal(t, 3, f.Messages)
	assert.Contains(t, f.String(), " retransmitted=0 duplicates=2")
}

// Frames behind 802.1Q and 802.1ad tags, stacked to any depth, decode.
func TestDecoderVLANStacks(t *testing.T) {
	frame, err := encap4().AppendFrame(nil, samplePacket(bth.RCSendOnly, 16))
	require.NoError(t, err)
	for _, tpids := range [][]uint16{{0x8100}, {0x88a8, 0x8100}, {0x88a8, 0x8100, 0x8100}, {0x9100, 0x8100}} {
		f := append([]byte(nil), frame[:12]...)
		for _, tp := range tpids {
			f = append(f, byte(tp>>8), byte(tp), 0x00, 0x05)
		}
		f = append(f, frame[12:]...)
		k, r := decodeFrame(t, NewDecoder(), LinkTypeEthernet, f, len(f))
		require.Equal(t, KindRoCE, k, "tags %#04x", tpids)
		assert.True(t, r.ICRCChecked && r.ICRCOK, "tags %#04x", tpids)
		assert.Equal(t, 16, r.PayloadLen)
	}
}

// Each packet's mark in its flow: retransmission (RC), duplicate (UC, and
// an ACK repeated), out-of-order (a PSN gap), none after a READ's PSNs.
func TestSummaryMarks(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	mark := func(src, dst string, p *bth.Packet) Mark {
		t.Helper()
		e := encap4()
		e.Src, e.Dst = netip.MustParseAddr(src), netip.MustParseAddr(dst)
		frame, err := e.AppendFrame(nil, p)
		require.NoError(t, err)
		k, r := decodeFrame(t, NewDecoder(), LinkTypeEthernet, frame, len(frame))
		return s.Add(k, r)
	}
	assert.Equal(t, MarkNone, mark(a, b, sendTo(0x11, bth.RCSendOnly, 10)))
	assert.Equal(t, MarkOutOfOrder, mark(a, b, sendTo(0x11, bth.RCSendOnly, 13)))
	assert.Equal(t, MarkRetransmission, mark(a, b, sendTo(0x11, bth.RCSendOnly, 11)))
	read := sendTo(0x11, bth.RCReadRequest, 14)
	read.Payload, read.RETH.DMALength = nil, 4096
	assert.Equal(t, MarkNone, mark(a, b, read))
	assert.Equal(t, MarkNone, mark(a, b, sendTo(0x11, bth.RCSendOnly, 18)), "the READ used 14..17")
	assert.Equal(t, MarkNone, mark(a, b, sendTo(0x12, bth.UCSendOnly, 1)))
	assert.Equal(t, MarkDuplicate, mark(a, b, sendTo(0x12, bth.UCSendOnly, 1)))
	ack := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: 0x21, PSN: 18},
		AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 3}}
	assert.Equal(t, MarkNone, mark(b, a, ack))
	assert.Equal(t, MarkDuplicate, mark(b, a, ack))
	ack.AETH.Syndrome = bth.NAKSyndrome(bth.NAKPSNSequenceError)
	assert.Equal(t, MarkNone, mark(b, a, ack), "a NAK after an ACK of the same PSN is not a duplicate")
	for m, w := range map[Mark]string{MarkNone: "", MarkRetransmission: "retransmission", MarkDuplicate: "duplicate", MarkOutOfOrder: "out-of-order"} {
		assert.Equal(t, w, m.String())
	}
}

// The flows a Summary tracks are bounded; packets beyond are counted.
func TestSummaryMaxFlows(t *testing.T) {
	const a, b = "192.0.2.1", "192.0.2.2"
	s := NewSummary()
	s.MaxFlows = 2
	for q := range uint32(4) {
		addPacket(t, s, a, b, sendTo(0x80+q, bth.RCSendOnly, 1))
	}
	addPacket(t, s, a, b, sendTo(0x80, bth.RCSendOnly, 2))
	assert.Len(t, s.Flows, 2)
	assert.Equal(t, 2, s.FlowsNotTracked)
	assert.Equal(t, 5, s.RoCE)
	assert.Equal(t, 2, s.Flows[0].Packets)
}

// Every pcapng block kind the reader does not use (name resolution,
// decryption secrets, custom, systemd journal, and unknown types) is
// skipped, with the packets around it read.
func TestReaderOtherBlockKinds(t *testing.T) {
	f := frameOf(t, 1, 8)
	nrb := []byte{1, 0, 8, 0, 192, 0, 2, 1, 'h', 'o', 's', 't', 0, 0, 0, 0, 0, 0, 0, 0} // IPv4 record "host", end
	w := newNg(le).shb().idb(1, 0).epb(0, 1, f)
	w.block(4, nrb)                                       // name resolution
	w.block(0x0A, []byte{'T', 'L', 'S', 'K', 0, 0, 0, 0}) // decryption secrets, empty
	w.block(0x00000BAD, []byte{0x7e, 0x13, 0, 0, 1, 2, 3, 4})
	w.block(0x40000BAD, []byte{0x7e, 0x13, 0, 0})
	w.block(9, []byte("journal entry"))
	w.block(0x12345, []byte{1, 2, 3, 4})
	w.epb(0, 2, f)
	res := readAll(t, w.b)
	require.NoError(t, res.err)
	assert.Len(t, res.frames, 2)
}
