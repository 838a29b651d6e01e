package conform

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// Addresses of the prober and of the Self peer on their in-memory network.
var (
	SelfProberAddr = netip.MustParseAddrPort("192.0.2.1:4791")
	SelfPeerAddr   = netip.MustParseAddrPort("192.0.2.2:4791")
)

// SelfOptions configure a Self peer.
type SelfOptions struct {
	// MTU is the peer's path MTU (for rc_pingpong, its -m; perftest
	// agrees it in its exchange); 0 means IBV_MTU_1024.
	MTU qp.MTU
	// WrapConn, when set, wraps the peer Endpoint's Conn: a way to break
	// the peer (drop its NAKs, say) and see cases fail.
	WrapConn func(transport.Conn) transport.Conn
	// RxeRetryCount gives the peer's QPs rxe's retry_cnt: 7 never runs
	// out (qp.InitAttr.StrictRetryCount false), a departure from IBTA that
	// the retry-exhaustion case finds. By default the peer counts as IBTA
	// says.
	RxeRetryCount bool
	// Seed draws the peer's first PSNs; the same seed gives the same run.
	Seed uint64
	// AnnouncedOutReads is the out_reads the perftest servers announce;
	// 0 means 16, the max_dest_rd_atomic their QPs have. A smaller one
	// makes a peer that takes more READs at once than it said, as one
	// that never refuses them looks (max-rd-atomic-exceeded fails).
	AnnouncedOutReads uint16
	// ACKTimeout is the local ACK timeout code of the perftest peers' QPs
	// (IBA 4.096 µs x 2^code; perftest's -u); 0 means 14 (67 ms), as
	// perftest. A short one makes a peer whose ACK timer alone could
	// resend a READ as soon as an implied NAK would.
	ACKTimeout uint8
}

// Self is roce-emu as the peer under test: one transport.Endpoint on an
// in-memory transport.Network whose QPs are set up by the exchanges of
// ibv_rc_pingpong's and perftest's servers, spoken over net.Pipe, and then
// behave as those servers do (see Peer). It is what `roce-emu conform
// --self` and the package's tests run against.
type Self struct {
	net    *transport.Network
	ep     *transport.Endpoint
	prober transport.Conn
	mtu    qp.MTU
	strict bool
	reads  uint16 // the out_reads perftest announces
	ackTO  uint8  // the perftest peers' ACK timeout code (0: 14)

	mu   sync.Mutex
	rng  *rand.Rand
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc
}

// NewSelf starts a Self peer.
func NewSelf(opts SelfOptions) (*Self, error) {
	if opts.MTU == 0 {
		opts.MTU = qp.IBV_MTU_1024
	}
	if opts.MTU.Bytes() == 0 {
		return nil, fmt.Errorf("conform: %d is not an ibv_mtu code", opts.MTU)
	}
	n := transport.NewNetwork(transport.Impairments{}, opts.Seed)
	pc, err := n.Listen(SelfPeerAddr)
	if err != nil {
		return nil, err
	}
	prober, err := n.Listen(SelfProberAddr)
	if err != nil {
		pc.Close()
		return nil, err
	}
	if opts.WrapConn != nil {
		pc = opts.WrapConn(pc)
	}
	if opts.AnnouncedOutReads == 0 {
		opts.AnnouncedOutReads = 16
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Self{reads: opts.AnnouncedOutReads, ackTO: opts.ACKTimeout, net: n, ep: transport.NewEndpoint(pc, transport.Options{}), prober: prober, mtu: opts.MTU, strict: !opts.RxeRetryCount,
		rng: rand.New(rand.NewPCG(opts.Seed, 0x636f6e66)), ctx: ctx, stop: stop}, nil
}

// Target returns the target to Run against: the prober's Conn on the same
// network and a Dial that starts a server program for each case.
func (s *Self) Target() *Target {
	return &Target{Conn: s.prober, Dial: s.dial, PingpongMTU: s.mtu.Bytes()}
}

// Close stops the peer's programs and its Endpoint.
func (s *Self) Close() error {
	s.stop()
	s.wg.Wait()
	return s.ep.Close()
}

// psn draws a first PSN, as the programs do with lrand48() & 0xffffff.
func (s *Self) psn() bth.PSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bth.PSN(s.rng.Uint32() & bth.PSNMask)
}

func (s *Self) dial(ctx context.Context, p Peer) (net.Conn, error) {
	if p != Pingpong && p != WriteBW && p != ReadBW && p != AtomicBW && p != ReadBWBidir {
		return nil, ErrNoPeer
	}
	client, server := net.Pipe()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer server.Close()
		// The program runs until the prober hangs up or the Self closes.
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		// A program that fails ends as the real one does: it destroys
		// its QP and goes; the case sees what the peer did on the wire.
		if p == Pingpong {
			s.pingpong(ctx, server)
		} else {
			s.perftest(ctx, server, p)
		}
	}()
	return client, nil
}

