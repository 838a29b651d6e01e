package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/roce-emu/roce-emu/transport"
)

// rping's constants (librdmacm/examples/rping.c).
const (
	rpingDefaultPort = 7174
	rpingBufSize     = 64 * 1024
	// rpingMinSize is sizeof(stringify(INT_MAX)) + sizeof("rdma-ping-%d: ").
	rpingMinSize = 26
	rpingSQDepth = 16
	// rpingInfoLen is struct rping_rdma_info: a buffer's address (64 bits),
	// R_Key and length (32 bits each), big-endian.
	rpingInfoLen = 16
)

type rpingFlags struct {
	netFlags
	server, client  bool
	addr            string
	source          string
	port            uint
	count, size     int
	verbose, verify bool
	debug           bool
	timeout         time.Duration
	peerTimeout     time.Duration // --peer-timeout
	js              jsonOut       // --json
	stdout, stderr  io.Writer
	serverAddr      netip.Addr
}

func runRping(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := rpingFlags{stdout: stdout, stderr: stderr}
	f.netFlags.register(fs, "127.0.0.1")
	fs.BoolVar(&f.server, "s", false, "server side")
	fs.BoolVar(&f.client, "c", false, "client side")
	fs.StringVar(&f.addr, "a", "", "`address`: the server's (client), the one to listen on (server; default --bind)")
	fs.StringVar(&f.source, "I", "", "source `address` to bind to for the client (the same as --bind)")
	fs.UintVar(&f.port, "p", rpingDefaultPort, "rdma_cm `port`")
	fs.IntVar(&f.count, "C", 0, "ping `count` times (0: until interrupted)")
	fs.IntVar(&f.size, "S", 64, "ping data `size` in bytes")
	fs.BoolVar(&f.verbose, "v", false, "display ping data to stdout")
	fs.BoolVar(&f.verify, "V", false, "validate ping data")
	fs.BoolVar(&f.debug, "d", false, "debug printfs")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up after this long in all (0: never, as rping)")
	fs.DurationVar(&f.peerTimeout, "peer-timeout", defaultPeerTimeout, "once connected, end the run with an error when not one RoCEv2 packet has come from the peer for this long (a peer stopped without a DREQ, or a dead path; retry_cnt 7 never runs out, as on rxe); 0: never")
	f.js.register(fs, "the pings, bytes and counters")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu rping -s [-v] [-V] [-d] [-S size] [-C count] [-a addr] [-p port]")
		fmt.Fprintln(stderr, "       roce-emu rping -c [-v] [-V] [-d] [-S size] [-C count] [-I addr] -a addr [-p port]")
		fmt.Fprintln(stderr, "\nrdma_cm's rping: the client connects through the communication manager over QP1, then per ping")
		fmt.Fprintln(stderr, "SENDs its buffer's address, R_Key and length; the server RDMA READs the ping data, SENDs a go-ahead;")
		fmt.Fprintln(stderr, "the client SENDs the address of its sink buffer; the server RDMA WRITEs the data back and SENDs.")
		fmt.Fprintln(stderr, "Works against librdmacm's rping on rxe (one flag per argument here: -v -V, not -vV).")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "roce-emu rping: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := f.check(); err != nil {
		fmt.Fprintf(stderr, "roce-emu rping: %v\n", err)
		return 2
	}
	f.stdout = f.js.text(stdout, stderr)
	if err := f.run(); err != nil {
		fmt.Fprintf(stderr, "roce-emu rping: %v\n", err)
		var intr *interruptedError
		if errors.As(err, &intr) {
			return intr.exitCode()
		}
		return 1
	}
	return 0
}

func (f *rpingFlags) check() error {
	if f.server == f.client {
		return errors.New("give -s (server) or -c (client)")
	}
	if f.size < rpingMinSize || f.size > rpingBufSize-1 {
		return fmt.Errorf("invalid size %d (valid range is %d to %d)", f.size, rpingMinSize, rpingBufSize-1)
	}
	if f.count < 0 {
		return fmt.Errorf("invalid count %d", f.count)
	}
	if f.port > 65535 {
		return fmt.Errorf("-p %d: not a port", f.port)
	}
	if f.timeout < 0 {
		return fmt.Errorf("--timeout %v: must not be negative", f.timeout)
	}
	if err := checkPeerTimeout(f.peerTimeout); err != nil {
		return err
	}
	if f.source != "" {
		f.bind = f.source
	}
	if f.client {
		if f.addr == "" {
			return errors.New("-c needs the server's address (-a)")
		}
		a, err := netip.ParseAddr(f.addr)
		if err != nil {
			return fmt.Errorf("-a %q: not an IP address", f.addr)
		}
		f.serverAddr = a
	} else if f.addr != "" {
		f.bind = f.addr
	}
	return f.netFlags.check()
}

