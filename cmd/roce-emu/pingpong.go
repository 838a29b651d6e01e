package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

type pingpongFlags struct {
	netFlags
	port    int
	size    int
	iters   int
	mtu     int
	rxDepth int
	gidIdx  int
	timeout time.Duration
	chk     bool
	events  bool
}

// pingpongPage is the page size rc_pingpong's --chk pattern steps by:
// sysconf(_SC_PAGESIZE) on the peer, 4096 on x86-64 Linux.
const pingpongPage = 4096

func (f *pingpongFlags) register(fs *flag.FlagSet) {
	f.netFlags.register(fs, "127.0.0.1")
	fs.IntVar(&f.port, "p", 18515, "TCP `port` of the address exchange")
	fs.IntVar(&f.size, "s", 4096, "message `size` in bytes")
	fs.IntVar(&f.iters, "n", 1000, "number of exchanges")
	fs.IntVar(&f.mtu, "m", 1024, "path `MTU` (256, 512, 1024, 2048 or 4096)")
	fs.IntVar(&f.rxDepth, "r", 500, "receive queue depth")
	fs.IntVar(&f.gidIdx, "g", 1, "local GID index; roce-emu's GID table holds the --bind address at 0 and 1 (as ::ffff:a.b.c.d for IPv4)")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "give up when the run takes longer than this")
	fs.BoolVar(&f.chk, "c", false, "validate the received buffer as rc_pingpong --chk: the client zeroes the first byte of every 4096-byte page before it sends, the server checks those bytes at the end")
	fs.BoolVar(&f.events, "e", false, "accepted for rc_pingpong compatibility: roce-emu always sleeps until a completion arrives (as rc_pingpong -e does), it never busy-polls")
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
		fmt.Fprintln(stderr, "Works against rdma-core's ibv_rc_pingpong (run it with -g set to the GID of the address family --bind uses:")
		fmt.Fprintln(stderr, "on rxe, 1 for its IPv4 address; for IPv6 the index whose GID is its IPv6 address).")
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
	local := oob.Dest{QPN: q.QPN(), PSN: randomPSN(), GID: ep.LocalAddr().Addr()}
	fmt.Fprintf(out, "  local address:  %s\n", local)

	connect := func(r oob.Dest) error {
		return q.Connect(transport.Remote{Addr: netip.AddrPortFrom(gidAddr(r.GID, local.GID), uint16(f.udpPort)), QPN: r.QPN, PSN: r.PSN},
			local.PSN, a)
	}
	conn, err := pingpongConn(ctx, mode == "client", host, f.port)
	if err != nil {
		return err
	}
	defer conn.Close()
	var remote oob.Dest
	if mode == "client" {
		remote, err = oob.PingpongClient(ctx, conn, local, connect)
	} else {
		remote, err = oob.PingpongServer(ctx, conn, local, connect)
	}
	if err != nil {
		return fmt.Errorf("address exchange: %w", err)
	}
	fmt.Fprintf(out, "  remote address: %s\n", remote)

	// The ping-pong loop of rc_pingpong: a side sends when its last send
	// completed and a message arrived; the client starts.
	start := time.Now()
	send := qp.SendWR{WRID: sendWRID, Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{mr.SGE(0, f.size)}}
	scnt, rcnt, routs := 0, 0, f.rxDepth
	pending := recvWRID
	if mode == "client" {
		if f.chk {
			// rc_pingpong --chk: buf[i] = i / page_size % sizeof(char),
			// which is 0, at the start of every page.
			for i := 0; i < f.size; i += pingpongPage {
				buf[i] = 0
			}
		}
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
	// rc_pingpong fills its buffer with 0x7b; a client run with --chk
	// zeroes the first byte of each page. Both sides send the buffer they
	// receive into, so either pattern is what must come back.
	mism := 0
	for i, b := range buf[:f.size] {
		if b != 0x7b && !(i%pingpongPage == 0 && b == 0) {
			mism++
		}
	}
	if mism > 0 {
		fmt.Fprintf(out, "warning: %d received bytes are neither rc_pingpong's fill byte 0x7b nor its --chk page marks\n", mism)
	}
	if f.chk && mode == "server" {
		// As rc_pingpong's server checks with --chk, and in its words.
		for i := 0; i < f.size; i += pingpongPage {
			if buf[i] != 0 {
				fmt.Fprintf(out, "invalid data in page %d\n", i/pingpongPage)
			}
		}
	}
	fmt.Fprintf(out, "counters: %s\n", describeCounters(q.Counters()))
	return nil
}

// pingpongConn connects to the server's address exchange (client), or
// waits for one client on TCP port (server).
func pingpongConn(ctx context.Context, client bool, host string, port int) (net.Conn, error) {
	if client {
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("cannot reach the server's address exchange at %s: %v", addr, err)
		}
		return c, nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("cannot listen for the address exchange on TCP port %d: %v", port, err)
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	c, err := l.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no client connected to TCP port %d within --timeout", port)
		}
		return nil, fmt.Errorf("waiting for a client on TCP port %d: %v", port, err)
	}
	return c, nil
}
