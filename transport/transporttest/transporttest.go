// Package transporttest provides helpers for tests of programs that use
// package transport, as net/http/httptest does for net/http: a connected
// pair of Reliable Connected queue pairs on an in-memory transport.Network,
// waiting for a number of completions with a deadline, and registering
// buffers and posting SEND, RDMA WRITE and RDMA READ work requests in one
// line each.
//
// Every helper takes a testing.TB and fails the test (t.Fatalf) with a
// message that says what was expected and what came, instead of returning
// an error. Nothing here reads the wall clock directly: deadlines are
// context timers, so the helpers run inside testing/synctest.Test, where
// the network's delays, the QPs' retransmission timers and the waits all
// run in simulated time and every run is the same:
//
//	func TestWriteUnderSynctest(t *testing.T) {
//		synctest.Test(t, func(t *testing.T) {
//			p := transporttest.NewPair(t, transporttest.Config{
//				Impairments: transport.Impairments{Delay: 5 * time.Microsecond, Loss: 0.05},
//			})
//			src := p.A.Reg([]byte("written by A"))
//			dst := p.B.Reg(make([]byte, 12))
//			p.A.PostWrite(1, src, dst)
//			p.A.WaitOK(1)
//			p.B.Endpoint.Sync() // B's writes to dst happen before what follows
//			if string(dst.Buf) != "written by A" {
//				t.Errorf("B's buffer holds %q", dst.Buf)
//			}
//		})
//	}
//
// Only the public API of package transport is used, so a Pair is what a
// program would build by hand: two Endpoints on one Network, each with a
// PD, a CQ and a QP, connected with QP.Connect. To see the packets, give
// Config.WrapConn a transport.Conn decorator (a packet observer or a
// capture): it wraps each side's Conn before the Endpoint starts on it.
package transporttest

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// Default addresses of the two sides: the documentation prefixes of RFC
// 5737 (TEST-NET-1) and RFC 3849, at UDP port 4791.
var (
	DefaultAddrs4 = [2]netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:4791"), netip.MustParseAddrPort("192.0.2.2:4791")}
	DefaultAddrs6 = [2]netip.AddrPort{netip.MustParseAddrPort("[2001:db8::1]:4791"), netip.MustParseAddrPort("[2001:db8::2]:4791")}
)

// AllAccess is the access a Pair's QPs and Reg's memory regions grant by
// default: local write and remote write, read and atomic.
const AllAccess = qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ | qp.IBV_ACCESS_REMOTE_ATOMIC

// DefaultTimeout is how long a Side's Wait waits when Config.Timeout is 0.
// Under testing/synctest it is simulated time and costs nothing.
const DefaultTimeout = 10 * time.Second

// Config describes a Pair. The zero value is a perfect network, IPv4,
// path MTU 1024, both sides starting at PSN 0, and QPs and memory regions
// that allow every remote operation.
type Config struct {
	// Impairments and Seed make the Network (transport.NewNetwork).
	Impairments transport.Impairments
	Seed        uint64
	// IPv6 puts the sides on DefaultAddrs6 instead of DefaultAddrs4.
	IPv6 bool
	// Addrs, when set, are the two sides' addresses (port 0 means 4791);
	// they override IPv6.
	Addrs [2]netip.AddrPort
	// PSN is the first PSN each side sends: side A sends from PSN[0] and
	// side B from PSN[1].
	PSN [2]bth.PSN
	// Connect are the attributes both QPs are connected with. Its zero
	// fields take transport.ConnectAttr's defaults, except Access, which
	// defaults to AllAccess; PathMTU sets the path MTU (default 1024).
	Connect transport.ConnectAttr
	// InitAttr is the QPs' creation attributes (its PD, CQs and QPN are
	// set by NewPair). Nil means qp.InitAttr{SQSigAll: true}: every send
	// work request completes.
	InitAttr *qp.InitAttr
	// CQDepth is each side's CQ depth (default 1024). One CQ takes both
	// the send and the receive completions of its side.
	CQDepth int
	// Options are the two Endpoints' options (faults, ICRC policy,
	// logger, DSCP).
	Options [2]transport.Options
	// WrapConn, when set, is given each side's Conn on the Network before
	// its Endpoint is made (side 0 is A), and the Endpoint runs on what it
	// returns. It is where a transport.Conn decorator goes: a packet
	// observer or capture that sees every datagram each side sends and
	// receives, or a test's own fault injection. An Endpoint sees through
	// transport's own decorators (they Unwrap) but not through a test's
	// own wrapper, so where its Options leave ICRC at transport.ICRCAuto
	// NewPair sets transport.ICRCAssumeID0, which is exact on a Network:
	// received ICRCs are verified as without the wrapper.
	WrapConn func(side int, c transport.Conn) transport.Conn
	// Timeout is how long Side.Wait and Side.WaitOK wait (default
	// DefaultTimeout).
	Timeout time.Duration
}