func (f *rpingFlags) debugf(format string, args ...any) {
	if f.debug {
		fmt.Fprintf(f.stdout, format, args...)
	}
}

// rpingSession is one connection's buffers and completions.
type rpingSession struct {
	f       *rpingFlags
	ep      *transport.Endpoint
	cq      *transport.CQ
	conn    *rdmacm.Conn
	recv    []byte // struct rping_rdma_info received
	send    []byte // struct rping_rdma_info sent
	rdma    []byte // the RDMA sink (server: READ into it; client: the server WRITEs into it)
	start   []byte // client: the ping data the server READs
	recvMR  *qp.MR
	sendMR  *qp.MR
	rdmaMR  *qp.MR
	startMR *qp.MR
	// completions seen but not yet waited for, by opcode
	seen map[qp.WCOpcode]int
	wcs  []qp.WC
	// pings done (the data READ and WRITTEN back), from up (the
	// connection established)
	pings int
	up    time.Time
}

// rpingJSON is rping's --json object, in the shape of server's and
// client's (pingpongJSON): written at the end of a run that had a
// connection up, also when a signal ended it (rping's usual end without
// -C), the text going to stderr.
type rpingJSON struct {
	Program  string         `json:"program"` // rping
	Role     string         `json:"role"`    // server or client
	Size     int            `json:"size"`    // -S, bytes of ping data
	Iters    int            `json:"iters"`   // pings done: READ by the server and WRITTEN back
	Bytes    string         `json:"bytes"`   // ping data moved, both ways (2 x size a ping)
	Seconds  float64        `json:"seconds"` // from the connection established to the end
	Stopped  string         `json:"stopped_by,omitempty"`
	Counters map[string]any `json:"counters"` // the data QP's (qp.Counters keys)
	Endpoint map[string]any `json:"endpoint"` // the RoCEv2 socket's (transport.Stats keys)
}

// emitJSON writes --json's object for a run whose connection came up.
func (s *rpingSession) emitJSON(c qp.Counters, sig os.Signal) error {
	f := s.f
	if !f.js.on || s.up.IsZero() {
		return nil
	}
	j := rpingJSON{Program: "rping", Role: "client", Size: f.size, Iters: s.pings, Bytes: strconv.Itoa(2 * f.size * s.pings),
		Seconds: time.Since(s.up).Seconds()}
	if f.server {
		j.Role = "server"
	}
	if sig != nil {
		j.Stopped = sig.String()
	}
	var err error
	if j.Counters, err = countersJSON(c); err != nil {
		return err
	}
	if j.Endpoint, err = countersJSON(s.ep.Stats()); err != nil {
		return err
	}
	return f.js.emit(j)
}

// run runs one rping. On SIGINT or SIGTERM (or --timeout, or an error)
// the connection still up is disconnected (a DREQ, the DREP awaited at
// most cmDisconnectWait), so that the peer's rping ends too, then the
// capture is closed whole; a signal ends the run with an
// *interruptedError after the counters are printed.
func (f *rpingFlags) run() (err error) {
	ep, closeAll, err := f.openEndpoint()
	if err != nil {
		return err
	}
	defer closeAll() // last: the DREQ and DREP are in the capture
	ctx := context.Background()
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	ctx, intr, stopSignals := withSignals(ctx)
	defer stopSignals()
	svc, err := rdmacm.New(ep, rdmacm.Config{UDPPort: uint16(f.udpPort)})
	if err != nil {
		return err
	}
	defer svc.Close()
	s := &rpingSession{f: f, ep: ep, cq: ep.NewCQ(rpingSQDepth * 2), seen: map[qp.WCOpcode]int{}, wcs: make([]qp.WC, 8),
		recv: make([]byte, rpingInfoLen), send: make([]byte, rpingInfoLen), rdma: make([]byte, f.size)}
	defer func() {
		detail := "no rdma_cm connection was up"
		var qpc string
		var c qp.Counters
		if s.conn != nil {
			wait := cmDisconnectWait
			if errors.Is(err, errPeerSilent) {
				wait = 0 // the peer is gone: the DREQ goes, no DREP is awaited
			}
			detail, _ = disconnectCMWithin(wait, s.conn)
			s.ep.Flush()
			c = s.conn.QP().Counters()
			qpc = describeCounters(c)
			s.conn.Close()
		} else if d := drainCM(svc); d != "" {
			detail = d
		}
		sig := intr.caught()
		f.debugf("cm counters: %s\n", cmCounters(svc.Stats()))
		if err == nil || sig != nil {
			if jerr := s.emitJSON(c, sig); jerr != nil && err == nil {
				err = jerr
			}
		}
		if sig == nil {
			return
		}
		fmt.Fprintf(f.stderr, "roce-emu rping: cm counters: %s\n", cmCounters(svc.Stats()))
		if qpc != "" {
			fmt.Fprintf(f.stderr, "roce-emu rping: qp counters: %s\n", qpc)
		}
		err = &interruptedError{sig: sig, detail: detail}
	}()
	return s.run(ctx, svc)
}

