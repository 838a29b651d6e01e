package bth

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// opcodeRow is the expected description of one opcode, written by hand from
// docs/wire-format.md section 2 (headers), IBTA Table 38 (position), Linux ib_pack.h
// (short names) and Wireshark's packet-infiniband.c bth_opcode_tbl (names).
type opcodeRow struct {
	op      Opcode
	name    string
	short   string
	ext     Ext
	pos     Position
	oper    Operation
	payload bool
}

const (
	rcName = "Reliable Connection (RC) - "
	ucName = "Unreliable Connection (UC) - "
	udName = "Unreliable Datagram (UD) - "
)

var opcodeTable = []opcodeRow{
	{0x00, rcName + "SEND First", "RC_SEND_FIRST", 0, PosFirst, OpSend, true},
	{0x01, rcName + "SEND Middle", "RC_SEND_MIDDLE", 0, PosMiddle, OpSend, true},
	{0x02, rcName + "SEND Last", "RC_SEND_LAST", 0, PosLast, OpSend, true},
	{0x03, rcName + "SEND Last with Immediate", "RC_SEND_LAST_WITH_IMMEDIATE", ExtImmDt, PosLast, OpSend, true},
	{0x04, rcName + "SEND Only", "RC_SEND_ONLY", 0, PosOnly, OpSend, true},
	{0x05, rcName + "SEND Only with Immediate", "RC_SEND_ONLY_WITH_IMMEDIATE", ExtImmDt, PosOnly, OpSend, true},
	{0x06, rcName + "RDMA WRITE First", "RC_RDMA_WRITE_FIRST", ExtRETH, PosFirst, OpWrite, true},
	{0x07, rcName + "RDMA WRITE Middle", "RC_RDMA_WRITE_MIDDLE", 0, PosMiddle, OpWrite, true},
	{0x08, rcName + "RDMA WRITE Last", "RC_RDMA_WRITE_LAST", 0, PosLast, OpWrite, true},
	{0x09, rcName + "RDMA WRITE Last with Immediate", "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", ExtImmDt, PosLast, OpWrite, true},
	{0x0A, rcName + "RDMA WRITE Only", "RC_RDMA_WRITE_ONLY", ExtRETH, PosOnly, OpWrite, true},
	{0x0B, rcName + "RDMA WRITE Only with Immediate", "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", ExtRETH | ExtImmDt, PosOnly, OpWrite, true},
	{0x0C, rcName + "RDMA READ Request", "RC_RDMA_READ_REQUEST", ExtRETH, PosNone, OpReadRequest, false},
	{0x0D, rcName + "RDMA READ response First", "RC_RDMA_READ_RESPONSE_FIRST", ExtAETH, PosFirst, OpReadResponse, true},
	{0x0E, rcName + "RDMA READ response Middle", "RC_RDMA_READ_RESPONSE_MIDDLE", 0, PosMiddle, OpReadResponse, true},
	{0x0F, rcName + "RDMA READ response Last", "RC_RDMA_READ_RESPONSE_LAST", ExtAETH, PosLast, OpReadResponse, true},
	{0x10, rcName + "RDMA READ response Only", "RC_RDMA_READ_RESPONSE_ONLY", ExtAETH, PosOnly, OpReadResponse, true},
	{0x11, rcName + "Acknowledge", "RC_ACKNOWLEDGE", ExtAETH, PosNone, OpAcknowledge, false},
	{0x12, rcName + "ATOMIC Acknowledge", "RC_ATOMIC_ACKNOWLEDGE", ExtAETH | ExtAtomicAckETH, PosNone, OpAtomicAcknowledge, false},
	{0x13, rcName + "CmpSwap", "RC_COMPARE_SWAP", ExtAtomicETH, PosNone, OpCompareSwap, false},
	{0x14, rcName + "FetchAdd", "RC_FETCH_ADD", ExtAtomicETH, PosNone, OpFetchAdd, false},
	{0x16, rcName + "SEND Last with Invalidate", "RC_SEND_LAST_WITH_INVALIDATE", ExtIETH, PosLast, OpSend, true},
	{0x17, rcName + "SEND Only with Invalidate", "RC_SEND_ONLY_WITH_INVALIDATE", ExtIETH, PosOnly, OpSend, true},

	{0x20, ucName + "SEND First", "UC_SEND_FIRST", 0, PosFirst, OpSend, true},
	{0x21, ucName + "SEND Middle", "UC_SEND_MIDDLE", 0, PosMiddle, OpSend, true},
	{0x22, ucName + "SEND Last", "UC_SEND_LAST", 0, PosLast, OpSend, true},
	{0x23, ucName + "SEND Last with Immediate", "UC_SEND_LAST_WITH_IMMEDIATE", ExtImmDt, PosLast, OpSend, true},
	{0x24, ucName + "SEND Only", "UC_SEND_ONLY", 0, PosOnly, OpSend, true},
	{0x25, ucName + "SEND Only with Immediate", "UC_SEND_ONLY_WITH_IMMEDIATE", ExtImmDt, PosOnly, OpSend, true},
	{0x26, ucName + "RDMA WRITE First", "UC_RDMA_WRITE_FIRST", ExtRETH, PosFirst, OpWrite, true},
	{0x27, ucName + "RDMA WRITE Middle", "UC_RDMA_WRITE_MIDDLE", 0, PosMiddle, OpWrite, true},
	{0x28, ucName + "RDMA WRITE Last", "UC_RDMA_WRITE_LAST", 0, PosLast, OpWrite, true},
	{0x29, ucName + "RDMA WRITE Last with Immediate", "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", ExtImmDt, PosLast, OpWrite, true},
	{0x2A, ucName + "RDMA WRITE Only", "UC_RDMA_WRITE_ONLY", ExtRETH, PosOnly, OpWrite, true},
	{0x2B, ucName + "RDMA WRITE Only with Immediate", "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", ExtRETH | ExtImmDt, PosOnly, OpWrite, true},

	{0x64, udName + "SEND only", "UD_SEND_ONLY", ExtDETH, PosOnly, OpSend, true},
	{0x65, udName + "SEND only with Immediate", "UD_SEND_ONLY_WITH_IMMEDIATE", ExtDETH | ExtImmDt, PosOnly, OpSend, true},

	// Wireshark 4.0 knows CNP only as 0x80 and shows 0x81 as "Unknown (129)";
	// this package names the real RoCEv2 CNP opcode 0x81 "CNP" (opcode.go).
	{0x81, "CNP", "CNP", ExtCNP, PosNone, OpCNP, false},
}

