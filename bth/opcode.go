package bth

import (
	"math/bits"
	"strconv"
)

// Opcode is the BTH OpCode (IBTA 9.2.1, Table 38). The top 3 bits select the
// transport (RC 0x00, UC 0x20, RD 0x40, UD 0x60, CNP 0x80), the low 5 the
// operation.
type Opcode uint8

// Reliable Connected opcodes (IBTA Table 38; names as in Linux's ib_pack.h).
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0A
	RCWriteOnlyImm       Opcode = 0x0B
	RCReadRequest        Opcode = 0x0C
	RCReadResponseFirst  Opcode = 0x0D
	RCReadResponseMiddle Opcode = 0x0E
	RCReadResponseLast   Opcode = 0x0F
	RCReadResponseOnly   Opcode = 0x10
	RCAcknowledge        Opcode = 0x11
	RCAtomicAcknowledge  Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInvalidate Opcode = 0x16
	RCSendOnlyInvalidate Opcode = 0x17
)

// Unreliable Connected opcodes: the SEND and RDMA WRITE subset of RC, plus 0x20.
const (
	UCSendFirst    Opcode = 0x20
	UCSendMiddle   Opcode = 0x21
	UCSendLast     Opcode = 0x22
	UCSendLastImm  Opcode = 0x23
	UCSendOnly     Opcode = 0x24
	UCSendOnlyImm  Opcode = 0x25
	UCWriteFirst   Opcode = 0x26
	UCWriteMiddle  Opcode = 0x27
	UCWriteLast    Opcode = 0x28
	UCWriteLastImm Opcode = 0x29
	UCWriteOnly    Opcode = 0x2A
	UCWriteOnlyImm Opcode = 0x2B
)

// Unreliable Datagram opcodes and the RoCEv2 Congestion Notification Packet
// (Annex A17.9.3).
const (
	UDSendOnly    Opcode = 0x64
	UDSendOnlyImm Opcode = 0x65
	CNP           Opcode = 0x81
)

// Transport is the transport service an opcode belongs to: opcode & 0xE0.
type Transport uint8

// Transport services (IBTA Table 38).
const (
	TransportRC  Transport = 0x00
	TransportUC  Transport = 0x20
	TransportRD  Transport = 0x40
	TransportUD  Transport = 0x60
	TransportCNP Transport = 0x80
)

// String returns "RC", "UC", "RD", "UD" or "CNP".
func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportUD:
		return "UD"
	case TransportCNP:
		return "CNP"
	}
	return "0x" + strconv.FormatUint(uint64(t), 16)
}

// Ext is a set of extended transport headers, as a bit mask.
type Ext uint16

// Extended headers. On the wire they follow the BTH in the order of these
// constants (IBTA 9.2: DETH, RETH or AtomicETH, AETH, AtomicAckETH, ImmDt or
// IETH); ExtCNP is the 16 reserved bytes of a CNP.
const (
	ExtDETH Ext = 1 << iota
	ExtRETH
	ExtAtomicETH
	ExtAETH
	ExtAtomicAckETH
	ExtImmDt
	ExtIETH
	ExtCNP
)

// Wire sizes in bytes.
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	DETHLen         = 8
	ImmDtLen        = 4
	IETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	CNPReservedLen  = 16
	ICRCLen         = 4
)

// extHeader is one extended header: its bit, wire size and name.
type extHeader struct {
	ext  Ext
	size int
	name string
}

// extOrder lists the extended headers in wire order with their sizes and
// names; Packet.Decode, Packet.Append and the gopacket layers walk it.
var extOrder = [...]extHeader{
	{ExtDETH, DETHLen, "DETH"},
	{ExtRETH, RETHLen, "RETH"},
	{ExtAtomicETH, AtomicETHLen, "AtomicETH"},
	{ExtAETH, AETHLen, "AETH"},
	{ExtAtomicAckETH, AtomicAckETHLen, "AtomicAckETH"},
	{ExtImmDt, ImmDtLen, "ImmDt"},
	{ExtIETH, IETHLen, "IETH"},
	{ExtCNP, CNPReservedLen, "CNP reserved"},
}

// extLens is Ext.Len of every set of the eight headers, so that the
// packet paths look a size up instead of walking extOrder.
var extLens = func() (t [1 << len(extOrder)]uint8) {
	for e := range t {
		for i, x := range extOrder {
			if e&(1<<i) != 0 {
				t[e] += uint8(x.size)
			}
		}
	}
	return t
}()

// extAll is every extended header; the bits above are none.
const extAll Ext = 1<<len(extOrder) - 1

// Len returns the total wire size of the headers in e.
func (e Ext) Len() int { return int(extLens[e&extAll]) }