func (s *rpingSession) run(ctx context.Context, svc *rdmacm.Service) error {
	f, ep := s.f, s.ep
	pd := ep.NewPD()
	var err error
	if s.recvMR, err = pd.RegMR(s.recv, qp.IBV_ACCESS_LOCAL_WRITE); err != nil {
		return err
	}
	if s.sendMR, err = pd.RegMR(s.send, 0); err != nil {
		return err
	}
	remote := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_READ | qp.IBV_ACCESS_REMOTE_WRITE
	if s.rdmaMR, err = pd.RegMR(s.rdma, remote); err != nil {
		return err
	}
	if f.client {
		s.start = make([]byte, f.size)
		if s.startMR, err = pd.RegMR(s.start, remote); err != nil {
			return err
		}
	}
	params := rdmacm.ConnParams{PD: pd, SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: rpingSQDepth, MaxRecvWR: 2, SQSigAll: true,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, RecvWRs: []qp.RecvWR{s.recvWR()}}

	if f.server {
		l, err := svc.Listen(uint16(f.port))
		if err != nil {
			return err
		}
		defer l.Close()
		f.debugf("listening on %s port %d\n", svc.LocalAddr(), f.port)
		conn, err := l.Accept(ctx, params)
		if err != nil {
			return fmt.Errorf("connect error: %w", err)
		}
		s.conn, s.up = conn, time.Now()
		f.debugf("cma_event type RDMA_CM_EVENT_ESTABLISHED cma_id %#x (child)\n", s.conn.ID())
		ctx, stopSilence := watchPeerSilence(ctx, f.stderr, "rping", f.peerTimeout, s.conn.QP())
		err = s.server(ctx)
		stopSilence()
		return s.finish(saidAbove(ctx, err))
	}
	conn, err := svc.Dial(ctx, f.serverAddr, uint16(f.port), params)
	if err != nil {
		var rej *rdmacm.RejectError
		switch {
		case errors.As(err, &rej):
			return fmt.Errorf("cma event RDMA_CM_EVENT_REJECTED, error %d (%v): connect error", rej.Reason, rej.Reason)
		case errors.Is(err, rdmacm.ErrUnreachable):
			return fmt.Errorf("cma event RDMA_CM_EVENT_UNREACHABLE: connect error: %w", err)
		case errors.Is(err, rdmacm.ErrConnectError):
			return fmt.Errorf("cma event RDMA_CM_EVENT_CONNECT_ERROR: connect error: %w", err)
		}
		return fmt.Errorf("connect error: %w", err)
	}
	s.conn, s.up = conn, time.Now()
	f.debugf("cma_event type RDMA_CM_EVENT_ESTABLISHED cma_id %#x (parent)\n", s.conn.ID())
	sctx, stopSilence := watchPeerSilence(ctx, f.stderr, "rping", f.peerTimeout, s.conn.QP())
	err = saidAbove(sctx, s.client(sctx))
	stopSilence()
	if errors.Is(err, errPeerSilent) {
		// The server is gone: no DREP will come (run's deferred
		// disconnect sends the DREQ and does not wait for one).
		return s.finish(err)
	}
	if ctx.Err() != nil {
		// A signal or --timeout: run's deferred disconnectCM sends the
		// DREQ and waits for the DREP with a bounded wait of its own (a
		// Disconnect on this ended context would send the DREQ and not
		// wait, and the DREP could then come before disconnectCM looked,
		// which would report no connection up).
		return err
	}
	// The server may be gone (its DREP lost, or it exited): the DREP is
	// awaited at most cmDisconnectWait, as on a signal.
	dctx, cancel := context.WithTimeout(ctx, cmDisconnectWait)
	derr := s.conn.Disconnect(dctx)
	cancel()
	switch {
	case errors.Is(derr, context.DeadlineExceeded) && ctx.Err() == nil:
		fmt.Fprintf(f.stderr, "client DISCONNECT: no DREP from the server within %v; disconnected without it\n", cmDisconnectWait)
	case derr != nil && err == nil:
		err = fmt.Errorf("disconnect: %w", derr)
	case err == nil:
		fmt.Fprintln(f.stderr, "client DISCONNECT EVENT...")
	}
	return s.finish(err)
}

