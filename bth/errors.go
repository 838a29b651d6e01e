package bth

import (
	"errors"
	"strconv"
)

// Sentinel errors. Decode functions return a *DecodeError that wraps one of
// them; test with errors.Is.
var (
	// ErrTruncated: the bytes end before a header the opcode requires, or
	// before the ICRC.
	ErrTruncated = errors.New("bth: packet truncated")
	// ErrUnknownOpcode: the opcode is not one this package decodes (RD, XRC
	// and reserved opcodes).
	ErrUnknownOpcode = errors.New("bth: unknown opcode")
	// ErrTVer: the BTH transport header version is not 0 (rxe check 4).
	ErrTVer = errors.New("bth: transport header version not 0")
	// ErrPadCnt: PadCnt is larger than the bytes after the headers.
	ErrPadCnt = errors.New("bth: pad count exceeds payload")
	// ErrUnexpectedPayload: payload bytes on an opcode that carries none
	// (ACK, READ request, atomics, CNP).
	ErrUnexpectedPayload = errors.New("bth: payload on an opcode that carries none")
	// ErrFieldRange: a field given to an encoder does not fit its wire width
	// (a PSN, QPN or MSN over 24 bits, PadCnt over 3).
	ErrFieldRange = errors.New("bth: field out of range")
	// ErrNotRoCE: a frame is not IPv4 or IPv6 UDP to the RoCEv2 port.
	ErrNotRoCE = errors.New("bth: not a RoCEv2 packet")
	// ErrBadICRC: the ICRC on the wire is not the one the packet's headers
	// and bytes give.
	ErrBadICRC = errors.New("bth: ICRC mismatch")
	// ErrBadIPHeader: an IP header is shorter than its own length fields say.
	ErrBadIPHeader = errors.New("bth: malformed IP or UDP header")
)

// DecodeError says which header failed to decode and why.
type DecodeError struct {
	Err    error  // one of the sentinel errors above
	Header string // "BTH", "RETH", ..., "ICRC", "payload"
	Opcode Opcode
	// OpcodeKnown says Opcode is the packet's: false for the errors of the
	// stand-alone header decoders, which see no BTH.
	OpcodeKnown bool
	Need        int // bytes needed (ErrTruncated, ErrPadCnt)
	Have        int // bytes present
}

func (e *DecodeError) Error() string {
	s := e.Err.Error()
	if e.Header != "" {
		s += " in " + e.Header
	}
	if e.OpcodeKnown {
		s += " (opcode " + e.Opcode.String() + ")"
	}
	if e.Need != 0 || e.Have != 0 {
		s += ": need " + strconv.Itoa(e.Need) + " bytes, have " + strconv.Itoa(e.Have)
	}
	return s
}

func (e *DecodeError) Unwrap() error { return e.Err }
