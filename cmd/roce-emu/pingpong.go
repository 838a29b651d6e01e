package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

type pingpongFlags struct {
	netFlags
	ccFlags
	port    int
	size    int
	iters   int
	mtu     int
	rxDepth int
	gidIdx  int
	timeout time.Duration
	chk     bool
	events  bool
	sl      int
	// connection is RC, UC or UD (--connection): ibv_rc_pingpong,
	// ibv_uc_pingpong or ibv_ud_pingpong.
	connection string
	qpType     qp.QPType
	// srq runs ibv_srq_pingpong: numQP RC QPs sharing one SRQ.
	srq   bool
	numQP int
	// set records the flags given on the command line (defaults differ
	// between the programs).
	set map[string]bool
	js  jsonOut // --json
}

// pingpongPage is the page size rc_pingpong's --chk pattern steps by:
// sysconf(_SC_PAGESIZE) on the peer, 4096 on x86-64 Linux.
const pingpongPage = 4096

// udPingpongQKey is ibv_ud_pingpong's Q_Key, on its QP and in every work
// request.
const udPingpongQKey = 0x11111111

// pingpongQuiet is how long a run waits for a first packet from its peer
// after the address exchange before it says what to check.
const pingpongQuiet = 5 * time.Second

// srqPingpongQPs is ibv_srq_pingpong's default -q.
const srqPingpongQPs = 16

func (f *pingpongFlags) register(fs *flag.FlagSet) {
	f.netFlags.register(fs, "127.0.0.1")
	f.netFlags.registerExchange(fs)
	f.ccFlags.register(fs)
	fs.IntVar(&f.port, "p", 18515, "TCP `port` of the address exchange")
	fs.IntVar(&f.size, "s", 4096, "message `size` in bytes (--connection UD: default 1024, at most the port MTU, as ibv_ud_pingpong)")
	fs.IntVar(&f.iters, "n", 1000, "number of exchanges (--srq: in all, over every QP, as ibv_srq_pingpong counts them)")
	fs.IntVar(&f.mtu, "m", 1024, "path `MTU` (256, 512, 1024, 2048 or 4096); with --connection UD the port's active MTU, which bounds -s: by default derived from the --bind address's link MTU as rxe does (less 80 bytes of headers, rounded down)")
	fs.IntVar(&f.rxDepth, "r", 500, "receive queue depth (--srq: the SRQ's)")
	fs.IntVar(&f.gidIdx, "g", 1, "local GID index; roce-emu's GID table holds the --bind address at 0 and 1 (as ::ffff:a.b.c.d for IPv4)")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up when the run, the wait for a client included, takes longer than this (0: never; rc_pingpong waits for ever)")
	fs.BoolVar(&f.chk, "c", false, "validate the received buffer as the pingpong programs' --chk: the client zeroes the first byte of every 4096-byte page before it sends, the server checks those bytes at the end")
	fs.BoolVar(&f.events, "e", false, "accepted for compatibility: roce-emu sleeps until a completion arrives (as the pingpong programs' -e do) unless --busy-poll")
	fs.IntVar(&f.sl, "l", 0, "service `level` (0-15), accepted for compatibility: a RoCEv2 packet has no field for it (no LRH)")
	fs.StringVar(&f.connection, "connection", "RC", "queue pair `type`: RC (ibv_rc_pingpong), UC (ibv_uc_pingpong) or UD (ibv_ud_pingpong)")
	fs.BoolVar(&f.srq, "srq", false, "speak ibv_srq_pingpong: -q RC QPs that share one shared receive queue of -r receives")
	fs.IntVar(&f.numQP, "q", srqPingpongQPs, "with --srq, the number of QPs (1-255; ibv_srq_pingpong's -q)")
}

