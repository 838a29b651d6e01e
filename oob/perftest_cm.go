package oob

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/roce-emu/roce-emu/bth"
)

// PerftestDestLen is the size of struct pingpong_dest as perftest 6.06
// sends it over rdma_cm (-R): LID, out_reads, QPN, PSN and R_Key as 32-bit
// big-endian integers at offsets 0 to 16, 4 bytes of padding, the VA as a
// 64-bit big-endian integer at 24, the GID at 32, the SRQ number at 48 and
// the GID index at 52 (perftest_communication.c, rdma_write_keys with
// HAVE_ENDIAN).
const PerftestDestLen = 56

// PerftestMessenger carries perftest's messages when it connects with
// rdma_cm (-R): each message is one SEND on an RC QP that rdma_cm
// connected, and each receive takes one whole message (perftest's
// rdma_write_data and rdma_read_data). SendMessage returns once the SEND
// completed; RecvMessage copies the next message received into b and
// returns its length, which may exceed len(b) only as an error.
type PerftestMessenger interface {
	SendMessage(ctx context.Context, b []byte) error
	RecvMessage(ctx context.Context, b []byte) (int, error)
}

// NewPerftestCMClient starts the client's side of perftest's exchange
// over rdma_cm (-R): the steps are those of the TCP exchange, each message
// a SEND of the same bytes, but the key strings are binary
// struct pingpong_dest (AppendDest), barriers may come before the keys
// (perftest's hand-shakes around the rdma_cm connection of its data QPs),
// and Done is the last barrier alone.
func NewPerftestCMClient(m PerftestMessenger) *Perftest { return &Perftest{msg: m, client: true} }

// NewPerftestCMServer starts the server's side of the rdma_cm exchange: it
// receives first.
func NewPerftestCMServer(m PerftestMessenger) *Perftest { return &Perftest{msg: m} }

// AppendDest appends k as perftest's binary struct pingpong_dest
// (PerftestDestLen bytes, GID index 0) to b. It fails when the QPN or PSN
// does not fit in 24 bits.
func (k PerftestKey) AppendDest(b []byte) ([]byte, error) {
	if k.QPN > 0xFFFFFF || !k.PSN.Valid() {
		return b, fmt.Errorf("perftest dest: QPN %#x and PSN %#x must fit in 24 bits", k.QPN, uint32(k.PSN))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(k.LID))
	b = binary.BigEndian.AppendUint32(b, uint32(k.OutReads))
	b = binary.BigEndian.AppendUint32(b, k.QPN)
	b = binary.BigEndian.AppendUint32(b, uint32(k.PSN))
	b = binary.BigEndian.AppendUint32(b, k.RKey)
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, k.VA)
	g := gid16(k.GID)
	b = append(b, g[:]...)
	b = binary.BigEndian.AppendUint32(b, k.SRQN)
	return binary.BigEndian.AppendUint32(b, 0), nil
}

// ParsePerftestDest reads a binary struct pingpong_dest of exactly
// PerftestDestLen bytes. A LID or out_reads above 16 bits, or a QPN or PSN
// above 24 bits, is not what perftest sends. Errors wrap ErrMalformed.
func ParsePerftestDest(b []byte) (PerftestKey, error) {
	if len(b) != PerftestDestLen {
		return PerftestKey{}, fmt.Errorf("%w: a perftest dest is %d bytes, not %d", ErrMalformed, PerftestDestLen, len(b))
	}
	u := func(off int) uint32 { return binary.BigEndian.Uint32(b[off:]) }
	lid, reads, qpn, psn := u(0), u(4), u(8), u(12)
	if lid > 0xFFFF || reads > 0xFFFF || qpn > 0xFFFFFF || psn > 0xFFFFFF {
		return PerftestKey{}, fmt.Errorf("%w: perftest dest: LID %#x, out_reads %d, QPN %#x, PSN %#x out of range", ErrMalformed, lid, reads, qpn, psn)
	}
	var g [16]byte
	copy(g[:], b[32:48])
	return PerftestKey{LID: uint16(lid), OutReads: uint16(reads), QPN: qpn, PSN: bth.PSN(psn), RKey: u(16),
		VA: binary.BigEndian.Uint64(b[24:]), GID: gidAddr(g), SRQN: u(48)}, nil
}

// cmXchg is one exchange over the messenger: the client sends first.
func (s *Perftest) cmXchg(ctx context.Context, what string, mine []byte) ([]byte, error) {
	what = "perftest exchange over rdma_cm: " + what
	rem := make([]byte, len(mine))
	recv := func() error {
		n, err := s.msg.RecvMessage(ctx, rem)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if n != len(mine) {
			return fmt.Errorf("%w: %s: the peer sent %d bytes, not %d", ErrMalformed, what, n, len(mine))
		}
		return nil
	}
	send := func() error {
		if err := s.msg.SendMessage(ctx, mine); err != nil {
			return fmt.Errorf("%s (%d bytes): %w", what, len(mine), err)
		}
		return nil
	}
	first, second := recv, send
	if s.client {
		first, second = send, recv
	}
	if err := first(); err != nil {
		return nil, err
	}
	if err := second(); err != nil {
		return nil, err
	}
	return rem, nil
}