func TestOpcodesList(t *testing.T) {
	var want []Opcode
	for _, r := range opcodeTable {
		want = append(want, r.op)
	}
	assert.Equal(t, want, Opcodes(), "Opcodes() must list exactly the table, in numeric order")
	assert.Len(t, Opcodes(), 23+12+2+1)
}

func TestOpcodeTable(t *testing.T) {
	for _, r := range opcodeTable {
		t.Run(r.short, func(t *testing.T) {
			info := r.op.Info()
			require.NotNil(t, info)
			assert.True(t, r.op.Known())
			assert.Equal(t, r.name, info.Name)
			assert.Equal(t, r.name, r.op.Name())
			assert.Equal(t, r.short, info.Short)
			assert.Equal(t, r.short, r.op.String())
			assert.Equal(t, r.ext, info.Ext, "extended headers: got %s, want %s", info.Ext, r.ext)
			assert.Equal(t, r.pos, info.Pos)
			assert.Equal(t, r.oper, info.Op)
			assert.Equal(t, r.payload, info.Payload)
			assert.Equal(t, r.ext&ExtImmDt != 0, info.Immediate)
			assert.Equal(t, r.ext&ExtIETH != 0, info.Invalidate)

			starts := r.pos == PosFirst || r.pos == PosOnly
			ends := r.pos == PosLast || r.pos == PosOnly
			assert.Equal(t, starts, info.Starts(), "Starts")
			assert.Equal(t, ends, info.Ends(), "Ends")
		})
	}
}