func (f *pingpongFlags) check() error {
	switch strings.ToUpper(f.connection) {
	case "RC":
		f.qpType = qp.IBV_QPT_RC
	case "UC":
		f.qpType = qp.IBV_QPT_UC
	case "UD":
		f.qpType = qp.IBV_QPT_UD
	default:
		return fmt.Errorf("--connection %q: want RC, UC or UD", f.connection)
	}
	if f.qpType == qp.IBV_QPT_UD && !f.set["s"] {
		f.size = 1024 // ud_pingpong's default
	}
	switch {
	case f.size < 0 || f.size > qp.MaxMessage:
		return fmt.Errorf("-s %d: size must be 0 to 2^31", f.size)
	case f.iters < 1:
		return fmt.Errorf("-n %d: need at least one iteration", f.iters)
	case f.rxDepth < 2 || f.rxDepth > 16384:
		return fmt.Errorf("-r %d: receive depth must be 2-16384", f.rxDepth)
	case f.gidIdx < 0 || f.gidIdx > 1:
		return fmt.Errorf("-g %d: roce-emu has GID indexes 0 and 1 (both the --bind address)", f.gidIdx)
	case f.port < 1 || f.port > 65535:
		return fmt.Errorf("-p %d: TCP port must be 1-65535", f.port)
	case f.sl < 0 || f.sl > 15:
		return fmt.Errorf("-l %d: a service level is 0-15", f.sl)
	case f.srq && f.qpType != qp.IBV_QPT_RC:
		return fmt.Errorf("--srq: ibv_srq_pingpong runs RC QPs; give it with --connection RC")
	case f.set["q"] && !f.srq:
		return fmt.Errorf("-q %d: the number of QPs is ibv_srq_pingpong's (add --srq)", f.numQP)
	case f.srq && (f.numQP < 1 || f.numQP >= oob.SRQPingpongMaxQP):
		return fmt.Errorf("-q %d: ibv_srq_pingpong runs 1 to %d QPs", f.numQP, oob.SRQPingpongMaxQP-1)
	case f.srq && f.numQP > f.rxDepth:
		return fmt.Errorf("-r %d is too small for %d QPs: the SRQ needs at least one receive per QP (as ibv_srq_pingpong says)", f.rxDepth, f.numQP)
	case f.srq && f.size < 1:
		return fmt.Errorf("-s %d: ibv_srq_pingpong sends at least 1 byte", f.size)
	}
	if _, err := mtuFlag(f.mtu); err != nil {
		return err
	}
	if err := f.netFlags.check(); err != nil {
		return err
	}
	return f.ccFlags.check()
}

// program names the rdma-core program a run speaks to.
func (f *pingpongFlags) program() string {
	switch {
	case f.srq:
		return "ibv_srq_pingpong"
	case f.qpType == qp.IBV_QPT_UC:
		return "ibv_uc_pingpong"
	case f.qpType == qp.IBV_QPT_UD:
		return "ibv_ud_pingpong"
	}
	return "ibv_rc_pingpong"
}

func runServer(args []string, stdout, stderr io.Writer) int {
	return runPingpong("server", args, stdout, stderr)
}

func runClient(args []string, stdout, stderr io.Writer) int {
	return runPingpong("client", args, stdout, stderr)
}

func runPingpong(mode string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f pingpongFlags
	f.register(fs)
	f.js.register(fs, "the results and counters")
	fs.Usage = func() {
		if mode == "server" {
			fmt.Fprintln(stderr, "usage: roce-emu server [flags]")
			fmt.Fprintln(stderr, "\nThe server side of rdma-core's pingpong programs: waits for a client on TCP port -p, exchanges")
		} else {
			fmt.Fprintln(stderr, "usage: roce-emu client [flags] HOST")
			fmt.Fprintln(stderr, "\nThe client side of rdma-core's pingpong programs: connects to HOST on TCP port -p, exchanges")
		}
		fmt.Fprintln(stderr, "QP numbers, PSNs and GIDs as they do, then ping-pongs -n SENDs of -s bytes. --connection RC, UC")
		fmt.Fprintln(stderr, "or UD speaks ibv_rc_pingpong, ibv_uc_pingpong or ibv_ud_pingpong; --srq (with -q QPs) ibv_srq_pingpong.")
		fmt.Fprintln(stderr, "Works against rdma-core's programs (run them with -g set to the GID of the address family --bind uses:")
		fmt.Fprintln(stderr, "on rxe, 1 for its IPv4 address; for IPv6 the index whose GID is its IPv6 address).")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	host := ""
	if mode == "client" {
		if fs.NArg() != 1 {
			fmt.Fprintln(stderr, "roce-emu client: give the server's host name or address")
			fs.Usage()
			return 2
		}
		host = fs.Arg(0)
	} else if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "roce-emu server: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := f.check(); err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", mode, err)
		return 2
	}
	f.progress = isTerminal(stdout) && isTerminal(stderr)
	if err := pingpong(mode, host, &f, f.js.text(stdout, stderr)); err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", mode, err)
		var intr *interruptedError
		if errors.As(err, &intr) {
			return intr.exitCode()
		}
		return 1
	}
	return 0
}

