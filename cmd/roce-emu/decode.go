package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
)

func runDecode(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "write JSON Lines: one object per RoCEv2 packet, then {\"summary\": ...} per file")
	port := fs.Uint("udp-port", 4791, "UDP destination `port` that marks RoCEv2 packets")
	qpFlag := fs.String("qp", "", "print only packets to or from `QPN` (destination QPN, or a UD packet's DETH source QPN; 0x for hex); the summary counts all")
	opFlag := fs.String("opcode", "", "print only packets of `OPCODE` (RC_SEND_ONLY, CNP, ... or a number); the summary counts all")
	maxFlows := fs.Int("max-flows", pcap.DefaultMaxFlows, "flows tracked at once: beyond them the least recently seen are evicted (a sixteenth at a time), each printed when evicted and counted in the summary")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu decode [--json] [--udp-port PORT] [--qp QPN] [--opcode OPCODE] FILE...")
		fmt.Fprintln(stderr, "\nDecodes every RoCEv2 packet (UDP destination port 4791) in pcap or pcapng")
		fmt.Fprintln(stderr, "captures: addresses, opcode, QPN, PSN, extended headers, payload length, ECN")
		fmt.Fprintln(stderr, "and whether the ICRC verifies; then a summary of each file.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	// Flags may come after file names too ("decode f.pcap --json"); after
	// "--" everything is a file name (parseInterspersed, as every command).
	if err := parseInterspersed(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	files := fs.Args()
	if len(files) == 0 {
		fmt.Fprintln(stderr, "roce-emu decode: no capture file given")
		fs.Usage()
		return 2
	}
	if *port == 0 || *port > 65535 {
		fmt.Fprintf(stderr, "roce-emu decode: --udp-port %d: must be 1-65535\n", *port)
		return 2
	}
	if *maxFlows < 1 {
		fmt.Fprintf(stderr, "roce-emu decode: --max-flows %d: must be at least 1\n", *maxFlows)
		return 2
	}
	var flt packetFilter
	if *qpFlag != "" {
		v, err := strconv.ParseUint(*qpFlag, 0, 32)
		if err != nil || v > bth.PSNMask {
			fmt.Fprintf(stderr, "roce-emu decode: --qp %q: want a 24-bit QPN\n", *qpFlag)
			return 2
		}
		flt.qp, flt.byQP = uint32(v), true
	}
	if *opFlag != "" {
		op, ok := parseOpcode(*opFlag)
		if !ok {
			fmt.Fprintf(stderr, "roce-emu decode: --opcode %q: not an opcode name (RC_SEND_ONLY, UD_SEND_ONLY, CNP, ...) or number\n", *opFlag)
			return 2
		}
		flt.op, flt.byOp = op, true
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	code := 0
	for _, name := range files {
		if err := decodeFile(name, uint16(*port), *asJSON, len(files) > 1, *maxFlows, flt, out); err != nil {
			out.Flush()
			fmt.Fprintf(stderr, "roce-emu decode: %v\n", err)
			code = 1
		}
	}
	return code
}

// packetFilter chooses the packets decode prints.
type packetFilter struct {
	byQP, byOp bool
	qp         uint32
	op         bth.Opcode
}

func (f packetFilter) match(k pcap.Kind, rec *pcap.Record) bool {
	if !f.byQP && !f.byOp {
		return true
	}
	if k != pcap.KindRoCE {
		return false
	}
	h := &rec.Packet.BTH
	if f.byOp && h.Opcode != f.op {
		return false
	}
	if f.byQP && h.DestQP != f.qp && !(h.Opcode.Info().Ext&bth.ExtDETH != 0 && rec.Packet.DETH.SrcQP == f.qp) {
		return false
	}
	return true
}

// parseOpcode takes an ib_pack.h name (RC_SEND_ONLY, any case) or a number.
func parseOpcode(s string) (bth.Opcode, bool) {
	if v, err := strconv.ParseUint(s, 0, 8); err == nil {
		op := bth.Opcode(v)
		return op, op.Info() != nil
	}
	for _, op := range bth.Opcodes() {
		if strings.EqualFold(op.String(), s) {
			return op, true
		}
	}
	return 0, false
}

func decodeFile(name string, port uint16, asJSON, many bool, maxFlows int, flt packetFilter, out *bufio.Writer) error {
	r, err := pcap.Open(name)
	if err != nil {
		return err
	}
	defer r.Close()
	if many && !asJSON {
		fmt.Fprintf(out, "== %s\n", name)
	}
	d := pcap.NewDecoder()
	d.Port = port
	sum := pcap.NewSummary()
	enc := json.NewEncoder(out)
	// Flows beyond maxFlows evict the least recently seen, printed here
	// as they go: memory stays bounded, and no flow goes unreported.
	sum.MaxFlows, sum.EvictFlows = maxFlows, true
	sum.OnEvict = func(f *pcap.Flow) {
		if asJSON {
			enc.Encode(struct {
				File        string     `json:"file"`
				EvictedFlow *pcap.Flow `json:"evicted_flow"`
			}{name, f})
			return
		}
		fmt.Fprintf(out, "evicted flow %s\n", f)
	}
	var rec pcap.Record
	var start time.Time
	var js jsonScratch
	var line []byte
	for n := 1; ; n++ {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			sum.SetUnreassembled(d.FragmentsDropped() + d.PendingFragments())
			writeSummary(out, enc, asJSON, name, sum)
			return fmt.Errorf("%s: %w", name, err)
		}
		if n == 1 {
			start = ci.Timestamp
		}
		k, err := d.Decode(data, ci, lt, &rec)
		if errors.Is(err, pcap.ErrLinkType) {
			// A pcapng interface of another link type (802.11, USB):
			// skipped and counted, as tshark goes on past it.
			sum.AddOtherLinkType(lt)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: frame %d: %w", name, n, err)
		}
		mark := sum.Add(k, &rec)
		if k == pcap.KindOther || k == pcap.KindFragment || !flt.match(k, &rec) {
			continue
		}
		rel := rec.Time.Sub(start).Seconds()
		if asJSON {
			j := js.record(name, n, rel, k, &rec)
			j.Mark = mark.String()
			line = appendJSON(line[:0], j)
			if _, err := out.Write(line); err != nil {
				return err
			}
		} else {
			out.WriteString(textLine(n, rel, k, &rec))
			if mark != pcap.MarkNone {
				out.WriteString(" [" + mark.String() + "]")
			}
			out.WriteByte('\n')
		}
	}
	sum.SetUnreassembled(d.FragmentsDropped() + d.PendingFragments())
	writeSummary(out, enc, asJSON, name, sum)
	return nil
}

// textLine formats one packet, for example:
//
//	6   0.004512 192.168.65.5:49153 > 192.168.65.4:4791 RC_RDMA_WRITE_ONLY dqpn=0x000011 psn=9209053 ackreq=1 reth{va=0x... rkey=0x... dmalen=18} pad=2 payload=18 ecn=Not-ECT icrc=ok
func textLine(n int, rel float64, k pcap.Kind, rec *pcap.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5d %10.6f %s > %s ", n, rel, netip.AddrPortFrom(rec.Src, rec.SrcPort), netip.AddrPortFrom(rec.Dst, rec.DstPort))
	h := &rec.Packet.BTH
	if k == pcap.KindMalformed {
		fmt.Fprintf(&b, "MALFORMED (%d bytes): %v", len(rec.UDPPayload), rec.Err)
		return b.String()
	}
	ack := 0
	if h.AckReq {
		ack = 1
	}
	fmt.Fprintf(&b, "%s dqpn=%#06x psn=%d ackreq=%d", h.Opcode, h.DestQP, h.PSN, ack)
	if h.SE {
		b.WriteString(" se=1")
	}
	if h.MigReq {
		b.WriteString(" migreq=1")
	}
	if h.FECN {
		b.WriteString(" fecn=1")
	}
	if h.BECN {
		b.WriteString(" becn=1")
	}
	if h.PKey != bth.DefaultPKey {
		fmt.Fprintf(&b, " pkey=%#04x", h.PKey)
	}
	p := &rec.Packet
	info := h.Opcode.Info()
	e := info.Ext
	if e&bth.ExtDETH != 0 {
		fmt.Fprintf(&b, " deth{qkey=%#08x srcqp=%#06x}", p.DETH.QKey, p.DETH.SrcQP)
	}
	if e&bth.ExtRETH != 0 {
		fmt.Fprintf(&b, " reth{va=%#x rkey=%#08x dmalen=%d}", p.RETH.VA, p.RETH.RKey, p.RETH.DMALength)
	}
	if e&bth.ExtAtomicETH != 0 {
		fmt.Fprintf(&b, " atomiceth{va=%#x rkey=%#08x swap_add=%#x compare=%#x}", p.AtomicETH.VA, p.AtomicETH.RKey, p.AtomicETH.SwapAdd, p.AtomicETH.Compare)
	}
	if e&bth.ExtAETH != 0 {
		fmt.Fprintf(&b, " aeth{%s syndrome=%#02x msn=%d}", p.AETH.Syndrome.KindName(), uint8(p.AETH.Syndrome), p.AETH.MSN)
	}
	if e&bth.ExtAtomicAckETH != 0 {
		fmt.Fprintf(&b, " atomicacketh{orig=%#x}", uint64(p.AtomicAckETH))
	}
	if e&bth.ExtImmDt != 0 {
		fmt.Fprintf(&b, " imm=%#08x", uint32(p.ImmDt))
	}
	if e&bth.ExtIETH != 0 {
		fmt.Fprintf(&b, " ieth{rkey=%#08x}", uint32(p.IETH))
	}
	if h.PadCnt != 0 {
		fmt.Fprintf(&b, " pad=%d", h.PadCnt)
	}
	if c := cmOf(p); c != nil {
		b.WriteString(c.text())
	}
	fmt.Fprintf(&b, " payload=%d ecn=%s icrc=%s", rec.PayloadLen, rec.ECN, icrcWord(rec))
	if rec.Fragments > 0 {
		fmt.Fprintf(&b, " reassembled=%d", rec.Fragments)
	}
	return b.String()
}

func icrcWord(rec *pcap.Record) string {
	switch {
	case !rec.ICRCChecked:
		return "unchecked"
	case rec.ICRCOK:
		return "ok"
	}
	return fmt.Sprintf("bad(wire=%#08x want=%#08x)", tsharkICRC(rec.Packet.ICRC), tsharkICRC(rec.ICRCComputed))
}

// tsharkICRC returns an ICRC value (bth.Packet.ICRC, little-endian on the
// wire) as tshark's infiniband.invariant.crc shows it: the wire bytes read
// in network byte order (wire bytes 88 09 74 2c are 0x8809742c).
func tsharkICRC(v uint32) uint32 { return bits.ReverseBytes32(v) }

type jsonPacket struct {
	File        string        `json:"file"`
	Frame       int           `json:"frame"`
	Time        float64       `json:"time"`
	Timestamp   time.Time     `json:"timestamp"`
	Src         string        `json:"src"`
	Dst         string        `json:"dst"`
	SPort       uint16        `json:"sport"`
	DPort       uint16        `json:"dport"`
	TOS         uint8         `json:"tos"`
	ECN         string        `json:"ecn"`
	TTL         uint8         `json:"ttl"`
	Error       string        `json:"error,omitempty"`
	Opcode      *uint8        `json:"opcode,omitempty"`
	OpcodeName  string        `json:"opcode_name,omitempty"`
	OpcodeShort string        `json:"opcode_short,omitempty"`
	DQPN        *uint32       `json:"dqpn,omitempty"`
	PSN         *uint32       `json:"psn,omitempty"`
	AckReq      *bool         `json:"ackreq,omitempty"`
	SE          *bool         `json:"se,omitempty"`
	MigReq      *bool         `json:"migreq,omitempty"`
	FECN        *bool         `json:"fecn,omitempty"`
	BECN        *bool         `json:"becn,omitempty"`
	PKey        *uint16       `json:"pkey,omitempty"`
	PadCnt      *uint8        `json:"padcnt,omitempty"`
	PayloadLen  int           `json:"payload_len"`
	ICRC        string        `json:"icrc,omitempty"`
	ICRCOK      *bool         `json:"icrc_ok"`
	Fragments   int           `json:"ip_fragments,omitempty"` // IPv4 fragments reassembled into this packet
	Mark        string        `json:"mark,omitempty"`         // pcap.Mark: retransmission, duplicate, out-of-order
	DETH        *jsonDETH     `json:"deth,omitempty"`
	RETH        *jsonRETH     `json:"reth,omitempty"`
	AtomicETH   *jsonAtomic   `json:"atomiceth,omitempty"`
	AETH        *jsonAETH     `json:"aeth,omitempty"`
	AtomicAck   *jsonAtomicAk `json:"atomicacketh,omitempty"`
	ImmDt       *uint32       `json:"immdt,omitempty"`
	IETH        *uint32       `json:"ieth,omitempty"`
	CM          *jsonCM       `json:"cm,omitempty"` // a CM MAD to QP1
}

type jsonDETH struct {
	QKey  uint32 `json:"qkey"`
	SrcQP uint32 `json:"srcqp"`
}

// The 64-bit fields (virtual addresses, atomic operands) are decimal
// strings, as tshark's JSON writes them: jq and JavaScript read numbers
// as doubles, exact only below 2^53. The DMA length is tshark's dmalen
// (infiniband.reth.dmalen).
type jsonRETH struct {
	VA        uint64 `json:"va,string"`
	RKey      uint32 `json:"rkey"`
	DMALength uint32 `json:"dmalen"`
}
type jsonAtomic struct {
	VA      uint64 `json:"va,string"`
	RKey    uint32 `json:"rkey"`
	SwapAdd uint64 `json:"swap_add,string"`
	Compare uint64 `json:"compare,string"`
}
type jsonAETH struct {
	Syndrome uint8  `json:"syndrome"`
	MSN      uint32 `json:"msn"`
	Kind     string `json:"kind"`
	Value    uint8  `json:"value"` // credits, RNR timer code or NAK code
}
type jsonAtomicAk struct {
	Orig uint64 `json:"orig,string"`
}

// jsonScratch holds one packet's JSON form and the values its pointers
// point to, reused from packet to packet.
type jsonScratch struct {
	pkt                        jsonPacket
	opcode, padCnt             uint8
	dqpn, psn, immDt, ieth     uint32
	ackReq, se, migReq, icrcOK bool
	fecn, becn                 bool
	pkey                       uint16
	deth                       jsonDETH
	reth                       jsonRETH
	atomic                     jsonAtomic
	aeth                       jsonAETH
	atomicAck                  jsonAtomicAk
	icrcFor                    uint32
	icrcStr                    string
	addrs                      [2]netip.Addr
	addrStr                    [2]string
}

// addr returns a.String(), kept from the last packet's source (i 0) or
// destination (i 1): a capture holds few addresses.
func (s *jsonScratch) addr(i int, a netip.Addr) string {
	if s.addrStr[i] == "" || s.addrs[i] != a {
		s.addrs[i], s.addrStr[i] = a, a.String()
	}
	return s.addrStr[i]
}

// record fills s with the JSON form of rec and returns it; it is valid
// until the next call.
func (s *jsonScratch) record(file string, n int, rel float64, k pcap.Kind, rec *pcap.Record) *jsonPacket {
	s.pkt = jsonPacket{File: file, Frame: n, Time: rel, Timestamp: rec.Time, Src: s.addr(0, rec.Src), Dst: s.addr(1, rec.Dst),
		SPort: rec.SrcPort, DPort: rec.DstPort, TOS: rec.TrafficClass, ECN: rec.ECN.String(), TTL: rec.HopLimit}
	j := &s.pkt
	if k == pcap.KindMalformed {
		j.Error = rec.Err.Error()
		j.PayloadLen = rec.PayloadLen
		return j
	}
	p := &rec.Packet
	h := &p.BTH
	s.opcode, s.dqpn, s.psn, s.ackReq = uint8(h.Opcode), h.DestQP, uint32(h.PSN), h.AckReq
	s.se, s.migReq, s.fecn, s.becn = h.SE, h.MigReq, h.FECN, h.BECN
	s.pkey, s.padCnt = h.PKey, h.PadCnt
	j.Opcode = &s.opcode
	j.OpcodeName = h.Opcode.Name()
	j.OpcodeShort = h.Opcode.String()
	j.DQPN, j.PSN, j.AckReq = &s.dqpn, &s.psn, &s.ackReq
	j.SE, j.MigReq, j.FECN, j.BECN = &s.se, &s.migReq, &s.fecn, &s.becn
	j.PKey, j.PadCnt = &s.pkey, &s.padCnt
	j.PayloadLen = rec.PayloadLen
	j.ICRC = s.icrcString(tsharkICRC(p.ICRC))
	if rec.ICRCChecked {
		s.icrcOK = rec.ICRCOK
		j.ICRCOK = &s.icrcOK
	}
	if rec.Fragments > 0 {
		j.Fragments = rec.Fragments
	}
	e := h.Opcode.Info().Ext
	if e&bth.ExtDETH != 0 {
		s.deth = jsonDETH{p.DETH.QKey, p.DETH.SrcQP}
		j.DETH = &s.deth
	}
	if e&bth.ExtRETH != 0 {
		s.reth = jsonRETH{p.RETH.VA, p.RETH.RKey, p.RETH.DMALength}
		j.RETH = &s.reth
	}
	if e&bth.ExtAtomicETH != 0 {
		s.atomic = jsonAtomic{p.AtomicETH.VA, p.AtomicETH.RKey, p.AtomicETH.SwapAdd, p.AtomicETH.Compare}
		j.AtomicETH = &s.atomic
	}
	if e&bth.ExtAETH != 0 {
		syn := p.AETH.Syndrome
		s.aeth = jsonAETH{uint8(syn), p.AETH.MSN, syn.KindName(), syn.Value()}
		j.AETH = &s.aeth
	}
	if e&bth.ExtAtomicAckETH != 0 {
		s.atomicAck = jsonAtomicAk{uint64(p.AtomicAckETH)}
		j.AtomicAck = &s.atomicAck
	}
	if e&bth.ExtImmDt != 0 {
		s.immDt = uint32(p.ImmDt)
		j.ImmDt = &s.immDt
	}
	j.CM = cmOf(p)
	if e&bth.ExtIETH != 0 {
		s.ieth = uint32(p.IETH)
		j.IETH = &s.ieth
	}
	return j
}

// icrcString formats v as fmt's %#08x does, keeping the last string for
// runs of packets with the same ICRC (retransmissions).
func (s *jsonScratch) icrcString(v uint32) string {
	if s.icrcStr != "" && s.icrcFor == v {
		return s.icrcStr
	}
	s.icrcFor, s.icrcStr = v, fmt.Sprintf("%#08x", v)
	return s.icrcStr
}

func writeSummary(out *bufio.Writer, enc *json.Encoder, asJSON bool, file string, s *pcap.Summary) {
	if asJSON {
		enc.Encode(struct {
			File    string        `json:"file"`
			Summary *pcap.Summary `json:"summary"`
		}{file, s})
		return
	}
	fmt.Fprintf(out, "summary: %d frames, %d RoCEv2 packets, %d malformed, %d non-RoCE skipped, %d bad ICRC, %d ICRC unchecked\n",
		s.Frames, s.RoCE, s.Malformed, s.NonRoCE, s.BadICRC, s.ICRCUnchecked)
	if s.IPFragments+s.Reassembled+s.Unreassembled > 0 {
		fmt.Fprintf(out, "  ip fragments: %d held, %d datagrams reassembled, %d never completed\n",
			s.IPFragments, s.Reassembled, s.Unreassembled)
	}
	writeCounts(out, "other link types skipped", s.OtherLinkTypes)
	writeCounts(out, "opcodes", s.Opcodes)
	writeCounts(out, "aeth", s.AETH)
	writeCounts(out, "ecn", s.ECN)
	for _, f := range s.Flows {
		fmt.Fprintf(out, "  flow %s\n", f)
	}
	if s.FlowsNotTracked > 0 {
		fmt.Fprintf(out, "  %d packets in flows beyond the %d tracked\n", s.FlowsNotTracked, len(s.Flows))
	}
	if s.FlowsEvicted > 0 {
		fmt.Fprintf(out, "  %d flows (%d packets) evicted, least recently seen first, beyond --max-flows %d; each printed when evicted\n",
			s.FlowsEvicted, s.EvictedPackets, s.MaxFlows)
	}
}

func writeCounts(out *bufio.Writer, label string, m map[string]int) {
	if len(m) == 0 {
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(out, "  %s:", label)
	for _, k := range keys {
		fmt.Fprintf(out, " %s=%d", k, m[k])
	}
	out.WriteByte('\n')
}
