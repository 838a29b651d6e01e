package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
)

// ---------------------------------------------------------------------------
// helpers

// runCLI calls run as main does and returns the exit code and both outputs.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// sharedPcaps returns the folder of the shared real captures, which sits
// beside the clone (/work/shared next to /work/main). Without it the tests
// that need it are skipped, except on CI where its absence is a failure.
func sharedPcaps(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "shared", "testdata", "pcaps")
	fi, err := os.Stat(dir)
	if err == nil && fi.IsDir() {
		return dir
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("shared testdata %s is missing on CI: %v", dir, err)
	}
	t.Skipf("shared testdata is not beside the clone (%s): %v", dir, err)
	return ""
}

// jsonPkt is the part of a packet object the tests look at.
type jsonPkt struct {
	File       string  `json:"file"`
	Frame      int     `json:"frame"`
	Time       float64 `json:"time"`
	Src        string  `json:"src"`
	Dst        string  `json:"dst"`
	SPort      uint16  `json:"sport"`
	DPort      uint16  `json:"dport"`
	TOS        uint8   `json:"tos"`
	ECN        string  `json:"ecn"`
	Error      string  `json:"error"`
	Opcode     *uint8  `json:"opcode"`
	OpcodeName string  `json:"opcode_name"`
	DQPN       *uint32 `json:"dqpn"`
	PSN        *uint32 `json:"psn"`
	AckReq     *bool   `json:"ackreq"`
	BECN       *bool   `json:"becn"`
	PadCnt     *uint8  `json:"padcnt"`
	PayloadLen int     `json:"payload_len"`
	ICRC       string  `json:"icrc"`
	ICRCOK     *bool   `json:"icrc_ok"`
	DETH       *struct {
		QKey  uint32 `json:"qkey"`
		SrcQP uint32 `json:"srcqp"`
	} `json:"deth"`
	RETH *struct {
		VA        uint64 `json:"va,string"`
		RKey      uint32 `json:"rkey"`
		DMALength uint32 `json:"dmalen"`
	} `json:"reth"`
	AETH *struct {
		Syndrome uint8  `json:"syndrome"`
		MSN      uint32 `json:"msn"`
		Kind     string `json:"kind"`
		Value    uint8  `json:"value"`
	} `json:"aeth"`
	ImmDt *uint32 `json:"immdt"`

	keys map[string]json.RawMessage
}

type jsonSummary struct {
	Frames        int            `json:"frames"`
	RoCE          int            `json:"roce"`
	Malformed     int            `json:"malformed"`
	NonRoCE       int            `json:"non_roce"`
	BadICRC       int            `json:"bad_icrc"`
	ICRCUnchecked int            `json:"icrc_unchecked"`
	Opcodes       map[string]int `json:"opcodes"`
	AETH          map[string]int `json:"aeth_kinds"`
	ECN           map[string]int `json:"ecn"`
	Flows         []jsonFlow     `json:"flows"`
}

type jsonFlow struct {
	Kind          string `json:"kind"`
	Transport     string `json:"transport"`
	Packets       int    `json:"packets"`
	PayloadBytes  int    `json:"payload_bytes,string"`
	Retransmitted int    `json:"retransmitted_packets"`
	CNPs          int    `json:"cnps"`
}

// jsonFile is what --json printed for one capture: its packets, then its
// summary line.
type jsonFile struct {
	File    string
	Packets []jsonPkt
	Summary jsonSummary
}

// parseJSONLines splits JSON Lines output into files: packet objects up to
// and including a {"file":..., "summary":...} line make one file.
func parseJSONLines(t *testing.T, out string) []jsonFile {
	t.Helper()
	require.True(t, strings.HasSuffix(out, "\n"), "JSON Lines output must end with a newline")
	var files []jsonFile
	var cur jsonFile
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var keys map[string]json.RawMessage
		require.NoErrorf(t, json.Unmarshal([]byte(line), &keys), "line %d is not a JSON object: %s", i+1, line)
		if raw, ok := keys["summary"]; ok {
			require.Lenf(t, keys, 2, "summary line %d must hold only file and summary: %s", i+1, line)
			require.Contains(t, keys, "file")
			require.NoError(t, json.Unmarshal(keys["file"], &cur.File))
			require.NoErrorf(t, json.Unmarshal(raw, &cur.Summary), "summary line %d: %s", i+1, line)
			for _, p := range cur.Packets {
				assert.Equalf(t, cur.File, p.File, "frame %d: file field differs from its summary's", p.Frame)
			}
			files = append(files, cur)
			cur = jsonFile{}
			continue
		}
		var p jsonPkt
		require.NoErrorf(t, json.Unmarshal([]byte(line), &p), "line %d: %s", i+1, line)
		p.keys = keys
		cur.Packets = append(cur.Packets, p)
	}
	require.Empty(t, cur.Packets, "packet objects after the last summary line")
	return files
}

// decodeJSONFile runs decode --json on one file, expects exit 0 and no
// stderr, and returns what it printed for that file.
func decodeJSONFile(t *testing.T, path string) jsonFile {
	t.Helper()
	code, out, errOut := runCLI(t, "decode", "--json", path)
	require.Equalf(t, 0, code, "stderr: %s", errOut)
	require.Empty(t, errOut)
	files := parseJSONLines(t, out)
	require.Len(t, files, 1)
	require.Equal(t, path, files[0].File)
	return files[0]
}

var packetKeys = []string{"time", "src", "dst", "sport", "dport", "opcode", "opcode_name",
	"dqpn", "psn", "ackreq", "padcnt", "ecn", "payload_len", "icrc_ok"}

// checkRealPackets checks what every packet of the real captures has: the
// documented keys, a verified ICRC, the RoCEv2 port and non-decreasing time.
func checkRealPackets(t *testing.T, f jsonFile) {
	t.Helper()
	for _, p := range f.Packets {
		for _, k := range packetKeys {
			assert.Containsf(t, p.keys, k, "frame %d has no %q key", p.Frame, k)
		}
		assert.NotContainsf(t, p.keys, "error", "frame %d", p.Frame)
		if assert.NotNilf(t, p.ICRCOK, "frame %d: icrc_ok", p.Frame) {
			assert.Truef(t, *p.ICRCOK, "frame %d: icrc_ok", p.Frame)
		}
		assert.NotEmptyf(t, p.OpcodeName, "frame %d: opcode_name", p.Frame)
		assert.Equalf(t, uint16(4791), p.DPort, "frame %d: dport", p.Frame)
		// Not checked to be non-decreasing: the Huawei capture itself steps
		// back 1 us at frame 67.
		assert.GreaterOrEqualf(t, p.Time, 0.0, "frame %d: time before the first frame", p.Frame)
		// Non-nil pointers make the tests below simple.
		require.NotNil(t, p.Opcode)
		require.NotNil(t, p.DQPN)
		require.NotNil(t, p.PSN)
		require.NotNil(t, p.AckReq)
		require.NotNil(t, p.PadCnt)
	}
}

