package conform

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// Verdict is a case's outcome.
type Verdict string

// Verdicts. NA is also given to a case that could not be set up (the
// Result's Detail says why, and Report.NotRun counts it).
const (
	Pass Verdict = "pass"
	Fail Verdict = "fail"
	NA   Verdict = "n/a"
)

// Peer is the program a case has the peer run: which out-of-band exchange
// sets the connection up, and what the peer does on it.
type Peer uint8

// Peers.
const (
	// Pingpong is ibv_rc_pingpong's server (rdma-core
	// libibverbs/examples/rc_pingpong.c): a QP with rx_depth (500)
	// receives of -s (4096) bytes posted, LOCAL_WRITE access only, that
	// answers every SEND it receives with one SEND of -s bytes once its
	// previous one completed; timeout 14, retry_cnt 7, rnr_retry 7.
	Pingpong Peer = iota + 1
	// WriteBW is ib_write_bw's server (perftest): a memory region
	// announced in its key string (R_Key, VA) the prober may WRITE to,
	// and no receive posted.
	WriteBW
	// ReadBW is ib_read_bw's server: the same with a region the prober
	// may READ.
	ReadBW
	// AtomicBW is ib_atomic_bw's server: the same with a region the
	// prober may reach with CMP_AND_SWP and FETCH_AND_ADD (REMOTE_ATOMIC).
	AtomicBW
	// ReadBWBidir is ib_read_bw -b's server (bidirectional): the same as
	// ReadBW, and after one more barrier it posts RDMA READs of its -s
	// bytes (default 65536) to the region the prober announces, up to the
	// prober's OutReads outstanding (its max_rd_atomic, perftest's
	// ctx_modify_qp_to_rts): the peer as READ requester.
	ReadBWBidir
)

// String returns the program's name.
func (p Peer) String() string {
	switch p {
	case Pingpong:
		return "ibv_rc_pingpong"
	case WriteBW:
		return "ib_write_bw"
	case ReadBW:
		return "ib_read_bw"
	case AtomicBW:
		return "ib_atomic_bw"
	case ReadBWBidir:
		return "ib_read_bw -b"
	}
	return fmt.Sprintf("peer(%d)", uint8(p))
}

// Case is one conformance case. Run drives the peer through t and says
// what the peer did wrong with t.Failf; a case that returns without a
// failure or t.NotApplicable passes.
type Case struct {
	Name string // short, lowercase, with dashes: the capture's file name
	IBTA string // the section of the specification that says what the peer must do
	Peer Peer   // the program the peer runs; its exchange sets the connection up
	// StartPSN is the first PSN the prober announces; 0 lets the Runner
	// choose.
	StartPSN bth.PSN
	Run      func(t *T)
}

// T is what a case's Run gets: the Driver on the connection the exchange
// set up, the waits to use, and the verdict being made.
type T struct {
	*Driver
	// Wait bounds how long the peer may take to answer (Target.Wait).
	Wait time.Duration
	// Quiet is how long the peer must stay silent for "no answer"
	// (Target.Quiet).
	Quiet time.Duration

	verdict  Verdict
	detail   []string
	evidence []int
	notRun   bool // the prober could not do its part
}

// Failf fails the case, citing frames as the evidence; the first failure
// is the verdict, later ones add to the detail.
func (t *T) Failf(frames []*Frame, format string, args ...any) {
	t.verdict = Fail
	t.Evidence(frames...)
	t.detail = append(t.detail, fmt.Sprintf(format, args...))
}

// NotApplicable ends the case as n/a (the peer cannot be driven into the
// situation the case needs), unless it already failed.
func (t *T) NotApplicable(format string, args ...any) {
	if t.verdict != Fail {
		t.verdict = NA
	}
	t.detail = append(t.detail, fmt.Sprintf(format, args...))
}

// Logf adds to the case's detail without changing the verdict.
func (t *T) Logf(format string, args ...any) {
	t.detail = append(t.detail, fmt.Sprintf(format, args...))
}