// Starts/Ends spelled out for a few opcodes, independently of the table.
func TestOpcodeStartsEnds(t *testing.T) {
	cases := []struct {
		op           Opcode
		starts, ends bool
	}{
		{RCSendFirst, true, false},
		{RCSendMiddle, false, false},
		{RCSendLast, false, true},
		{RCSendOnly, true, true},
		{RCWriteFirst, true, false},
		{RCWriteLastImm, false, true},
		{RCReadRequest, false, false},
		{RCReadResponseFirst, true, false},
		{RCReadResponseMiddle, false, false},
		{RCReadResponseLast, false, true},
		{RCReadResponseOnly, true, true},
		{RCAcknowledge, false, false},
		{RCAtomicAcknowledge, false, false},
		{RCCompareSwap, false, false},
		{RCFetchAdd, false, false},
		{RCSendLastInvalidate, false, true},
		{RCSendOnlyInvalidate, true, true},
		{UCWriteOnlyImm, true, true},
		{UCSendMiddle, false, false},
		{UDSendOnly, true, true},
		{UDSendOnlyImm, true, true},
		{CNP, false, false},
	}
	for _, c := range cases {
		info := c.op.Info()
		require.NotNil(t, info, "%#x", uint8(c.op))
		assert.Equal(t, c.starts, info.Starts(), "%s Starts", c.op)
		assert.Equal(t, c.ends, info.Ends(), "%s Ends", c.op)
	}
}

func TestOpcodeConstants(t *testing.T) {
	// The named constants carry the numeric values of IBTA Table 38.
	consts := map[Opcode]uint8{
		RCSendFirst: 0x00, RCSendMiddle: 0x01, RCSendLast: 0x02, RCSendLastImm: 0x03,
		RCSendOnly: 0x04, RCSendOnlyImm: 0x05, RCWriteFirst: 0x06, RCWriteMiddle: 0x07,
		RCWriteLast: 0x08, RCWriteLastImm: 0x09, RCWriteOnly: 0x0A, RCWriteOnlyImm: 0x0B,
		RCReadRequest: 0x0C, RCReadResponseFirst: 0x0D, RCReadResponseMiddle: 0x0E,
		RCReadResponseLast: 0x0F, RCReadResponseOnly: 0x10, RCAcknowledge: 0x11,
		RCAtomicAcknowledge: 0x12, RCCompareSwap: 0x13, RCFetchAdd: 0x14,
		RCSendLastInvalidate: 0x16, RCSendOnlyInvalidate: 0x17,
		UCSendFirst: 0x20, UCSendMiddle: 0x21, UCSendLast: 0x22, UCSendLastImm: 0x23,
		UCSendOnly: 0x24, UCSendOnlyImm: 0x25, UCWriteFirst: 0x26, UCWriteMiddle: 0x27,
		UCWriteLast: 0x28, UCWriteLastImm: 0x29, UCWriteOnly: 0x2A, UCWriteOnlyImm: 0x2B,
		UDSendOnly: 0x64, UDSendOnlyImm: 0x65, CNP: 0x81,
	}
	assert.Len(t, consts, 38)
	for op, v := range consts {
		assert.Equal(t, v, uint8(op))
		assert.True(t, op.Known(), "%#x", v)
	}
}