var packetLine = regexp.MustCompile(`^ *[0-9]+ +[0-9]+\.[0-9]{6} `)

// decodeText runs decode in text mode on one file, expects exit 0, checks
// that there is one line per RoCE packet followed by the summary line, and
// returns the packet lines.
func decodeText(t *testing.T, path string, roce int, summary string) []string {
	t.Helper()
	code, out, errOut := runCLI(t, "decode", path)
	require.Equalf(t, 0, code, "stderr: %s", errOut)
	require.Empty(t, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Greater(t, len(lines), roce)
	pkts := lines[:roce]
	for i, l := range pkts {
		require.Regexpf(t, packetLine, l, "line %d is not a packet line", i+1)
	}
	assert.Equal(t, summary, lines[roce], "the line after the packets")
	for _, l := range lines[roce+1:] {
		assert.Truef(t, strings.HasPrefix(l, "  "), "unexpected line after the summary: %q", l)
	}
	return pkts
}

func summaryLine(frames, roce, malformed, nonRoCE, badICRC, unchecked int) string {
	return fmt.Sprintf("summary: %d frames, %d RoCEv2 packets, %d malformed, %d non-RoCE skipped, %d bad ICRC, %d ICRC unchecked",
		frames, roce, malformed, nonRoCE, badICRC, unchecked)
}

// ---------------------------------------------------------------------------
// real captures (expected values from /work/shared/testdata/README.md)

const (
	opRCSendFirst     = 0x00
	opRCSendLastImm   = 0x03
	opRCSendOnly      = 0x04
	opRCSendOnlyImm   = 0x05
	opRCWriteOnly     = 0x0A
	opRCReadRequest   = 0x0C
	opRCReadRespFirst = 0x0D
	opRCReadRespMid   = 0x0E
	opRCReadRespLast  = 0x0F
	opRCAck           = 0x11
	opUDSendOnly      = 0x64
	opCNP             = 0x81
)

func TestDecodeRealRdmaCM(t *testing.T) {
	t.Parallel()
	path := filepath.Join(sharedPcaps(t), "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap")
	f := decodeJSONFile(t, path)
	checkRealPackets(t, f)
	require.Len(t, f.Packets, 12)

	s := f.Summary
	assert.Equal(t, 12, s.Frames)
	assert.Equal(t, 12, s.RoCE)
	assert.Equal(t, 0, s.NonRoCE)
	assert.Equal(t, 0, s.Malformed)
	assert.Equal(t, 0, s.BadICRC)
	assert.Equal(t, 0, s.ICRCUnchecked)
	assert.Equal(t, 5, s.Opcodes["UD_SEND_ONLY"])
	assert.Equal(t, 1, s.Opcodes["RC_RDMA_WRITE_ONLY"])
	assert.Equal(t, 1, s.Opcodes["RC_ACKNOWLEDGE"])
	assert.Equal(t, 1, s.Opcodes["RC_RDMA_READ_REQUEST"])
	assert.Equal(t, 1, s.Opcodes["RC_RDMA_READ_RESPONSE_FIRST"])
	assert.Equal(t, 2, s.Opcodes["RC_RDMA_READ_RESPONSE_MIDDLE"])
	assert.Equal(t, 1, s.Opcodes["RC_RDMA_READ_RESPONSE_LAST"])
	assert.Equal(t, 3, s.AETH["ACK"], "ACK + READ FIRST + READ LAST carry an AETH")
	assert.Zero(t, s.ECN["CE"])

	var ud, write, ack, readReq int
	var resp []jsonPkt
	for _, p := range f.Packets {
		assert.Contains(t, []string{"192.168.65.5", "192.168.65.4"}, p.Src)
		assert.Contains(t, []string{"192.168.65.5", "192.168.65.4"}, p.Dst)
		assert.NotEqual(t, p.Src, p.Dst)
		switch *p.Opcode {
		case opUDSendOnly:
			ud++
			assert.Equal(t, uint32(1), *p.DQPN, "CM MADs go to QP1")
			if assert.NotNil(t, p.DETH, "UD SEND_ONLY has a DETH") {
				assert.Equal(t, uint32(0x80010000), p.DETH.QKey)
			}
		case opRCWriteOnly:
			write++
			assert.Equal(t, "192.168.65.5", p.Src)
			assert.Equal(t, uint32(0x11), *p.DQPN)
			assert.Equal(t, uint32(0x8c84dd), *p.PSN, "first RC request PSN = REP starting PSN")
			assert.Equal(t, 18, p.PayloadLen)
			assert.Equal(t, uint8(2), *p.PadCnt)
			if assert.NotNil(t, p.RETH) {
				assert.Equal(t, uint32(18), p.RETH.DMALength)
			}
		case opRCAck:
			ack++
			assert.Equal(t, uint32(0x11), *p.DQPN)
			assert.Equal(t, 0, p.PayloadLen)
			if assert.NotNil(t, p.AETH) {
				assert.Equal(t, uint8(0x1F), p.AETH.Syndrome)
				assert.Equal(t, "ACK", p.AETH.Kind)
				assert.Equal(t, uint32(1), p.AETH.MSN)
			}
		case opRCReadRequest:
			readReq++
			assert.Equal(t, uint32(9209054), *p.PSN)
			assert.Equal(t, 0, p.PayloadLen)
			if assert.NotNil(t, p.RETH) {
				assert.Equal(t, uint32(4096), p.RETH.DMALength)
			}
		case opRCReadRespFirst, opRCReadRespMid, opRCReadRespLast:
			resp = append(resp, p)
		default:
			t.Errorf("frame %d: unexpected opcode %#x", p.Frame, *p.Opcode)
		}
	}
	assert.Equal(t, 5, ud)
	assert.Equal(t, 1, write)
	assert.Equal(t, 1, ack)
	assert.Equal(t, 1, readReq)
	require.Len(t, resp, 4)
	wantOps := []uint8{opRCReadRespFirst, opRCReadRespMid, opRCReadRespMid, opRCReadRespLast}
	for i, p := range resp {
		assert.Equal(t, wantOps[i], *p.Opcode, "response %d", i)
		assert.Equal(t, uint32(9209054+i), *p.PSN, "response %d", i)
		assert.Equal(t, 1024, p.PayloadLen, "response %d", i)
		assert.Equal(t, "192.168.65.4", p.Src, "response %d", i)
		if i == 0 || i == 3 {
			if assert.NotNil(t, p.AETH, "response %d (FIRST/LAST) carries an AETH", i) {
				assert.Equal(t, uint32(2), p.AETH.MSN, "response %d", i)
				assert.Equal(t, "ACK", p.AETH.Kind, "response %d", i)
			}
		} else {
			assert.Nil(t, p.AETH, "response %d (MIDDLE) carries no AETH", i)
			assert.NotContains(t, p.keys, "aeth", "response %d", i)
		}
	}

	lines := decodeText(t, path, 12, summaryLine(12, 12, 0, 0, 0, 0))
	for _, l := range lines {
		assert.Contains(t, l, "icrc=ok")
	}
	assert.Contains(t, lines[3], "RC_RDMA_WRITE_ONLY")
	assert.Contains(t, lines[3], "pad=2")
	assert.Contains(t, lines[3], "payload=18")
	assert.Contains(t, lines[3], "dmalen=18")
}

func TestDecodeRealHuawei(t *testing.T) {
	t.Parallel()
	path := filepath.Join(sharedPcaps(t), "huawei-hns-rc-send-imm-srcport69-mtu1024.pcap")
	f := decodeJSONFile(t, path)
	checkRealPackets(t, f)
	require.Len(t, f.Packets, 105)

	s := f.Summary
	assert.Equal(t, 123, s.Frames)
	assert.Equal(t, 105, s.RoCE)
	assert.Equal(t, 18, s.NonRoCE, "10 TCP + 4 ICMPv6 + 4 ARP")
	assert.Equal(t, 0, s.Malformed)
	assert.Equal(t, 0, s.BadICRC)
	assert.Equal(t, 0, s.ICRCUnchecked)
	assert.Equal(t, map[string]int{
		"RC_ACKNOWLEDGE":              37,
		"RC_SEND_FIRST":               33,
		"RC_SEND_LAST_WITH_IMMEDIATE": 33,
		"RC_SEND_ONLY_WITH_IMMEDIATE": 2,
	}, s.Opcodes)
	assert.Equal(t, map[string]int{"ACK": 37}, s.AETH)
	assert.Equal(t, map[string]int{"ECT(0)": 105}, s.ECN)

	const a4, a6 = "192.168.70.4", "192.168.70.6"
	var acksFrom4, acksFrom6 []jsonPkt
	var reqFrom6, reqFrom4 []jsonPkt
	for _, p := range f.Packets {
		assert.Equalf(t, "ECT(0)", p.ECN, "frame %d", p.Frame)
		switch p.Src {
		case a4:
			assert.Equal(t, a6, p.Dst)
			assert.Equalf(t, uint16(69), p.SPort, "frame %d: .4's source port is its QPN 0x45", p.Frame)
			assert.Equalf(t, uint32(0x48), *p.DQPN, "frame %d: .4 sends to QPN 0x48", p.Frame)
		case a6:
			assert.Equal(t, a4, p.Dst)
			assert.Equalf(t, uint16(72), p.SPort, "frame %d: .6's source port is its QPN 0x48", p.Frame)
			assert.Equalf(t, uint32(0x45), *p.DQPN, "frame %d: .6 sends to QPN 0x45", p.Frame)
		default:
			t.Errorf("frame %d: unexpected source %s", p.Frame, p.Src)
			continue
		}
		if *p.Opcode == opRCAck {
			if assert.NotNilf(t, p.AETH, "frame %d", p.Frame) {
				assert.Equalf(t, "ACK", p.AETH.Kind, "frame %d", p.Frame)
				assert.Containsf(t, []uint8{5, 6}, p.AETH.Syndrome, "frame %d: syndrome", p.Frame)
			}
			if p.Src == a4 {
				acksFrom4 = append(acksFrom4, p)
			} else {
				acksFrom6 = append(acksFrom6, p)
			}
		} else if p.Src == a6 {
			reqFrom6 = append(reqFrom6, p)
		} else {
			reqFrom4 = append(reqFrom4, p)
		}
	}

	// .4 -> .6: one 141-byte SEND_ONLY_WITH_IMM at PSN 0, ACKed with PSN 0, MSN 1.
	require.Len(t, reqFrom4, 1)
	assert.Equal(t, uint8(opRCSendOnlyImm), *reqFrom4[0].Opcode)
	assert.Equal(t, uint32(0), *reqFrom4[0].PSN)
	assert.Equal(t, 141, reqFrom4[0].PayloadLen)
	assert.NotNil(t, reqFrom4[0].ImmDt)
	require.Len(t, acksFrom6, 1)
	assert.Equal(t, uint32(0), *acksFrom6[0].PSN)
	if acksFrom6[0].AETH != nil {
		assert.Equal(t, uint32(1), acksFrom6[0].AETH.MSN)
	}

	// .4 sends 36 ACKs, the last with PSN 66 and MSN 34.
	require.Len(t, acksFrom4, 36)
	last := acksFrom4[len(acksFrom4)-1]
	assert.Equal(t, uint32(66), *last.PSN)
	if last.AETH != nil {
		assert.Equal(t, uint32(34), last.AETH.MSN)
	}

	// .6 -> .4: 67 packets, PSN 0..66 in order, 34 messages: 32 x 2048,
	// one of 1497 bytes (whose last packet has PadCnt 3), one of 4.
	require.Len(t, reqFrom6, 67)
	var msgs []int
	msg := 0
	pad3 := 0
	for i, p := range reqFrom6 {
		assert.Equalf(t, uint32(i), *p.PSN, "request %d from .6", i)
		switch *p.Opcode {
		case opRCSendFirst:
			assert.Zero(t, msg, "SEND_FIRST inside a message")
			assert.Equal(t, 1024, p.PayloadLen, "SEND_FIRST carries one path MTU")
			msg = p.PayloadLen
		case opRCSendLastImm:
			assert.NotNil(t, p.ImmDt)
			msgs = append(msgs, msg+p.PayloadLen)
			msg = 0
		case opRCSendOnlyImm:
			assert.NotNil(t, p.ImmDt)
			msgs = append(msgs, p.PayloadLen)
		default:
			t.Errorf("frame %d: unexpected opcode %#x from .6", p.Frame, *p.Opcode)
		}
		if *p.PadCnt == 3 {
			pad3++
			assert.Equal(t, uint8(opRCSendLastImm), *p.Opcode, "the PadCnt 3 packet ends the 1497-byte message")
			assert.Equal(t, 1497, msgs[len(msgs)-1])
		} else {
			assert.Equalf(t, 0, (p.PayloadLen+int(*p.PadCnt))%4, "frame %d: payload+pad is a multiple of 4", p.Frame)
		}
	}
	assert.Equal(t, 1, pad3, "one packet from .6 with PadCnt 3")
	// The README gives the sizes, not their order: compare counts.
	count := map[int]int{}
	for _, m := range msgs {
		count[m]++
	}
	assert.Equal(t, map[int]int{2048: 32, 1497: 1, 4: 1}, count, "message sizes from .6")
	assert.Len(t, msgs, 34)

	lines := decodeText(t, path, 105, summaryLine(123, 105, 0, 18, 0, 0))
	for _, l := range lines {
		assert.Contains(t, l, "ecn=ECT(0)")
		assert.Contains(t, l, "icrc=ok")
	}
}

func TestDecodeRealCNP(t *testing.T) {
	t.Parallel()
	path := filepath.Join(sharedPcaps(t), "cx4lx-cnp-from-scapy-hexdump.pcap")
	f := decodeJSONFile(t, path)
	checkRealPackets(t, f)
	require.Len(t, f.Packets, 1)
	p := f.Packets[0]
	assert.Equal(t, uint8(opCNP), *p.Opcode)
	assert.Equal(t, uint32(0x118), *p.DQPN)
	assert.Equal(t, uint32(0), *p.PSN)
	assert.Equal(t, uint16(0), p.SPort, "UDP source port 0 is accepted")
	assert.Equal(t, "10.0.17.1", p.Src)
	assert.Equal(t, "10.0.18.1", p.Dst)
	assert.Equal(t, uint8(0xC2), p.TOS)
	assert.Equal(t, "ECT(0)", p.ECN)
	if assert.NotNil(t, p.BECN) {
		assert.True(t, *p.BECN)
	}
	assert.Equal(t, 0, p.PayloadLen, "the 16 reserved bytes are not payload")
	assert.Equal(t, "0x82fd002a", p.ICRC, "wire bytes 82 fd 00 2a, as tshark's infiniband.invariant.crc shows them")

	s := f.Summary
	assert.Equal(t, 1, s.Frames)
	assert.Equal(t, 1, s.RoCE)
	assert.Equal(t, map[string]int{"CNP": 1}, s.Opcodes)
	assert.Equal(t, 0, s.BadICRC)

	lines := decodeText(t, path, 1, summaryLine(1, 1, 0, 0, 0, 0))
	assert.Contains(t, lines[0], "10.0.17.1:0 > 10.0.18.1:4791 CNP")
	assert.Contains(t, lines[0], "becn=1")
	assert.Contains(t, lines[0], "icrc=ok")
}

func TestDecodeRealPingpongPcapng(t *testing.T) {
	t.Parallel()
	path := filepath.Join(sharedPcaps(t), "rxe-rc-pingpong-send-unacked-retransmit.pcapng")
	f := decodeJSONFile(t, path)
	checkRealPackets(t, f)
	require.Len(t, f.Packets, 367)
	for _, p := range f.Packets {
		assert.Equalf(t, uint8(opRCSendOnly), *p.Opcode, "frame %d", p.Frame)
		assert.Equalf(t, uint32(13664499), *p.PSN, "frame %d", p.Frame)
		assert.Equalf(t, uint32(0xd080f3), *p.PSN, "frame %d", p.Frame)
		assert.Truef(t, *p.AckReq, "frame %d: ackreq", p.Frame)
		assert.Equalf(t, 64, p.PayloadLen, "frame %d", p.Frame)
		assert.Equalf(t, uint32(0x123456), *p.DQPN, "frame %d", p.Frame)
		assert.Equalf(t, uint16(63920), p.SPort, "frame %d", p.Frame)
		assert.Equalf(t, "192.0.2.2", p.Src, "frame %d", p.Frame)
		assert.Equalf(t, "192.0.2.1", p.Dst, "frame %d", p.Frame)
	}
	// Retransmitted for about 25 s.
	span := f.Packets[366].Time - f.Packets[0].Time
	assert.InDelta(t, 25, span, 1.5, "time between the first and last retransmission")

	s := f.Summary
	assert.Equal(t, 378, s.Frames)
	assert.Equal(t, 367, s.RoCE)
	assert.Equal(t, 11, s.NonRoCE)
	assert.Equal(t, map[string]int{"RC_SEND_ONLY": 367}, s.Opcodes)
	assert.Equal(t, 0, s.BadICRC)

	lines := decodeText(t, path, 367, summaryLine(378, 367, 0, 11, 0, 0))
	for _, l := range lines {
		assert.Contains(t, l, "192.0.2.2:63920 > 192.0.2.1:4791 RC_SEND_ONLY dqpn=0x123456 psn=13664499 ackreq=1")
		assert.Contains(t, l, "payload=64")
		assert.Contains(t, l, "icrc=ok")
	}
}

// ---------------------------------------------------------------------------
// synthetic captures

var (
	macA = [6]byte{0x02, 0, 0, 0, 0, 0x0a}
	macB = [6]byte{0x02, 0, 0, 0, 0, 0x0b}
	t0   = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
)

func encap(sport, dport uint16) *bth.Encap {
	return &bth.Encap{SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("192.0.2.10"), Dst: netip.MustParseAddr("192.0.2.20"),
		SrcPort: sport, DstPort: dport}
}

// goodFrame is an RC SEND_ONLY with a valid ICRC.
func goodFrame(t *testing.T, psn uint32, payload int) []byte {
	t.Helper()
	p := &bth.Packet{
		BTH:     bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x17, AckReq: true, PSN: bth.PSN(psn)},
		Payload: bytes.Repeat([]byte{0xab}, payload),
	}
	b, err := encap(49152, 0).AppendFrame(nil, p)
	require.NoError(t, err)
	return b
}