// Pair is two connected RC QPs on one in-memory Network.
type Pair struct {
	Network *transport.Network
	A, B    *Side
}

// Side is one end of a Pair: an Endpoint with one PD, one CQ (for both
// send and receive completions) and one connected QP. Its methods fail the
// test with t.Fatalf, so call them from the test's goroutine, as testing
// requires of FailNow; the fields may be used from anywhere, as their own
// documentation allows.
type Side struct {
	Name     string // "A" or "B"
	Addr     netip.AddrPort
	Endpoint *transport.Endpoint
	PD       *transport.PD
	CQ       *transport.CQ
	QP       *transport.QP

	t       testing.TB
	timeout time.Duration
	access  qp.Access
}

// NewPair builds a Network and two Endpoints on it, creates a PD, a CQ
// and a QP on each, and connects the QPs to each other as an out-of-band
// exchange would (QP.Connect). The Endpoints are closed by t.Cleanup. It
// fails t when any step fails.
//
// Inside testing/synctest.Test, call NewPair with the bubble's t: the
// Network's and Endpoints' goroutines and timers then belong to the bubble
// and end with it.
func NewPair(t testing.TB, cfg Config) *Pair {
	t.Helper()
	addrs := DefaultAddrs4
	if cfg.IPv6 {
		addrs = DefaultAddrs6
	}
	if cfg.Addrs[0].IsValid() || cfg.Addrs[1].IsValid() {
		addrs = cfg.Addrs
	}
	for i, a := range addrs {
		if !a.Addr().IsValid() {
			t.Fatalf("transporttest: address of side %s is not set (Config.Addrs = %v)", sideName(i), cfg.Addrs)
		}
		if a.Port() == 0 {
			addrs[i] = netip.AddrPortFrom(a.Addr(), bth.UDPPort)
		}
	}
	if addrs[0] == addrs[1] {
		t.Fatalf("transporttest: both sides have address %s", addrs[0])
	}
	if addrs[0].Addr().Unmap().Is4() != addrs[1].Addr().Unmap().Is4() {
		t.Fatalf("transporttest: addresses %s and %s are not of one IP version", addrs[0], addrs[1])
	}
	if cfg.Connect.Access == 0 {
		cfg.Connect.Access = AllAccess
	}
	init := qp.InitAttr{SQSigAll: true}
	if cfg.InitAttr != nil {
		init = *cfg.InitAttr
	}
	if cfg.CQDepth == 0 {
		cfg.CQDepth = 1024
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}

	p := &Pair{Network: transport.NewNetwork(cfg.Impairments, cfg.Seed)}
	var sides [2]*Side
	for i := range 2 {
		conn, err := p.Network.Listen(addrs[i])
		if err != nil {
			t.Fatalf("transporttest: side %s cannot listen at %s: %v", sideName(i), addrs[i], err)
		}
		opts := cfg.Options[i]
		if cfg.WrapConn != nil {
			conn = cfg.WrapConn(i, conn)
			if opts.ICRC == transport.ICRCAuto {
				opts.ICRC = transport.ICRCAssumeID0
			}
		}
		ep := transport.NewEndpoint(conn, opts)
		t.Cleanup(func() { ep.Close() })
		s := &Side{Name: sideName(i), Addr: addrs[i], Endpoint: ep, t: t, timeout: cfg.Timeout, access: cfg.Connect.Access}
		s.PD = ep.NewPD()
		s.CQ = ep.NewCQ(cfg.CQDepth)
		if s.QP, err = ep.NewQP(s.PD, s.CQ, s.CQ, init); err != nil {
			t.Fatalf("transporttest: side %s cannot create a QP: %v", s.Name, err)
		}
		sides[i] = s
	}
	for i, s := range sides {
		peer := sides[1-i]
		r := transport.Remote{Addr: peer.Endpoint.LocalAddr(), QPN: peer.QP.QPN(), PSN: cfg.PSN[1-i]}
		if err := s.QP.Connect(r, cfg.PSN[i], cfg.Connect); err != nil {
			t.Fatalf("transporttest: side %s cannot connect its QP %#x to QPN %#x at %s: %v", s.Name, s.QP.QPN(), r.QPN, r.Addr, err)
		}
	}
	p.A, p.B = sides[0], sides[1]
	return p
}

func sideName(i int) string { return string(rune('A' + i)) }