const (
	recvWRID = 1
	sendWRID = 2
)

// linkActiveMTU is the active MTU rxe gives a port on a link of MTU
// ifMTU (rxe_set_mtu with eth_mtu_int_to_enum: the link MTU less
// RXE_MAX_HDR_LENGTH, 80 bytes, rounded down to an IB MTU; 256 at least,
// 4096 at most).
func linkActiveMTU(ifMTU int) qp.MTU {
	m := qp.IBV_MTU_256
	for c := qp.IBV_MTU_4096; c > qp.IBV_MTU_256; c-- {
		if ifMTU-80 >= c.Bytes() {
			m = c
			break
		}
	}
	return m
}

// interfaceMTU returns the MTU of the interface that holds addr.
func interfaceMTU(addr netip.Addr) (int, bool) {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, false
	}
	addr = addr.Unmap().WithZone("")
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == addr {
					return ifc.MTU, true
				}
			}
		}
	}
	return 0, false
}

// pingpongRun is one side of a pingpong run: its QPs, their shared CQ and
// buffer, and where each QP sends.
type pingpongRun struct {
	f     *pingpongFlags
	ep    *transport.Endpoint
	buf   []byte
	off   int // where the message starts in buf: 40 for UD (the GRH slot)
	fill  byte
	mr    *qp.MR
	cq    *transport.CQ
	srq   *transport.SRQ
	qps   []*transport.QP
	local []oob.Dest
	// ahs and rqpns: UD, where each send goes.
	ahs   []*qp.AddressVector
	rqpns []uint32
	// peer is the address the exchange's TCP connection came from.
	peer netip.Addr
}