// udpFrame wraps a hand-made UDP payload in Ethernet, IPv4 and UDP headers.
func udpFrame(t *testing.T, e *bth.Encap, payload []byte) []byte {
	t.Helper()
	b := append(append(append([]byte{}, e.DstMAC[:]...), e.SrcMAC[:]...), 0x08, 0x00)
	b, err := e.AppendIPUDP(b, len(payload))
	require.NoError(t, err)
	return append(b, payload...)
}

// captureBytes writes frames as a pcap with pcap.Writer.
func captureBytes(t *testing.T, frames ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := pcap.NewWriter(&buf)
	require.NoError(t, err)
	for i, f := range frames {
		require.NoError(t, w.WriteFrame(t0.Add(time.Duration(i)*time.Millisecond), f))
	}
	require.NoError(t, w.Flush())
	return buf.Bytes()
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

func TestDecodeNotACapture(t *testing.T) {
	t.Parallel()
	path := writeTemp(t, "notes.txt", []byte("this is a text file, not a capture\n"))
	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr: %q", errOut)
	assert.True(t, strings.HasSuffix(errOut, "\n"))
	assert.Contains(t, errOut, path)
	assert.Contains(t, errOut, "not a pcap or pcapng capture")

	// The same in JSON mode: no summary for a file that is not a capture.
	code, out, errOut = runCLI(t, "decode", "--json", path)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "not a pcap or pcapng capture")

	// Files too short to hold a magic number.
	for _, data := range [][]byte{nil, {0xd4, 0xc3}} {
		p := writeTemp(t, "short.pcap", data)
		code, out, errOut := runCLI(t, "decode", p)
		assert.Equal(t, 1, code, "%d-byte file", len(data))
		assert.Empty(t, out)
		assert.Contains(t, errOut, p)
		assert.Contains(t, errOut, "not a pcap or pcapng capture")
	}
}

func TestDecodeMissingFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "does-not-exist.pcap")
	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, path)
	_, openErr := os.Open(path)
	require.Error(t, openErr)
	assert.Contains(t, errOut, openErr.Error(), "the OS error, which names the file")
	assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr: %q", errOut)
}

// pcapRecordOffsets returns the offset of each record of a classic pcap.
func pcapRecordOffsets(t *testing.T, data []byte) []int {
	t.Helper()
	require.GreaterOrEqual(t, len(data), 24)
	var offs []int
	for off := 24; off < len(data); {
		offs = append(offs, off)
		require.GreaterOrEqual(t, len(data), off+16)
		incl := binary.LittleEndian.Uint32(data[off+8:])
		off += 16 + int(incl)
	}
	return offs
}

func TestDecodeTruncatedCapture(t *testing.T) {
	t.Parallel()
	data := captureBytes(t, goodFrame(t, 100, 32), goodFrame(t, 101, 32), goodFrame(t, 102, 64))
	offs := pcapRecordOffsets(t, data)
	require.Len(t, offs, 3)
	third := offs[2]
	thirdLen := len(data) - third

	// Sanity: the whole capture decodes cleanly.
	code, out, errOut := runCLI(t, "decode", writeTemp(t, "whole.pcap", data))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, summaryLine(3, 3, 0, 0, 0, 0))

	cuts := []struct {
		name string
		at   int
	}{
		{"middle of the data", third + 16 + (thirdLen-16)/2},
		{"one byte short", len(data) - 1},
		{"middle of the record header", third + 8},
		{"after the record header", third + 16},
	}
	for _, c := range cuts {
		t.Run(c.name, func(t *testing.T) {
			path := writeTemp(t, "cut.pcap", data[:c.at])

			code, out, errOut := runCLI(t, "decode", path)
			assert.Equal(t, 1, code, "exit code; stdout:\n%s", out)
			assert.Contains(t, errOut, path)
			assert.Contains(t, errOut, "truncated")
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			require.GreaterOrEqual(t, len(lines), 3, "stdout:\n%s", out)
			assert.Regexp(t, packetLine, lines[0])
			assert.Contains(t, lines[0], "psn=100")
			assert.Regexp(t, packetLine, lines[1])
			assert.Contains(t, lines[1], "psn=101")
			assert.Equal(t, summaryLine(2, 2, 0, 0, 0, 0), lines[2])
			assert.NotContains(t, out, "psn=102")

			code, out, errOut = runCLI(t, "decode", "--json", path)
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut, "truncated")
			files := parseJSONLines(t, out)
			require.Len(t, files, 1)
			assert.Len(t, files[0].Packets, 2)
			assert.Equal(t, 2, files[0].Summary.Frames)
			assert.Equal(t, 2, files[0].Summary.RoCE)
		})
	}
}

