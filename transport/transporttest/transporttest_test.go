package transporttest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
)

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ byte(i>>8)
	}
	return b
}

// A WRITE's bytes land in the target's buffer, and only the writer gets a
// completion.
func TestWriteLands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{})
		src := p.A.Reg(pattern(5000))
		dst := p.B.Reg(make([]byte, 5000))
		p.A.PostWrite(7, src, dst)
		wc := p.A.WaitOK(1)[0]
		if wc.WRID != 7 || wc.Opcode != qp.IBV_WC_RDMA_WRITE || wc.ByteLen != 5000 {
			t.Errorf("writer's completion %+v, want WRID 7, RDMA_WRITE, 5000 bytes", wc)
		}
		p.B.Endpoint.Sync()
		if !bytes.Equal(dst.Buf, src.Buf) {
			t.Errorf("target buffer differs from the source")
		}
		if n := p.B.CQ.Poll(make([]qp.WC, 1)); n != 0 {
			t.Errorf("the target got %d completions for a WRITE without immediate", n)
		}
		// Path MTU 1024 by default: 5000 bytes are five packets.
		if got := p.A.QP.Counters().SentPackets; got != 5 {
			t.Errorf("writer sent %d packets, want 5", got)
		}
	})
}

// SEND and READ over IPv6, at path MTU 4096, with PSNs that wrap.
func TestSendReadIPv6(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{IPv6: true, PSN: [2]bth.PSN{0xFFFFFE, 5},
			Connect: transport.ConnectAttr{PathMTU: qp.IBV_MTU_4096}})
		if a := p.A.Endpoint.LocalAddr(); a != transporttest.DefaultAddrs6[0] {
			t.Fatalf("side A is at %s, want %s", a, transporttest.DefaultAddrs6[0])
		}
		if got := p.B.QP.Attr().RQPSN; got != 0xFFFFFE {
			t.Errorf("B expects PSN %v from A, want 0xFFFFFE", got)
		}
		if got := p.A.QP.Attr().PathMTU; got != qp.IBV_MTU_4096 {
			t.Errorf("path MTU %v, want 4096", got)
		}
		msg := p.A.Reg(pattern(10000))
		inbox := p.B.Reg(make([]byte, 10000))
		p.B.PostRecv(1, inbox)
		p.A.PostSend(2, msg)
		if wc := p.B.WaitOK(1)[0]; wc.Opcode != qp.IBV_WC_RECV || wc.ByteLen != 10000 {
			t.Errorf("receive completion %+v", wc)
		}
		p.A.WaitOK(1)
		if !bytes.Equal(inbox.Buf, msg.Buf) {
			t.Errorf("received bytes differ")
		}
		// Three packets at MTU 4096, from PSN 0xFFFFFE across the wrap.
		if got := p.A.QP.Counters().SentPackets; got != 3 {
			t.Errorf("sender sent %d packets, want 3", got)
		}

		exposed := p.B.Reg([]byte("read from B's memory"))
		into := p.A.Reg(make([]byte, len(exposed.Buf)))
		p.A.PostRead(3, into, exposed)
		if wc := p.A.WaitOK(1)[0]; wc.Opcode != qp.IBV_WC_RDMA_READ || wc.WRID != 3 {
			t.Errorf("READ completion %+v", wc)
		}
		if string(into.Buf) != "read from B's memory" {
			t.Errorf("READ brought %q", into.Buf)
		}
	})
}

// A pair on a network that loses 10% of the packets still completes every
// work request, by retransmitting.
func TestLossyPairCompletes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{Seed: 3,
			Impairments: transport.Impairments{Loss: 0.1, Delay: 10 * time.Microsecond, Jitter: 5 * time.Microsecond}})
		src := p.A.Reg(pattern(64 << 10))
		dst := p.B.Reg(make([]byte, 64<<10))
		inbox := p.B.Reg(make([]byte, 64))
		back := p.A.Reg(make([]byte, 64<<10))
		p.B.PostRecv(1, inbox)
		p.A.PostWrite(1, src, dst)
		p.A.Post(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{src.SGE(0, 64)}})
		p.A.PostRead(3, back, dst)
		wcs := p.A.WaitOK(3)
		for i, wc := range wcs {
			if wc.WRID != uint64(i+1) {
				t.Errorf("completion %d has WRID %d, want %d", i, wc.WRID, i+1)
			}
		}
		p.B.WaitOK(1)
		if !bytes.Equal(back.Buf, src.Buf) || !bytes.Equal(inbox.Buf, src.Buf[:64]) {
			t.Errorf("data differs after a lossy run")
		}
		c := p.A.QP.Counters()
		if c.RetransmittedPkts == 0 || p.Network.Lost == 0 {
			t.Errorf("no packet was lost or retransmitted (lost %d, retransmitted %d): the network was not lossy", p.Network.Lost, c.RetransmittedPkts)
		}
		t.Logf("lost %d, retransmitted %d, sequence NAKs %d, ACK timeouts %d", p.Network.Lost, c.RetransmittedPkts, c.PacketSeqErr, c.LocalAckTimeoutErr)
	})
}