// Evidence cites frames (of the case's capture) for the verdict.
func (t *T) Evidence(frames ...*Frame) {
	for _, f := range frames {
		if f != nil {
			t.evidence = append(t.evidence, f.N)
		}
	}
}

// Failed reports whether the case failed.
func (t *T) Failed() bool { return t.verdict == Fail }

// Result is the outcome of one case. Its JSON form is one element of
// --json's "cases".
type Result struct {
	Name    string  `json:"name"`
	Verdict Verdict `json:"verdict"`
	IBTA    string  `json:"ibta"`
	Peer    string  `json:"peer"`
	// Frames are the frame numbers, in Capture, of the evidence.
	Frames  []int  `json:"frames"`
	Detail  string `json:"detail"`
	Capture string `json:"capture,omitempty"`

	setupFailed bool
}

// Report is the outcome of a run.
type Report struct {
	Cases  []Result `json:"cases"`
	Passed int      `json:"passed"`
	Failed int      `json:"failed"`
	NA     int      `json:"na"`
	// NotRun counts the n/a cases whose set-up failed (the peer's program
	// did not answer, or its exchange broke): not verdicts on the peer. A
	// program the target does not run (ErrNoPeer) is not counted.
	NotRun int `json:"not_run"`
}

// What the prober announces to ib_read_bw -b (ReadBWBidir), which READs
// from it: up to ProberOutReads READs outstanding (the peer's
// max_rd_atomic) from the region ProberRKey, ProberVA. The region is not
// memory: the cases answer the READs they choose to with the bytes they
// craft.
const (
	ProberOutReads = 16
	ProberRKey     = 0x00C0F5EE
	ProberVA       = 0x7F0000000000
)

// ErrNoPeer is what Target.Dial returns for a program the target does not
// run: the cases that need it are n/a.
var ErrNoPeer = errors.New("conform: no such peer program at the target")

// Target is the peer under test.
type Target struct {
	// Conn is the prober's RoCEv2 socket (port 4791 at its address, which
	// is the GID announced to the peer). Run reads it and closes it.
	Conn transport.Conn
	// Dial opens the out-of-band connection to the peer program p (a TCP
	// connection to its server, or a net.Pipe to a Self peer); ErrNoPeer
	// when the target does not run p.
	Dial func(ctx context.Context, p Peer) (net.Conn, error)
	// UDPPort is the peer's RoCEv2 UDP port; 0 means 4791.
	UDPPort uint16
	// PingpongMTU is the path MTU ibv_rc_pingpong was started with (-m;
	// its exchange does not carry it); 0 means 1024, its default.
	PingpongMTU int
	// Wait bounds how long the peer may take to answer; 0 means 1 s.
	Wait time.Duration
	// Quiet is how long the peer must stay silent to count as not
	// answering; 0 means 300 ms.
	Quiet time.Duration
}

// Options configure a run.
type Options struct {
	// PcapDir, when set, gets a capture per case, NN-name.pcap, whose frame
	// numbers the Results cite.
	PcapDir string
	// CaseTimeout bounds one case, its set-up included; 0 means 30 s.
	CaseTimeout time.Duration
}

// Run runs cases against tgt one after another and reports their
// verdicts. It reads tgt.Conn and closes it before returning. An error is
// returned only when the run itself cannot go on (a capture that cannot be
// written); a case that cannot be set up is n/a with the reason.
func Run(ctx context.Context, tgt *Target, cases []Case, opts Options) (Report, error) {
	if tgt.Conn == nil || tgt.Dial == nil {
		return Report{}, errors.New("conform: the target needs a Conn and a Dial")
	}
	cp := *tgt // the defaults below are not the caller's
	tgt = &cp
	if tgt.Wait <= 0 {
		tgt.Wait = time.Second
	}
	if tgt.Quiet <= 0 {
		tgt.Quiet = 300 * time.Millisecond
	}
	if tgt.PingpongMTU == 0 {
		tgt.PingpongMTU = 1024
	}
	if opts.CaseTimeout <= 0 {
		opts.CaseTimeout = 30 * time.Second
	}
	rd := &reader{conn: tgt.Conn, byQPN: map[uint32]*Driver{}, done: make(chan struct{})}
	go rd.loop()
	defer func() {
		tgt.Conn.Close()
		<-rd.done
	}()

	var rep Report
	for i, c := range cases {
		if err := rd.failed(); err != nil {
			return rep, fmt.Errorf("conform: reading the prober's socket: %w", err)
		}
		res, err := runCase(ctx, tgt, rd, i, c, opts)
		if err != nil {
			return rep, err
		}
		switch res.Verdict {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		default:
			rep.NA++
		}
		if res.setupFailed {
			rep.NotRun++
		}
		rep.Cases = append(rep.Cases, res)
	}
	return rep, nil
}

