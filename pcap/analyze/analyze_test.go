package analyze_test

import (
	"encoding/json"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/pcap/analyze"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func analyzeFile(t *testing.T, path string, cfg analyze.Config) *analyze.Report {
	t.Helper()
	r, err := pcap.Open(path)
	require.NoError(t, err)
	defer r.Close()
	d := pcap.NewDecoder()
	a := analyze.New(cfg)
	var rec pcap.Record
	for n := 1; ; n++ {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		k, err := d.Decode(data, ci, lt, &rec)
		if err != nil {
			require.ErrorIs(t, err, pcap.ErrLinkType)
			a.AddOtherLinkType(lt)
			continue
		}
		a.Add(n, k, &rec)
	}
	return a.Report()
}

func caseFile(t *testing.T, name string) string {
	return filepath.Join(testenv.ModuleRoot(t), "testdata", "cases", name)
}

func shared(t *testing.T, name string) string {
	return filepath.Join(testenv.SharedPcaps(t), name)
}

// ---------------------------------------------------------------------
// The handed cases.

func TestCaseGoBackNAcrossWrap(t *testing.T) {
	rep := analyzeFile(t, caseFile(t, "messages-count-includes-resends-psn-wrap.pcap"), analyze.Config{})
	require.Len(t, rep.Connections, 1)
	c := rep.Connections[0]
	assert.Equal(t, "RC", c.Transport)
	assert.Equal(t, "10.1.0.1/0x000022", c.Requester, "the requester's QPN, from the responses")
	assert.Equal(t, "10.1.0.2/0x000011", c.Responder)
	assert.Equal(t, 4, c.Messages)
	assert.Equal(t, map[string]int{"SEND": 4}, c.MessagesByKind)
	assert.Equal(t, 2, c.RetransmittedPackets)
	require.NotNil(t, c.PSN)
	assert.Equal(t, analyze.PSNRange{First: 16777214, Last: 1, Count: 4}, *c.PSN)
	require.Len(t, c.GBNEpisodes, 1)
	e := c.GBNEpisodes[0]
	assert.Equal(t, analyze.Episode{Cause: "NAK", StartFrame: 5, FirstResendFrame: 6, DelayUs: 1, FromPSN: 0,
		PacketsResent: 2, BytesResent: 16, ResendFrom: "ONLY"}, e)
	assert.Equal(t, 1, c.NAKs)
	assert.Equal(t, 1, c.ACKs)
	assert.Zero(t, c.Timeouts)
	assert.Equal(t, 4, rep.Summary.Messages)
}

func TestCaseUDTwoSourceQPs(t *testing.T) {
	rep := analyzeFile(t, caseFile(t, "ud-two-srcqp-one-dqp-spurious-retransmits.pcap"), analyze.Config{})
	require.Len(t, rep.Connections, 2)
	for i, src := range []string{"10.1.0.1/0x000100", "10.1.0.1/0x000101"} {
		c := rep.Connections[i]
		assert.Equal(t, "UD", c.Transport)
		assert.Equal(t, src, c.Requester)
		assert.Equal(t, "10.1.0.2/0x000200", c.Responder)
		assert.Zero(t, c.RetransmittedPackets)
		assert.Empty(t, c.GBNEpisodes)
		assert.Equal(t, 5, c.Messages)
		assert.Equal(t, int64(5), c.PSN.Count)
	}
}

func TestCaseQPNReuse(t *testing.T) {
	rep := analyzeFile(t, caseFile(t, "rxe-qpn-reuse-second-run.pcap"), analyze.Config{})
	require.Len(t, rep.Connections, 2)
	for i, c := range rep.Connections {
		assert.Equal(t, i, c.Epoch)
		assert.Zero(t, c.RetransmittedPackets)
		assert.Equal(t, 10, c.Messages)
		assert.Equal(t, 10, c.ACKs)
		assert.Equal(t, "10.2.0.5/0x000011", c.Requester)
		assert.Empty(t, c.Checks)
	}
	assert.Equal(t, uint32(9209053), rep.Connections[0].PSN.First)
	assert.Equal(t, uint32(1048576), rep.Connections[1].PSN.First)
	assert.Equal(t, 21, rep.Connections[1].FirstFrame)
}

func TestCaseOtherLinkTypeAndFragments(t *testing.T) {
	rep := analyzeFile(t, caseFile(t, "pcapng-80211-interface-first.pcapng"), analyze.Config{})
	assert.Equal(t, map[string]int{"LINKTYPE_105": 1}, rep.Summary.OtherLinkTypes)
	require.Len(t, rep.Connections, 1)
	assert.Equal(t, 3, rep.Connections[0].Messages)
	assert.Equal(t, 2, rep.Connections[0].FirstFrame, "frame numbers count the skipped frame")

	rep = analyzeFile(t, caseFile(t, "ipv4-fragmented-roce.pcap"), analyze.Config{})
	assert.Equal(t, 1, rep.Summary.Reassembled)
	assert.Equal(t, 2, rep.Summary.IPFragments)
	require.Len(t, rep.Connections, 1)
	assert.Equal(t, uint64(64), rep.Connections[0].Bytes)
	assert.Zero(t, rep.Summary.BadICRC)
}