// The helpers work outside synctest too, in real time.
func TestRealTime(t *testing.T) {
	p := transporttest.NewPair(t, transporttest.Config{Timeout: time.Minute})
	msg := p.A.Reg([]byte("real time"))
	inbox := p.B.Reg(make([]byte, 16))
	p.B.PostRecv(1, inbox)
	p.A.PostSend(2, msg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if wc := transporttest.WaitN(t, ctx, p.B.CQ, 1)[0]; wc.ByteLen != 9 {
		t.Errorf("received %d bytes, want 9", wc.ByteLen)
	}
	p.A.WaitOK(1)
	if got := string(inbox.Buf[:9]); got != "real time" {
		t.Errorf("received %q", got)
	}
}

// Access flags: a pair whose QPs allow only local writes refuses a WRITE.
func TestAccessFlags(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{Connect: transport.ConnectAttr{Access: qp.IBV_ACCESS_LOCAL_WRITE}})
		src := p.A.Reg([]byte("refused"))
		dst := p.B.Reg(make([]byte, 7))
		p.A.PostWrite(1, src, dst)
		if wc := p.A.Wait(1)[0]; wc.Status != qp.IBV_WC_REM_ACCESS_ERR {
			t.Errorf("WRITE to a QP without remote write access ended %s, want REM_ACCESS_ERR", wc.Status)
		}
	})
}

// WrapConn sees each side's Conn: a decorator that counts what goes out.
func TestWrapConn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var counters [2]*countingConn
		p := transporttest.NewPair(t, transporttest.Config{WrapConn: func(side int, c transport.Conn) transport.Conn {
			counters[side] = &countingConn{Conn: c}
			return counters[side]
		}})
		p.A.PostWrite(1, p.A.Reg(make([]byte, 3000)), p.B.Reg(make([]byte, 3000)))
		p.A.WaitOK(1)
		// Three WRITE packets out of A; one coalesced or three ACKs out of B.
		if got := counters[0].sent(); got != 3 {
			t.Errorf("A's Conn sent %d datagrams, want 3", got)
		}
		if got := counters[1].sent(); got == 0 {
			t.Errorf("B's Conn sent no ACK")
		}
		if st := p.B.Endpoint.Stats(); st.BadICRC != 0 || st.Received != 3 {
			t.Errorf("B's endpoint received %d datagrams, %d with a bad ICRC; want 3 and 0", st.Received, st.BadICRC)
		}
	})
}

// Behind a wrapper the Endpoints still verify ICRCs: on a network that
// corrupts packets, corrupted ones are dropped as bad ICRCs and the WRITE
// completes by retransmission with the right bytes.
func TestWrapConnKeepsICRCCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{Seed: 2, Impairments: transport.Impairments{Corrupt: 0.2},
			WrapConn: func(_ int, c transport.Conn) transport.Conn { return &countingConn{Conn: c} }})
		src := p.A.Reg(pattern(20 << 10))
		dst := p.B.Reg(make([]byte, 20<<10))
		p.A.PostWrite(1, src, dst)
		p.A.WaitOK(1)
		p.B.Endpoint.Sync()
		if !bytes.Equal(dst.Buf, src.Buf) {
			t.Errorf("corrupted bytes reached the target buffer")
		}
		bad := p.A.Endpoint.Stats().BadICRC + p.B.Endpoint.Stats().BadICRC
		if p.Network.Corrupted == 0 || bad == 0 {
			t.Errorf("network corrupted %d datagrams, endpoints saw %d bad ICRCs; want both above 0", p.Network.Corrupted, bad)
		}
	})
}

type countingConn struct {
	transport.Conn
	mu sync.Mutex
	n  int
}

func (c *countingConn) WriteBatch(ds []transport.Datagram) (int, error) {
	c.mu.Lock()
	c.n += len(ds)
	c.mu.Unlock()
	return c.Conn.WriteBatch(ds)
}

func (c *countingConn) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// fakeTB records failures instead of failing the test. Fatalf ends the
// goroutine, as testing's does, so run calls the helper on its own.
type fakeTB struct {
	testing.TB // the real test: Cleanup, Logf, Name, Context
	mu         sync.Mutex
	failures   []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Fatalf(format string, args ...any) { f.Errorf(format, args...); runtime.Goexit() }
func (f *fakeTB) Fatal(args ...any)                 { f.Errorf("%s", fmt.Sprint(args...)); runtime.Goexit() }
func (f *fakeTB) FailNow()                          { f.Errorf("FailNow"); runtime.Goexit() }
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.failures) > 0
}

