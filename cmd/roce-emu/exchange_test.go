package main

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/roce-emu/roce-emu/transport"
)

// A peer that connects to a perftest server's exchange and sends nothing
// is let go after --exchange-timeout: the server says who stalled and in
// which step, and exits 1 as it does for a refused GID (it held the
// server until --timeout, 20 s here, before).
func TestPerftestServerSilentPeer(t *testing.T) {
	c, wait := startPerftestServer(t, "bw", "--exchange-timeout", "300ms")
	defer c.Close()
	code, out := wait()
	assert.Equal(t, 1, code, out)
	assert.Regexp(t, `roce-emu bw: the exchange with 127\.0\.0\.1:\d+ stalled: no complete message within --exchange-timeout 300ms: .*version`, out)
	assert.NotContains(t, out, "context deadline exceeded", "the stall says it once")
	assert.NotContains(t, out, "--timeout expired")
}

// A peer that dribbles its messages a byte at a time, each byte well
// within the timeout, is let go too: the bound is on the whole set-up,
// not on the gap between bytes.
func TestPerftestServerDribblingPeer(t *testing.T) {
	c, wait := startPerftestServer(t, "bw", "--exchange-timeout", "500ms")
	defer c.Close()
	stop := make(chan struct{})
	go func() {
		msg := append([]byte("6.06"), make([]byte, 12+8+2)...) // version, system data, MTU
		for _, b := range msg {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
		}
	}()
	code, out := wait()
	close(stop)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "stalled: no complete message within --exchange-timeout 500ms")
	assert.NotContains(t, out, "--timeout expired")
}

// rc_pingpong's server: the same bound on its address exchange.
func TestPingpongServerSilentPeer(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	out := &lockedBuffer{}
	done := make(chan int)
	go func() {
		done <- run([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-n", "1", "--timeout", "20s", "--exchange-timeout", "300ms"}, out, out)
	}()
	c := dialRetry(t, "127.0.0.1:"+tcp)
	defer c.Close()
	code := <-done
	assert.Equal(t, 1, code, out.String())
	assert.Regexp(t, `roce-emu server: address exchange: the exchange with 127\.0\.0\.1:\d+ stalled: no complete message within --exchange-timeout 300ms`, out.String())
}

// A client that ends a server's QP in ERR with a NAK and leaves before
// the results exchange: the server still says why its QP went to ERR
// (it said only that the barrier found the connection closed).
func TestPerftestServerQPErrPeerLeft(t *testing.T) {
	r := startQPErrRun(t)
	r.c.Close()
	code, out := r.wait()
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "results: size (8 bytes): the peer closed the connection")
	assert.Contains(t, out, "QP 0x11 ended in IBV_QPS_ERR: qp: the responder refused the request at PSN 0x001234 with NAK_REMOTE_ACCESS")
}

// The same client staying connected and silent: the mismatch watcher
// ends the run (the peer's WRITE went beyond the region), and the QP's
// error is told too.
func TestPerftestServerQPErrPeerSilent(t *testing.T) {
	r := startQPErrRun(t)
	defer r.c.Close()
	code, out := r.wait()
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "results: size (8 bytes)")
	assert.Contains(t, out, "QP 0x11 ended in IBV_QPS_ERR: qp: the responder refused the request at PSN 0x001234 with NAK_REMOTE_ACCESS")
	assert.NotContains(t, out, "--timeout expired")
}

// A client that goes through the set-up and then sends nothing, neither
// RoCE nor the results: the step that waits on the traffic is bounded by
// --exchange-timeout from the step's start and the peer's last packet.
func TestPerftestServerSilentAfterSetup(t *testing.T) {
	r := startPlayedClient(t, false, "--exchange-timeout", "300ms")
	defer r.c.Close()
	code, out := r.wait()
	assert.Equal(t, 1, code, out)
	assert.Regexp(t, `the exchange with 127\.0\.0\.1:\d+ stalled: no complete message within --exchange-timeout 300ms \(nor any RoCE packet from it\): perftest exchange: results: size \(8 bytes\)`, out)
	assert.NotContains(t, out, "context canceled", "the stall says it once")
	assert.NotContains(t, out, "--timeout expired")
}

// dialRetry connects to addr, retrying while the command starts.
func dialRetry(t *testing.T, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	for range 200 {
		if c, err = net.Dial("tcp", addr); err == nil {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, err)
	return nil
}

// fakeServer listens on 127.0.0.9 and hands the first connection to
// serve; it returns the port.
func fakeServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.9:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		serve(c)
	}()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// Clients dial the exchange from --bind: a server on 127.0.0.9 sees a
// client run with --bind 127.0.0.10 come from 127.0.0.10, the address of
// the GID it announces (the kernel chose 127.0.0.1 before, and a server
// on a host with several non-loopback addresses refused such a client).
func TestClientsDialExchangeFromBind(t *testing.T) {
	for _, cmd := range []string{"bw", "client"} {
		t.Run(cmd, func(t *testing.T) {
			from := make(chan netip.Addr, 1)
			port := fakeServer(t, func(c net.Conn) { from <- oob.RemoteIP(c) })
			out := &lockedBuffer{}
			code := run([]string{cmd, "--bind", "127.0.0.10", "--udp-port", freeUDPPort(t), "-p", port, "--timeout", "10s", "127.0.0.9"}, out, out)
			assert.Equal(t, 1, code, out.String())
			select {
			case a := <-from:
				assert.Equal(t, netip.MustParseAddr("127.0.0.10"), a)
			default:
				t.Fatalf("the client never connected: %s", out.String())
			}
		})
	}
}

