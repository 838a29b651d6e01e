package oob

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// perftest 6.06's out-of-band protocol (Debian 12's perftest 4.5+0.17;
// linux-rdma/perftest src/perftest_communication.c). Every message is a
// fixed-size exchange: the client writes its message and reads the
// server's of the same size, the server reads first (ctx_xchg_data). In
// order, as the methods of Perftest:
//
//	version      16 bytes, "6.06" NUL-padded (exchange_versions)
//	system data  4 bytes big-endian cycle buffer, then 4 bytes cache line
//	             size, when the peer is 5.32 or later (check_sys_data);
//	             both sides use the larger of each
//	MTU          the ibv_mtu code as a decimal string, 2 bytes ("3\0") from
//	             5.31 on, 4 before, when the peer is 5.1 or later
//	             (check_mtu); both use the smaller
//	keys         per QP, a 108-byte key string (PerftestKey); both sides
//	             then move their QPs to RTR and RTS (ctx_connect)
//	barriers     a key string again (ctx_hand_shake): once per QP, each
//	             QP's (BarrierEach), after connecting; QP 0's (Barrier)
//	             after printing the addresses, and (send_bw and every
//	             latency test) once the receives are posted
//	results      write_bw and read_bw, after a barrier when the client is
//	             done: message size and iterations, 8 bytes big-endian each
//	             (iterations 4 bytes before 5.33), then three big-endian
//	             doubles, peak and average bandwidth and Mpps
//	             (xchg_bw_reports)
//	done         a last barrier, then "done\0" from each side
//	             (ctx_close_connection); ib_write_lat closes without either
//
// testdata/perftest-6.06-*-exchange.txt hold every message of one run of
// each program between two perftest peers on rxe.
const (
	// PerftestPort is perftest's default TCP port (-p).
	PerftestPort = 18515
	// PerftestVersion is the version perftest 6.06 sends, and this
	// package speaks.
	PerftestVersion = "6.06"
	// PerftestVersionLen is the size of the version message
	// (sizeof user_param->version).
	PerftestVersionLen = 16
	// PerftestKeyLen is the size of a key string, NUL included.
	PerftestKeyLen = 108
	// DefaultCycleBuffer is perftest's default cycle buffer, the page
	// size, in bytes.
	DefaultCycleBuffer = 4096
	// DefaultCacheLine is perftest's default cache line size in bytes.
	DefaultCacheLine = 64
	// MaxCycleBuffer is the largest cycle buffer a peer may ask for here
	// (1 GiB) whatever the limit; perftest's are a page.
	MaxCycleBuffer = 1 << 30
	// DefaultCycleBufferLimit is the largest cycle buffer a peer may ask
	// for by default (Perftest.CycleBufferLimit): 256 KiB. perftest sends
	// its page size in every mode (sysconf(_SC_PAGESIZE) in
	// init_perftest_params, perftest_parameters.c), and no Linux
	// architecture has pages larger than 256 KiB (4 KiB on x86, up to
	// 64 KiB on arm64 and ppc64, 256 KiB on hexagon and 44x).
	DefaultCycleBufferLimit = 256 << 10
)

// PerftestKey is one QP's key string (struct pingpong_dest as perftest
// prints it with KEY_PRINT_FMT_GID):
//
//	"%04x:%04x:%06x:%06x:%08x:%016llx:" LID, out_reads, QPN, PSN, R_Key, VA
//	"%02x:" x 16                        the GID, network byte order
//	"%08x:"                             the SRQ number
//
// 107 characters and a NUL. OutReads is the number of RDMA READs and
// atomics the side lets its peer have outstanding (its max_dest_rd_atomic
// for the peer's max_rd_atomic); perftest sends 1 except in READ tests,
// where it sends its device's maximum. VA and RKey name the region the
// side lets its peer WRITE to or READ from. GIDs are as in Dest.
type PerftestKey struct {
	LID      uint16
	OutReads uint16
	QPN      uint32
	PSN      bth.PSN
	RKey     uint32
	VA       uint64
	GID      netip.Addr
	SRQN     uint32
}