// ---------------------------------------------------------------------
// The shared real captures (../shared/testdata/README.md).

func TestCaptureRxeRDMACM(t *testing.T) {
	rep := analyzeFile(t, shared(t, "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"), analyze.Config{})
	var rc []*analyze.Connection
	for _, c := range rep.Connections {
		if c.Transport == "RC" {
			rc = append(rc, c)
		} else {
			assert.Equal(t, "UD", c.Transport, "the CM MADs")
		}
	}
	require.Len(t, rc, 1, "1 RC connection")
	c := rc[0]
	assert.Equal(t, "192.168.65.5/0x000011", c.Requester, "both sides' QPN is 0x11")
	assert.Equal(t, "192.168.65.4/0x000011", c.Responder)
	assert.Equal(t, uint32(0x8c84dd), c.PSN.First, "the REP's starting PSN")
	assert.Equal(t, uint32(9209057), c.PSN.Last, "the READ's last response PSN")
	assert.Equal(t, map[string]int{"RDMA_WRITE": 1, "RDMA_READ": 1}, c.MessagesByKind)
	assert.Equal(t, uint64(18), c.Bytes)
	assert.Equal(t, uint64(4096), c.ReadBytes)
	assert.Equal(t, 1024, c.PathMTU)
	assert.Equal(t, 1, c.ACKs)
	assert.Equal(t, 5, c.ResponsePackets)
	for _, n := range []int{c.NAKs, c.RetransmittedPackets, c.CEMarked, c.CNPs, c.ImpliedNAKs, rep.Summary.BadICRC} {
		assert.Zero(t, n)
	}
	assert.Empty(t, c.Checks)
	assert.Equal(t, 2, c.RTT.Samples, "the WRITE's ACK and the READ's first response")
	require.NotNil(t, c.CMStartingPSN)
	assert.Equal(t, uint32(0x8c84dd), *c.CMStartingPSN, "the REP's starting PSN")
}

func TestCaptureHuawei(t *testing.T) {
	rep := analyzeFile(t, shared(t, "huawei-hns-rc-send-imm-srcport69-mtu1024.pcap"), analyze.Config{})
	require.Len(t, rep.Connections, 2, "1 RC connection, both sides requesters")
	byReq := map[string]*analyze.Connection{}
	for _, c := range rep.Connections {
		byReq[c.Requester] = c
		assert.Zero(t, c.RetransmittedPackets)
		assert.Zero(t, c.NAKs)
		assert.Zero(t, c.RNRNAKs)
		assert.Zero(t, c.CEMarked)
		assert.Empty(t, c.Checks)
	}
	b := byReq["192.168.70.6/0x000048"]
	require.NotNil(t, b)
	assert.Equal(t, "192.168.70.4/0x000045", b.Responder)
	assert.Equal(t, 34, b.Messages)
	assert.Equal(t, 67, b.Packets)
	assert.Equal(t, analyze.PSNRange{First: 0, Last: 66, Count: 67}, *b.PSN)
	assert.Equal(t, 36, b.ACKs, ".4's coalesced ACKs")
	assert.Equal(t, 1024, b.PathMTU)
	assert.Equal(t, uint64(32*2048+1497+4), b.Bytes)
	a := byReq["192.168.70.4/0x000045"]
	require.NotNil(t, a)
	assert.Equal(t, 1, a.Messages)
	assert.Equal(t, uint64(141), a.Bytes)
	assert.Equal(t, 1, a.ACKs)
	assert.Equal(t, 105, rep.Summary.RoCE)
}

func TestCaptureConnectXCNP(t *testing.T) {
	rep := analyzeFile(t, shared(t, "cx4lx-cnp-from-scapy-hexdump.pcap"), analyze.Config{})
	assert.Empty(t, rep.Connections, "the CNP's data is not in the capture")
	assert.Equal(t, 1, rep.Summary.UnmatchedCNPs)
	assert.Equal(t, map[string]int{"10.0.18.1/0x000118": 1}, rep.Summary.UnmatchedCNPsTo)
}