// run calls fn with a fake TB on a goroutine of its own and returns the
// failures it recorded, and whether fn returned (false: it called Fatalf).
func run(t *testing.T, fn func(tb testing.TB)) (failures []string, returned bool) {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
		returned = true
	}()
	<-done
	return f.failures, returned
}

// Waiting for more completions than come fails the test, saying how many
// came, once the timeout passes (in simulated time).
func TestWaitForMoreThanComeFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		failures, returned := run(t, func(tb testing.TB) {
			p := transporttest.NewPair(tb, transporttest.Config{Timeout: 3 * time.Second})
			p.A.PostWrite(5, p.A.Reg([]byte("one")), p.B.Reg(make([]byte, 3)))
			p.A.Wait(2)
		})
		if returned || len(failures) != 1 {
			t.Fatalf("Wait(2) with one completion coming: returned %v, failures %q; want one Fatalf", returned, failures)
		}
		for _, want := range []string{"side A waited 3s for 2 completions and got 1", "context deadline exceeded", "WRID 5 RDMA_WRITE SUCCESS 3 bytes"} {
			if !strings.Contains(failures[0], want) {
				t.Errorf("failure %q does not say %q", failures[0], want)
			}
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("the wait took %v of simulated time, want 3s", waited)
		}
	})
}

// WaitN fails when the context ends, and WaitOK when a completion is not a
// success.
func TestWaitFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		failures, _ := run(t, func(tb testing.TB) {
			p := transporttest.NewPair(tb, transporttest.Config{})
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			transporttest.WaitN(tb, ctx, p.B.CQ, 1)
		})
		if len(failures) != 1 || !strings.Contains(failures[0], "waited for 1 completions and got 0: context canceled") {
			t.Errorf("WaitN with a canceled context: failures %q", failures)
		}

		failures, _ = run(t, func(tb testing.TB) {
			p := transporttest.NewPair(tb, transporttest.Config{})
			src := p.A.Reg([]byte("abc"))
			dst := p.B.Reg(make([]byte, 3))
			dst.RKey ^= 0xFF // a key B never gave out
			p.A.PostWrite(1, src, dst)
			p.A.WaitOK(1)
		})
		if len(failures) != 1 || !strings.Contains(failures[0], "side A: completion 1 of 1 is REM_ACCESS_ERR, want SUCCESS") {
			t.Errorf("WaitOK on a failed WRITE: failures %q", failures)
		}

		failures, _ = run(t, func(tb testing.TB) {
			p := transporttest.NewPair(tb, transporttest.Config{})
			p.A.Wait(-1)
		})
		if len(failures) != 1 || !strings.Contains(failures[0], "cannot wait for -1 completions") {
			t.Errorf("Wait(-1): failures %q", failures)
		}
	})
}

// A Config that cannot make a pair fails the test with what is wrong.
func TestBadConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a4, a6 := netip.MustParseAddrPort("192.0.2.9:4791"), netip.MustParseAddrPort("[2001:db8::9]:4791")
		for _, c := range []struct {
			cfg  transporttest.Config
			want string
		}{
			{transporttest.Config{Addrs: [2]netip.AddrPort{a4, a4}}, "both sides have address 192.0.2.9:4791"},
			{transporttest.Config{Addrs: [2]netip.AddrPort{a4, a6}}, "not of one IP version"},
			{transporttest.Config{Addrs: [2]netip.AddrPort{a4}}, "address of side B is not set"},
			{transporttest.Config{Connect: transport.ConnectAttr{PathMTU: 9}}, "side A cannot connect its QP"},
			{transporttest.Config{InitAttr: &qp.InitAttr{MaxSendWR: -1}}, "side A cannot create a QP"},
		} {
			failures, returned := run(t, func(tb testing.TB) { transporttest.NewPair(tb, c.cfg) })
			if returned || len(failures) != 1 || !strings.Contains(failures[0], c.want) {
				t.Errorf("NewPair(%+v): returned %v, failures %q; want one saying %q", c.cfg, returned, failures, c.want)
			}
		}
		failures, _ := run(t, func(tb testing.TB) {
			p := transporttest.NewPair(tb, transporttest.Config{})
			p.A.Reg(nil)
		})
		if len(failures) != 1 || !strings.Contains(failures[0], "side A cannot register 0 bytes") {
			t.Errorf("Reg(nil): failures %q", failures)
		}
	})
}