// Append appends k as a 108-byte key string to b. It fails when the QPN
// or PSN does not fit in 24 bits. It does not allocate when b has room.
func (k PerftestKey) Append(b []byte) ([]byte, error) {
	if k.QPN > 0xFFFFFF || !k.PSN.Valid() {
		return b, fmt.Errorf("perftest key: QPN %#x and PSN %#x must fit in 24 bits", k.QPN, uint32(k.PSN))
	}
	n := len(b)
	for _, f := range [...]struct {
		v     uint64
		width int
	}{{uint64(k.LID), 4}, {uint64(k.OutReads), 4}, {uint64(k.QPN), 6}, {uint64(k.PSN), 6}, {uint64(k.RKey), 8}, {k.VA, 16}} {
		b = append(appendHex(b, f.v, f.width), ':')
	}
	for _, x := range gid16(k.GID) {
		b = append(appendHex(b, uint64(x), 2), ':')
	}
	b = append(appendHex(b, uint64(k.SRQN), 8), ':')
	return append(b, make([]byte, PerftestKeyLen-(len(b)-n))...), nil
}

// ParsePerftestKey reads a key string up to its first NUL (what follows
// the NUL is ignored, as sscanf does). Fields may be shorter than their
// printed width but not wider than their type; the colon after the SRQ
// number may be missing. Errors wrap ErrMalformed.
func ParsePerftestKey(b []byte) (PerftestKey, error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	s := string(b)
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return PerftestKey{}, fmt.Errorf("%w: not a perftest key string (%d fields, not 23): %q", ErrMalformed, len(f), s)
	}
	var err error
	num := func(i, bits int) uint64 {
		v, e := strconv.ParseUint(f[i], 16, bits)
		if e != nil && err == nil {
			err = fmt.Errorf("%w: perftest key string %q: field %d %q is not a %d-bit hex number", ErrMalformed, s, i+1, f[i], bits)
		}
		return v
	}
	k := PerftestKey{LID: uint16(num(0, 16)), OutReads: uint16(num(1, 16)), QPN: uint32(num(2, 24)),
		PSN: bth.PSN(num(3, 24)), RKey: uint32(num(4, 32)), VA: num(5, 64)}
	var g [16]byte
	for i := range g {
		g[i] = byte(num(6+i, 8))
	}
	k.GID = gidAddr(g)
	k.SRQN = uint32(num(22, 32))
	if err != nil {
		return PerftestKey{}, err
	}
	return k, nil
}

// ParsePerftestVersion reads a version message as perftest does, with
// atof(): the number at its start (0 when there is none) and the text up
// to the first NUL.
func ParsePerftestVersion(b []byte) (float64, string) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	s := string(b)
	n := 0
	for n < len(s) && (s[n] >= '0' && s[n] <= '9' || s[n] == '.') {
		n++
	}
	for ; n > 0; n-- {
		if v, err := strconv.ParseFloat(s[:n], 64); err == nil {
			return v, s
		}
	}
	return 0, s
}

// SysData is what check_sys_data exchanges: the cycle buffer (the span of
// the peer's region a bandwidth client walks) and the cache line size
// (the step it walks in), both in bytes.
type SysData struct {
	CycleBuffer int
	CacheLine   int
}

// BWReport is one side's bandwidth result (struct bw_report_data):
// message size in bytes, iterations, peak and average bandwidth in the
// unit the client reports (MB/sec of 2^20 bytes, or Gb/sec with
// --report_gbits) and the message rate in Mpps.
type BWReport struct {
	Size, Iters   uint64
	PeakBW, AvgBW float64
	MsgRate       float64
}

// Perftest is one side of perftest's out-of-band exchange over a
// connected net.Conn. Call its steps in the protocol's order: Versions,
// SysData, MTU, Keys, then Barrier, BWReports and Done as the test
// program does. Its zero value is not usable; use NewPerftestClient or
// NewPerftestServer.
type Perftest struct {
	// CycleBufferLimit is the largest cycle buffer SysData accepts from
	// the peer, in bytes (0: DefaultCycleBufferLimit; at most
	// MaxCycleBuffer). The cycle buffer sizes the region each QP
	// advertises, so this bounds what a peer can make this side allocate.
	CycleBufferLimit int

	conn    net.Conn
	msg     PerftestMessenger // instead of conn: perftest -R
	client  bool
	peerVer float64
	peerTxt string
	keys    [][]byte // our key strings, QP 0's sent as barriers
}

// NewPerftestClient starts the client's side: it writes first in every
// exchange.
func NewPerftestClient(conn net.Conn) *Perftest { return &Perftest{conn: conn, client: true} }