// One SEND resent every ~68 ms (rxe's local ACK timeout 14) for 25 s:
// one message, 366 resends, each an ACK timeout.
func TestCaptureRxeUnackedRetransmit(t *testing.T) {
	rep := analyzeFile(t, filepath.Join(testenv.ModuleRoot(t), "testdata", "rxe-rc-pingpong-send-unacked-retransmit.pcapng"), analyze.Config{})
	require.Len(t, rep.Connections, 1)
	c := rep.Connections[0]
	assert.Equal(t, "192.0.2.2/?", c.Requester, "nothing came back: the requester's QPN is unknown")
	assert.Equal(t, "192.0.2.1/0x123456", c.Responder)
	assert.Equal(t, 1, c.Messages)
	assert.Equal(t, 366, c.RetransmittedPackets)
	assert.Equal(t, 366, c.Timeouts)
	require.Len(t, c.GBNEpisodes, 366)
	for i, e := range c.GBNEpisodes {
		assert.Equal(t, "timeout", e.Cause)
		assert.Equal(t, 12+i, e.StartFrame)
		assert.Equal(t, 13+i, e.FirstResendFrame)
		assert.InDelta(t, 68000, e.DelayUs, 3000, "episode %d", i)
		assert.Equal(t, 1, e.PacketsResent)
		assert.Equal(t, uint64(64), e.BytesResent)
	}
	assert.Equal(t, analyze.PSNRange{First: 13664499, Last: 13664499, Count: 1}, *c.PSN)
	assert.Zero(t, c.RTT.Samples)
}

// ---------------------------------------------------------------------
// Built packet by packet.

// wire feeds packets to an Analyzer as frames of a capture.
type wire struct {
	t   *testing.T
	a   *analyze.Analyzer
	d   *pcap.Decoder
	n   int
	now time.Time
}

func newWire(t *testing.T, cfg analyze.Config) *wire {
	return &wire{t: t, a: analyze.New(cfg), d: pcap.NewDecoder(), now: time.Unix(1700000000, 0)}
}

const hostA, hostB = "192.0.2.1", "192.0.2.2"

// send adds packet p from src to dst dt after the previous frame, with ECN
// ecn, and returns its frame number.
func (w *wire) send(dt time.Duration, src, dst string, ecn bth.ECN, p *bth.Packet) int {
	w.t.Helper()
	w.now = w.now.Add(dt)
	e := &bth.Encap{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: 49152, TrafficClass: bth.TrafficClass(26, ecn)}
	frame, err := e.AppendFrame(nil, p)
	require.NoError(w.t, err)
	var rec pcap.Record
	k, err := w.d.Decode(frame, gopacket.CaptureInfo{Timestamp: w.now, CaptureLength: len(frame), Length: len(frame)}, pcap.LinkTypeEthernet, &rec)
	require.NoError(w.t, err)
	w.n++
	w.a.Add(w.n, k, &rec)
	return w.n
}

func req(op bth.Opcode, psn uint32, payload int, ackreq bool) *bth.Packet {
	return &bth.Packet{BTH: bth.BTH{Opcode: op, PKey: bth.DefaultPKey, DestQP: 0xB1, PSN: bth.PSN(psn & bth.PSNMask), AckReq: ackreq},
		RETH: bth.RETH{VA: 0x1000, RKey: 7, DMALength: uint32(payload)}, Payload: make([]byte, payload)}
}

func ack(psn uint32, syn bth.Syndrome, msn uint32) *bth.Packet {
	return &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: 0xA1, PSN: bth.PSN(psn & bth.PSNMask)},
		AETH: bth.AETH{Syndrome: syn, MSN: msn}}
}

func (w *wire) report() *analyze.Report { return w.a.Report() }

func TestTimeoutAndMiddleResend(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	// A 3-packet WRITE; its LAST lost; after 500 us the requester goes
	// back to the MIDDLE (its ACK timer), the responder ACKs.
	w.send(0, hostA, hostB, bth.ECT0, req(bth.RCWriteFirst, 100, 1024, false))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteMiddle, 101, 1024, false))
	last := w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 102, 10, true))
	w.send(3*time.Microsecond, hostB, hostA, bth.ECT0, ack(100, bth.SyndromeACKNoCredits, 0))
	first := w.send(500*time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteMiddle, 101, 1024, false))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 102, 10, true))
	w.send(3*time.Microsecond, hostB, hostA, bth.ECT0, ack(102, bth.SyndromeACKNoCredits, 1))
	// A spurious resend of the LAST, ACKed already: a duplicate.
	w.send(900*time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 102, 10, true))
	rep := w.report()
	require.Len(t, rep.Connections, 1)
	c := rep.Connections[0]
	assert.Equal(t, 1, c.Messages)
	assert.Equal(t, 2, c.Timeouts)
	require.Len(t, c.GBNEpisodes, 2)
	assert.Equal(t, "LAST", c.GBNEpisodes[1].ResendFrom)
	assert.Equal(t, 900.0, c.GBNEpisodes[1].DelayUs)
	e := c.GBNEpisodes[0]
	assert.Equal(t, "timeout", e.Cause)
	assert.Equal(t, last+1, e.StartFrame, "the last frame before the resend: the ACK that restarted the timer")
	assert.Equal(t, first, e.FirstResendFrame)
	assert.Equal(t, 500.0, e.DelayUs)
	assert.Equal(t, "MIDDLE", e.ResendFrom)
	assert.Equal(t, 2, e.PacketsResent)
	assert.Equal(t, uint64(1034), e.BytesResent)
	assert.Equal(t, 1, c.Duplicates, "only the last resend was of a PSN ACKed already")
	assert.Zero(t, c.RTT.Samples, "the resent LAST gives no sample (Karn)")
	assert.Equal(t, 3, c.RetransmittedPackets)
}