// pcapngBlocks returns the offset and type of each block of a
// little-endian pcapng file.
func pcapngBlocks(t *testing.T, data []byte) (offs []int, types []uint32) {
	t.Helper()
	require.GreaterOrEqual(t, len(data), 12)
	require.Equal(t, uint32(0x1A2B3C4D), binary.LittleEndian.Uint32(data[8:]), "little-endian section")
	for off := 0; off < len(data); {
		require.GreaterOrEqual(t, len(data), off+8)
		n := int(binary.LittleEndian.Uint32(data[off+4:]))
		require.GreaterOrEqual(t, n, 12)
		offs = append(offs, off)
		types = append(types, binary.LittleEndian.Uint32(data[off:]))
		off += n
	}
	return offs, types
}

// A pcapng capture cut inside a packet block is truncated just as a pcap is.
func TestDecodeTruncatedRealPcapng(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(sharedPcaps(t), "rxe-rc-pingpong-send-unacked-retransmit.pcapng"))
	require.NoError(t, err)
	offs, types := pcapngBlocks(t, data)
	// Find the 20th Enhanced Packet Block (type 6): the README puts the 11
	// TCP frames first, so 19 whole frames before it are 11 TCP + 8 RoCE.
	epb := 0
	at := -1
	for i, typ := range types {
		if typ == 6 {
			epb++
			if epb == 20 {
				at = offs[i]
				break
			}
		}
	}
	require.Positive(t, at, "20th packet block")

	for _, c := range []struct {
		name string
		cut  int
	}{
		{"middle of the packet data", at + 28 + 40},
		{"inside the block header", at + 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeTemp(t, "cut.pcapng", data[:c.cut])
			code, out, errOut := runCLI(t, "decode", path)
			assert.Equal(t, 1, code, "exit code")
			assert.Contains(t, errOut, path)
			assert.Contains(t, errOut, "truncated")
			assert.Equal(t, 8, strings.Count(out, "RC_SEND_ONLY dqpn=0x123456 psn=13664499 ackreq=1"), "packet lines before the cut")
			assert.Contains(t, out, summaryLine(19, 8, 0, 11, 0, 0)+"\n")
		})
	}
}