// NewPerftestServer starts the server's side: it reads first.
func NewPerftestServer(conn net.Conn) *Perftest { return &Perftest{conn: conn} }

// PeerVersion is the peer's version as a number and as sent, once
// Versions has run.
func (s *Perftest) PeerVersion() (float64, string) { return s.peerVer, s.peerTxt }

func (s *Perftest) xchg(ctx context.Context, what string, mine []byte) ([]byte, error) {
	if s.msg != nil {
		return s.cmXchg(ctx, what, mine)
	}
	rem := make([]byte, len(mine))
	if err := exchange(ctx, s.conn, s.client, "perftest exchange: "+what, mine, rem); err != nil {
		return nil, err
	}
	return rem, nil
}

func (s *Perftest) needVersion(step string) error {
	if s.peerVer == 0 {
		return fmt.Errorf("%w: perftest %s before the versions", ErrState, step)
	}
	return nil
}

// Versions is exchange_versions: it sends PerftestVersion and returns the
// peer's version text. Peers before 5.0 are refused with ErrVersion: the
// branches this package knows are those of 5.1 and later.
func (s *Perftest) Versions(ctx context.Context) (string, error) {
	mine := make([]byte, PerftestVersionLen)
	copy(mine, PerftestVersion)
	rem, err := s.xchg(ctx, "version", mine)
	if err != nil {
		return "", err
	}
	v, txt := ParsePerftestVersion(rem)
	if !(v >= 5) { // also NaN
		return txt, fmt.Errorf("%w: the peer says it is perftest version %q; this is the protocol of perftest %s (5.x and later)", ErrVersion, txt, PerftestVersion)
	}
	s.peerVer, s.peerTxt = v, txt
	return txt, nil
}

// SysData is check_sys_data: each side sends its cycle buffer and cache
// line size, and both use the larger of each, which SysData returns.
// Before 5.32 nothing is exchanged and mine is returned. A peer whose
// values make a cycle buffer above CycleBufferLimit (ErrCycleBuffer; above
// MaxCycleBuffer, or negative, ErrMalformed) or a cache line larger than
// the cycle buffer (ErrMalformed) is refused.
func (s *Perftest) SysData(ctx context.Context, mine SysData) (SysData, error) {
	if err := s.needVersion("system data"); err != nil {
		return mine, err
	}
	limit := s.CycleBufferLimit
	if limit == 0 {
		limit = DefaultCycleBufferLimit
	}
	if limit < 0 || limit > MaxCycleBuffer {
		return mine, fmt.Errorf("perftest system data: cycle buffer limit %d bytes: must be 1 to %d", limit, MaxCycleBuffer)
	}
	if mine.CycleBuffer < 1 || mine.CacheLine < 1 || mine.CycleBuffer > limit || mine.CacheLine > mine.CycleBuffer {
		return mine, fmt.Errorf("perftest system data: cycle buffer %d and cache line %d bytes: need 1 <= cache line <= cycle buffer <= %d", mine.CycleBuffer, mine.CacheLine, limit)
	}
	if s.peerVer < 5.32 {
		return mine, nil
	}
	got := mine
	for _, v := range []struct {
		what string
		mine int
		use  *int
	}{{"cycle buffer", mine.CycleBuffer, &got.CycleBuffer}, {"cache line size", mine.CacheLine, &got.CacheLine}} {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(v.mine))
		rem, err := s.xchg(ctx, v.what, b[:])
		if err != nil {
			return mine, err
		}
		*v.use = max(v.mine, int(int32(binary.BigEndian.Uint32(rem))))
	}
	if got.CycleBuffer > MaxCycleBuffer {
		return got, fmt.Errorf("%w: the peer asks for a cycle buffer of %d bytes", ErrMalformed, got.CycleBuffer)
	}
	if got.CycleBuffer > limit {
		return got, fmt.Errorf("%w: the peer asks for a cycle buffer of %d bytes, above the limit of %d (perftest sends its page size)", ErrCycleBuffer, got.CycleBuffer, limit)
	}
	if got.CacheLine > got.CycleBuffer {
		return got, fmt.Errorf("%w: the peer asks for a cycle buffer of %d bytes and a cache line of %d", ErrMalformed, got.CycleBuffer, got.CacheLine)
	}
	return got, nil
}

