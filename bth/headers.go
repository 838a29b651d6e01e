package bth

import (
	"encoding/binary"
	"time"
)

// BTH is the Base Transport Header (IBTA 9.2), 12 bytes:
//
//	 0               1               2               3
//	+---------------+-+-+---+-------+-------------------------------+
//	|    OpCode     |S|M|Pad| TVer  |             P_Key             |
//	+---------------+-+-+---+-------+-------------------------------+
//	|F|B|   Resv6   |                 DestQP                        |
//	+-+-+-----------+-----------------------------------------------+
//	|A|   Resv7     |                  PSN                          |
//	+-+-------------+-----------------------------------------------+
//
// MigReq is carried as received: rxe sends 0 and ConnectX sets 1 on ACKs.
type BTH struct {
	Opcode Opcode
	SE     bool  // solicited event
	MigReq bool  // migration state
	PadCnt uint8 // pad bytes before the ICRC, 0-3
	TVer   uint8 // transport header version, 0
	PKey   uint16
	FECN   bool   // forward explicit congestion notification
	BECN   bool   // backward explicit congestion notification (set on CNPs)
	Resv6  uint8  // 6 reserved bits of byte 4
	DestQP uint32 // destination QPN, 24 bits
	AckReq bool   // acknowledge request
	Resv7  uint8  // 7 reserved bits of byte 8
	PSN    PSN
}

// DefaultPKey is the default partition key that rxe and perftest use.
const DefaultPKey = 0xFFFF

// Decode fills h from the first BTHLen bytes of b.
func (h *BTH) Decode(b []byte) error {
	if len(b) < BTHLen {
		return &DecodeError{Err: ErrTruncated, Header: "BTH", Need: BTHLen, Have: len(b)}
	}
	h.Opcode = Opcode(b[0])
	h.SE = b[1]&0x80 != 0
	h.MigReq = b[1]&0x40 != 0
	h.PadCnt = (b[1] >> 4) & 3
	h.TVer = b[1] & 0x0F
	h.PKey = binary.BigEndian.Uint16(b[2:])
	h.FECN = b[4]&0x80 != 0
	h.BECN = b[4]&0x40 != 0
	h.Resv6 = b[4] & 0x3F
	h.DestQP = uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	h.AckReq = b[8]&0x80 != 0
	h.Resv7 = b[8] & 0x7F
	h.PSN = PSN(uint32(b[9])<<16 | uint32(b[10])<<8 | uint32(b[11]))
	return nil
}

// Append appends the 12 wire bytes of h to b. Fields wider than their wire
// width are truncated; use Check first to refuse them.
func (h *BTH) Append(b []byte) []byte {
	b1 := h.PadCnt&3<<4 | h.TVer&0x0F
	if h.SE {
		b1 |= 0x80
	}
	if h.MigReq {
		b1 |= 0x40
	}
	b4 := h.Resv6 & 0x3F
	if h.FECN {
		b4 |= 0x80
	}
	if h.BECN {
		b4 |= 0x40
	}
	b8 := h.Resv7 & 0x7F
	if h.AckReq {
		b8 |= 0x80
	}
	return append(b, byte(h.Opcode), b1, byte(h.PKey>>8), byte(h.PKey),
		b4, byte(h.DestQP>>16), byte(h.DestQP>>8), byte(h.DestQP),
		b8, byte(h.PSN>>16), byte(h.PSN>>8), byte(h.PSN))
}

// Check reports ErrFieldRange when a field does not fit its wire width.
func (h *BTH) Check() error {
	switch {
	case h.DestQP > 0xFFFFFF:
		return &DecodeError{Err: ErrFieldRange, Header: "BTH DestQP", Opcode: h.Opcode, OpcodeKnown: true}
	case !h.PSN.Valid():
		return &DecodeError{Err: ErrFieldRange, Header: "BTH PSN", Opcode: h.Opcode, OpcodeKnown: true}
	case h.PadCnt > 3:
		return &DecodeError{Err: ErrFieldRange, Header: "BTH PadCnt", Opcode: h.Opcode, OpcodeKnown: true}
	case h.TVer > 0x0F:
		return &DecodeError{Err: ErrFieldRange, Header: "BTH TVer", Opcode: h.Opcode, OpcodeKnown: true}
	}
	return nil
}