// pcapHeader is a classic little-endian microsecond pcap file header.
func pcapHeader(linkType uint32) []byte {
	h := make([]byte, 24)
	binary.LittleEndian.PutUint32(h[0:], 0xA1B2C3D4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], 65535)
	binary.LittleEndian.PutUint32(h[20:], linkType)
	return h
}

func TestDecodeUnsupportedLinkType(t *testing.T) {
	t.Parallel()
	data := pcapHeader(105) // LINKTYPE_IEEE802_11
	rec := make([]byte, 16)
	binary.LittleEndian.PutUint32(rec[8:], 24)
	binary.LittleEndian.PutUint32(rec[12:], 24)
	data = append(append(data, rec...), make([]byte, 24)...)
	path := writeTemp(t, "wifi.pcap", data)

	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, path)
	assert.Contains(t, errOut, "link type")
	assert.Contains(t, errOut, "105")
	assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr: %q", errOut)
}

func TestDecodeUsageErrors(t *testing.T) {
	t.Parallel()
	t.Run("no arguments", func(t *testing.T) {
		code, out, errOut := runCLI(t)
		assert.Equal(t, 2, code)
		assert.Empty(t, out)
		assert.Contains(t, errOut, "usage: roce-emu COMMAND")
		assert.Contains(t, errOut, "decode")
	})
	t.Run("decode without files", func(t *testing.T) {
		code, out, errOut := runCLI(t, "decode")
		assert.Equal(t, 2, code)
		assert.Empty(t, out)
		assert.Contains(t, errOut, "no capture file given")
		assert.Contains(t, errOut, "usage: roce-emu decode")
	})
	t.Run("unknown flag", func(t *testing.T) {
		path := writeTemp(t, "ok.pcap", captureBytes(t, goodFrame(t, 1, 4)))
		code, out, errOut := runCLI(t, "decode", "--bogus", path)
		assert.Equal(t, 2, code)
		assert.Empty(t, out)
		assert.Contains(t, errOut, "bogus")
		assert.Contains(t, errOut, "usage: roce-emu decode")
	})
	t.Run("unknown command", func(t *testing.T) {
		code, out, errOut := runCLI(t, "frobnicate", "x.pcap")
		assert.Equal(t, 2, code)
		assert.Empty(t, out)
		assert.Contains(t, errOut, `unknown command "frobnicate"`)
		assert.Contains(t, errOut, "usage: roce-emu COMMAND")
	})
	t.Run("help", func(t *testing.T) {
		code, out, errOut := runCLI(t, "help")
		assert.Equal(t, 0, code)
		assert.Contains(t, out, "usage: roce-emu COMMAND")
		assert.Empty(t, errOut)
	})
}

func TestDecodeSeveralFilesOneBad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good1 := filepath.Join(dir, "good1.pcap")
	good2 := filepath.Join(dir, "good2.pcap")
	bad := filepath.Join(dir, "bad.pcap")
	require.NoError(t, os.WriteFile(good1, captureBytes(t, goodFrame(t, 7, 8)), 0o644))
	require.NoError(t, os.WriteFile(good2, captureBytes(t, goodFrame(t, 8, 8), goodFrame(t, 9, 8)), 0o644))
	require.NoError(t, os.WriteFile(bad, []byte("garbage, not a capture"), 0o644))

	code, out, errOut := runCLI(t, "decode", good1, bad, good2)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, bad)
	assert.Contains(t, errOut, "not a pcap or pcapng capture")
	assert.NotContains(t, errOut, good1)
	assert.NotContains(t, errOut, good2)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 7, "stdout:\n%s", out)
	assert.Equal(t, "== "+good1, lines[0])
	assert.Contains(t, lines[1], "psn=7")
	assert.Equal(t, summaryLine(1, 1, 0, 0, 0, 0), lines[2])
	assert.Contains(t, out, "== "+good2+"\n")
	assert.NotContains(t, out, "== "+bad)
	assert.Contains(t, out, "psn=8 ")
	assert.Contains(t, out, "psn=9 ")
	assert.Contains(t, out, summaryLine(2, 2, 0, 0, 0, 0))

	code, out, errOut = runCLI(t, "decode", "--json", good1, bad, good2)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, bad)
	files := parseJSONLines(t, out)
	require.Len(t, files, 2)
	assert.Equal(t, good1, files[0].File)
	assert.Len(t, files[0].Packets, 1)
	assert.Equal(t, good2, files[1].File)
	assert.Len(t, files[1].Packets, 2)
	assert.Equal(t, 2, files[1].Summary.RoCE)
}

func TestDecodeMalformedRoCE(t *testing.T) {
	t.Parallel()
	// BTH: RC_RDMA_WRITE_ONLY, default P_Key, DestQP 0x11, AckReq, PSN 5,
	// then only 8 bytes where the 16-byte RETH and the ICRC should be.
	udp := []byte{0x0A, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x05,
		1, 2, 3, 4, 5, 6, 7, 8}
	frame := udpFrame(t, encap(49152, 0), udp)
	path := writeTemp(t, "malformed.pcap", captureBytes(t, goodFrame(t, 4, 8), frame))

	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 0, code, errOut)
	assert.Empty(t, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 3, "stdout:\n%s", out)
	assert.Contains(t, lines[0], "icrc=ok")
	assert.Regexp(t, packetLine, lines[1])
	assert.Contains(t, lines[1], "MALFORMED")
	assert.Contains(t, lines[1], "192.0.2.10:49152 > 192.0.2.20:4791")
	assert.Contains(t, lines[1], "RETH")
	assert.Equal(t, summaryLine(2, 1, 1, 0, 0, 0), lines[2])

	code, out, errOut = runCLI(t, "decode", "--json", path)
	assert.Equal(t, 0, code, errOut)
	files := parseJSONLines(t, out)
	require.Len(t, files, 1)
	require.Len(t, files[0].Packets, 2)
	m := files[0].Packets[1]
	assert.Contains(t, m.keys, "error")
	assert.NotEmpty(t, m.Error)
	assert.Contains(t, m.Error, "truncated")
	assert.Equal(t, 2, m.Frame)
	assert.Equal(t, "192.0.2.10", m.Src)
	assert.Equal(t, uint16(4791), m.DPort)
	assert.Equal(t, 20, m.PayloadLen, "a malformed packet reports its UDP payload length")
	assert.NotContains(t, files[0].Packets[0].keys, "error")
	assert.Equal(t, 1, files[0].Summary.Malformed)
	assert.Equal(t, 1, files[0].Summary.RoCE)
	assert.Equal(t, 2, files[0].Summary.Frames)
}