// pingpong is ibv_rc_pingpong's server with its defaults (-s 4096, -r 500).
func (s *Self) pingpong(ctx context.Context, conn net.Conn) error {
	const size, rxDepth = 4096, 500
	ep := s.ep
	pd := ep.NewPD()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = 0x7b
	}
	mr, err := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return err
	}
	defer pd.DeregMR(mr)
	cq := ep.NewCQ(rxDepth + 1)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 1, MaxRecvWR: rxDepth, StrictRetryCount: s.strict})
	if err != nil {
		return err
	}
	defer q.Destroy()
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS); err != nil {
		return err
	}
	recv := qp.RecvWR{WRID: 1, SGEs: []qp.SGE{mr.SGE(0, size)}}
	for range rxDepth {
		if err := q.PostRecv(recv); err != nil {
			return err
		}
	}
	local := oob.Dest{QPN: q.QPN(), PSN: s.psn(), GID: ep.LocalAddr().Addr()}
	attr := transport.ConnectAttr{PathMTU: s.mtu, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1, Access: qp.IBV_ACCESS_LOCAL_WRITE}
	if _, err := oob.PingpongServer(ctx, conn, local, func(r oob.Dest) error {
		return q.Connect(transport.Remote{Addr: netip.AddrPortFrom(r.GID, bth.UDPPort), QPN: r.QPN, PSN: r.PSN}, local.PSN, attr)
	}); err != nil {
		return err
	}
	ctx = hangUp(ctx, conn)
	// rc_pingpong's loop: send when the last send completed and a message
	// came; repost receives when one is left.
	send := qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{mr.SGE(0, size)}}
	routs, pending := rxDepth, 1
	wc := make([]qp.WC, 2)
	for {
		n, err := cq.Wait(ctx, wc)
		if err != nil {
			return err
		}
		for _, c := range wc[:n] {
			if c.Status != qp.IBV_WC_SUCCESS {
				return fmt.Errorf("work completion %s", c.Status)
			}
			if c.WRID == 1 {
				if routs--; routs <= 1 {
					for ; routs < rxDepth; routs++ {
						if err := q.PostRecv(recv); err != nil {
							return err
						}
					}
				}
			}
			if pending &^= int(c.WRID); pending == 0 {
				if err := q.PostSend(send); err != nil {
					return err
				}
				pending = 3
			}
		}
	}
}

// Self's ib_read_bw -b: the READs it posts, and their size (its -s).
const selfBidirReads, selfBidirSize = 8, 4096

// perftest is ib_write_bw's, ib_read_bw's or ib_atomic_bw's server as
// roce-emu bw serves them: one region of 64 KiB open to remote WRITE and
// READ (and atomics for ib_atomic_bw), no receives. As ib_read_bw -b's
// it also posts selfBidirReads RDMA READs of selfBidirSize bytes from the
// region the prober announced, after the bidirectional tests' barrier.
func (s *Self) perftest(ctx context.Context, conn net.Conn, p Peer) error {
	ep := s.ep
	ps := oob.NewPerftestServer(conn)
	if _, err := ps.Versions(ctx); err != nil {
		return err
	}
	if _, err := ps.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine}); err != nil {
		return err
	}
	mtu, err := ps.MTU(ctx, s.mtu)
	if err != nil {
		return err
	}
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ
	if p == AtomicBW {
		access |= qp.IBV_ACCESS_REMOTE_ATOMIC
	}
	pd := ep.NewPD()
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	mr, err := pd.RegMR(buf, access)
	if err != nil {
		return err
	}
	defer pd.DeregMR(mr)
	cq := ep.NewCQ(64)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 16, MaxRecvWR: 1, StrictRetryCount: s.strict})
	if err != nil {
		return err
	}
	defer q.Destroy()
	local := oob.PerftestKey{OutReads: s.reads, QPN: q.QPN(), PSN: s.psn(), GID: ep.LocalAddr().Addr(), RKey: mr.RKey, VA: mr.VA}
	rems, err := ps.Keys(ctx, []oob.PerftestKey{local})
	if err != nil {
		return err
	}
	r := rems[0]
	if err := q.Connect(transport.Remote{Addr: netip.AddrPortFrom(r.GID, bth.UDPPort), QPN: r.QPN, PSN: r.PSN}, local.PSN,
		transport.ConnectAttr{PathMTU: mtu, Access: access, Timeout: s.ackTO}); err != nil {
		return err
	}
	for _, what := range []string{"after connecting", "addresses printed"} {
		if err := ps.Barrier(ctx, what); err != nil {
			return err
		}
	}
	if p == ReadBWBidir {
		if err := ps.Barrier(ctx, "before bidirectional traffic"); err != nil {
			return err
		}
		for i := range selfBidirReads {
			wr := qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_RDMA_READ, Flags: qp.IBV_SEND_SIGNALED,
				SGEs: []qp.SGE{mr.SGE(i*selfBidirSize, selfBidirSize)}, RemoteAddr: r.VA, RKey: r.RKey}
			if err := q.PostSend(wr); err != nil {
				return err
			}
		}
	}
	if err := ps.Barrier(ctx, "traffic done"); err != nil {
		return err
	}
	if _, err := ps.BWReports(ctx, oob.BWReport{}); err != nil {
		return err
	}
	return ps.Done(ctx)
}

// hangUp returns a context that ends when the prober closes conn (the
// programs read nothing more from it after their exchange).
func hangUp(ctx context.Context, conn net.Conn) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		var b [1]byte
		for {
			if _, err := conn.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return ctx
}