// RETH is the RDMA Extended Transport Header (IBTA 9.3.3.1), 16 bytes:
// virtual address (64), R_Key (32), DMA length (32). It is on RDMA WRITE
// First/Only and RDMA READ requests.
type RETH struct {
	VA        uint64
	RKey      uint32
	DMALength uint32 // bytes of the whole message
}

// Decode fills r from the first RETHLen bytes of b.
func (r *RETH) Decode(b []byte) error {
	if len(b) < RETHLen {
		return &DecodeError{Err: ErrTruncated, Header: "RETH", Need: RETHLen, Have: len(b)}
	}
	r.VA = binary.BigEndian.Uint64(b)
	r.RKey = binary.BigEndian.Uint32(b[8:])
	r.DMALength = binary.BigEndian.Uint32(b[12:])
	return nil
}

// Append appends the 16 wire bytes of r to b.
func (r *RETH) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, r.VA)
	b = binary.BigEndian.AppendUint32(b, r.RKey)
	return binary.BigEndian.AppendUint32(b, r.DMALength)
}

// AETH is the ACK Extended Transport Header (IBTA 9.3.5), 4 bytes:
// syndrome (8) and MSN (24). It is on ACKs, atomic ACKs and READ response
// First, Last and Only.
type AETH struct {
	Syndrome Syndrome
	MSN      uint32 // message sequence number, 24 bits
}

// Decode fills a from the first AETHLen bytes of b.
func (a *AETH) Decode(b []byte) error {
	if len(b) < AETHLen {
		return &DecodeError{Err: ErrTruncated, Header: "AETH", Need: AETHLen, Have: len(b)}
	}
	a.Syndrome = Syndrome(b[0])
	a.MSN = uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	return nil
}

// Append appends the 4 wire bytes of a to b; the MSN is truncated to 24 bits.
func (a *AETH) Append(b []byte) []byte {
	return append(b, byte(a.Syndrome), byte(a.MSN>>16), byte(a.MSN>>8), byte(a.MSN))
}

// Syndrome is the AETH syndrome byte (IBTA 9.7.5.2.1, Table 43). Bits 6-5
// give the kind: 00 ACK (low 5 bits: credit count), 01 RNR NAK (low 5 bits:
// RNR timer code), 11 NAK (low 5 bits: NAK code). Bit 7 and kind 10 are
// reserved.
type Syndrome uint8

// AckKind is the kind of an AETH syndrome.
type AckKind uint8

// Syndrome kinds, from bits 6-5.
const (
	KindACK      AckKind = 0
	KindRNRNAK   AckKind = 1
	KindReserved AckKind = 2
	KindNAK      AckKind = 3
)

// NAKCode is the low 5 bits of a NAK syndrome (IBTA Table 44).
type NAKCode uint8

// NAK codes.
const (
	NAKPSNSequenceError     NAKCode = 0
	NAKInvalidRequest       NAKCode = 1
	NAKRemoteAccessError    NAKCode = 2
	NAKRemoteOperationalErr NAKCode = 3
	NAKInvalidRDRequest     NAKCode = 4
)

// NoCredits is the ACK credit code that means "no credit information" (0x1F),
// which rxe always sends.
const NoCredits = 0x1F

// Common syndromes.
const (
	SyndromeACKNoCredits Syndrome = 0x1F
	SyndromePSNSeqErr    Syndrome = 0x60
	SyndromeInvalidReq   Syndrome = 0x61
	SyndromeRemoteAccess Syndrome = 0x62
	SyndromeRemoteOp     Syndrome = 0x63
	SyndromeInvalidRDReq Syndrome = 0x64
)