func pingpong(mode, host string, f *pingpongFlags, out io.Writer) (err error) {
	mtu, _ := mtuFlag(f.mtu)
	ctx, cancel := runContext(f.timeout)
	defer cancel()
	// A peer of another --connection: its first packet ends the run
	// with a hint, instead of a hang until --timeout.
	ctx, foreign := watchTransport(ctx, f)
	defer func() {
		if t, ok := foreign(); ok && err != nil {
			err = fmt.Errorf("%w; %s", err, connectionHint(f, t))
		}
	}()
	ep, closeAll, err := f.openEndpoint()
	if err != nil {
		return err
	}
	defer closeAll()
	if f.qpType == qp.IBV_QPT_UD {
		// ud_pingpong: "Requested size larger than port MTU".
		if !f.set["m"] {
			mtu = qp.IBV_MTU_1024
			if ifmtu, ok := interfaceMTU(ep.LocalAddr().Addr()); ok {
				mtu = linkActiveMTU(ifmtu)
			}
		}
		if f.size > mtu.Bytes() {
			return fmt.Errorf("requested size %d larger than the port MTU (%d): ibv_ud_pingpong sends one packet per message (-m sets the port MTU)", f.size, mtu.Bytes())
		}
		if err := ep.SetActiveMTU(mtu); err != nil {
			return err
		}
	}
	// SIGINT or SIGTERM end the run with the capture closed whole (the
	// deferred closeAll) and the counters printed; exit 128+signal.
	ctx, intr, stopSignals := withSignals(ctx)
	defer stopSignals()

	r := &pingpongRun{f: f, ep: ep, fill: 0x7b} // what rc/uc/ud_pingpong fill their buffer with
	defer func() {
		if sig := intr.caught(); sig != nil {
			fmt.Fprintf(f.stderr, "roce-emu %s: qp counters: %s\n", mode, describeCounters(r.counters()))
			err = &interruptedError{sig: sig, detail: "stopped", cause: err}
		}
	}()
	if f.srq {
		r.fill = 0 // srq_pingpong zeroes its buffer
	}
	if f.qpType == qp.IBV_QPT_UD {
		r.off = qp.GRHLen
	}
	if err := r.setup(mtu); err != nil {
		return err
	}
	for i, d := range r.local {
		if f.qpType == qp.IBV_QPT_UD {
			// ud_pingpong prints its own address with ": GID".
			fmt.Fprintf(out, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x: GID %s\n", d.LID, d.QPN, uint32(d.PSN), oob.GIDString(d.GID))
		} else {
			fmt.Fprintf(out, "  local address:  %s\n", r.local[i])
		}
	}
	bind, _ := netip.ParseAddr(f.bind)
	conn, err := pingpongConn(ctx, mode == "client", bind, host, f.port)
	if err != nil {
		return err
	}
	defer conn.Close()
	r.peer = oob.RemoteIP(conn)
	// The whole exchange within --exchange-timeout of the connection.
	xb := f.exchangeBound(conn.RemoteAddr().String())
	xctx, xcancel := xb.under(ctx)
	var remote []oob.Dest
	if f.srq {
		remote, err = r.exchangeSRQ(xctx, conn, mode == "client", mtu)
	} else {
		connect := func(d oob.Dest) error { return r.connect(0, d, mtu) }
		var d oob.Dest
		if mode == "client" {
			d, err = oob.PingpongClient(xctx, conn, r.local[0], connect)
		} else {
			d, err = oob.PingpongServer(xctx, conn, r.local[0], connect)
		}
		remote = []oob.Dest{d}
	}
	xcancel()
	if err != nil {
		if mode == "client" {
			// A server that refused our GID closed without its address.
			err = refusedHint(err, r.local[0].GID, oob.LocalIP(conn))
		}
		return fmt.Errorf("address exchange: %w", xb.explain(err))
	}
	for _, d := range remote {
		fmt.Fprintf(out, "  remote address: %s\n", d)
	}
	// No packet at all from the peer for a while after the exchange:
	// say what to check (the run goes on until --timeout).
	quiet := func() {
		if r.counters().ReceivedPackets == 0 {
			fmt.Fprintf(f.stderr, "roce-emu %s: no packet from the peer in %v since the address exchange: check that both sides run the same --connection (RC, UC or UD) and --srq (%s), and that UDP port %d reaches this host\n",
				mode, pingpongQuiet, f.program(), f.udpPort)
		}
	}
	defer watchDeadPath(ctx, f.stderr, r.qps...)()
	defer watchProgress(ctx, f.progress, f.stderr, r.qps...)()
	ctx, stopSilence := watchPeerSilence(ctx, f.stderr, mode, f.peerTimeout, r.qps...)
	defer stopSilence()
	defer func() { err = saidAbove(ctx, err) }()
	secs, err := r.loop(ctx, mode == "client", remote, quiet)
	if err != nil {
		return err
	}
	bytes := int64(f.size) * int64(f.iters) * 2
	fmt.Fprintf(out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, secs, float64(bytes)*8/secs/1e6)
	fmt.Fprintf(out, "%d iters in %.2f seconds = %.2f usec/iter\n", f.iters, secs, secs*1e6/float64(f.iters))
	// Read the buffer under the Endpoint's lock: a late packet (a peer's
	// retransmission) is handled, and may touch the buffer, only under it.
	ep.Locked(func() { r.checkData(mode, out) })
	ep.Flush() // the ACK held after the last completion is counted
	fmt.Fprintf(out, "counters: %s\n", describeCounters(r.counters()))
	fmt.Fprintf(out, "congestion (%s): %s\n", f.ccFlags.describe(f.qpType == qp.IBV_QPT_RC), sumCC(r.qps))
	fmt.Fprintf(out, "drops and refusals: %s\n", describeDrops(r.counters(), ep.Stats(), r.cq))
	if err := qpErrors(r.qps...); err != nil {
		return err
	}
	return emitPingpong(f, mode, bytes, secs, r.counters(), ep.Stats())
}

// setup makes the buffer, CQ, SRQ and QPs, moves the QPs to INIT and
// posts the receives, as the programs' pp_init_ctx and pp_post_recv.
func (r *pingpongRun) setup(mtu qp.MTU) error {
	f := r.f
	pd := r.ep.NewPD()
	r.buf = make([]byte, r.off+max(f.size, 1))
	for i := range r.buf {
		r.buf[i] = r.fill
	}
	var err error
	if r.mr, err = pd.RegMR(r.buf, qp.IBV_ACCESS_LOCAL_WRITE); err != nil {
		return err
	}
	nqp := 1
	if f.srq {
		nqp = f.numQP
		if r.srq, err = pd.NewSRQ(qp.SRQInitAttr{MaxWR: f.rxDepth}); err != nil {
			return err
		}
	}
	r.cq = r.ep.NewCQ(f.rxDepth + nqp)
	for range nqp {
		init := qp.InitAttr{QPType: f.qpType, MaxSendWR: 1, MaxRecvWR: f.rxDepth}
		f.ccFlags.apply(&init)
		if r.srq != nil {
			init.SRQ = r.srq.SRQ()
		}
		q, err := r.ep.NewQP(pd, r.cq, r.cq, init)
		if err != nil {
			return err
		}
		switch f.qpType {
		case qp.IBV_QPT_UD:
			err = q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, QKey: udPingpongQKey}, qp.IBV_QP_STATE|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT|qp.IBV_QP_QKEY)
		case qp.IBV_QPT_UC:
			// uc_pingpong and srq_pingpong allow no remote access.
			err = q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT)
		default:
			a := rcPingpongAttrs(mtu)
			err = q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: a.Access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT)
		}
		if err != nil {
			return err
		}
		r.qps = append(r.qps, q)
		r.local = append(r.local, oob.Dest{QPN: q.QPN(), PSN: randomPSN(), GID: r.ep.LocalAddr().Addr()})
	}
	r.ahs = make([]*qp.AddressVector, nqp)
	r.rqpns = make([]uint32, nqp)
	for range f.rxDepth {
		if err := r.postRecv(); err != nil {
			return err
		}
	}
	return nil
}