func TestUnknownOpcodes(t *testing.T) {
	known := map[Opcode]bool{}
	for _, r := range opcodeTable {
		known[r.op] = true
	}
	for i := 0; i < 256; i++ {
		op := Opcode(i)
		if known[op] {
			continue
		}
		assert.Nil(t, op.Info(), "%#x", i)
		assert.False(t, op.Known(), "%#x", i)
		assert.Equal(t, "Unknown ("+strconv.Itoa(i)+")", op.Name())
		assert.Equal(t, "0x"+strconv.FormatUint(uint64(i), 16), op.String())
	}
	// Spelled out.
	assert.Equal(t, "Unknown (21)", Opcode(0x15).Name())
	assert.Equal(t, "Unknown (64)", Opcode(0x40).Name())
	assert.Equal(t, "Unknown (128)", Opcode(0x80).Name())
	assert.Equal(t, "Unknown (255)", Opcode(0xFF).Name())
	assert.Equal(t, "0x4c", Opcode(0x4C).String())
	assert.Equal(t, "0x15", Opcode(0x15).String())
}

// Spot checks of the names quoted in the task and in Wireshark.
func TestOpcodeWiresharkNames(t *testing.T) {
	assert.Equal(t, "Reliable Connection (RC) - SEND First", Opcode(0x00).Name())
	assert.Equal(t, "Reliable Connection (RC) - RDMA READ response Only", Opcode(0x10).Name())
	assert.Equal(t, "Unreliable Datagram (UD) - SEND only", Opcode(0x64).Name())
	assert.Equal(t, "Unreliable Connection (UC) - RDMA WRITE Only with Immediate", Opcode(0x2B).Name())
	assert.Equal(t, "RC_SEND_FIRST", Opcode(0x00).String())
	assert.Equal(t, "UD_SEND_ONLY_WITH_IMMEDIATE", Opcode(0x65).String())
}

func TestTransport(t *testing.T) {
	cases := []struct {
		op   Opcode
		tr   Transport
		name string
	}{
		{RCSendFirst, TransportRC, "RC"},
		{RCSendOnlyInvalidate, TransportRC, "RC"},
		{UCWriteOnlyImm, TransportUC, "UC"},
		{0x4C, TransportRD, "RD"},
		{UDSendOnly, TransportUD, "UD"},
		{CNP, TransportCNP, "CNP"},
		{0xA0, Transport(0xA0), "0xa0"},
		{0xFF, Transport(0xE0), "0xe0"},
	}
	for _, c := range cases {
		assert.Equal(t, c.tr, c.op.Transport(), "%#x", uint8(c.op))
		assert.Equal(t, c.name, c.op.Transport().String(), "%#x", uint8(c.op))
	}
}

func TestExt(t *testing.T) {
	cases := []struct {
		e     Ext
		len   int
		s     string
		order []string
	}{
		{0, 0, "", nil},
		{ExtDETH, 8, "DETH", []string{"DETH"}},
		{ExtRETH, 16, "RETH", []string{"RETH"}},
		{ExtAETH, 4, "AETH", []string{"AETH"}},
		{ExtAtomicETH, 28, "AtomicETH", []string{"AtomicETH"}},
		{ExtAtomicAckETH, 8, "AtomicAckETH", []string{"AtomicAckETH"}},
		{ExtImmDt, 4, "ImmDt", []string{"ImmDt"}},
		{ExtIETH, 4, "IETH", []string{"IETH"}},
		{ExtCNP, 16, "CNP reserved", []string{"CNP reserved"}},
		// Wire order (IBTA 9.2): DETH, RETH/AtomicETH, AETH, AtomicAckETH, ImmDt/IETH.
		{ExtImmDt | ExtRETH, 20, "RETH+ImmDt", []string{"RETH", "ImmDt"}},
		{ExtImmDt | ExtDETH, 12, "DETH+ImmDt", []string{"DETH", "ImmDt"}},
		{ExtAtomicAckETH | ExtAETH, 12, "AETH+AtomicAckETH", []string{"AETH", "AtomicAckETH"}},
	}
	for _, c := range cases {
		assert.Equal(t, c.len, c.e.Len(), "%s", c.s)
		assert.Equal(t, c.s, c.e.String())
		var names []string
		total := 0
		c.e.Each(func(h Ext, size int, name string) {
			assert.NotZero(t, c.e&h)
			names = append(names, name)
			total += size
		})
		assert.Equal(t, c.order, names)
		assert.Equal(t, c.len, total)
	}
}