func TestRNRWait(t *testing.T) {
	w := newWire(t, analyze.Config{})
	w.send(0, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 7, 8, true))
	rnr := w.send(2*time.Microsecond, hostB, hostA, bth.ECT0, ack(7, bth.RNRNAKSyndrome(14), 0)) // code 14: 1.28 ms
	resend := w.send(1300*time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 7, 8, true))
	w.send(2*time.Microsecond, hostB, hostA, bth.ECT0, ack(7, bth.SyndromeACKNoCredits, 1))
	c := w.report().Connections[0]
	assert.Equal(t, 1, c.RNRNAKs)
	require.Len(t, c.RNRWaits, 1)
	assert.Equal(t, analyze.RNRWait{Frame: rnr, TimerCode: 14, AskedUs: 1280, SeenUs: 1300, ResendSeen: true}, c.RNRWaits[0])
	require.Len(t, c.GBNEpisodes, 1)
	assert.Equal(t, "RNR_NAK", c.GBNEpisodes[0].Cause)
	assert.Equal(t, resend, c.GBNEpisodes[0].FirstResendFrame)
	assert.Zero(t, c.Timeouts)
	assert.Equal(t, 1, c.Messages)
}

func TestReadImpliedNAKAndReACK(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	read := req(bth.RCReadRequest, 10, 0, true)
	read.RETH.DMALength = 2048
	w.send(0, hostA, hostB, bth.ECT0, read)                                            // PSNs 10, 11
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 12, 4, true)) // PSN 12
	// The READ's responses are lost; the SEND's ACK comes: an implied NAK.
	implied := w.send(5*time.Microsecond, hostB, hostA, bth.ECT0, ack(12, bth.SyndromeACKNoCredits, 2))
	again := w.send(time.Microsecond, hostB, hostA, bth.ECT0, ack(12, bth.SyndromeACKNoCredits, 2))
	resend := w.send(time.Microsecond, hostA, hostB, bth.ECT0, read)
	resp := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadResponseFirst, PKey: bth.DefaultPKey, DestQP: 0xA1, PSN: 10},
		AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 1}, Payload: make([]byte, 1024)}
	w.send(5*time.Microsecond, hostB, hostA, bth.ECT0, resp)
	resp.BTH.Opcode, resp.BTH.PSN = bth.RCReadResponseLast, 11
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, resp)
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 12, 4, true))
	w.send(5*time.Microsecond, hostB, hostA, bth.ECT0, ack(12, bth.SyndromeACKNoCredits, 2))
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, ack(12, bth.SyndromeACKNoCredits, 2))
	c := w.report().Connections[0]
	assert.Equal(t, 1, c.ImpliedNAKs, "the second ACK comes during the retry")
	require.Len(t, c.GBNEpisodes, 1)
	e := c.GBNEpisodes[0]
	assert.Equal(t, "implied_NAK", e.Cause)
	assert.Equal(t, implied, e.StartFrame)
	assert.Equal(t, resend, e.FirstResendFrame)
	assert.Equal(t, "REQUEST", e.ResendFrom)
	assert.Equal(t, 2, e.PacketsResent)
	assert.Equal(t, 2, c.Messages)
	assert.Equal(t, uint64(2048), c.ReadBytes)
	assert.Equal(t, analyze.PSNRange{First: 10, Last: 12, Count: 3}, *c.PSN)
	assert.Equal(t, 1, c.ReACKs, "the last ACK acknowledges nothing new; the two during the retry were dropped")
	assert.Equal(t, 4, c.ACKs)
	assert.Zero(t, c.RTT.Samples, "Karn: the go-back-N resent the READ and the SEND")
	_ = again
}