// A server that closes the exchange after the client's address (what a
// roce-emu server does when its GID check refuses the client): the
// client says that this is the likely cause and names the flag, instead
// of a bare EOF.
func TestClientToldOfGIDRefusal(t *testing.T) {
	t.Run("bw", func(t *testing.T) {
		port := fakeServer(t, func(c net.Conn) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s := oob.NewPerftestServer(c)
			if _, err := s.Versions(ctx); err != nil {
				return
			}
			if _, err := s.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine}); err != nil {
				return
			}
			if _, err := s.MTU(ctx, qp.IBV_MTU_1024); err != nil {
				return
			}
			s.Keys(ctx, []oob.PerftestKey{{OutReads: 1, QPN: 0x11, PSN: 1, GID: netip.MustParseAddr("127.0.0.9"), RKey: 1, VA: 0x1000}})
		})
		out := &lockedBuffer{}
		code := run([]string{"bw", "--bind", "127.0.0.10", "--udp-port", freeUDPPort(t), "-p", port, "--timeout", "10s", "127.0.0.9"}, out, out)
		assert.Equal(t, 1, code, out.String())
		// The client dials from --bind, the GID it announces: a GID check
		// cannot be the cause, and the client does not claim it.
		assert.Contains(t, out.String(), "the server closed the exchange after our address (127.0.0.10): its own output says why")
		assert.NotContains(t, out.String(), "likely refused the GID")
	})
	t.Run("client", func(t *testing.T) {
		port := fakeServer(t, func(c net.Conn) {
			b := make([]byte, 52)
			c.Read(b)
		})
		out := &lockedBuffer{}
		code := run([]string{"client", "--bind", "127.0.0.10", "--udp-port", freeUDPPort(t), "-p", port, "--timeout", "10s", "127.0.0.9"}, out, out)
		assert.Equal(t, 1, code, out.String())
		assert.Contains(t, out.String(), "the server closed the exchange after our address (127.0.0.10): its own output says why")
		assert.NotContains(t, out.String(), "likely refused the GID")
	})
}

// refusedHint names the GID check only where it can be the cause: an
// announced GID other than the exchange connection's own address, of the
// same IP version (a server refuses another version for that reason).
func TestRefusedHint(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	eof := io.EOF
	err := refusedHint(eof, a("127.0.0.10"), a("127.0.0.1"))
	assert.ErrorIs(t, err, io.EOF)
	assert.Contains(t, err.Error(), "it likely refused the GID we announced (127.0.0.10) as not the address our exchange connection came from (127.0.0.1)")
	assert.Contains(t, err.Error(), "--allow-gid-mismatch")
	for _, c := range [][2]string{{"127.0.0.10", "127.0.0.10"}, {"::ffff:127.0.0.10", "127.0.0.10"}, {"fd00::1", "127.0.0.1"}} {
		err := refusedHint(eof, a(c[0]), a(c[1]))
		assert.ErrorIs(t, err, io.EOF)
		assert.Contains(t, err.Error(), "the server closed the exchange after our address ("+c[0]+"): its own output says why", "%v", c)
		assert.NotContains(t, err.Error(), "GID we announced", "%v", c)
	}
	assert.Equal(t, context.Canceled, refusedHint(context.Canceled, a("127.0.0.10"), a("127.0.0.1")), "not a closed connection")
}

// The same bound on the exchange over rdma_cm (-R): a peer that connects
// the exchange's QP and sends nothing on it is let go.
func TestPerftestCMServerSilentPeer(t *testing.T) {
	port, udp := freeTCPPort(t), freeUDPPort(t)
	out := &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"bw", "-R", "--bind", "127.0.0.2", "--udp-port", udp, "-p", port, "--timeout", "20s", "--exchange-timeout", "300ms"}, out, out)
	}()
	for i := 0; i < 500 && !strings.Contains(out.String(), "Waiting for client"); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	uport, err := strconv.Atoi(udp)
	require.NoError(t, err)
	pport, err := strconv.Atoi(port)
	require.NoError(t, err)
	conn, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(uport)), transport.UDPOptions{})
	require.NoError(t, err)
	ep := transport.NewEndpoint(conn, transport.Options{})
	defer ep.Close()
	svc, err := rdmacm.New(ep, rdmacm.Config{UDPPort: uint16(uport)})
	require.NoError(t, err)
	defer svc.Close()
	cq := ep.NewCQ(8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := svc.Dial(ctx, netip.MustParseAddr("127.0.0.2"), uint16(pport), rdmacm.ConnParams{PD: ep.NewPD(), SendCQ: cq, RecvCQ: cq,
		MaxSendWR: 2, MaxRecvWR: 2, RetryCount: 7, RNRRetryCount: 7})
	require.NoError(t, err, out.String())
	defer c.Close()
	code := <-done // --timeout 20s ends it at the latest, with another message
	assert.Equal(t, 1, code, out.String())
	assert.Contains(t, out.String(), "roce-emu bw: the exchange with 127.0.0.1 (rdma_cm) stalled: no complete message within --exchange-timeout 300ms: ")
	assert.Contains(t, out.String(), "version")
	assert.NotContains(t, out.String(), "--timeout expired")
}
