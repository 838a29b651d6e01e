package cm

import (
	"errors"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/stretchr/testify/require"
)

// capturedMAD is one CM MAD read from a capture, with the addresses of
// its packet.
type capturedMAD struct {
	time     time.Time
	src, dst netip.Addr
	deth     bth.DETH
	destQP   uint32
	mad      []byte
}

// readMADs returns the UD SEND_ONLY packets to QP1 of a capture.
func readMADs(t *testing.T, path string) []capturedMAD {
	t.Helper()
	r, err := pcap.Open(path)
	require.NoError(t, err)
	defer r.Close()
	d := pcap.NewDecoder()
	var out []capturedMAD
	for {
		data, ci, lt, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		var rec pcap.Record
		kind, err := d.Decode(data, ci, lt, &rec)
		require.NoError(t, err)
		if kind != pcap.KindRoCE || rec.Packet.BTH.Opcode != bth.UDSendOnly || rec.Packet.BTH.DestQP != 1 {
			continue
		}
		out = append(out, capturedMAD{time: rec.Time, src: rec.Src, dst: rec.Dst, deth: rec.Packet.DETH,
			destQP: rec.Packet.BTH.DestQP, mad: append([]byte(nil), rec.Packet.Payload...)})
	}
}

func sharedCaptureRDMACM(t *testing.T) string {
	t.Helper()
	return filepath.Join(testenv.SharedPcaps(t), "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap")
}

func sharedCase(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(testenv.SharedPcaps(t), "..", "cases", "interop", name)
}

// TestRXECaptureExchange decodes the five CM MADs of the rxe rdma_cm
// capture (../shared/testdata README: REQ starting PSN 0xe1a47d, REP
// starting PSN 0x8c84dd, both QPNs 0x11, path MTU 1024) and re-encodes
// each to the same 256 bytes.
func TestRXECaptureExchange(t *testing.T) {
	mads := readMADs(t, filepath.Join(testenv.SharedPcaps(t), "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"))
	require.Len(t, mads, 5)
	active, passive := netip.MustParseAddr("192.168.65.5"), netip.MustParseAddr("192.168.65.4")
	const activeID, passiveID, tid = 0x34cfb552, 0xa980e2d3, 0x0000000252b5cf34
	wantAttr := []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP}
	wantSrc := []netip.Addr{active, passive, active, active, passive}
	msgs := make([]Message, len(mads))
	for i, c := range mads {
		require.Len(t, c.mad, MADLen)
		require.Equal(t, uint32(bth.GSIQKey), c.deth.QKey)
		require.Equal(t, uint32(1), c.deth.SrcQP)
		require.Equal(t, wantSrc[i], c.src)
		h, m, err := DecodeMAD(c.mad)
		require.NoError(t, err, "MAD %d", i)
		require.True(t, h.IsCM())
		require.Equal(t, wantAttr[i], h.AttrID)
		require.Equal(t, uint64(tid), h.TransactionID)
		require.Zero(t, h.Status)
		require.Zero(t, h.AttrModifier)
		enc, err := AppendMAD(nil, h.TransactionID, m)
		require.NoError(t, err)
		require.Equal(t, c.mad, enc, "re-encoded %v", h.AttrID)
		msgs[i] = m
	}

	req := msgs[0].(*REQ)
	require.Equal(t, uint32(activeID), req.LocalCommID)
	require.Equal(t, ServiceID(PortSpaceTCP, 0x1d2f), req.ServiceID)
	ps, port, ok := ParseServiceID(req.ServiceID)
	require.True(t, ok)
	require.Equal(t, uint16(PortSpaceTCP), ps)
	require.Equal(t, uint16(7471), port)
	require.Equal(t, uint64(0x505400fffe0aaaba), req.LocalCAGUID)
	require.Equal(t, uint32(0x11), req.LocalQPN)
	require.Equal(t, bth.PSN(0xe1a47d), req.StartingPSN)
	require.Equal(t, uint8(3), req.PathMTU) // IBV_MTU_1024
	require.Equal(t, uint8(1), req.ResponderResources)
	require.Equal(t, uint8(1), req.InitiatorDepth)
	require.Equal(t, uint8(7), req.RetryCount)
	require.Equal(t, uint8(7), req.RNRRetryCount)
	require.Equal(t, uint8(15), req.MaxCMRetries)
	require.Equal(t, uint8(20), req.RemoteCMResponseTimeout)
	require.Equal(t, uint8(20), req.LocalCMResponseTimeout)
	require.Equal(t, uint8(ServiceRC), req.TransportServiceType)
	require.Equal(t, uint16(0xffff), req.PKey)
	require.False(t, req.SRQ)
	require.Equal(t, uint16(0xffff), req.Primary.LocalLID)
	require.Equal(t, uint16(0xffff), req.Primary.RemoteLID)
	require.Equal(t, active, req.Primary.LocalGID)
	require.Equal(t, passive, req.Primary.RemoteGID)
	require.Equal(t, uint8(64), req.Primary.HopLimit)
	require.Equal(t, uint8(0x13), req.Primary.LocalACKTimeout)
	require.Equal(t, netip.IPv6Unspecified(), req.Alternate.LocalGID)
	var ip IPHeader
	require.NoError(t, ip.Decode(req.PrivateData[:]))
	require.Equal(t, netip.AddrPortFrom(active, 0x93d7), ip.Src)
	require.Equal(t, passive, ip.Dst)

	rep := msgs[1].(*REP)
	require.Equal(t, uint32(passiveID), rep.LocalCommID)
	require.Equal(t, uint32(activeID), rep.RemoteCommID)
	require.Equal(t, uint32(0x11), rep.LocalQPN)
	require.Equal(t, bth.PSN(0x8c84dd), rep.StartingPSN)
	require.Equal(t, uint8(1), rep.ResponderResources)
	require.Equal(t, uint8(1), rep.InitiatorDepth)
	require.Equal(t, uint8(15), rep.TargetACKDelay)
	require.Equal(t, uint8(7), rep.RNRRetryCount)
	require.False(t, rep.SRQ)
	require.Equal(t, uint64(0x505400fffebf4369), rep.LocalCAGUID)

	rtu := msgs[2].(*RTU)
	require.Equal(t, uint32(activeID), rtu.LocalCommID)
	require.Equal(t, uint32(passiveID), rtu.RemoteCommID)

	dreq := msgs[3].(*DREQ)
	require.Equal(t, uint32(activeID), dreq.LocalCommID)
	require.Equal(t, uint32(passiveID), dreq.RemoteCommID)
	require.Equal(t, uint32(0x11), dreq.RemoteQPN)

	drep := msgs[4].(*DREP)
	require.Equal(t, uint32(passiveID), drep.LocalCommID)
	require.Equal(t, uint32(activeID), drep.RemoteCommID)
}

