package oob

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"

	"github.com/roce-emu/roce-emu/bth"
)

// rdma-core's ibv_rc_pingpong exchange (libibverbs/examples/rc_pingpong.c,
// pp_client_exch_dest and pp_server_exch_dest; docs/wire-format.md section 6):
//
//	client -> server  "%04x:%06x:%06x:%s\0"  LID, QPN, PSN, GID   52 bytes
//	server -> client  the same, once the server's QP is in RTR/RTS
//	client -> server  "done\0"                                     5 bytes
//
// The GID is 32 hex digits in network byte order (wire_gid_to_gid), e.g.
// 00000000000000000000ffffc0000202 for ::ffff:192.0.2.2.
const (
	// PingpongPort is rc_pingpong's default TCP port (-p).
	PingpongPort = 18515
	// PingpongMsgLen is the length of one address message, NUL included
	// (sizeof "0000:000000:000000:" + 32 GID digits + 1).
	PingpongMsgLen = 52
)

// Dest is what one side of ibv_rc_pingpong tells the other (struct
// pingpong_dest): its port's LID (0 on RoCE), its QPN (24 bits), the first
// PSN it sends (24 bits) and its GID. The zero GID (an invalid Addr) is
// sent as 32 zeros, as rc_pingpong sends without -g; 32 zeros are read
// back as the IPv6 unspecified address ::.
type Dest struct {
	LID uint16
	QPN uint32
	PSN bth.PSN
	GID netip.Addr
}

func (d Dest) String() string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, d.QPN, uint32(d.PSN), GIDString(d.GID))
}

// GIDString prints a GID as rc_pingpong does, with inet_ntop(AF_INET6):
// ::ffff:192.0.2.2 for an IPv4 address, fd00::1 for an IPv6 one, :: for
// the zero Addr.
func GIDString(a netip.Addr) string { return netip.AddrFrom16(gid16(a)).String() }

// AppendPingpong appends d as rc_pingpong's 52-byte message to b. It fails
// when the QPN or PSN does not fit in 24 bits. It does not allocate when b
// has room.
func (d Dest) AppendPingpong(b []byte) ([]byte, error) {
	if d.QPN > 0xFFFFFF || !d.PSN.Valid() {
		return b, fmt.Errorf("rc_pingpong message: QPN %#x and PSN %#x must fit in 24 bits", d.QPN, uint32(d.PSN))
	}
	g := gid16(d.GID)
	n := len(b)
	b = append(appendHex(b, uint64(d.LID), 4), ':')
	b = append(appendHex(b, uint64(d.QPN), 6), ':')
	b = append(appendHex(b, uint64(d.PSN), 6), ':')
	b = hex.AppendEncode(b, g[:])
	return append(b, make([]byte, PingpongMsgLen-(len(b)-n))...), nil
}

// ParsePingpong reads rc_pingpong's address message: "LLLL:QQQQQQ:PPPPPP:"
// and 32 hex digits, then NULs (rc_pingpong sends exactly one; trailing
// NULs are allowed, anything else after the GID is not). Errors wrap
// ErrMalformed.
func ParsePingpong(b []byte) (Dest, error) {
	s := string(b)
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	bad := func(why string) (Dest, error) {
		return Dest{}, fmt.Errorf("%w: not an ibv_rc_pingpong address message (%s): %q", ErrMalformed, why, s)
	}
	if len(s) != PingpongMsgLen-1 || s[4] != ':' || s[11] != ':' || s[18] != ':' {
		return bad("want LLLL:QQQQQQ:PPPPPP: and a GID of 32 hex digits")
	}
	lid, err1 := strconv.ParseUint(s[0:4], 16, 16)
	qpn, err2 := strconv.ParseUint(s[5:11], 16, 32)
	psn, err3 := strconv.ParseUint(s[12:18], 16, 32)
	if err1 != nil || err2 != nil || err3 != nil {
		return bad("LID, QPN and PSN must be hex digits")
	}
	var g [16]byte
	if _, err := hex.Decode(g[:], []byte(s[19:])); err != nil {
		return bad("the GID must be 32 hex digits")
	}
	return Dest{LID: uint16(lid), QPN: uint32(qpn), PSN: bth.PSN(psn), GID: gidAddr(g)}, nil
}

// PingpongClient is the client's side of the exchange
// (pp_client_exch_dest): it writes local, reads the server's Dest, calls
// connect with it (when connect is not nil: move the QP to RTR and RTS
// there) and then writes "done". It returns the server's Dest, and the
// connect error if there was one. conn stays open; the caller closes it.
func PingpongClient(ctx context.Context, conn net.Conn, local Dest, connect func(remote Dest) error) (Dest, error) {
	mine, err := local.AppendPingpong(nil)
	if err != nil {
		return Dest{}, err
	}
	rem := make([]byte, PingpongMsgLen)
	if err := exchange(ctx, conn, true, "rc_pingpong exchange: the server's address", mine, rem); err != nil {
		return Dest{}, err
	}
	remote, err := ParsePingpong(rem)
	if err != nil {
		return Dest{}, err
	}
	if connect != nil {
		if err := connect(remote); err != nil {
			return remote, err
		}
	}
	release, err := bind(ctx, conn)
	if err != nil {
		return remote, fmt.Errorf("rc_pingpong exchange: done: %w", err)
	}
	defer release()
	if _, err := conn.Write([]byte(doneMsg)); err != nil {
		return remote, ioErr(ctx, "rc_pingpong exchange: done", len(doneMsg), err)
	}
	return remote, nil
}

// PingpongServer is the server's side (pp_server_exch_dest): it reads the
// client's Dest, calls connect with it (when not nil) before answering, as
// rc_pingpong moves its QP to RTR and RTS first, writes local and waits for
// the client's "done". It returns the client's Dest.
func PingpongServer(ctx context.Context, conn net.Conn, local Dest, connect func(remote Dest) error) (Dest, error) {
	mine, err := local.AppendPingpong(nil)
	if err != nil {
		return Dest{}, err
	}
	release, err := bind(ctx, conn)
	if err != nil {
		return Dest{}, fmt.Errorf("rc_pingpong exchange: %w", err)
	}
	defer release()
	rem := make([]byte, PingpongMsgLen)
	if _, err := io.ReadFull(conn, rem); err != nil {
		return Dest{}, ioErr(ctx, "rc_pingpong exchange: the client's address", len(rem), err)
	}
	remote, err := ParsePingpong(rem)
	if err != nil {
		return Dest{}, err
	}
	if connect != nil {
		if err := connect(remote); err != nil {
			return remote, err
		}
	}
	if _, err := conn.Write(mine); err != nil {
		return remote, ioErr(ctx, "rc_pingpong exchange: our address", len(mine), err)
	}
	done := make([]byte, len(doneMsg))
	if _, err := io.ReadFull(conn, done); err != nil {
		return remote, ioErr(ctx, "rc_pingpong exchange: the client's done", len(done), err)
	}
	if string(done) != doneMsg {
		return remote, fmt.Errorf("%w: the client said %q, not \"done\"", ErrMalformed, done)
	}
	return remote, nil
}
