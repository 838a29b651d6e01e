package oob

import (
	"context"
	"fmt"
	"io"
	"net"
)

// rdma-core's ibv_srq_pingpong exchange (libibverbs/examples/srq_pingpong.c,
// pp_client_exch_dest and pp_server_exch_dest) is rc_pingpong's with one
// address message per QP: each side always writes MAX_QP (256) of the
// 52-byte messages, its -q QPs first and then all-zero entries
// ("0000:000000:000000:" and 32 zeros: the rest of its zeroed table),
// 13312 bytes in all:
//
//	client -> server  256 x "%04x:%06x:%06x:%s\0"
//	server -> client  256 x the same, once the server's -q QPs are in RTS
//	client -> server  "done\0"
//
// ibv_uc_pingpong and ibv_ud_pingpong exchange exactly what
// ibv_rc_pingpong does ([PingpongClient], [PingpongServer]).
const (
	// SRQPingpongMaxQP is srq_pingpong's MAX_QP: the number of address
	// messages each side sends, whatever its -q. A side runs at most
	// SRQPingpongMaxQP-1 QPs (srq_pingpong refuses -q 256 and more).
	SRQPingpongMaxQP = 256
)

// appendSRQPingpong appends local's messages and zero entries up to
// SRQPingpongMaxQP.
func appendSRQPingpong(b []byte, local []Dest) ([]byte, error) {
	if len(local) == 0 || len(local) >= SRQPingpongMaxQP {
		return b, fmt.Errorf("srq_pingpong exchange: %d QPs, want 1 to %d", len(local), SRQPingpongMaxQP-1)
	}
	for i := range SRQPingpongMaxQP {
		var d Dest
		if i < len(local) {
			d = local[i]
			if d.QPN == 0 {
				return b, fmt.Errorf("srq_pingpong exchange: QP %d has QPN 0, which marks an unused entry", i)
			}
		}
		var err error
		if b, err = d.AppendPingpong(b); err != nil {
			return b, err
		}
	}
	return b, nil
}

// ParseSRQPingpong reads srq_pingpong's SRQPingpongMaxQP address messages
// from b (exactly SRQPingpongMaxQP*PingpongMsgLen bytes) and returns the
// peer's QPs: the entries before the first unused one (QPN 0). Every
// entry after that must be unused too, and at least one and at most
// SRQPingpongMaxQP-1 must be used (srq_pingpong refuses -q 256).
// Errors wrap ErrMalformed.
func ParseSRQPingpong(b []byte) ([]Dest, error) {
	if len(b) != SRQPingpongMaxQP*PingpongMsgLen {
		return nil, fmt.Errorf("%w: an ibv_srq_pingpong address table is %d bytes, not %d", ErrMalformed, SRQPingpongMaxQP*PingpongMsgLen, len(b))
	}
	var out []Dest
	used := true
	for i := range SRQPingpongMaxQP {
		d, err := ParsePingpong(b[i*PingpongMsgLen : (i+1)*PingpongMsgLen])
		if err != nil {
			return nil, fmt.Errorf("address message %d: %w", i, err)
		}
		if d.QPN == 0 {
			used = false
		}
		switch {
		case used:
			out = append(out, d)
		case d.QPN != 0 || d.LID != 0 || d.PSN != 0 || !d.GID.IsUnspecified():
			return nil, fmt.Errorf("%w: address message %d names QPN %#x after an unused entry", ErrMalformed, i, d.QPN)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: the ibv_srq_pingpong address table names no QP", ErrMalformed)
	}
	if len(out) >= SRQPingpongMaxQP {
		// srq_pingpong refuses -q 256 and more, so a real peer always
		// leaves at least the last entry unused.
		return nil, fmt.Errorf("%w: the ibv_srq_pingpong address table names %d QPs, at most %d", ErrMalformed, len(out), SRQPingpongMaxQP-1)
	}
	return out, nil
}

// SRQPingpongClient is the client's side of srq_pingpong's exchange: it
// writes local (1 to SRQPingpongMaxQP-1 QPs) padded to SRQPingpongMaxQP
// messages, reads the server's table, calls connect with the server's QPs
// (when connect is not nil) and writes "done". It returns the server's
// QPs, and the connect error if there was one. It does not check that
// both sides have as many QPs: srq_pingpong pairs QP i with the peer's
// entry i, which the caller decides about in connect.
func SRQPingpongClient(ctx context.Context, conn net.Conn, local []Dest, connect func(remote []Dest) error) ([]Dest, error) {
	mine, err := appendSRQPingpong(nil, local)
	if err != nil {
		return nil, err
	}
	rem := make([]byte, len(mine))
	if err := exchange(ctx, conn, true, "srq_pingpong exchange: the server's addresses", mine, rem); err != nil {
		return nil, err
	}
	remote, err := ParseSRQPingpong(rem)
	if err != nil {
		return nil, err
	}
	if connect != nil {
		if err := connect(remote); err != nil {
			return remote, err
		}
	}
	release, err := bind(ctx, conn)
	if err != nil {
		return remote, fmt.Errorf("srq_pingpong exchange: done: %w", err)
	}
	defer release()
	if _, err := conn.Write([]byte(doneMsg)); err != nil {
		return remote, ioErr(ctx, "srq_pingpong exchange: done", len(doneMsg), err)
	}
	return remote, nil
}

// SRQPingpongServer is the server's side: it reads the client's table,
// calls connect with the client's QPs (when not nil) before answering, as
// srq_pingpong moves its QPs to RTR and RTS first, writes local padded to
// SRQPingpongMaxQP messages and waits for the client's "done". It returns
// the client's QPs.
func SRQPingpongServer(ctx context.Context, conn net.Conn, local []Dest, connect func(remote []Dest) error) ([]Dest, error) {
	mine, err := appendSRQPingpong(nil, local)
	if err != nil {
		return nil, err
	}
	release, err := bind(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("srq_pingpong exchange: %w", err)
	}
	defer release()
	rem := make([]byte, len(mine))
	if _, err := io.ReadFull(conn, rem); err != nil {
		return nil, ioErr(ctx, "srq_pingpong exchange: the client's addresses", len(rem), err)
	}
	remote, err := ParseSRQPingpong(rem)
	if err != nil {
		return nil, err
	}
	if connect != nil {
		if err := connect(remote); err != nil {
			return remote, err
		}
	}
	if _, err := conn.Write(mine); err != nil {
		return remote, ioErr(ctx, "srq_pingpong exchange: our addresses", len(mine), err)
	}
	done := make([]byte, len(doneMsg))
	if _, err := io.ReadFull(conn, done); err != nil {
		return remote, ioErr(ctx, "srq_pingpong exchange: the client's done", len(done), err)
	}
	if string(done) != doneMsg {
		return remote, fmt.Errorf("%w: the client said %q, not \"done\"", ErrMalformed, done)
	}
	return remote, nil
}