func TestCNPsAndCE(t *testing.T) {
	w := newWire(t, analyze.Config{MinCNPInterval: 50 * time.Microsecond})
	for i := range 6 {
		w.send(10*time.Microsecond, hostA, hostB, bth.CE, req(bth.RCSendOnly, uint32(i), 64, true))
		if i%2 == 1 {
			cnp := &bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: 0xA1}}
			w.send(time.Microsecond, hostB, hostA, bth.ECT0, cnp)
		}
	}
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, ack(5, bth.SyndromeACKNoCredits, 6))
	bad := &bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, DestQP: 0xA1}}
	badFrame := w.send(100*time.Microsecond, hostB, hostA, bth.ECT0, bad)
	rep := w.report()
	require.Len(t, rep.Connections, 1)
	c := rep.Connections[0]
	assert.Equal(t, "192.0.2.1/0x0000a1", c.Requester)
	assert.Equal(t, 6, c.CEMarked)
	assert.Equal(t, 4, c.CNPs)
	assert.Equal(t, hostB, c.CNPFrom, "the responder is the notification point")
	assert.Equal(t, 21.0, c.CNPIntervalMin)
	assert.Equal(t, 2, c.CNPsUnderMin, "21 us apart twice; then 101 and 100 us")
	require.Len(t, c.Checks, 1)
	assert.Equal(t, analyze.Check{Frame: badFrame, Severity: "warning", Kind: "CNP fields",
		Message: "CNP with BECN=false FECN=false (a CNP sets BECN only)"}, c.Checks[0])
	assert.Equal(t, 6, rep.Summary.CEMarked)
	require.Contains(t, rep.Summary.CNPPorts, hostB)
	p := rep.Summary.CNPPorts[hostB]
	assert.Equal(t, []any{4, 21.0, 2}, []any{p.CNPs, p.IntervalMinUs, p.UnderMin}, "the port's stream, the bad CNP included")
}

func TestChecks(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	w.send(0, hostA, hostB, bth.ECT0, req(bth.RCSendFirst, 1, 1024, false))
	short := w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendMiddle, 2, 512, false))
	only := w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 3, 8, true))
	orphan := w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendLast, 4, 8, true))
	gap := w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 9, 8, true))
	big := w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 10, 2000, true))
	w.send(1, hostB, hostA, bth.ECT0, ack(9, bth.SyndromeACKNoCredits, 5))
	msn := w.send(1, hostB, hostA, bth.ECT0, ack(10, bth.SyndromeACKNoCredits, 4))
	c := w.report().Connections[0]
	got := map[int]string{}
	for _, k := range c.Checks {
		got[k.Frame] += k.Kind + ";"
	}
	assert.Equal(t, map[int]string{
		short:  "path MTU;",
		only:   "opcode sequence;",
		orphan: "opcode sequence;",
		gap:    "PSN sequence;",
		big:    "path MTU;",
		msn:    "MSN order;",
	}, got)
	assert.Equal(t, map[string]int{"path MTU": 2, "opcode sequence": 2, "PSN sequence": 1, "MSN order": 1}, c.ChecksByKind)
}

func TestBounded(t *testing.T) {
	w := newWire(t, analyze.Config{MaxConnections: 3, MaxEvents: 2, Bin: time.Microsecond, MaxBins: 4})
	for q := range uint32(5) {
		p := req(bth.RCSendOnly, 1, 8, false)
		p.BTH.DestQP = 0x100 + q
		w.send(time.Microsecond, hostA, hostB, bth.ECT0, p)
	}
	// Five resends of one PSN on the last connection: five episodes, two
	// listed; 10 us of traffic in 4 bins that widened.
	for range 5 {
		p := req(bth.RCSendOnly, 1, 8, false)
		p.BTH.DestQP = 0x104
		w.send(2*time.Microsecond, hostA, hostB, bth.ECT0, p)
	}
	rep := w.report()
	assert.Len(t, rep.Connections, 3)
	assert.Equal(t, 2, rep.Summary.EvictedConnections)
	last := rep.Connections[2]
	assert.Equal(t, "192.0.2.2/0x000104", last.Responder)
	assert.Len(t, last.GBNEpisodes, 2)
	assert.Equal(t, 3, last.EpisodesNotListed)
	assert.Equal(t, 5, rep.Summary.GBNEpisodes)
	assert.LessOrEqual(t, len(last.Throughput), 4)
	var sum uint64
	for _, b := range last.Throughput {
		sum += b.Bytes
	}
	assert.Equal(t, uint64(48), sum)
}

// The JSON form has the keys the issue names, 64-bit values as strings.
func TestJSONKeys(t *testing.T) {
	rep := analyzeFile(t, caseFile(t, "messages-count-includes-resends-psn-wrap.pcap"), analyze.Config{})
	raw, err := json.Marshal(rep)
	require.NoError(t, err)
	var m struct {
		Connections []map[string]any `json:"connections"`
		Summary     map[string]any   `json:"summary"`
	}
	require.NoError(t, json.Unmarshal(raw, &m))
	require.Len(t, m.Connections, 1)
	c := m.Connections[0]
	for _, k := range []string{"transport", "requester", "responder", "messages", "retransmitted_packets", "gbn_episodes", "rtt_us", "ce_marked", "cnps"} {
		assert.Contains(t, c, k)
	}
	assert.Equal(t, "32", c["bytes"])
	ep := c["gbn_episodes"].([]any)[0].(map[string]any)
	for _, k := range []string{"cause", "start_frame", "first_resend_frame", "delay_us", "packets_resent"} {
		assert.Contains(t, ep, k)
	}
	rtt := c["rtt_us"].(map[string]any)
	assert.Contains(t, rtt, "p50")
	assert.Contains(t, rtt, "p99")
	assert.Equal(t, "32", m.Summary["bytes"])
}

