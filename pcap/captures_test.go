package pcap

import (
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rec is what the capture tests keep of a Record (Records alias the
// reader's buffer).
type rec struct {
	kind    Kind
	src     netip.Addr
	dst     netip.Addr
	sport   uint16
	ecn     bth.ECN
	ipID    uint16
	df      bool
	udpLen  int
	p       bth.Packet
	payload []byte
	icrcOK  bool
}

func readCapture(t *testing.T, path string) ([]rec, *Summary) {
	t.Helper()
	r, err := Open(path)
	require.NoError(t, err)
	defer r.Close()
	d := NewDecoder()
	sum := NewSummary()
	var out []rec
	var x Record
	for {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		k, err := d.Decode(data, ci, lt, &x)
		require.NoError(t, err)
		sum.Add(k, &x)
		if k == KindOther {
			continue
		}
		require.Equal(t, KindRoCE, k, "frame %d: %v", sum.Frames, x.Err)
		out = append(out, rec{kind: k, src: x.Src, dst: x.Dst, sport: x.SrcPort, ecn: x.ECN, ipID: x.IPID, df: x.DF,
			udpLen: len(x.UDPHeader) + len(x.UDPPayload), p: x.Packet,
			payload: append([]byte(nil), x.Packet.Payload...), icrcOK: x.ICRCChecked && x.ICRCOK})
	}
	return out, sum
}

func sharedCapture(t *testing.T, name string) string {
	return filepath.Join(testenv.SharedPcaps(t), name)
}

// Expected values: ../shared/testdata/README.md.
func TestCaptureRxeRDMACM(t *testing.T) {
	recs, sum := readCapture(t, sharedCapture(t, "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"))
	require.Len(t, recs, 12)
	assert.Equal(t, 0, sum.BadICRC)
	assert.Equal(t, 0, sum.NonRoCE)
	for i, r := range recs {
		assert.True(t, r.icrcOK, "frame %d ICRC", i+1)
	}
	assert.Equal(t, map[string]int{"UD_SEND_ONLY": 5, "RC_RDMA_WRITE_ONLY": 1, "RC_ACKNOWLEDGE": 1,
		"RC_RDMA_READ_REQUEST": 1, "RC_RDMA_READ_RESPONSE_FIRST": 1, "RC_RDMA_READ_RESPONSE_MIDDLE": 2,
		"RC_RDMA_READ_RESPONSE_LAST": 1}, sum.Opcodes)

	// CM MADs on QP1: REQ, REP, RTU, DREQ, DREP in that order. The MAD
	// attribute ID is bytes 16-17 of the MAD; the REQ's starting PSN is at
	// MAD data offset 44 and the REP's at 20 (IBTA 12.6.5, 12.6.8).
	var attrs []uint16
	var reqPSN, repPSN uint32
	for _, r := range recs {
		if r.p.BTH.Opcode != bth.UDSendOnly {
			continue
		}
		assert.Equal(t, uint32(1), r.p.BTH.DestQP)
		assert.Equal(t, uint32(bth.GSIQKey), r.p.DETH.QKey)
		require.Len(t, r.payload, 256)
		attr := binary.BigEndian.Uint16(r.payload[16:])
		attrs = append(attrs, attr)
		data := r.payload[24:]
		switch attr {
		case 0x0010:
			reqPSN = uint32(data[44])<<16 | uint32(data[45])<<8 | uint32(data[46])
		case 0x0013:
			repPSN = uint32(data[20])<<16 | uint32(data[21])<<8 | uint32(data[22])
		}
	}
	assert.Equal(t, []uint16{0x0010, 0x0013, 0x0014, 0x0015, 0x0016}, attrs)
	assert.Equal(t, uint32(0xe1a47d), reqPSN)
	assert.Equal(t, uint32(0x8c84dd), repPSN)

	byOp := func(op bth.Opcode) []rec {
		var o []rec
		for _, r := range recs {
			if r.p.BTH.Opcode == op {
				o = append(o, r)
			}
		}
		return o
	}
	w := byOp(bth.RCWriteOnly)
	require.Len(t, w, 1)
	assert.Equal(t, bth.PSN(0x8c84dd), w[0].p.BTH.PSN, "first RC request PSN is the REP's starting PSN")
	assert.Equal(t, uint8(2), w[0].p.BTH.PadCnt)
	assert.Len(t, w[0].payload, 18)
	assert.Equal(t, uint32(18), w[0].p.RETH.DMALength)
	assert.Equal(t, uint32(0x11), w[0].p.BTH.DestQP)

	ack := byOp(bth.RCAcknowledge)
	require.Len(t, ack, 1)
	assert.Equal(t, bth.SyndromeACKNoCredits, ack[0].p.AETH.Syndrome)
	assert.Equal(t, uint32(1), ack[0].p.AETH.MSN)

	rd := byOp(bth.RCReadRequest)
	require.Len(t, rd, 1)
	assert.Equal(t, bth.PSN(9209054), rd[0].p.BTH.PSN)
	assert.Equal(t, uint32(4096), rd[0].p.RETH.DMALength)
	var resp []rec
	for _, r := range recs {
		if r.p.BTH.Opcode.Info().Op == bth.OpReadResponse {
			resp = append(resp, r)
		}
	}
	require.Len(t, resp, 4)
	for i, r := range resp {
		assert.Equal(t, bth.PSN(9209054+i), r.p.BTH.PSN)
		assert.Len(t, r.payload, 1024, "path MTU 1024")
		if i == 0 || i == 3 {
			assert.Equal(t, uint32(2), r.p.AETH.MSN)
		}
	}
	for _, f := range sum.Flows {
		assert.Zero(t, f.Retransmitted)
		assert.Zero(t, f.NAKs)
		assert.Zero(t, f.CE)
		assert.Zero(t, f.CNPs)
	}
}

func TestCaptureHuawei(t *testing.T) {
	recs, sum := readCapture(t, sharedCapture(t, "huawei-hns-rc-send-imm-srcport69-mtu1024.pcap"))
	assert.Equal(t, 123, sum.Frames)
	assert.Equal(t, 105, sum.RoCE, "classified by UDP destination port only: none taken for TFTP")
	assert.Equal(t, 18, sum.NonRoCE, "10 TCP, 4 ICMPv6, 4 ARP")
	assert.Equal(t, 0, sum.BadICRC)
	a, b := netip.MustParseAddr("192.168.70.4"), netip.MustParseAddr("192.168.70.6")
	var fromB, fromA []rec
	for _, r := range recs {
		assert.True(t, r.icrcOK)
		assert.Equal(t, bth.ECT0, r.ecn)
		assert.Zero(t, r.ipID)
		assert.True(t, r.df)
		switch r.src {
		case a:
			assert.Equal(t, uint16(69), r.sport)
			assert.Equal(t, uint32(0x48), r.p.BTH.DestQP)
			fromA = append(fromA, r)
		case b:
			assert.Equal(t, uint16(72), r.sport)
			assert.Equal(t, uint32(0x45), r.p.BTH.DestQP)
			fromB = append(fromB, r)
		default:
			t.Fatalf("unexpected source %s", r.src)
		}
	}
	// .6 -> .4: 34 SEND messages in 67 packets, PSN 0..66, and one ACK.
	var reqs, msgs, acks int
	var sizes []int
	size := 0
	for _, r := range fromB {
		info := r.p.BTH.Opcode.Info()
		if info.Op == bth.OpAcknowledge {
			acks++
			assert.Equal(t, bth.PSN(0), r.p.BTH.PSN)
			assert.Equal(t, uint32(1), r.p.AETH.MSN)
			continue
		}
		assert.Equal(t, bth.PSN(reqs), r.p.BTH.PSN)
		reqs++
		size += len(r.payload)
		if info.Ends() {
			msgs++
			sizes = append(sizes, size)
			size = 0
		}
	}
	assert.Equal(t, 67, reqs)
	assert.Equal(t, 34, msgs)
	assert.Equal(t, 1, acks)
	n2048 := 0
	for _, s := range sizes {
		if s == 2048 {
			n2048++
		}
	}
	assert.Equal(t, 32, n2048)
	assert.Contains(t, sizes, 1497)
	assert.Contains(t, sizes, 4)
	// .4 -> .6: one 141-byte SEND_ONLY_WITH_IMMEDIATE at PSN 0, and 36
	// coalesced ACKs, the last with PSN 66 and MSN 34, real credit counts.
	var acksA []rec
	for _, r := range fromA {
		if r.p.BTH.Opcode == bth.RCAcknowledge {
			acksA = append(acksA, r)
			assert.Contains(t, []bth.Syndrome{5, 6}, r.p.AETH.Syndrome)
			continue
		}
		assert.Equal(t, bth.RCSendOnlyImm, r.p.BTH.Opcode)
		assert.Len(t, r.payload, 141)
		assert.Equal(t, uint8(3), r.p.BTH.PadCnt)
	}
	require.Len(t, acksA, 36)
	assert.Equal(t, bth.PSN(66), acksA[35].p.BTH.PSN)
	assert.Equal(t, uint32(34), acksA[35].p.AETH.MSN)
	assert.Equal(t, 37, sum.Opcodes["RC_ACKNOWLEDGE"])
}

func TestCaptureConnectXCNP(t *testing.T) {
	recs, sum := readCapture(t, sharedCapture(t, "cx4lx-cnp-from-scapy-hexdump.pcap"))
	require.Len(t, recs, 1)
	r := recs[0]
	assert.Equal(t, bth.CNP, r.p.BTH.Opcode)
	assert.Equal(t, uint32(0x118), r.p.BTH.DestQP)
	assert.True(t, r.p.BTH.BECN)
	assert.Equal(t, uint16(0), r.sport, "UDP source port 0 accepted")
	assert.Equal(t, netip.MustParseAddr("10.0.18.1"), r.dst)
	assert.True(t, r.icrcOK)
	assert.Equal(t, uint32(0x2a00fd82), r.p.ICRC, "wire bytes 82 fd 00 2a")
	assert.Equal(t, 1, sum.Flows[0].CNPs)
}

func TestCaptureRxePingpongRetransmit(t *testing.T) {
	recs, sum := readCapture(t, sharedCapture(t, "rxe-rc-pingpong-send-unacked-retransmit.pcapng"))
	require.Len(t, recs, 367)
	assert.Equal(t, 11, sum.NonRoCE, "the TCP exchange")
	ids := map[uint16]bool{}
	for _, r := range recs {
		assert.Equal(t, bth.RCSendOnly, r.p.BTH.Opcode)
		assert.Equal(t, bth.PSN(13664499), r.p.BTH.PSN)
		assert.True(t, r.p.BTH.AckReq)
		assert.Equal(t, uint32(0x123456), r.p.BTH.DestQP)
		assert.Len(t, r.payload, 64)
		assert.Equal(t, 88, r.udpLen)
		assert.Equal(t, uint16(63920), r.sport)
		assert.True(t, r.icrcOK)
		ids[r.ipID] = true
	}
	assert.Len(t, ids, 367, "rxe puts a new IP ID on every packet")
	require.Len(t, sum.Flows, 1)
	assert.Equal(t, 366, sum.Flows[0].Retransmitted)
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notCap := filepath.Join(dir, "notes.txt")
	require.NoError(t, writeFile(notCap, []byte("hello, this is not a capture\n")))
	_, err := Open(notCap)
	assert.ErrorIs(t, err, ErrNotCapture)
	assert.Contains(t, err.Error(), notCap)

	empty := filepath.Join(dir, "empty.pcap")
	require.NoError(t, writeFile(empty, nil))
	_, err = Open(empty)
	assert.ErrorIs(t, err, ErrNotCapture)

	// A pcap header with link type 105 (IEEE 802.11).
	hdr := []byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 105, 0, 0, 0}
	wifi := filepath.Join(dir, "wifi.pcap")
	require.NoError(t, writeFile(wifi, hdr))
	_, err = Open(wifi)
	assert.ErrorIs(t, err, ErrLinkType)

	_, err = Open(filepath.Join(dir, "missing.pcap"))
	assert.True(t, errors.Is(err, errNotExist()))
}