// next returns the first header of e in wire order (its extOrder entry)
// and e without it; e must not be empty nor have bits outside extAll. The
// Ext bits are in wire order, so the lowest set bit comes first on the
// wire.
func (e Ext) next() (*extHeader, Ext) {
	return &extOrder[bits.TrailingZeros16(uint16(e))], e & (e - 1)
}

// Each calls f for every header in e, in wire order.
func (e Ext) Each(f func(h Ext, size int, name string)) {
	for e &= extAll; e != 0; {
		var x *extHeader
		x, e = e.next()
		f(x.ext, x.size, x.name)
	}
}

// String names the headers in e in wire order, joined by "+"; "" for none.
func (e Ext) String() string {
	s := ""
	for i := range extOrder {
		x := &extOrder[i]
		if e&x.ext != 0 {
			if s != "" {
				s += "+"
			}
			s += x.name
		}
	}
	return s
}

// Position tells where a packet falls in its message (IBTA 9.8.3).
type Position uint8

// Packet positions. A message is either one Only packet or a First, any
// number of Middles, and a Last.
const (
	PosNone Position = iota // ACKs, READ requests, atomics, CNPs: not part of a segmented message
	PosFirst
	PosMiddle
	PosLast
	PosOnly
)

// Operation is what an opcode does, independent of transport and position.
type Operation uint8

// Operations.
const (
	OpUnknown Operation = iota
	OpSend
	OpWrite
	OpReadRequest
	OpReadResponse
	OpAcknowledge
	OpAtomicAcknowledge
	OpCompareSwap
	OpFetchAdd
	OpCNP
)

// IsRequest reports whether op is a requester's: SEND, RDMA WRITE, RDMA
// READ request or an atomic (IBTA 9.2, the request opcodes), not a
// response, an acknowledgement or a CNP.
func (op Operation) IsRequest() bool {
	switch op {
	case OpSend, OpWrite, OpReadRequest, OpCompareSwap, OpFetchAdd:
		return true
	}
	return false
}

var operationNames = [...]string{"UNKNOWN", "SEND", "RDMA_WRITE", "RDMA_READ_REQUEST",
	"RDMA_READ_RESPONSE", "ACKNOWLEDGE", "ATOMIC_ACKNOWLEDGE", "COMPARE_SWAP", "FETCH_ADD", "CNP"}

// String returns the operation's name in capitals, e.g. "RDMA_WRITE".
func (o Operation) String() string {
	if int(o) < len(operationNames) {
		return operationNames[o]
	}
	return "UNKNOWN"
}

// OpInfo describes one opcode.
type OpInfo struct {
	Name       string    // as Wireshark's infiniband dissector shows it
	Short      string    // as Linux's ib_pack.h names it, without the IB_OPCODE_ prefix
	Ext        Ext       // extended headers after the BTH
	Pos        Position  // place in a segmented message
	Op         Operation // what it does
	Payload    bool      // whether the packet may carry payload bytes
	Immediate  bool      // carries ImmDt
	Invalidate bool      // carries IETH
}

// Starts reports whether the opcode starts a message (First or Only).
func (i *OpInfo) Starts() bool { return i.Pos == PosFirst || i.Pos == PosOnly }

// Ends reports whether the opcode ends a message (Last or Only).
func (i *OpInfo) Ends() bool { return i.Pos == PosLast || i.Pos == PosOnly }

var opTable [256]*OpInfo

