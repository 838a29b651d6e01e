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
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// The ibv_rc_pingpong out-of-band exchange (rdma-core
// libibverbs/examples/rc_pingpong.c; ROCEV2.md section 6): TCP port 18515,
// one 52-byte message each way, "LLLL:QQQQQQ:PPPPPP:GGGG...G" plus NUL,
// then "done" from the client.
const pingpongMsgLen = 52

func formatPingpongMsg(p peer) []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", p.LID, p.QPN, uint32(p.PSN), gidHex(p.GID))
	b := make([]byte, pingpongMsgLen)
	copy(b, s)
	return b
}

func parsePingpongMsg(b []byte) (peer, error) {
	s := strings.TrimRight(string(b), "\x00")
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[0]) != 4 || len(parts[1]) != 6 || len(parts[2]) != 6 || len(parts[3]) != 32 {
		return peer{}, fmt.Errorf("not an ibv_rc_pingpong address message: %q", s)
	}
	lid, err1 := strconv.ParseUint(parts[0], 16, 16)
	qpn, err2 := strconv.ParseUint(parts[1], 16, 32)
	psn, err3 := strconv.ParseUint(parts[2], 16, 32)
	gid, err4 := parseGIDHex(parts[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return peer{}, fmt.Errorf("bad ibv_rc_pingpong address message %q: %v", s, err)
	}
	return peer{LID: uint16(lid), QPN: uint32(qpn), PSN: qpPSN(psn), GID: gid}, nil
}

type pingpongFlags struct {
	netFlags
	port    int
	size    int
	iters   int
	mtu     int
	rxDepth int
	gidIdx  int
	timeout time.Duration
}

func (f *pingpongFlags) register(fs *flag.FlagSet) {
	f.netFlags.register(fs, "127.0.0.1")
	fs.IntVar(&f.port, "p", 18515, "TCP `port` of the address exchange")
	fs.IntVar(&f.size, "s", 4096, "message `size` in bytes")
	fs.IntVar(&f.iters, "n", 1000, "number of exchanges")
	fs.IntVar(&f.mtu, "m", 1024, "path `MTU` (256, 512, 1024, 2048 or 4096)")
	fs.IntVar(&f.rxDepth, "r", 500, "receive queue depth")
	fs.IntVar(&f.gidIdx, "g", 1, "local GID index; roce-emu's GID table holds the --bind address at 0 and 1 (as ::ffff:a.b.c.d for IPv4)")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "give up when the run takes longer than this")
}

func (f *pingpongFlags) check() error {
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
	}
	if _, err := mtuFlag(f.mtu); err != nil {
		return err
	}
	return f.netFlags.check()
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
	fs.Usage = func() {
		if mode == "server" {
			fmt.Fprintln(stderr, "usage: roce-emu server [flags]")
			fmt.Fprintln(stderr, "\nThe server side of ibv_rc_pingpong: waits for a client on TCP port -p, exchanges")
		} else {
			fmt.Fprintln(stderr, "usage: roce-emu client [flags] HOST")
			fmt.Fprintln(stderr, "\nThe client side of ibv_rc_pingpong: connects to HOST on TCP port -p, exchanges")
		}
		fmt.Fprintln(stderr, "QP numbers, PSNs and GIDs as rc_pingpong does, then ping-pongs -n RC SENDs of -s bytes.")
		fmt.Fprintln(stderr, "Works against rdma-core's ibv_rc_pingpong (run it with -g set to an IPv4 GID).")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
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
	if err := pingpong(mode, host, &f, stdout); err != nil {
		fmt.Fprintf(stderr, "roce-emu %s: %v\n", mode, err)
		return 1
	}
	return 0
}

const (
	recvWRID = 1
	sendWRID = 2
)