func TestDecodeBadICRC(t *testing.T) {
	t.Parallel()
	bad := goodFrame(t, 42, 16)
	bad[len(bad)-1] ^= 0xFF // the last ICRC byte
	path := writeTemp(t, "badicrc.pcap", captureBytes(t, goodFrame(t, 41, 16), bad))

	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 3, "stdout:\n%s", out)
	assert.Contains(t, lines[0], "psn=41")
	assert.Contains(t, lines[0], "icrc=ok")
	assert.Contains(t, lines[1], "psn=42")
	assert.Contains(t, lines[1], "icrc=bad")
	assert.NotContains(t, lines[1], "icrc=ok")
	assert.Equal(t, summaryLine(2, 2, 0, 0, 1, 0), lines[2])

	code, out, _ = runCLI(t, "decode", "--json", path)
	assert.Equal(t, 0, code)
	files := parseJSONLines(t, out)
	require.Len(t, files, 1)
	require.Len(t, files[0].Packets, 2)
	if p := files[0].Packets[0]; assert.NotNil(t, p.ICRCOK) {
		assert.True(t, *p.ICRCOK)
	}
	if p := files[0].Packets[1]; assert.NotNil(t, p.ICRCOK) {
		assert.False(t, *p.ICRCOK)
		assert.Equal(t, uint32(42), *p.PSN)
	}
	assert.Equal(t, 1, files[0].Summary.BadICRC)
	assert.Equal(t, 2, files[0].Summary.RoCE)
}

func TestDecodeSourcePort4791IsNotRoCE(t *testing.T) {
	t.Parallel()
	// A well-formed RoCE-looking payload, but sent from port 4791 to 5000:
	// RoCEv2 is classified by destination port only.
	p := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x17, PSN: 77}, Payload: []byte{1, 2, 3, 4}}
	payload, err := p.Append(nil, encap(4791, 5000))
	require.NoError(t, err)
	frame := udpFrame(t, encap(4791, 5000), payload)
	path := writeTemp(t, "sport4791.pcap", captureBytes(t, frame, goodFrame(t, 78, 4)))

	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 2, "stdout:\n%s", out)
	assert.Contains(t, lines[0], "psn=78")
	assert.Equal(t, summaryLine(2, 1, 0, 1, 0, 0), lines[1])
	assert.NotContains(t, out, "psn=77")
	assert.NotContains(t, out, ":5000")

	code, out, _ = runCLI(t, "decode", "--json", path)
	assert.Equal(t, 0, code)
	files := parseJSONLines(t, out)
	require.Len(t, files, 1)
	require.Len(t, files[0].Packets, 1)
	assert.Equal(t, uint16(4791), files[0].Packets[0].DPort)
	assert.Equal(t, 1, files[0].Summary.NonRoCE)
	assert.Equal(t, 1, files[0].Summary.RoCE)
	assert.Equal(t, 2, files[0].Summary.Frames)
}

// ---------------------------------------------------------------------------
// corrupt and unusual captures

// pcapngLE builds a little-endian pcapng file: a section header, one
// interface description block of link type lt with the given options, and an
// enhanced packet block per frame (timestamps 1, 2, ... in the interface's
// units).
func pcapngLE(lt uint16, idbOpts []byte, frames ...[]byte) []byte {
	block := func(b []byte, typ uint32, body []byte) []byte {
		for len(body)%4 != 0 {
			body = append(body, 0)
		}
		n := uint32(12 + len(body))
		b = binary.LittleEndian.AppendUint32(b, typ)
		b = binary.LittleEndian.AppendUint32(b, n)
		b = append(b, body...)
		return binary.LittleEndian.AppendUint32(b, n)
	}
	shb := []byte{0x4D, 0x3C, 0x2B, 0x1A, 1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}
	b := block(nil, 0x0A0D0D0A, shb)
	idb := binary.LittleEndian.AppendUint16(nil, lt)
	idb = append(idb, 0, 0, 0, 0, 4, 0) // reserved, snaplen 262144
	if len(idbOpts) > 0 {
		idb = append(append(idb, idbOpts...), 0, 0, 0, 0)
	}
	b = block(b, 1, idb)
	for i, f := range frames {
		epb := binary.LittleEndian.AppendUint32(nil, 0)
		epb = binary.LittleEndian.AppendUint32(epb, 0)
		epb = binary.LittleEndian.AppendUint32(epb, uint32(i+1))
		epb = binary.LittleEndian.AppendUint32(epb, uint32(len(f)))
		epb = binary.LittleEndian.AppendUint32(epb, uint32(len(f)))
		b = block(b, 6, append(epb, f...))
	}
	return b
}

// An if_tsresol that makes gopacket divide by zero: one line naming the
// file, exit 1, and the next file is decoded.
func TestDecodeTimestampResolutionOverflow(t *testing.T) {
	t.Parallel()
	good := writeTemp(t, "good.pcap", captureBytes(t, goodFrame(t, 5, 8)))
	for _, r := range []byte{64, 0x80 | 64} {
		bad := writeTemp(t, "res.pcapng", pcapngLE(1, []byte{9, 0, 1, 0, r, 0, 0, 0}, goodFrame(t, 4, 8)))
		code, out, errOut := runCLI(t, "decode", bad, good)
		assert.Equal(t, 1, code)
		assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr: %q", errOut)
		assert.True(t, strings.HasPrefix(errOut, "roce-emu decode: "+bad+": "), errOut)
		assert.Contains(t, errOut, "corrupt capture")
		assert.Contains(t, errOut, "if_tsresol")
		assert.NotContains(t, errOut, "panic")
		assert.Contains(t, out, "== "+good+"\n")
		assert.Contains(t, out, "psn=5 ")
	}
}