// MTU is check_mtu: each side sends its path MTU as the ibv_mtu code in
// decimal, and both use the smaller, which MTU returns. Before 5.1 nothing
// is exchanged and mine is returned. A peer's MTU that is not an ibv_mtu
// code (1 to 5) is an error.
func (s *Perftest) MTU(ctx context.Context, mine qp.MTU) (qp.MTU, error) {
	if err := s.needVersion("MTU"); err != nil {
		return mine, err
	}
	if mine.Bytes() == 0 {
		return mine, fmt.Errorf("perftest MTU: %d is not an ibv_mtu code", mine)
	}
	if s.peerVer < 5.1 {
		return mine, nil
	}
	n := 4
	if s.peerVer >= 5.31 {
		n = 2
	}
	b := make([]byte, n)
	copy(b, strconv.Itoa(int(mine)))
	rem, err := s.xchg(ctx, "MTU", b)
	if err != nil {
		return mine, err
	}
	txt := string(rem)
	if i := strings.IndexByte(txt, 0); i >= 0 {
		txt = txt[:i]
	}
	v, err := strconv.Atoi(txt)
	if err != nil || qp.MTU(v).Bytes() == 0 || v != int(qp.MTU(v)) {
		return mine, fmt.Errorf("%w: the peer's MTU %q is not an ibv_mtu code (1 to 5)", ErrMalformed, txt)
	}
	return min(mine, qp.MTU(v)), nil
}

// Keys exchanges one key string per QP, QP i's with the peer's QP i
// (perftest's -q N sends N), and returns the peer's. The peer's GIDs must
// be of the IP version of ours (ErrGIDType). Barriers send mine[0] again.
func (s *Perftest) Keys(ctx context.Context, mine []PerftestKey) ([]PerftestKey, error) {
	if err := s.needVersion("key exchange"); err != nil {
		return nil, err
	}
	if len(mine) == 0 {
		return nil, errors.New("perftest key exchange: no QP")
	}
	keys := make([][]byte, len(mine))
	rem := make([]PerftestKey, len(mine))
	for i, k := range mine {
		b, err := s.appendKey(k)
		if err != nil {
			return nil, err
		}
		keys[i] = b
		rb, err := s.xchg(ctx, fmt.Sprintf("key string of QP %d", i), b)
		if err != nil {
			return nil, err
		}
		if rem[i], err = s.parseKey(rb); err != nil {
			return nil, err
		}
		if rem[i].GID.Is4() != k.GID.Unmap().Is4() {
			return nil, fmt.Errorf("%w: the peer's GID %s and ours %s (QP %d)", ErrGIDType, GIDString(rem[i].GID), GIDString(k.GID), i)
		}
	}
	s.keys = keys
	return rem, nil
}

// KeysAfter is Keys with this side's keys made by mine only once the
// peer has shown itself: a server (which reads first in every exchange)
// reads the peer's first key and parses it before it calls mine, so that
// what mine allocates (QPs, the memory they advertise) is allocated only
// for a peer that got that far; a client, which writes first, calls mine
// at once. mine must return n keys. A peer's key that does not parse is
// an error before mine is called.
func (s *Perftest) KeysAfter(ctx context.Context, n int, mine func() ([]PerftestKey, error)) ([]PerftestKey, error) {
	if err := s.needVersion("key exchange"); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, errors.New("perftest key exchange: no QP")
	}
	if s.client {
		m, err := mine()
		if err != nil {
			return nil, err
		}
		if len(m) != n {
			return nil, fmt.Errorf("perftest key exchange: %d keys for %d QPs", len(m), n)
		}
		return s.Keys(ctx, m)
	}
	keyLen := PerftestKeyLen
	if s.msg != nil {
		keyLen = PerftestDestLen
	}
	what := "key string of QP 0"
	rb, err := s.recv(ctx, what, keyLen)
	if err != nil {
		return nil, err
	}
	first, err := s.parseKey(rb)
	if err != nil {
		return nil, err
	}
	m, err := mine()
	if err != nil {
		return nil, err
	}
	if len(m) != n {
		return nil, fmt.Errorf("perftest key exchange: %d keys for %d QPs", len(m), n)
	}
	keys := make([][]byte, n)
	for i, k := range m {
		if keys[i], err = s.appendKey(k); err != nil {
			return nil, err
		}
	}
	if err := s.send(ctx, what, keys[0]); err != nil {
		return nil, err
	}
	rem := make([]PerftestKey, n)
	rem[0] = first
	for i := range n {
		if i > 0 {
			rb, err := s.xchg(ctx, fmt.Sprintf("key string of QP %d", i), keys[i])
			if err != nil {
				return nil, err
			}
			if rem[i], err = s.parseKey(rb); err != nil {
				return nil, err
			}
		}
		if rem[i].GID.Is4() != m[i].GID.Unmap().Is4() {
			return nil, fmt.Errorf("%w: the peer's GID %s and ours %s (QP %d)", ErrGIDType, GIDString(rem[i].GID), GIDString(m[i].GID), i)
		}
	}
	s.keys = keys
	return rem, nil
}