// finish prints the data QP's counters and every drop and refusal (with
// -d, as the CM's), and fails a run that went well so far if the QP ended
// in IBV_QPS_ERR other than by the disconnection, saying why.
func (s *rpingSession) finish(err error) error {
	q := s.conn.QP()
	s.ep.Flush() // the ACK held after the last completion is counted
	c := q.Counters()
	s.f.debugf("qp counters: %s\n", describeCounters(c))
	s.f.debugf("drops and refusals: %s\n", describeDrops(c, s.ep.Stats(), s.cq))
	if err == nil {
		err = qpErrors(q)
	}
	return err
}

func (s *rpingSession) recvWR() qp.RecvWR {
	return qp.RecvWR{WRID: 1, SGEs: []qp.SGE{s.recvMR.SGE(0, rpingInfoLen)}}
}

// errDisconnected: the peer disconnected (our receive was flushed).
var errDisconnected = errors.New("disconnected")

// wait blocks until n completions of opcode op came (counting those seen
// earlier). A completion in error fails, a flushed one after the peer's
// DREQ says errDisconnected.
func (s *rpingSession) wait(ctx context.Context, op qp.WCOpcode) error {
	for s.seen[op] == 0 {
		n, err := s.cq.Wait(ctx, s.wcs)
		if err != nil {
			return err
		}
		for _, wc := range s.wcs[:n] {
			if wc.Status != qp.IBV_WC_SUCCESS {
				if wc.Status == qp.IBV_WC_WR_FLUSH_ERR {
					select {
					case <-s.conn.Disconnected():
						return errDisconnected
					default:
					}
				}
				if qerr := s.conn.QP().Err(); qerr != nil {
					return fmt.Errorf("cq completion failed status %d (%v): %w", int(wc.Status), wc.Status, qerr)
				}
				return fmt.Errorf("cq completion failed status %d (%v)", int(wc.Status), wc.Status)
			}
			if wc.Opcode == qp.IBV_WC_RECV {
				if wc.ByteLen != rpingInfoLen {
					return fmt.Errorf("received bogus data, size %d", wc.ByteLen)
				}
			}
			s.seen[wc.Opcode]++
		}
	}
	s.seen[op]--
	return nil
}

// waitRecv waits for a SEND from the peer and returns the rping_rdma_info
// it carried, with the receive WQE posted again (as rping's CQ handler).
func (s *rpingSession) waitRecv(ctx context.Context) (addr uint64, rkey, size uint32, err error) {
	if err := s.wait(ctx, qp.IBV_WC_RECV); err != nil {
		return 0, 0, 0, err
	}
	s.ep.Sync()
	addr = binary.BigEndian.Uint64(s.recv[0:8])
	rkey = binary.BigEndian.Uint32(s.recv[8:12])
	size = binary.BigEndian.Uint32(s.recv[12:16])
	return addr, rkey, size, s.conn.QP().PostRecv(s.recvWR())
}

// sendInfo SENDs a buffer's address, R_Key and length (rping_format_send)
// and waits for the SEND's completion.
func (s *rpingSession) sendInfo(ctx context.Context, mr *qp.MR, size int) error {
	binary.BigEndian.PutUint64(s.send[0:8], mr.VA)
	binary.BigEndian.PutUint32(s.send[8:12], mr.RKey)
	binary.BigEndian.PutUint32(s.send[12:16], uint32(size))
	s.f.debugf("RDMA addr %x rkey %x len %d\n", mr.VA, mr.RKey, size)
	return s.postSend(ctx, qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{s.sendMR.SGE(0, rpingInfoLen)}}, qp.IBV_WC_SEND)
}

