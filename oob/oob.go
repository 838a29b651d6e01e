// Package oob speaks the out-of-band exchanges RDMA test programs use to
// set up connections without a connection manager: the TCP messages that
// carry QPNs, PSNs, GIDs, R_Keys and addresses before two RC queue pairs
// are moved to RTR and RTS. Two families of protocols are here, each as a
// session over any net.Conn (TCP, or net.Pipe in tests):
//
//   - rdma-core's ibv_rc_pingpong (libibverbs/examples/rc_pingpong.c and
//     pingpong.c): one 52-byte "LID:QPN:PSN:GID" message each way and a
//     "done" from the client ([PingpongClient], [PingpongServer], [Dest]);
//     ibv_uc_pingpong and ibv_ud_pingpong use the same exchange, and
//     ibv_srq_pingpong sends 256 such messages each way
//     ([SRQPingpongClient], [SRQPingpongServer]).
//   - perftest 6.06's (linux-rdma/perftest src/perftest_communication.c,
//     the protocol of ib_{send,write,read}_{bw,lat}): versions, system
//     data, MTU, 108-byte key strings per QP, barriers, bandwidth results
//     and "done" ([Perftest], [PerftestKey], [BWReport]); with -R the
//     same steps run as SENDs on an RC QP that rdma_cm connected, keys as
//     binary struct pingpong_dest ([NewPerftestCMClient],
//     [PerftestMessenger], [PerftestKey.AppendDest]).
//
// Both are described in docs/wire-format.md section 6 (the project's reference
// notes) and were checked against the real programs on Linux rxe.
//
// A GID is carried as a netip.Addr: an IPv4 address is the IPv4-mapped GID
// ::ffff:a.b.c.d (RoCEv2 over IPv4), any other address is its own GID
// (RoCEv2 over IPv6). Parsed GIDs that are IPv4-mapped come back as IPv4
// addresses; an IPv6 zone is not carried.
//
// Every session step takes a context: its deadline becomes the
// connection's, and cancelling it unblocks a read or write in progress.
// A peer that sends too little, garbage or nothing gives an error, never a
// panic or a hang past the context. Sessions are not safe for concurrent
// use.
package oob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// Errors the sessions and parsers wrap; test them with errors.Is.
var (
	// ErrMalformed: a peer's message is not one the program sends.
	ErrMalformed = errors.New("oob: malformed message")
	// ErrVersion: the peer speaks a version of the protocol not spoken here.
	ErrVersion = errors.New("oob: unsupported protocol version")
	// ErrGIDType: one side's GID is IPv4-mapped and the other's is not
	// (perftest: "Found Incompatibility issue with GID types").
	ErrGIDType = errors.New("oob: GIDs of different IP versions")
	// ErrState: a session step was called out of order.
	ErrState = errors.New("oob: session step out of order")
	// ErrCycleBuffer: a perftest peer asks for a cycle buffer above the
	// limit (Perftest.CycleBufferLimit).
	ErrCycleBuffer = errors.New("oob: perftest cycle buffer above the limit")
)

// doneMsg is what rc_pingpong's client and both perftest peers write last:
// "done" with its NUL (sizeof "done").
const doneMsg = "done\x00"

// bind applies ctx to conn for one step: ctx's deadline becomes conn's
// (none when ctx has none, so that a step after one with a deadline is
// not held to it), and cancelling ctx makes a blocked read or write
// return. The returned function undoes the cancellation hook; it does not
// clear the deadline.
func bind(ctx context.Context, conn net.Conn) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	if err := conn.SetDeadline(dl); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }, nil
}

// ioErr says what failed, giving the context's reason when the step
// ended because ctx did.
func ioErr(ctx context.Context, what string, n int, err error) error {
	if isTimeout(err) {
		cerr := ctx.Err()
		if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
			cerr = context.DeadlineExceeded
		}
		if cerr != nil {
			return fmt.Errorf("%s (%d bytes): %w", what, n, cerr)
		}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("%s (%d bytes): the peer closed the connection: %w", what, n, err)
	}
	return fmt.Errorf("%s (%d bytes): %w", what, n, err)
}

// isTimeout reports a deadline error of a net.Conn.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// exchange sends mine and reads the peer's message of len(rem) bytes: the
// client writes first, the server reads first (perftest's ctx_xchg_data,
// rc_pingpong's exchange).
func exchange(ctx context.Context, conn net.Conn, client bool, what string, mine, rem []byte) error {
	release, err := bind(ctx, conn)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer release()
	if client {
		if _, err = conn.Write(mine); err == nil {
			_, err = io.ReadFull(conn, rem)
		}
	} else {
		if _, err = io.ReadFull(conn, rem); err == nil {
			_, err = conn.Write(mine)
		}
	}
	if err != nil {
		return ioErr(ctx, what, len(mine), err)
	}
	return nil
}

// gid16 is the 16-byte GID of an address: IPv4-mapped for IPv4, the zero
// GID for the zero Addr.
func gid16(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}

// appendHex appends v in lowercase hex, zero-padded to width digits, as
// printf's "%0*x" does; wider values take more digits.
func appendHex(b []byte, v uint64, width int) []byte {
	var d [16]byte
	i := len(d)
	for v != 0 || i == len(d) {
		i--
		d[i] = "0123456789abcdef"[v&0xF]
		v >>= 4
	}
	for n := len(d) - i; n < width; n++ {
		b = append(b, '0')
	}
	return append(b, d[i:]...)
}

// gidAddr is the address of a GID: IPv4 for an IPv4-mapped GID.
func gidAddr(g [16]byte) netip.Addr { return netip.AddrFrom16(g).Unmap() }