// postRecv posts one receive of the whole buffer (UD: the GRH slot and
// the message) to the SRQ or the QP.
func (r *pingpongRun) postRecv() error {
	wr := qp.RecvWR{WRID: recvWRID, SGEs: []qp.SGE{r.mr.SGE(0, r.off+r.f.size)}}
	if r.srq != nil {
		return r.srq.PostRecv(wr)
	}
	return r.qps[0].PostRecv(wr)
}

// postSend sends the message from QP i (UD: from after the GRH slot, to
// the peer's QPN with ud_pingpong's Q_Key).
func (r *pingpongRun) postSend(i int) error {
	wr := qp.SendWR{WRID: sendWRID, Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{r.mr.SGE(r.off, r.f.size)}}
	if r.f.qpType == qp.IBV_QPT_UD {
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = r.ahs[i], r.rqpns[i], udPingpongQKey
	}
	return r.qps[i].PostSend(wr)
}

// connect moves QP i to RTR and RTS towards d, as the program's
// pp_connect_ctx does for its QP type (UD: and makes the address handle).
func (r *pingpongRun) connect(i int, d oob.Dest, mtu qp.MTU) error {
	if !d.GID.IsValid() || d.GID.IsUnspecified() {
		// The programs send a zero GID without -g; on RoCE an address
		// (and so a GID) is needed.
		return fmt.Errorf("the peer sent no GID for QPN %#x: run %s with -g (on rxe, 1 for its IPv4 address)", d.QPN, r.f.program())
	}
	if err := r.f.checkPeerGID(d.GID, r.peer, d.QPN); err != nil {
		return err
	}
	q, local := r.qps[i], r.local[i]
	to := r.f.peer(netip.AddrPortFrom(gidAddr(d.GID, local.GID), uint16(r.f.udpPort)))
	switch r.f.qpType {
	case qp.IBV_QPT_UD:
		if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR}, qp.IBV_QP_STATE); err != nil {
			return err
		}
		if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: local.PSN}, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN); err != nil {
			return err
		}
		// ud_pingpong's address handle: hop limit 64.
		r.ahs[i], r.rqpns[i] = &qp.AddressVector{Remote: to, HopLimit: routeHopLimit}, d.QPN
		return nil
	case qp.IBV_QPT_UC:
		av := qp.AddressVector{Remote: to, HopLimit: routeHopLimit}
		if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: mtu, DestQPN: d.QPN, RQPSN: d.PSN, AV: av},
			qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN); err != nil {
			return fmt.Errorf("cannot move the UC QP to RTR towards %s QPN %#x: %w", to, d.QPN, err)
		}
		if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: local.PSN}, qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN); err != nil {
			return fmt.Errorf("cannot move the UC QP to RTS: %w", err)
		}
		return nil
	}
	return q.Connect(transport.Remote{Addr: to, QPN: d.QPN, PSN: d.PSN}, local.PSN, rcPingpongAttrs(mtu))
}