// recv reads one message of n bytes, the first half of a server's
// exchange.
func (s *Perftest) recv(ctx context.Context, what string, n int) ([]byte, error) {
	rem := make([]byte, n)
	if s.msg != nil {
		what = "perftest exchange over rdma_cm: " + what
		got, err := s.msg.RecvMessage(ctx, rem)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if got != n {
			return nil, fmt.Errorf("%w: %s: the peer sent %d bytes, not %d", ErrMalformed, what, got, n)
		}
		return rem, nil
	}
	what = "perftest exchange: " + what
	release, err := bind(ctx, s.conn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer release()
	if _, err := io.ReadFull(s.conn, rem); err != nil {
		return nil, ioErr(ctx, what, n, err)
	}
	return rem, nil
}

// send writes one message, the second half of a server's exchange.
func (s *Perftest) send(ctx context.Context, what string, b []byte) error {
	if s.msg != nil {
		if err := s.msg.SendMessage(ctx, b); err != nil {
			return fmt.Errorf("perftest exchange over rdma_cm: %s (%d bytes): %w", what, len(b), err)
		}
		return nil
	}
	what = "perftest exchange: " + what
	release, err := bind(ctx, s.conn)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer release()
	if _, err := s.conn.Write(b); err != nil {
		return ioErr(ctx, what, len(b), err)
	}
	return nil
}

// appendKey is k as this session sends it: a key string, or a binary
// dest over rdma_cm.
func (s *Perftest) appendKey(k PerftestKey) ([]byte, error) {
	if s.msg != nil {
		return k.AppendDest(nil)
	}
	return k.Append(nil)
}

// parseKey reads a peer's key as this session carries it.
func (s *Perftest) parseKey(b []byte) (PerftestKey, error) {
	if s.msg != nil {
		return ParsePerftestDest(b)
	}
	return ParsePerftestKey(b)
}

// Barrier is ctx_hand_shake: both sides send QP 0's key string again, and
// neither goes on before the other is there. what names the barrier in
// errors. The peer's message must be a key string.
//
// Over rdma_cm a barrier may come before the keys, as perftest's
// hand-shakes around the rdma_cm connection of its data QPs do: it sends
// a zero dest then, and the peer's may be anything of the dest's size
// (perftest's is not set yet).
func (s *Perftest) Barrier(ctx context.Context, what string) error {
	if s.keys == nil && s.msg != nil {
		_, err := s.xchg(ctx, "barrier ("+what+")", make([]byte, PerftestDestLen))
		return err
	}
	if s.keys == nil {
		return fmt.Errorf("%w: perftest barrier (%s) before the key exchange", ErrState, what)
	}
	rem, err := s.xchg(ctx, "barrier ("+what+")", s.keys[0])
	if err != nil {
		return err
	}
	if _, err := s.parseKey(rem); err != nil {
		return fmt.Errorf("perftest barrier (%s): %w", what, err)
	}
	return nil
}

// BarrierEach is ctx_hand_shake once per QP, in QP order, each with that
// QP's key string, as perftest's bandwidth tests do with -q N after
// connecting (perftest overwrites its copy of the peer's key i with what
// comes back, so each must be QP i's). what names the barrier in errors.
// Every message the peer sends must be a key string.
func (s *Perftest) BarrierEach(ctx context.Context, what string) error {
	if s.keys == nil {
		return fmt.Errorf("%w: perftest barrier (%s) before the key exchange", ErrState, what)
	}
	for i, k := range s.keys {
		rem, err := s.xchg(ctx, fmt.Sprintf("barrier (%s, QP %d)", what, i), k)
		if err != nil {
			return err
		}
		if _, err := s.parseKey(rem); err != nil {
			return fmt.Errorf("perftest barrier (%s, QP %d): %w", what, i, err)
		}
	}
	return nil
}

// BWReports is xchg_bw_reports: each side sends its report, and the
// peer's comes back. perftest's server sends whatever its report holds
// (it does not measure in write and read tests); the server prints the
// client's.
func (s *Perftest) BWReports(ctx context.Context, mine BWReport) (BWReport, error) {
	var rem BWReport
	if err := s.needVersion("results"); err != nil {
		return rem, err
	}
	iterLen := 8
	if s.peerVer < 5.33 {
		iterLen = 4
	}
	for _, v := range []struct {
		what string
		mine uint64
		n    int
		rem  *uint64
	}{
		{"results: size", mine.Size, 8, &rem.Size},
		{"results: iterations", mine.Iters, iterLen, &rem.Iters},
	} {
		b := make([]byte, v.n)
		if v.n == 4 {
			binary.BigEndian.PutUint32(b, uint32(v.mine))
		} else {
			binary.BigEndian.PutUint64(b, v.mine)
		}
		rb, err := s.xchg(ctx, v.what, b)
		if err != nil {
			return rem, err
		}
		if v.n == 4 {
			*v.rem = uint64(binary.BigEndian.Uint32(rb))
		} else {
			*v.rem = binary.BigEndian.Uint64(rb)
		}
	}
	for _, v := range []struct {
		what string
		mine float64
		rem  *float64
	}{
		{"results: peak", mine.PeakBW, &rem.PeakBW},
		{"results: average", mine.AvgBW, &rem.AvgBW},
		{"results: Mpps", mine.MsgRate, &rem.MsgRate},
	} {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], math.Float64bits(v.mine))
		rb, err := s.xchg(ctx, v.what, b[:])
		if err != nil {
			return rem, err
		}
		*v.rem = math.Float64frombits(binary.BigEndian.Uint64(rb))
	}
	return rem, nil
}

