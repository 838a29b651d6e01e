package cm

import "errors"

// Sentinel errors. Decoders and the Manager return them (or errors that
// wrap them); test with errors.Is.
var (
	// ErrTruncated: fewer bytes than the MAD header or the message needs
	// (a CM MAD is 256 bytes, MADLen).
	ErrTruncated = errors.New("cm: MAD truncated")
	// ErrNotCM: the MAD's base version, management class, class version or
	// method is not a CM Send (1, 0x07, 2, 0x03).
	ErrNotCM = errors.New("cm: not a communication management MAD")
	// ErrUnknownAttr: a CM attribute ID this package does not handle (LAP,
	// APR, SIDR, ClassPortInfo and reserved IDs).
	ErrUnknownAttr = errors.New("cm: unknown CM attribute")
	// ErrFieldRange: a field given to an encoder does not fit its wire
	// width (a QPN or PSN over 24 bits, a timeout over 5 bits, too much
	// private data).
	ErrFieldRange = errors.New("cm: field out of range")
	// ErrNotIPCM: private data does not start with an RDMA IP CM header
	// (IBTA Annex A11: major version 0, IP version 4 or 6).
	ErrNotIPCM = errors.New("cm: private data holds no IP CM header")
	// ErrNoConnection: no connection has this local communication ID.
	ErrNoConnection = errors.New("cm: no such connection")
	// ErrState: the operation is not valid in the connection's state.
	ErrState = errors.New("cm: operation not valid in this state")
	// ErrListening: a listener already holds this service ID.
	ErrListening = errors.New("cm: service ID already has a listener")
	// ErrTooManyConnections: Config.MaxConnections connections exist.
	ErrTooManyConnections = errors.New("cm: too many connections")
)