// exchangeSRQ runs srq_pingpong's exchange and connects QP i to the
// peer's entry i. Both sides must run as many QPs (srq_pingpong pairs
// them by index and does not check; a mismatch would hang it).
func (r *pingpongRun) exchangeSRQ(ctx context.Context, conn net.Conn, client bool, mtu qp.MTU) ([]oob.Dest, error) {
	connect := func(remote []oob.Dest) error {
		if len(remote) != len(r.qps) {
			return fmt.Errorf("the peer runs %d QPs and we run %d: give both sides the same -q", len(remote), len(r.qps))
		}
		for i, d := range remote {
			if err := r.connect(i, d, mtu); err != nil {
				return err
			}
		}
		return nil
	}
	if client {
		return oob.SRQPingpongClient(ctx, conn, r.local, connect)
	}
	return oob.SRQPingpongServer(ctx, conn, r.local, connect)
}

// loop is the programs' ping-pong: a QP sends when its last send
// completed and a message arrived on it; the client starts on every QP.
// Receives are reposted when fewer than the QP count (rc/uc/ud: 1) are
// left, and the run ends when -n sends and -n receives completed in all
// (srq_pingpong counts over its QPs). It returns the seconds taken.
//
// quiet is called once when no message came pingpongQuiet after the start.
func (r *pingpongRun) loop(ctx context.Context, client bool, remote []oob.Dest, quiet func()) (float64, error) {
	f := r.f
	index := make(map[uint32]int, len(r.qps))
	for i, q := range r.qps {
		index[q.QPN()] = i
	}
	start := time.Now()
	pending := make([]int, len(r.qps))
	if client {
		if f.chk {
			// --chk: buf[i] = i / page_size % sizeof(char), which is 0,
			// at the start of every page.
			for i := 0; i < f.size; i += pingpongPage {
				r.buf[r.off+i] = 0
			}
		}
		for i := range r.qps {
			if err := r.postSend(i); err != nil {
				return 0, err
			}
			pending[i] = recvWRID | sendWRID
		}
	} else {
		for i := range pending {
			pending[i] = recvWRID
		}
	}
	scnt, rcnt, routs := 0, 0, f.rxDepth
	wc := make([]qp.WC, f.rxDepth+len(r.qps))
	hinted := false
	for rcnt < f.iters || scnt < f.iters {
		wctx, wcancel := ctx, context.CancelFunc(nil)
		if !hinted && rcnt == 0 {
			// Until the first message, wait no longer than the quiet
			// time at once.
			wctx, wcancel = context.WithDeadline(ctx, start.Add(pingpongQuiet))
		}
		n, err := r.cq.Wait(wctx, wc)
		if wcancel != nil {
			wcancel()
			if err != nil && ctx.Err() == nil {
				hinted = true
				quiet()
				continue
			}
		}
		if err != nil {
			return 0, fmt.Errorf("after %d sends and %d receives: %v (QP %s; %s; drops and refusals: %s)", scnt, rcnt, whyStopped(ctx, err), qpStateWhy(r.qps[0]), describeCounters(r.counters()), describeDrops(r.counters(), r.ep.Stats(), r.cq))
		}
		for _, c := range wc[:n] {
			if c.Status != qp.IBV_WC_SUCCESS {
				return 0, fmt.Errorf("work completion %s for wr_id %d after %d sends and %d receives (QP %s; %s; drops and refusals: %s)", c.Status, c.WRID, scnt, rcnt,
					qpStateWhy(r.qps[0]), describeCounters(r.counters()), describeDrops(r.counters(), r.ep.Stats(), r.cq))
			}
			i, ok := index[c.QPNum]
			if !ok {
				return 0, fmt.Errorf("a completion for QPN %#06x, not one of ours", c.QPNum)
			}
			switch c.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if f.qpType == qp.IBV_QPT_UD && (c.SrcQP != remote[i].QPN || c.SrcAddr.Addr().Unmap().WithZone("") != remote[i].GID.Unmap()) {
					return 0, fmt.Errorf("a datagram from QPN %#06x at %s, not from the peer's QPN %#06x at %s", c.SrcQP, c.SrcAddr.Addr(), remote[i].QPN, remote[i].GID)
				}
				routs--
				if routs <= len(r.qps) {
					for routs < f.rxDepth {
						if err := r.postRecv(); err != nil {
							return 0, err
						}
						routs++
					}
				}
				rcnt++
			default:
				return 0, fmt.Errorf("a completion for unknown wr_id %d", c.WRID)
			}
			pending[i] &^= int(c.WRID)
			if scnt < f.iters && pending[i] == 0 {
				if err := r.postSend(i); err != nil {
					return 0, err
				}
				pending[i] = recvWRID | sendWRID
			}
		}
	}
	return time.Since(start).Seconds(), nil
}