func (s *rpingSession) postSend(ctx context.Context, wr qp.SendWR, op qp.WCOpcode) error {
	if err := s.conn.QP().PostSend(wr); err != nil {
		return fmt.Errorf("post send error: %w", err)
	}
	return s.wait(ctx, op)
}

// client runs rping_test_client: per ping, the ping data goes out by the
// server's READ and comes back by its WRITE.
func (s *rpingSession) client(ctx context.Context) error {
	f := s.f
	start := byte(65)
	for ping := 0; f.count == 0 || ping < f.count; ping++ {
		s.ep.Locked(func() {
			cc := copy(s.start, fmt.Sprintf("rdma-ping-%d: ", ping))
			c := start
			for i := cc; i < len(s.start); i++ {
				s.start[i] = c
				if c++; c > 122 {
					c = 65
				}
			}
			s.start[len(s.start)-1] = 0
		})
		if start++; start > 122 {
			start = 65
		}
		if err := s.sendInfo(ctx, s.startMR, f.size); err != nil {
			return err
		}
		// The server READs the ping data, then says go ahead.
		if _, _, _, err := s.waitRecv(ctx); err != nil {
			return fmt.Errorf("wait for RDMA_WRITE_ADV: %w", err)
		}
		if err := s.sendInfo(ctx, s.rdmaMR, f.size); err != nil {
			return err
		}
		// The server WRITEs the data back, then says it is done.
		if _, _, _, err := s.waitRecv(ctx); err != nil {
			return fmt.Errorf("wait for RDMA_WRITE_COMPLETE: %w", err)
		}
		s.ep.Sync()
		if f.verify && !bytes.Equal(s.start, s.rdma) {
			return errors.New("data mismatch")
		}
		if f.verbose {
			fmt.Fprintf(f.stdout, "ping data: %s\n", cstring(s.rdma))
		}
		s.pings++
	}
	return nil
}

// server runs rping_test_server until the client disconnects: as rping,
// a disconnect at any step ends it without error (the last SEND's ACK may
// not have come before the client's DREQ flushed it).
func (s *rpingSession) server(ctx context.Context) error {
	err := s.serve(ctx)
	if errors.Is(err, errDisconnected) {
		fmt.Fprintln(s.f.stderr, "server DISCONNECT EVENT...")
		return nil
	}
	return err
}

func (s *rpingSession) serve(ctx context.Context) error {
	f := s.f
	for {
		addr, rkey, size, err := s.waitRecv(ctx)
		if err != nil {
			return fmt.Errorf("wait for RDMA_READ_ADV: %w", err)
		}
		f.debugf("Received rkey %x addr %x len %d from peer\n", rkey, addr, size)
		if int(size) > len(s.rdma) {
			return fmt.Errorf("the client's ping buffer is %d bytes, more than -S %d", size, len(s.rdma))
		}
		if err := s.postSend(ctx, qp.SendWR{WRID: 3, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{s.rdmaMR.SGE(0, int(size))},
			RemoteAddr: addr, RKey: rkey}, qp.IBV_WC_RDMA_READ); err != nil {
			return fmt.Errorf("wait for RDMA_READ_COMPLETE: %w", err)
		}
		s.ep.Sync()
		if f.verbose {
			fmt.Fprintf(f.stdout, "server ping data: %s\n", cstring(s.rdma))
		}
		// Tell the client to continue.
		if err := s.postSend(ctx, qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{s.sendMR.SGE(0, rpingInfoLen)}}, qp.IBV_WC_SEND); err != nil {
			return err
		}
		addr, rkey, size, err = s.waitRecv(ctx)
		if err != nil {
			return fmt.Errorf("wait for RDMA_WRITE_ADV: %w", err)
		}
		f.debugf("Received rkey %x addr %x len %d from peer\n", rkey, addr, size)
		n := len(cstring(s.rdma)) + 1
		if n > len(s.rdma) {
			n = len(s.rdma)
		}
		if err := s.postSend(ctx, qp.SendWR{WRID: 4, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{s.rdmaMR.SGE(0, n)},
			RemoteAddr: addr, RKey: rkey}, qp.IBV_WC_RDMA_WRITE); err != nil {
			return fmt.Errorf("wait for RDMA_WRITE_COMPLETE: %w", err)
		}
		s.pings++
		// Tell the client to begin again.
		if err := s.postSend(ctx, qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{s.sendMR.SGE(0, rpingInfoLen)}}, qp.IBV_WC_SEND); err != nil {
			return err
		}
	}
}

// cstring is b up to its first NUL byte.
func cstring(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