func TestDecodeCorruptPcapng(t *testing.T) {
	t.Parallel()
	data := append(pcapngLE(1, nil, goodFrame(t, 1, 8), goodFrame(t, 2, 8)), make([]byte, 4096)...)
	path := writeTemp(t, "zeros.pcapng", data)
	code, out, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "psn=1 ")
	assert.Contains(t, out, "psn=2 ")
	assert.Contains(t, out, summaryLine(2, 2, 0, 0, 0, 0)+"\n")
	assert.Contains(t, errOut, path+": corrupt capture after 2 frames: pcapng block at offset")
	assert.Contains(t, errOut, "block length 0 is less than 12")
}

func TestDecodeDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, out, errOut := runCLI(t, "decode", dir)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Equal(t, "roce-emu decode: "+dir+": read error: is a directory\n", errOut)
}

func TestDecodeTruncatedFileHeader(t *testing.T) {
	t.Parallel()
	path := writeTemp(t, "hdr.pcap", captureBytes(t)[:10])
	code, _, errOut := runCLI(t, "decode", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "truncated")
	assert.NotContains(t, errOut, "not a pcap")
}

func TestDecodeFlagsAfterFiles(t *testing.T) {
	t.Parallel()
	path := writeTemp(t, "ok.pcap", captureBytes(t, goodFrame(t, 9, 4)))
	code, out, errOut := runCLI(t, "decode", path, "--json")
	require.Equal(t, 0, code, errOut)
	files := parseJSONLines(t, out)
	require.Len(t, files, 1)
	assert.Len(t, files[0].Packets, 1)

	code, out, errOut = runCLI(t, "decode", path, "--udp-port", "4791", "--json", path)
	require.Equal(t, 0, code, errOut)
	assert.Len(t, parseJSONLines(t, out), 2)

	// After "--" everything is a file name.
	code, _, errOut = runCLI(t, "decode", path, "--", "--json")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "--json")
}

func TestDecodeIPv6Brackets(t *testing.T) {
	t.Parallel()
	e := &bth.Encap{SrcMAC: macA, DstMAC: macB, Src: netip.MustParseAddr("2001:db8::10"),
		Dst: netip.MustParseAddr("2001:db8::20"), SrcPort: 49152}
	p := &bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x17, PSN: 3}, Payload: []byte{1, 2, 3, 4}}
	frame, err := e.AppendFrame(nil, p)
	require.NoError(t, err)
	path := writeTemp(t, "v6.pcap", captureBytes(t, frame))
	lines := decodeText(t, path, 1, summaryLine(1, 1, 0, 0, 0, 0))
	assert.Contains(t, lines[0], " [2001:db8::10]:49152 > [2001:db8::20]:4791 RC_SEND_ONLY")
}

// pcapRecord is a classic pcap record header and data.
func pcapRecord(caplen, orig int, data []byte) []byte {
	r := make([]byte, 16)
	binary.LittleEndian.PutUint32(r[0:], 1700000000)
	binary.LittleEndian.PutUint32(r[8:], uint32(caplen))
	binary.LittleEndian.PutUint32(r[12:], uint32(orig))
	return append(r, data...)
}

// A frame cut by the snapshot length after its headers: RoCE, the payload
// length of the wire, ICRC unchecked; the flow counts the bytes of the wire.
func TestDecodeSnaplenCut(t *testing.T) {
	t.Parallel()
	whole := goodFrame(t, 50, 1000)
	cut := whole[:96]
	data := append(pcapHeader(1), pcapRecord(len(cut), len(whole), cut)...)
	path := writeTemp(t, "snap.pcap", data)

	lines := decodeText(t, path, 1, summaryLine(1, 1, 0, 0, 0, 1))
	assert.Contains(t, lines[0], "RC_SEND_ONLY dqpn=0x000017 psn=50 ackreq=1 payload=1000 ecn=Not-ECT icrc=unchecked")
	code, out, _ := runCLI(t, "decode", path)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "  flow requests RC 192.0.2.10 > 192.0.2.20 dqpn=0x000017 packets=1 psn=50..50 messages=1 payload=1000B retransmitted=0\n")

	f := decodeJSONFile(t, path)
	require.Len(t, f.Packets, 1)
	assert.Equal(t, 1000, f.Packets[0].PayloadLen)
	assert.Nil(t, f.Packets[0].ICRCOK)
	assert.NotContains(t, f.Packets[0].keys, "error")
	require.Len(t, f.Summary.Flows, 1)
	assert.Equal(t, 1000, f.Summary.Flows[0].PayloadBytes)
}

// Lengths that lie in a complete frame: malformed, saying which.
func TestDecodeLyingLengths(t *testing.T) {
	t.Parallel()
	f := goodFrame(t, 60, 64)
	binary.BigEndian.PutUint16(f[14+20+4:], 200) // UDP length
	path := writeTemp(t, "udplen.pcap", captureBytes(t, f))
	lines := decodeText(t, path, 1, summaryLine(1, 0, 1, 0, 0, 0))
	assert.Contains(t, lines[0], "MALFORMED")
	assert.Contains(t, lines[0], "UDP length 200 exceeds the 88 bytes the IPv4 total length 108 leaves it")
}

// A CNP to a QP is not one of the requests to it.
func TestDecodeCNPFlow(t *testing.T) {
	t.Parallel()
	cnp := &bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: 0xFFFF, BECN: true, DestQP: 0x17}}
	cnpFrame, err := encap(0, 0).AppendFrame(nil, cnp)
	require.NoError(t, err)
	path := writeTemp(t, "cnp.pcap", captureBytes(t, goodFrame(t, 100, 8), goodFrame(t, 101, 8), cnpFrame, goodFrame(t, 102, 8)))
	code, out, errOut := runCLI(t, "decode", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "  flow requests RC 192.0.2.10 > 192.0.2.20 dqpn=0x000017 packets=3 psn=100..102 messages=3 payload=24B retransmitted=0\n")
	assert.Contains(t, out, "  flow cnps CNP 192.0.2.10 > 192.0.2.20 dqpn=0x000017 packets=1 cnps=1\n")

	j := decodeJSONFile(t, path)
	require.Len(t, j.Summary.Flows, 2)
	assert.Equal(t, "requests", j.Summary.Flows[0].Kind)
	assert.Equal(t, "RC", j.Summary.Flows[0].Transport)
	assert.Equal(t, 0, j.Summary.Flows[0].Retransmitted)
	assert.Equal(t, "cnps", j.Summary.Flows[1].Kind)
	assert.Equal(t, "CNP", j.Summary.Flows[1].Transport)
	assert.Equal(t, 1, j.Summary.Flows[1].CNPs)
}