// proberQPN is the QPN the prober announces for case i: one per case, so
// that the late packets of an earlier case's peer QP reach no Driver.
func proberQPN(i int) uint32 { return 0xC0F000 + uint32(i) }

// defaultPSN is the first PSN of case i when the case does not choose.
func defaultPSN(i int) bth.PSN { return bth.PSN(0x1000 + 0x10101*uint32(i)).Add(0) }

func runCase(ctx context.Context, tgt *Target, rd *reader, i int, c Case, opts Options) (Result, error) {
	res := Result{Name: c.Name, IBTA: c.IBTA, Peer: c.Peer.String(), Frames: []int{}}
	var w *pcap.Writer
	if opts.PcapDir != "" {
		res.Capture = filepath.Join(opts.PcapDir, fmt.Sprintf("%02d-%s.pcap", i+1, c.Name))
		var err error
		if w, err = pcap.Create(res.Capture); err != nil {
			return res, fmt.Errorf("conform: capture of case %s: %w", c.Name, err)
		}
		defer w.Close()
	}
	psn := c.StartPSN
	if psn == 0 {
		psn = defaultPSN(i)
	}
	d := newDriver(tgt.Conn, proberQPN(i), psn, w)
	rd.attach(d)
	defer rd.detach(d)

	cctx, cancel := context.WithTimeout(ctx, opts.CaseTimeout)
	defer cancel()
	nc, err := tgt.Dial(cctx, c.Peer)
	if err != nil {
		res.Verdict = NA
		if errors.Is(err, ErrNoPeer) {
			res.Detail = fmt.Sprintf("not run: the target runs no %s", c.Peer)
		} else {
			res.Detail = fmt.Sprintf("not run: cannot reach %s: %v", c.Peer, err)
			res.setupFailed = true
		}
		return res, nil
	}
	defer nc.Close()
	finish, err := setUp(cctx, tgt, d, c.Peer, nc)
	if err != nil {
		res.Verdict = NA
		res.Detail = fmt.Sprintf("not run: %s's exchange: %v", c.Peer, err)
		res.setupFailed = true
		return res, nil
	}
	t := &T{Driver: d, Wait: tgt.Wait, Quiet: tgt.Quiet, verdict: Pass}
	c.Run(t)
	if finish != nil {
		finish(cctx)
	}
	if n := d.Overflow(); n > 0 {
		t.Logf("%d peer packets were not kept (more than %d unread)", n, maxQueued)
	}
	res.Verdict, res.setupFailed = t.verdict, t.notRun
	res.Detail = strings.Join(t.detail, "; ")
	res.Frames = append(res.Frames, dedupe(t.evidence)...)
	if w != nil {
		if err := w.Flush(); err != nil {
			return res, fmt.Errorf("conform: capture of case %s: %w", c.Name, err)
		}
	}
	return res, nil
}