// DoneWait bounds how long Done waits for the peer's "done": perftest
// writes it and closes without reading ours.
const DoneWait = 2 * time.Second

// Done is ctx_close_connection: a last barrier, then "done\0" each way,
// the client's written first. The peer's "done" is awaited for at most
// DoneWait; a peer that closes or stays silent instead is not an error
// (perftest does not wait for it either), one that sends other bytes is.
// The server does not answer a peer that closed. Done does not close the
// connection.
//
// Over rdma_cm, Done is the last barrier alone (perftest writes "done"
// only on its socket).
func (s *Perftest) Done(ctx context.Context) error {
	if err := s.Barrier(ctx, "closing"); err != nil {
		return err
	}
	if s.msg != nil {
		return nil
	}
	release, err := bind(ctx, s.conn)
	if err != nil {
		if !s.client && errors.Is(err, io.ErrClosedPipe) {
			// The client has closed already (a net.Pipe refuses deadlines
			// then): closing instead of saying done is fine, as below.
			return nil
		}
		return fmt.Errorf("perftest done: %w", err)
	}
	defer release()
	write := func() error {
		if _, err := s.conn.Write([]byte(doneMsg)); err != nil {
			return ioErr(ctx, "perftest done", len(doneMsg), err)
		}
		return nil
	}
	if s.client {
		if err := write(); err != nil {
			return err
		}
	}
	dl := time.Now().Add(DoneWait)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	s.conn.SetReadDeadline(dl)
	b := make([]byte, len(doneMsg))
	n, rerr := io.ReadFull(s.conn, b)
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("perftest done: %w", cerr)
	}
	if string(b[:n]) != doneMsg[:n] {
		return fmt.Errorf("%w: the peer said %q, not \"done\"", ErrMalformed, b[:n])
	}
	gone := errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) || errors.Is(rerr, syscall.ECONNRESET)
	if rerr != nil && !gone && !isTimeout(rerr) {
		return ioErr(ctx, "perftest done: the peer's", len(doneMsg), rerr)
	}
	if !s.client && !gone {
		if d, ok := ctx.Deadline(); ok {
			s.conn.SetWriteDeadline(d)
		}
		return write()
	}
	return nil
}