func init() {
	type row struct {
		low   Opcode
		name  string
		short string
		ext   Ext
		pos   Position
		op    Operation
		pay   bool
	}
	// Operations shared by RC and UC (low 5 bits 0x00-0x0B).
	sendWrite := []row{
		{0x00, "SEND First", "SEND_FIRST", 0, PosFirst, OpSend, true},
		{0x01, "SEND Middle", "SEND_MIDDLE", 0, PosMiddle, OpSend, true},
		{0x02, "SEND Last", "SEND_LAST", 0, PosLast, OpSend, true},
		{0x03, "SEND Last with Immediate", "SEND_LAST_WITH_IMMEDIATE", ExtImmDt, PosLast, OpSend, true},
		{0x04, "SEND Only", "SEND_ONLY", 0, PosOnly, OpSend, true},
		{0x05, "SEND Only with Immediate", "SEND_ONLY_WITH_IMMEDIATE", ExtImmDt, PosOnly, OpSend, true},
		{0x06, "RDMA WRITE First", "RDMA_WRITE_FIRST", ExtRETH, PosFirst, OpWrite, true},
		{0x07, "RDMA WRITE Middle", "RDMA_WRITE_MIDDLE", 0, PosMiddle, OpWrite, true},
		{0x08, "RDMA WRITE Last", "RDMA_WRITE_LAST", 0, PosLast, OpWrite, true},
		{0x09, "RDMA WRITE Last with Immediate", "RDMA_WRITE_LAST_WITH_IMMEDIATE", ExtImmDt, PosLast, OpWrite, true},
		{0x0A, "RDMA WRITE Only", "RDMA_WRITE_ONLY", ExtRETH, PosOnly, OpWrite, true},
		{0x0B, "RDMA WRITE Only with Immediate", "RDMA_WRITE_ONLY_WITH_IMMEDIATE", ExtRETH | ExtImmDt, PosOnly, OpWrite, true},
	}
	rcOnly := []row{
		{0x0C, "RDMA READ Request", "RDMA_READ_REQUEST", ExtRETH, PosNone, OpReadRequest, false},
		{0x0D, "RDMA READ response First", "RDMA_READ_RESPONSE_FIRST", ExtAETH, PosFirst, OpReadResponse, true},
		{0x0E, "RDMA READ response Middle", "RDMA_READ_RESPONSE_MIDDLE", 0, PosMiddle, OpReadResponse, true},
		{0x0F, "RDMA READ response Last", "RDMA_READ_RESPONSE_LAST", ExtAETH, PosLast, OpReadResponse, true},
		{0x10, "RDMA READ response Only", "RDMA_READ_RESPONSE_ONLY", ExtAETH, PosOnly, OpReadResponse, true},
		{0x11, "Acknowledge", "ACKNOWLEDGE", ExtAETH, PosNone, OpAcknowledge, false},
		{0x12, "ATOMIC Acknowledge", "ATOMIC_ACKNOWLEDGE", ExtAETH | ExtAtomicAckETH, PosNone, OpAtomicAcknowledge, false},
		{0x13, "CmpSwap", "COMPARE_SWAP", ExtAtomicETH, PosNone, OpCompareSwap, false},
		{0x14, "FetchAdd", "FETCH_ADD", ExtAtomicETH, PosNone, OpFetchAdd, false},
		{0x16, "SEND Last with Invalidate", "SEND_LAST_WITH_INVALIDATE", ExtIETH, PosLast, OpSend, true},
		{0x17, "SEND Only with Invalidate", "SEND_ONLY_WITH_INVALIDATE", ExtIETH, PosOnly, OpSend, true},
	}
	add := func(t Transport, tname, prefix string, rows []row) {
		for _, r := range rows {
			op := Opcode(uint8(t) | uint8(r.low))
			opTable[op] = &OpInfo{
				Name:       tname + " - " + r.name,
				Short:      prefix + "_" + r.short,
				Ext:        r.ext,
				Pos:        r.pos,
				Op:         r.op,
				Payload:    r.pay,
				Immediate:  r.ext&ExtImmDt != 0,
				Invalidate: r.ext&ExtIETH != 0,
			}
		}
	}
	add(TransportRC, "Reliable Connection (RC)", "RC", sendWrite)
	add(TransportRC, "Reliable Connection (RC)", "RC", rcOnly)
	add(TransportUC, "Unreliable Connection (UC)", "UC", sendWrite)
	add(TransportUD, "Unreliable Datagram (UD)", "UD", []row{
		{0x04, "SEND only", "SEND_ONLY", ExtDETH, PosOnly, OpSend, true},
		{0x05, "SEND only with Immediate", "SEND_ONLY_WITH_IMMEDIATE", ExtDETH | ExtImmDt, PosOnly, OpSend, true},
	})
	// Wireshark 4.0 lists CNP under 0x80 and shows the real 0x81 as "Unknown (129)".
	opTable[CNP] = &OpInfo{Name: "CNP", Short: "CNP", Ext: ExtCNP, Op: OpCNP}
}

// Info returns the description of op, or nil when op is not in the table
// (RD, XRC and reserved opcodes are not).
func (op Opcode) Info() *OpInfo { return opTable[op] }

// Known reports whether op is in the table.
func (op Opcode) Known() bool { return opTable[op] != nil }

// Transport returns op & 0xE0.
func (op Opcode) Transport() Transport { return Transport(op & 0xE0) }

// String returns ib_pack.h's name, e.g. "RC_SEND_FIRST", or "0x4c" for an
// opcode not in the table.
func (op Opcode) String() string {
	if i := opTable[op]; i != nil {
		return i.Short
	}
	return "0x" + strconv.FormatUint(uint64(op), 16)
}

// Name returns Wireshark's name, e.g. "Reliable Connection (RC) - SEND First",
// or "Unknown (N)" as Wireshark shows an opcode it does not know.
func (op Opcode) Name() string {
	if i := opTable[op]; i != nil {
		return i.Name
	}
	return "Unknown (" + strconv.Itoa(int(op)) + ")"
}

// Opcodes returns every opcode in the table, in numeric order.
func Opcodes() []Opcode {
	var ops []Opcode
	for i, info := range opTable {
		if info != nil {
			ops = append(ops, Opcode(i))
		}
	}
	return ops
}