// checkData looks at what arrived last. rc/uc/ud_pingpong fill their
// buffer with 0x7b, srq_pingpong with 0; a client run with --chk zeroes
// the first byte of each page. Both sides send the buffer they receive
// into, so either pattern is what must come back.
func (r *pingpongRun) checkData(mode string, out io.Writer) {
	f := r.f
	msg := r.buf[r.off : r.off+f.size]
	mism := 0
	for i, b := range msg {
		if b != r.fill && !(i%pingpongPage == 0 && b == 0) {
			mism++
		}
	}
	if mism > 0 {
		fmt.Fprintf(out, "warning: %d received bytes are neither %s's fill byte %#02x nor its --chk page marks\n", mism, f.program(), r.fill)
	}
	if f.chk && mode == "server" {
		// As the programs' server checks with --chk, and in their words.
		for i := 0; i < f.size; i += pingpongPage {
			if msg[i] != 0 {
				fmt.Fprintf(out, "invalid data in page %d\n", i/pingpongPage)
			}
		}
	}
}

// counters sums the counters of the run's QPs.
func (r *pingpongRun) counters() qp.Counters {
	cs := make([]qp.Counters, len(r.qps))
	for i, q := range r.qps {
		cs[i] = q.Counters()
	}
	return sumCounters(cs...)
}

// pingpongConn connects to the server's address exchange from bind
// (client; dialExchange), or waits for one client on TCP port (server).
func pingpongConn(ctx context.Context, client bool, bind netip.Addr, host string, port int) (net.Conn, error) {
	if client {
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		c, err := dialExchange(ctx, bind, host, port)
		if err != nil {
			return nil, fmt.Errorf("cannot reach the server's address exchange at %s: %v", addr, err)
		}
		return c, nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, addrInUseHint(fmt.Errorf("cannot listen for the address exchange on TCP port %d: %w", port, err), tcpInUse)
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	c, err := l.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no client connected to TCP port %d: %v", port, whyStopped(ctx, err))
		}
		return nil, fmt.Errorf("waiting for a client on TCP port %d: %v", port, err)
	}
	return c, nil
}

// watchTransport makes f's Endpoint watch for packets of another transport
// service than its --connection (a UD SEND Only to an RC run, an RC SEND
// to a UC run...): the address exchange of the pingpong programs carries
// no QP type, so a peer started with another --connection exchanges
// addresses fine and then sends what this side's QPs drop (counted as
// opcode errors). The first such packet ends ctx; foreign then says which
// service the peer speaks. QP1 (CM MADs, UD) and CNPs do not count.
func watchTransport(parent context.Context, f *pingpongFlags) (ctx context.Context, foreign func() (bth.Transport, bool)) {
	want := map[qp.QPType]bth.Transport{qp.IBV_QPT_RC: bth.TransportRC, qp.IBV_QPT_UC: bth.TransportUC, qp.IBV_QPT_UD: bth.TransportUD}[f.qpType]
	ctx, cancel := context.WithCancel(parent)
	var seen atomic.Int32 // the foreign transport + 1
	f.observe = func(e *transport.Event) {
		if e.Dir != transport.In || e.Packet == nil || e.Packet.BTH.DestQP == 1 {
			return
		}
		switch t := e.Packet.BTH.Opcode.Transport(); t {
		case bth.TransportRC, bth.TransportUC, bth.TransportUD:
			if t != want && seen.CompareAndSwap(0, int32(t)+1) {
				cancel()
			}
		}
	}
	return ctx, func() (bth.Transport, bool) {
		v := seen.Load()
		return bth.Transport(v - 1), v != 0
	}
}

// connectionHint says what to do when the peer speaks transport service t.
func connectionHint(f *pingpongFlags, t bth.Transport) string {
	peer := map[bth.Transport]string{bth.TransportRC: "ibv_rc_pingpong or ibv_srq_pingpong", bth.TransportUC: "ibv_uc_pingpong",
		bth.TransportUD: "ibv_ud_pingpong"}[t]
	return fmt.Sprintf("the peer sends %s packets but this side runs %s (%s): the peer runs %s; start both sides with the same --connection (here --connection %s)",
		t, f.qpType, f.program(), peer, t)
}