// PSN-over-time points stay within Config.Points first sends (thinned
// evenly) plus as many resends and NAKs.
func TestPointsBounded(t *testing.T) {
	w := newWire(t, analyze.Config{Points: 4})
	for i := range 20 {
		w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, uint32(i), 8, false))
	}
	for range 10 {
		w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 3, 8, false))
	}
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, ack(3, bth.NAKSyndrome(bth.NAKPSNSequenceError), 3))
	pts := w.report().Connections[0].Points
	var n [3]int
	for _, p := range pts {
		n[p.Kind]++
	}
	assert.LessOrEqual(t, n[analyze.PointSend], 4)
	assert.GreaterOrEqual(t, n[analyze.PointSend], 2)
	assert.Equal(t, 4, n[analyze.PointResend]+n[analyze.PointNAK], "resends and NAKs up to Points")
	assert.Equal(t, int64(0), pts[0].PSN, "PSNs count from the first")
}

// cmMAD builds a CM REQ or REP MAD in a UD SEND_ONLY to QP1.
func cmMAD(attr uint16, local, remote uint32, qpn, psn uint32) *bth.Packet {
	m := make([]byte, 256)
	m[0], m[1], m[2], m[3] = 1, 0x07, 2, 3
	m[16], m[17] = byte(attr>>8), byte(attr)
	d := m[24:]
	put24 := func(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }
	d[0], d[1], d[2], d[3] = byte(local>>24), byte(local>>16), byte(local>>8), byte(local)
	if attr == 0x0010 {
		put24(d[32:], qpn)
		put24(d[44:], psn)
	} else {
		d[4], d[5], d[6], d[7] = byte(remote>>24), byte(remote>>16), byte(remote>>8), byte(remote)
		put24(d[12:], qpn)
		put24(d[20:], psn)
	}
	return &bth.Packet{BTH: bth.BTH{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: 1, PSN: 1},
		DETH: bth.DETH{QKey: bth.GSIQKey, SrcQP: 1}, Payload: m}
}

// The CM's REQ and REP pair the two QPs before any response: with two
// connections between the same hosts, each response goes to its own; a
// first PSN other than the CM's is a check.
func TestCMPairing(t *testing.T) {
	w := newWire(t, analyze.Config{})
	w.send(0, hostA, hostB, bth.ECT0, cmMAD(0x0010, 0x1111, 0, 0xA1, 500)) // A's QP 0xA1
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, cmMAD(0x0013, 0x2222, 0x1111, 0xB1, 900))
	w.send(0, hostA, hostB, bth.ECT0, cmMAD(0x0010, 0x3333, 0, 0xA2, 100)) // A's QP 0xA2
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, cmMAD(0x0013, 0x4444, 0x3333, 0xB2, 200))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 900, 8, true)) // to 0xB1, at the REP's PSN
	p := req(bth.RCSendOnly, 7, 8, true)                                                // to 0xB2, not at 200
	p.BTH.DestQP = 0xB2
	bad := w.send(time.Microsecond, hostA, hostB, bth.ECT0, p)
	a2 := ack(7, bth.SyndromeACKNoCredits, 1)
	a2.BTH.DestQP = 0xA2
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, a2)
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, ack(900, bth.SyndromeACKNoCredits, 1))
	var rc []*analyze.Connection
	for _, c := range w.report().Connections {
		if c.Transport == "RC" {
			rc = append(rc, c)
		}
	}
	require.Len(t, rc, 2)
	assert.Equal(t, "192.0.2.1/0x0000a1", rc[0].Requester)
	assert.Equal(t, "192.0.2.2/0x0000b1", rc[0].Responder)
	assert.Equal(t, uint32(900), *rc[0].CMStartingPSN)
	assert.Empty(t, rc[0].Checks)
	assert.Equal(t, 1, rc[0].ACKs)
	assert.Equal(t, "192.0.2.1/0x0000a2", rc[1].Requester)
	assert.Equal(t, 1, rc[1].ACKs)
	require.Len(t, rc[1].Checks, 1)
	assert.Equal(t, analyze.Check{Frame: bad, Severity: "warning", Kind: "CM starting PSN", Message: "first PSN 7, the CM's starting PSN 200"}, rc[1].Checks[0])
}