func pingpong(mode, host string, f *pingpongFlags, out io.Writer) error {
	mtu, _ := mtuFlag(f.mtu)
	ep, closeAll, err := f.openEndpoint()
	if err != nil {
		return err
	}
	defer closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()

	pd := ep.NewPD()
	buf := make([]byte, max(f.size, 1))
	for i := range buf {
		buf[i] = 0x7b // what rc_pingpong fills its buffer with
	}
	mr, err := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return err
	}
	cq := ep.NewCQ(f.rxDepth + 1)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 1, MaxRecvWR: f.rxDepth})
	if err != nil {
		return err
	}
	a := rcPingpongAttrs(mtu)
	if err := q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: a.Access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS|qp.IBV_QP_PKEY_INDEX|qp.IBV_QP_PORT); err != nil {
		return err
	}
	recv := qp.RecvWR{WRID: recvWRID, SGEs: []qp.SGE{mr.SGE(0, f.size)}}
	for range f.rxDepth {
		if err := q.PostRecv(recv); err != nil {
			return err
		}
	}
	local := peer{QPN: q.QPN(), PSN: randomPSN(), GID: ep.LocalAddr().Addr()}
	fmt.Fprintf(out, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", local.LID, local.QPN, uint32(local.PSN), gidString(local.GID))

	var remote peer
	connect := func(r peer) error {
		remote = r
		return q.Connect(remoteOf(r, uint16(f.udpPort)), local.PSN, a)
	}
	if mode == "client" {
		err = clientExchange(ctx, net.JoinHostPort(host, strconv.Itoa(f.port)), local, connect)
	} else {
		err = serverExchange(ctx, f.port, local, connect)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", remote.LID, remote.QPN, uint32(remote.PSN), gidString(remote.GID))

	// The ping-pong loop of rc_pingpong: a side sends when its last send
	// completed and a message arrived; the client starts.
	start := time.Now()
	send := qp.SendWR{WRID: sendWRID, Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{mr.SGE(0, f.size)}}
	scnt, rcnt, routs := 0, 0, f.rxDepth
	pending := recvWRID
	if mode == "client" {
		if err := q.PostSend(send); err != nil {
			return err
		}
		pending |= sendWRID
	}
	wc := make([]qp.WC, 2)
	for rcnt < f.iters || scnt < f.iters {
		n, err := cq.Wait(ctx, wc)
		if err != nil {
			return fmt.Errorf("after %d sends and %d receives: %v (QP %s; %s)", scnt, rcnt, err, q.State(), describeCounters(q.Counters()))
		}
		for _, c := range wc[:n] {
			if c.Status != qp.IBV_WC_SUCCESS {
				return fmt.Errorf("work completion %s for wr_id %d after %d sends and %d receives (%s)", c.Status, c.WRID, scnt, rcnt, describeCounters(q.Counters()))
			}
			switch c.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				routs--
				if routs <= 1 {
					for routs < f.rxDepth {
						if err := q.PostRecv(recv); err != nil {
							return err
						}
						routs++
					}
				}
				rcnt++
			}
			pending &^= int(c.WRID)
			if scnt < f.iters && pending == 0 {
				if err := q.PostSend(send); err != nil {
					return err
				}
				pending = recvWRID | sendWRID
			}
		}
	}
	secs := time.Since(start).Seconds()
	bytes := int64(f.size) * int64(f.iters) * 2
	fmt.Fprintf(out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, secs, float64(bytes)*8/secs/1e6)
	fmt.Fprintf(out, "%d iters in %.2f seconds = %.2f usec/iter\n", f.iters, secs, secs*1e6/float64(f.iters))
	ep.Sync()
	mism := 0
	for _, b := range buf[:f.size] {
		if b != 0x7b {
			mism++
		}
	}
	if mism > 0 {
		fmt.Fprintf(out, "warning: %d received bytes are not rc_pingpong's fill byte 0x7b\n", mism)
	}
	fmt.Fprintf(out, "counters: %s\n", describeCounters(q.Counters()))
	return nil
}

func qpPSN(v uint64) bth.PSN { return bth.PSN(v & bth.PSNMask) }

// gidString prints a GID as inet_ntop(AF_INET6) does, as rc_pingpong does.
func gidString(a netip.Addr) string {
	g := gidOf(a)
	return netip.AddrFrom16(g).String()
}

// clientExchange is pp_client_exch_dest: send ours, read theirs, connect,
// say "done".
func clientExchange(ctx context.Context, addr string, local peer, connect func(peer) error) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot reach the server's address exchange at %s: %v", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(formatPingpongMsg(local)); err != nil {
		return fmt.Errorf("address exchange: %v", err)
	}
	msg := make([]byte, pingpongMsgLen)
	if _, err := io.ReadFull(c, msg); err != nil {
		return fmt.Errorf("address exchange: reading the server's address: %v", err)
	}
	remote, err := parsePingpongMsg(msg)
	if err != nil {
		return err
	}
	if err := connect(remote); err != nil {
		return err
	}
	if _, err := c.Write([]byte("done\x00")); err != nil {
		return fmt.Errorf("address exchange: %v", err)
	}
	return nil
}

// serverExchange is pp_server_exch_dest: read theirs, connect, send ours,
// wait for "done".
func serverExchange(ctx context.Context, port int, local peer, connect func(peer) error) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("cannot listen for the address exchange on TCP port %d: %v", port, err)
	}
	defer l.Close()
	go func() { <-ctx.Done(); l.Close() }()
	c, err := l.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("no client connected to TCP port %d within --timeout", port)
		}
		return fmt.Errorf("waiting for a client on TCP port %d: %v", port, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	msg := make([]byte, pingpongMsgLen)
	if _, err := io.ReadFull(c, msg); err != nil {
		return fmt.Errorf("address exchange: reading the client's address: %v", err)
	}
	remote, err := parsePingpongMsg(msg)
	if err != nil {
		return err
	}
	if err := connect(remote); err != nil {
		return err
	}
	if _, err := c.Write(formatPingpongMsg(local)); err != nil {
		return fmt.Errorf("address exchange: %v", err)
	}
	done := make([]byte, 5)
	if _, err := io.ReadFull(c, done); err != nil || string(done) != "done\x00" {
		return fmt.Errorf("address exchange: the client did not say done (%q, %v)", done, err)
	}
	return nil
}