// TestUnansweredREQCaptures decodes the REQs of rping -c and
// ib_write_bw -R sent to a peer that never answered, and the REJ
// (reason timeout, ARI the CA GUID) that each sends when its retries run
// out. The REQs are resent every RemoteCMResponseTimeout + 2 *
// PacketLifeTime, as REQTimeout computes it (6.44 s for 20 and 18).
func TestUnansweredREQCaptures(t *testing.T) {
	for _, tc := range []struct {
		file      string
		port      uint16
		qpn       uint32
		psn       bth.PSN
		rdAtomic  uint8
		srcPort   uint16
		wantREJ   bool
		commID    uint32
		minResent int
	}{
		{"rxe-rping-c-cm-req-unanswered.pcapng", 7174, 0x40, 0x04357a, 1, 0xc725, true, 0x2e79c0be, 4},
		{"rxe-ib_write_bw-R-cm-req-unanswered.pcapng", 18515, 0x3f, 0xb068a7, 0, 0xe584, true, 0x2f79c0be, 4},
	} {
		t.Run(tc.file, func(t *testing.T) {
			mads := readMADs(t, sharedCase(t, tc.file))
			var reqs, rejs int
			var last time.Time
			for _, c := range mads {
				h, m, err := DecodeMAD(c.mad)
				require.NoError(t, err)
				switch m := m.(type) {
				case *REQ:
					reqs++
					if reqs > 2 { // the first gap is shorter: the REQ left before its timer started
						gap := c.time.Sub(last)
						want := REQTimeout(m, 18)
						require.InDelta(t, want.Seconds(), gap.Seconds(), 0.05*want.Seconds(), "gap before REQ %d", reqs)
					}
					last = c.time
					require.Equal(t, tc.commID, m.LocalCommID)
					require.Equal(t, ServiceID(PortSpaceTCP, tc.port), m.ServiceID)
					require.Equal(t, tc.qpn, m.LocalQPN)
					require.Equal(t, tc.psn, m.StartingPSN)
					require.Equal(t, uint8(5), m.PathMTU) // IBV_MTU_4096
					require.Equal(t, tc.rdAtomic, m.ResponderResources)
					require.Equal(t, tc.rdAtomic, m.InitiatorDepth)
					require.Equal(t, uint8(15), m.MaxCMRetries)
					require.Equal(t, uint8(20), m.RemoteCMResponseTimeout)
					var ip IPHeader
					require.NoError(t, ip.Decode(m.PrivateData[:]))
					require.Equal(t, netip.MustParseAddrPort("192.0.2.2:0").Addr(), ip.Src.Addr())
					require.Equal(t, tc.srcPort, ip.Src.Port())
					require.Equal(t, netip.MustParseAddr("192.0.2.1"), ip.Dst)
					require.Equal(t, netip.MustParseAddr("192.0.2.2"), m.Primary.LocalGID)
					require.Equal(t, netip.MustParseAddr("192.0.2.1"), m.Primary.RemoteGID)
				case *REJ:
					rejs++
					require.Equal(t, tc.commID, m.LocalCommID)
					require.Zero(t, m.RemoteCommID)
					require.Equal(t, RejTimeout, m.Reason)
					require.Equal(t, uint8(MsgOther), m.MessageRejected)
					require.Equal(t, []byte{0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56}, m.ARIBytes())
				default:
					t.Fatalf("unexpected %v", h.AttrID)
				}
				enc, err := AppendMAD(nil, h.TransactionID, m)
				require.NoError(t, err)
				require.Equal(t, c.mad, enc)
			}
			require.GreaterOrEqual(t, reqs, tc.minResent)
			require.Equal(t, tc.wantREJ, rejs > 0)
		})
	}
}