// An ACK past an unanswered READ implies a NAK, but the READ's responses
// were on the wire behind it: they come, the requester's go-back resends
// nothing, and a later loss is recovered by the ACK timer. The resend is a
// timeout, not the implied NAK's (a lossy run of TestLossyRunMatchesCounters
// once counted it so: timeouts 2 against the requester's 3).
func TestImpliedNAKOvertakenThenTimeout(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	read := req(bth.RCReadRequest, 20, 0, true)
	read.RETH.DMALength = 1024
	w.send(0, hostA, hostB, bth.ECT0, read)                                            // PSN 20
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 21, 4, true)) // PSN 21
	// The responder's ACK for the SEND overtakes the READ's response.
	implied := w.send(5*time.Microsecond, hostB, hostA, bth.ECT0, ack(21, bth.SyndromeACKNoCredits, 2))
	resp := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadResponseOnly, PKey: bth.DefaultPKey, DestQP: 0xA1, PSN: 20},
		AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 1}, Payload: make([]byte, 1024)}
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, resp)
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, ack(21, bth.SyndromeACKNoCredits, 2))
	// A new SEND is lost; the ACK timer resends it.
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 22, 4, true))
	resend := w.send(16*time.Millisecond, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 22, 4, true))
	w.send(5*time.Microsecond, hostB, hostA, bth.ECT0, ack(22, bth.SyndromeACKNoCredits, 3))
	c := w.report().Connections[0]
	assert.Equal(t, 1, c.ImpliedNAKs)
	assert.Equal(t, 1, c.Timeouts)
	require.Len(t, c.GBNEpisodes, 2)
	assert.Equal(t, analyze.Episode{Cause: "implied_NAK", StartFrame: implied, FromPSN: 20, ResendFrom: "none"}, c.GBNEpisodes[0])
	e := c.GBNEpisodes[1]
	assert.Equal(t, "timeout", e.Cause)
	assert.Equal(t, resend, e.FirstResendFrame)
	assert.Equal(t, uint32(22), e.FromPSN)
	assert.Equal(t, 16000.0, e.DelayUs)
	assert.Equal(t, 1, e.PacketsResent)
}

// The AckReq policy: a message whose last packet does not ask for an ACK
// is listed once and counted after; a run of 128 request packets without
// AckReq (rxe's window) is listed; READ requests count as message ends.
func TestAckReqPolicy(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	first := w.send(0, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 1, 8, false))
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 2, 8, false))
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCWriteFirst, 3, 1024, false))
	var run int
	for i := range uint32(125) {
		run = w.send(1, hostA, hostB, bth.ECT0, req(bth.RCWriteMiddle, 4+i, 1024, false))
	}
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 129, 8, true))
	read := req(bth.RCReadRequest, 130, 0, false)
	read.RETH.DMALength = 8
	w.send(1, hostA, hostB, bth.ECT0, read)
	c := w.report().Connections[0]
	var got []analyze.Check
	for _, k := range c.Checks {
		if k.Kind == "AckReq policy" {
			got = append(got, k)
		}
	}
	require.Len(t, got, 2, "%v", c.Checks)
	assert.Equal(t, first, got[0].Frame)
	assert.Contains(t, got[0].Message, "RC_SEND_ONLY ends a message without AckReq")
	assert.Equal(t, run, got[1].Frame, "the 128th packet in a row without AckReq: 2 SENDs, the FIRST and 125 MIDDLEs")
	assert.Contains(t, got[1].Message, "128 request packets in a row without AckReq")
	assert.Equal(t, 4, c.ChecksByKind["AckReq policy"], "3 message ends (2 SENDs, the READ) and the run")
}

// A capture that missed a message's first transmission (a PSN gap) sees
// it first as a resend: the message is counted then, once; a resend of a
// PSN seen before is not counted again.
func TestGapFilledByResendCountsMessage(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	w.send(0, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 1, 8, true))
	// PSNs 2 (a SEND Only) and 3, 4 (a WRITE First and Last) are not in
	// the capture; 5 is.
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 5, 8, true))
	w.send(1, hostB, hostA, bth.ECT0, ack(1, bth.NAKSyndrome(bth.NAKPSNSequenceError), 1))
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 2, 8, true))
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCWriteFirst, 3, 1024, false))
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 4, 16, true))
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 5, 8, true))
	// The go-back-N again from 2: nothing is new now.
	w.send(1, hostA, hostB, bth.ECT0, req(bth.RCSendOnly, 2, 8, true))
	c := w.report().Connections[0]
	assert.Equal(t, 4, c.Messages, "SENDs at 1, 2 and 5 and the WRITE at 3-4, each once: the second resend of 2 is not new")
	assert.Equal(t, map[string]int{"SEND": 3, "RDMA_WRITE": 1}, c.MessagesByKind)
	assert.Equal(t, 5, c.RetransmittedPackets)
}