// Reg registers buf in the side's PD with the access the QPs were
// connected with (Config.Connect.Access, by default AllAccess) and
// returns the memory region; mr.Buf is buf. It fails the test on error
// (an empty buf, say).
func (s *Side) Reg(buf []byte) *qp.MR {
	s.t.Helper()
	mr, err := s.PD.RegMR(buf, s.access|qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		s.t.Fatalf("transporttest: side %s cannot register %d bytes: %v", s.Name, len(buf), err)
	}
	return mr
}

// Post posts wr on the side's QP and fails the test when the QP refuses it.
func (s *Side) Post(wr qp.SendWR) {
	s.t.Helper()
	if err := s.QP.PostSend(wr); err != nil {
		s.t.Fatalf("transporttest: side %s cannot post %s (WRID %d): %v", s.Name, wr.Opcode, wr.WRID, err)
	}
}

// PostRecv posts a receive work request for the whole of mr (nil: no
// buffer, enough for a WRITE with immediate or a zero-byte SEND).
func (s *Side) PostRecv(wrid uint64, mr *qp.MR) {
	s.t.Helper()
	wr := qp.RecvWR{WRID: wrid}
	if mr != nil {
		wr.SGEs = []qp.SGE{mr.SGE(0, len(mr.Buf))}
	}
	if err := s.QP.PostRecv(wr); err != nil {
		s.t.Fatalf("transporttest: side %s cannot post a receive (WRID %d): %v", s.Name, wrid, err)
	}
}

// PostSend posts a SEND of the whole of mr.
func (s *Side) PostSend(wrid uint64, mr *qp.MR) {
	s.t.Helper()
	s.Post(qp.SendWR{WRID: wrid, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr.SGE(0, len(mr.Buf))}})
}

// PostWrite posts an RDMA WRITE of the whole of local to the start of
// remote, a region of the other side (its VA and R_Key are what an
// out-of-band exchange would carry).
func (s *Side) PostWrite(wrid uint64, local, remote *qp.MR) {
	s.t.Helper()
	s.Post(qp.SendWR{WRID: wrid, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{local.SGE(0, len(local.Buf))},
		RemoteAddr: remote.VA, RKey: remote.RKey})
}

// PostRead posts an RDMA READ of len(local.Buf) bytes from the start of
// remote, a region of the other side, into local.
func (s *Side) PostRead(wrid uint64, local, remote *qp.MR) {
	s.t.Helper()
	s.Post(qp.SendWR{WRID: wrid, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{local.SGE(0, len(local.Buf))},
		RemoteAddr: remote.VA, RKey: remote.RKey})
}

// Wait waits up to the Pair's timeout for n completions on the side's CQ
// and returns them, oldest first, whatever their status. See WaitN.
func (s *Side) Wait(n int) []qp.WC {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	return waitN(s.t, ctx, s.CQ, n, fmt.Sprintf("side %s waited %v", s.Name, s.timeout))
}

// WaitOK is Wait, and also fails the test unless every completion has
// status IBV_WC_SUCCESS.
func (s *Side) WaitOK(n int) []qp.WC {
	s.t.Helper()
	wcs := s.Wait(n)
	for i, wc := range wcs {
		if wc.Status != qp.IBV_WC_SUCCESS {
			s.t.Fatalf("transporttest: side %s: completion %d of %d is %s, want SUCCESS: %s", s.Name, i+1, n, wc.Status, formatWC(wc))
		}
	}
	return wcs
}

// WaitN waits until n completions have come out of cq and returns them,
// oldest first. It fails t, saying how many of the n came and listing
// them, when ctx ends first or cq's Endpoint closes. It polls no more
// than n, so completions after the nth stay in cq.
func WaitN(t testing.TB, ctx context.Context, cq *transport.CQ, n int) []qp.WC {
	t.Helper()
	return waitN(t, ctx, cq, n, "waited")
}

func waitN(t testing.TB, ctx context.Context, cq *transport.CQ, n int, who string) []qp.WC {
	t.Helper()
	if n < 0 {
		t.Fatalf("transporttest: cannot wait for %d completions", n)
		return nil
	}
	out := make([]qp.WC, 0, n)
	buf := make([]qp.WC, min(n, 64))
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("transporttest: %s for %d completions and got %d: %v%s", who, n, len(out), err, formatWCs(out))
			return out
		}
		out = append(out, buf[:k]...)
	}
	return out
}

func formatWC(wc qp.WC) string {
	return fmt.Sprintf("{WRID %d %s %s %d bytes QPN %#x}", wc.WRID, wc.Opcode, wc.Status, wc.ByteLen, wc.QPNum)
}

func formatWCs(wcs []qp.WC) string {
	if len(wcs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("; got:")
	for _, wc := range wcs {
		b.WriteString(" ")
		b.WriteString(formatWC(wc))
	}
	return b.String()
}