func TestOperationString(t *testing.T) {
	want := map[Operation]string{
		OpUnknown: "UNKNOWN", OpSend: "SEND", OpWrite: "RDMA_WRITE", OpReadRequest: "RDMA_READ_REQUEST",
		OpReadResponse: "RDMA_READ_RESPONSE", OpAcknowledge: "ACKNOWLEDGE",
		OpAtomicAcknowledge: "ATOMIC_ACKNOWLEDGE", OpCompareSwap: "COMPARE_SWAP",
		OpFetchAdd: "FETCH_ADD", OpCNP: "CNP", Operation(200): "UNKNOWN",
	}
	for op, s := range want {
		assert.Equal(t, s, op.String())
	}
}

// Every opcode a requester sends is a request; responses, ACKs and CNPs
// are not.
func TestOperationIsRequest(t *testing.T) {
	for op := range 256 {
		info := Opcode(op).Info()
		if info == nil {
			continue
		}
		want := info.Op == OpSend || info.Op == OpWrite || info.Op == OpReadRequest || info.Op == OpCompareSwap || info.Op == OpFetchAdd
		if got := info.Op.IsRequest(); got != want {
			t.Errorf("%s: IsRequest %v, want %v", Opcode(op), got, want)
		}
	}
	for _, op := range []Opcode{RCReadResponseOnly, RCAcknowledge, RCAtomicAcknowledge, CNP} {
		if op.Info().Op.IsRequest() {
			t.Errorf("%s is not a request", op)
		}
	}
}

// Ext.next and extLens index extOrder by bit number: entry i must be bit i.
func TestExtOrderIsBitOrder(t *testing.T) {
	for i, x := range extOrder {
		if x.ext != 1<<i {
			t.Fatalf("extOrder[%d] is %s, bit %#x; want bit %#x", i, x.name, x.ext, 1<<i)
		}
	}
	for e := Ext(0); e < 1<<len(extOrder); e++ {
		n, names := 0, ""
		for _, x := range extOrder {
			if e&x.ext != 0 {
				n += x.size
				if names != "" {
					names += "+"
				}
				names += x.name
			}
		}
		if e.Len() != n || e.String() != names {
			t.Fatalf("%#x: Len %d String %q, want %d %q", uint16(e), e.Len(), e.String(), n, names)
		}
		var each []string
		e.Each(func(h Ext, size int, name string) { each = append(each, name) })
		if got := strings.Join(each, "+"); got != names {
			t.Fatalf("%#x: Each gave %q, want %q", uint16(e), got, names)
		}
	}
}

// A bit above the eight headers in an opcode's Ext (the table is reached
// through the pointer Info returns) is ignored, as Len ignores it, not an
// index past extOrder (found by review).
func TestExtBitsAboveHeadersIgnored(t *testing.T) {
	info := RCSendOnlyImm.Info()
	saved := info.Ext
	info.Ext |= 0x100
	defer func() { info.Ext = saved }()
	b := make([]byte, 64)
	b[0] = byte(RCSendOnlyImm)
	b[12] = 0xAB // ImmDt: the 4 bytes after the 12-byte BTH
	var p Packet
	require.NotPanics(t, func() { _ = p.Decode(b) })
	require.NoError(t, p.Decode(b))
	assert.Equal(t, ImmDt(0xAB000000), p.ImmDt)
	var out []byte
	require.NotPanics(t, func() { out, _ = p.AppendHeaders(nil) })
	assert.Len(t, out, BTHLen+ImmDtLen)
}