// The CM exchange of the rxe rdma_cm capture: REQ, REP, RTU, and the
// active side's DREQ answered by a DREP.
func TestCMExchangeRxe(t *testing.T) {
	rep := analyzeFile(t, shared(t, "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"), analyze.Config{})
	require.Len(t, rep.Summary.CM, 1)
	x := rep.Summary.CM[0]
	assert.Equal(t, analyze.CMExchange{Active: "192.168.65.5", Passive: "192.168.65.4", ActiveCommID: "0x34cfb552", PassiveCommID: "0xa980e2d3",
		ServiceID: "0x0000000001061d2f", ActiveQPN: "0x000011", PassiveQPN: "0x000011", REQFrame: 1, REQs: 1, REPFrame: 2, REPs: 1, RTUFrame: 3,
		DREQFrame: 11, DREQFrom: "active", DREPFrame: 12, SetupUs: 4112, State: "disconnected"}, x)
}

// A REQ retried, an MRA, and the passive side's REJ; a REQ nobody answers;
// MADs of exchanges whose REQ is not in the capture are skipped.
func TestCMExchangeRejectMRA(t *testing.T) {
	w := newWire(t, analyze.Config{})
	mad := func(m cm.Message) *bth.Packet {
		b, err := cm.AppendMAD(nil, 1, m)
		require.NoError(t, err)
		return &bth.Packet{BTH: bth.BTH{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: 1, PSN: 1},
			DETH: bth.DETH{QKey: bth.GSIQKey, SrcQP: 1}, Payload: b}
	}
	req := &cm.REQ{LocalCommID: 0x10, ServiceID: 0x106abcd, LocalQPN: 0xA1, TransportServiceType: 0, PathMTU: 3}
	first := w.send(0, hostA, hostB, bth.ECT0, mad(req))
	w.send(time.Millisecond, hostA, hostB, bth.ECT0, mad(req))
	w.send(time.Microsecond, hostB, hostA, bth.ECT0, mad(&cm.MRA{LocalCommID: 0x20, RemoteCommID: 0x10, ServiceTimeout: 20}))
	rej := w.send(time.Microsecond, hostB, hostA, bth.ECT0, mad(&cm.REJ{RemoteCommID: 0x10, MessageRejected: cm.MsgREQ, Reason: cm.RejInvalidServiceID}))
	lone := w.send(time.Microsecond, hostB, hostA, bth.ECT0, mad(&cm.REQ{LocalCommID: 0x30, ServiceID: 0x106abce, LocalQPN: 0xB1}))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, mad(&cm.DREQ{LocalCommID: 0x99, RemoteCommID: 0x98}))
	s := w.report().Summary
	require.Len(t, s.CM, 2)
	assert.Equal(t, analyze.CMExchange{Active: hostA, Passive: hostB, ActiveCommID: "0x00000010", ServiceID: "0x000000000106abcd", ActiveQPN: "0x0000a1",
		REQFrame: first, REQs: 2, MRAs: 1, REJFrame: rej, REJFrom: "passive", REJReason: "invalid service ID (8)", State: "rejected"}, s.CM[0])
	assert.Equal(t, lone, s.CM[1].REQFrame)
	assert.Equal(t, "REQ sent", s.CM[1].State)
	assert.Equal(t, hostB, s.CM[1].Active)
}

// Packets missing from the capture leave a message's place unknown: a
// Middle after a gap is no opcode-sequence error, nor is the Last that
// follows a go-back-N resend of its message's First and Middles (both
// seen in chapter 3 of docs/learn: a dropped Middle, a dropped Last).
func TestOpcodeSequenceAcrossGapsAndResends(t *testing.T) {
	w := newWire(t, analyze.Config{PathMTU: 1024})
	w.send(0, hostA, hostB, bth.ECT0, req(bth.RCWriteFirst, 100, 1024, false))
	// 101 (a Middle) is not in the capture.
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteMiddle, 102, 1024, false))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 103, 8, true))
	// A second WRITE whose Last never reached the capture; the ACK timer
	// resends First and Middles, then the Last goes out for the first time.
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteFirst, 104, 1024, false))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteMiddle, 105, 1024, false))
	w.send(time.Millisecond, hostA, hostB, bth.ECT0, req(bth.RCWriteFirst, 104, 1024, false))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteMiddle, 105, 1024, false))
	w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 106, 8, true))
	// A real error is still one: a Last with no First.
	orphan := w.send(time.Microsecond, hostA, hostB, bth.ECT0, req(bth.RCWriteLast, 107, 8, true))
	c := w.report().Connections[0]
	var seq []analyze.Check
	for _, k := range c.Checks {
		if k.Kind == "opcode sequence" {
			seq = append(seq, k)
		}
	}
	require.Len(t, seq, 1, "%v", c.Checks)
	assert.Equal(t, orphan, seq[0].Frame)
	assert.Equal(t, 3, c.Messages)
}