// ACKSyndrome returns the ACK syndrome carrying a credit code (0-31).
func ACKSyndrome(credits uint8) Syndrome { return Syndrome(credits & 0x1F) }

// RNRNAKSyndrome returns the RNR NAK syndrome carrying an RNR timer code (0-31).
func RNRNAKSyndrome(timer uint8) Syndrome { return Syndrome(0x20 | timer&0x1F) }

// NAKSyndrome returns the NAK syndrome with the given code.
func NAKSyndrome(code NAKCode) Syndrome { return Syndrome(0x60 | uint8(code)&0x1F) }

// Kind returns the syndrome's kind from bits 6-5.
func (s Syndrome) Kind() AckKind { return AckKind(s>>5) & 3 }

// Value returns the low 5 bits: credit count, RNR timer code or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1F }

// IsACK reports whether s is a positive acknowledgement.
func (s Syndrome) IsACK() bool { return s&0x80 == 0 && s.Kind() == KindACK }

// NAKCode returns the NAK code; meaningful only when Kind is KindNAK.
func (s Syndrome) NAKCode() NAKCode { return NAKCode(s.Value()) }

// KindName names the syndrome as roce-emu reports it: "ACK", "RNR_NAK",
// "NAK_PSN_SEQ", "NAK_INVALID_REQUEST", "NAK_REMOTE_ACCESS",
// "NAK_REMOTE_OPERATIONAL", "NAK_INVALID_RD_REQUEST", "NAK_RESERVED" or
// "RESERVED".
func (s Syndrome) KindName() string {
	if s&0x80 != 0 {
		return "RESERVED"
	}
	switch s.Kind() {
	case KindACK:
		return "ACK"
	case KindRNRNAK:
		return "RNR_NAK"
	case KindNAK:
		switch s.NAKCode() {
		case NAKPSNSequenceError:
			return "NAK_PSN_SEQ"
		case NAKInvalidRequest:
			return "NAK_INVALID_REQUEST"
		case NAKRemoteAccessError:
			return "NAK_REMOTE_ACCESS"
		case NAKRemoteOperationalErr:
			return "NAK_REMOTE_OPERATIONAL"
		case NAKInvalidRDRequest:
			return "NAK_INVALID_RD_REQUEST"
		}
		return "NAK_RESERVED"
	}
	return "RESERVED"
}

// rnrTimerMicros is IBTA Table 45, the RNR NAK timer field in microseconds.
// Code 0 is the largest value, not zero.
var rnrTimerMicros = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
	122880, 163840, 245760, 327680, 491520,
}

// RNRTimer returns the delay an RNR timer code (0-31; higher bits ignored)
// stands for, per IBTA Table 45: code 0 is 655.36 ms, code 1 is 10 us.
func RNRTimer(code uint8) time.Duration {
	return time.Duration(rnrTimerMicros[code&0x1F]) * time.Microsecond
}

// DETH is the Datagram Extended Transport Header (IBTA 9.3.2), 8 bytes:
// Q_Key (32), reserved (8), source QPN (24). It is on UD packets.
type DETH struct {
	QKey  uint32
	Resv  uint8
	SrcQP uint32 // 24 bits
}

// GSIQKey is the Q_Key of QP1, the General Services Interface (CM MADs).
const GSIQKey = 0x80010000

// Decode fills d from the first DETHLen bytes of b.
func (d *DETH) Decode(b []byte) error {
	if len(b) < DETHLen {
		return &DecodeError{Err: ErrTruncated, Header: "DETH", Need: DETHLen, Have: len(b)}
	}
	d.QKey = binary.BigEndian.Uint32(b)
	d.Resv = b[4]
	d.SrcQP = uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	return nil
}