func dedupe(ns []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, n := range ns {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// setUp speaks the peer program's exchange as its client, announcing the
// Driver's QPN and PSN and the prober's address as GID, and fills in what
// the peer announced. It returns what ends the exchange after the case
// (perftest's closing steps), or nil.
func setUp(ctx context.Context, tgt *Target, d *Driver, p Peer, nc net.Conn) (func(context.Context), error) {
	gid := tgt.Conn.LocalAddr().Addr()
	port := tgt.UDPPort
	switch p {
	case Pingpong:
		rem, err := oob.PingpongClient(ctx, nc, oob.Dest{QPN: d.QPN, PSN: d.PSN, GID: gid}, nil)
		if err != nil {
			return nil, err
		}
		d.connect(netip.AddrPortFrom(rem.GID, port), rem.QPN)
		d.PeerPSN, d.MTU = rem.PSN, tgt.PingpongMTU
		return nil, nil
	case WriteBW, ReadBW, AtomicBW, ReadBWBidir:
		s := oob.NewPerftestClient(nc)
		if _, err := s.Versions(ctx); err != nil {
			return nil, err
		}
		if _, err := s.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine}); err != nil {
			return nil, err
		}
		// The largest MTU: perftest takes the smaller of both sides'.
		mtu, err := s.MTU(ctx, qp.IBV_MTU_4096)
		if err != nil {
			return nil, err
		}
		mine := oob.PerftestKey{OutReads: 1, QPN: d.QPN, PSN: d.PSN, GID: gid}
		if p == ReadBWBidir {
			// The peer READs from the prober: let it have several
			// READs outstanding, from a region the prober names.
			mine.OutReads, mine.RKey, mine.VA = ProberOutReads, ProberRKey, ProberVA
		}
		rems, err := s.Keys(ctx, []oob.PerftestKey{mine})
		if err != nil {
			return nil, err
		}
		rem := rems[0]
		d.connect(netip.AddrPortFrom(rem.GID, port), rem.QPN)
		d.PeerPSN, d.MTU, d.RKey, d.VA = rem.PSN, mtu.Bytes(), rem.RKey, rem.VA
		d.PeerOutReads = int(rem.OutReads)
		if err := s.Barrier(ctx, "after connecting"); err != nil {
			return nil, err
		}
		if err := s.Barrier(ctx, "addresses printed"); err != nil {
			return nil, err
		}
		if p == ReadBWBidir {
			// perftest's bidirectional tests meet once more before
			// their traffic (read_bw.c, "if (user_param.duplex)").
			if err := s.Barrier(ctx, "before bidirectional traffic"); err != nil {
				return nil, err
			}
		}
		return func(ctx context.Context) {
			// The client's end of a bandwidth test; the peer's program
			// then exits as after a run. Errors do not matter any more.
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if s.Barrier(ctx, "traffic done") == nil {
				if _, err := s.BWReports(ctx, oob.BWReport{}); err == nil {
					s.Done(ctx)
				}
			}
		}, nil
	}
	return nil, fmt.Errorf("unknown peer program %d", p)
}

// reader reads the prober's Conn and hands each peer packet to the Driver
// of the QPN it is for; packets for no Driver are dropped.
type reader struct {
	conn  transport.Conn
	mu    sync.Mutex
	byQPN map[uint32]*Driver
	err   error // why reading stopped, when not closed
	done  chan struct{}
}

func (r *reader) failed() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *reader) attach(d *Driver) {
	r.mu.Lock()
	r.byQPN[d.QPN] = d
	r.mu.Unlock()
}

func (r *reader) detach(d *Driver) {
	r.mu.Lock()
	delete(r.byQPN, d.QPN)
	r.mu.Unlock()
}

func (r *reader) loop() {
	defer close(r.done)
	ds := make([]transport.Datagram, 32)
	for i := range ds {
		ds[i].Data = make([]byte, 0, 16<<10)
	}
	var p bth.Packet
	for {
		n, err := r.conn.ReadBatch(ds)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				r.mu.Lock()
				r.err = err
				r.mu.Unlock()
			}
			return
		}
		now := time.Now()
		for i := range n {
			if p.Decode(ds[i].Data) != nil {
				continue
			}
			r.mu.Lock()
			d := r.byQPN[p.BTH.DestQP]
			r.mu.Unlock()
			if d != nil {
				d.arrive(now, &ds[i], &p)
			}
		}
	}
}