// Append appends the 8 wire bytes of d to b; SrcQP is truncated to 24 bits.
func (d *DETH) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, d.QKey)
	return append(b, d.Resv, byte(d.SrcQP>>16), byte(d.SrcQP>>8), byte(d.SrcQP))
}

// ImmDt is the Immediate Data header (IBTA 9.3.4), 4 bytes, carried on SEND
// and RDMA WRITE "with Immediate" packets. The value is kept as the 32-bit
// big-endian number on the wire; verbs hand it to applications in network
// byte order (ibv_wc.imm_data is __be32).
type ImmDt uint32

// Decode fills i from the first ImmDtLen bytes of b.
func (i *ImmDt) Decode(b []byte) error {
	if len(b) < ImmDtLen {
		return &DecodeError{Err: ErrTruncated, Header: "ImmDt", Need: ImmDtLen, Have: len(b)}
	}
	*i = ImmDt(binary.BigEndian.Uint32(b))
	return nil
}

// Append appends the 4 wire bytes of i to b.
func (i ImmDt) Append(b []byte) []byte { return binary.BigEndian.AppendUint32(b, uint32(i)) }

// IETH is the Invalidate Extended Transport Header (IBTA 9.3.6), 4 bytes:
// the R_Key the responder invalidates, on SEND with Invalidate.
type IETH uint32

// Decode fills i from the first IETHLen bytes of b.
func (i *IETH) Decode(b []byte) error {
	if len(b) < IETHLen {
		return &DecodeError{Err: ErrTruncated, Header: "IETH", Need: IETHLen, Have: len(b)}
	}
	*i = IETH(binary.BigEndian.Uint32(b))
	return nil
}

// Append appends the 4 wire bytes of i to b.
func (i IETH) Append(b []byte) []byte { return binary.BigEndian.AppendUint32(b, uint32(i)) }

// AtomicETH is the Atomic Extended Transport Header (IBTA 9.3.3.2), 28 bytes:
// virtual address (64), R_Key (32), swap or add data (64), compare data (64).
// It is on CmpSwap and FetchAdd requests; the address must be 8-byte aligned.
type AtomicETH struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64 // swap value (CmpSwap) or addend (FetchAdd)
	Compare uint64 // compare value (CmpSwap); ignored by FetchAdd
}

// Decode fills a from the first AtomicETHLen bytes of b.
func (a *AtomicETH) Decode(b []byte) error {
	if len(b) < AtomicETHLen {
		return &DecodeError{Err: ErrTruncated, Header: "AtomicETH", Need: AtomicETHLen, Have: len(b)}
	}
	a.VA = binary.BigEndian.Uint64(b)
	a.RKey = binary.BigEndian.Uint32(b[8:])
	a.SwapAdd = binary.BigEndian.Uint64(b[12:])
	a.Compare = binary.BigEndian.Uint64(b[20:])
	return nil
}

// Append appends the 28 wire bytes of a to b.
func (a *AtomicETH) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, a.VA)
	b = binary.BigEndian.AppendUint32(b, a.RKey)
	b = binary.BigEndian.AppendUint64(b, a.SwapAdd)
	return binary.BigEndian.AppendUint64(b, a.Compare)
}

// AtomicAckETH is the Atomic Acknowledge Extended Transport Header
// (IBTA 9.3.3.3), 8 bytes: the value the target held before the operation.
type AtomicAckETH uint64

// Decode fills a from the first AtomicAckETHLen bytes of b.
func (a *AtomicAckETH) Decode(b []byte) error {
	if len(b) < AtomicAckETHLen {
		return &DecodeError{Err: ErrTruncated, Header: "AtomicAckETH", Need: AtomicAckETHLen, Have: len(b)}
	}
	*a = AtomicAckETH(binary.BigEndian.Uint64(b))
	return nil
}

// Append appends the 8 wire bytes of a to b.
func (a AtomicAckETH) Append(b []byte) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(a))
}
