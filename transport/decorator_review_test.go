package transport

import (
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// several goroutines WriteBatch through WithObserver(WithFaults(...))
// at once; every datagram not dropped arrives (dups twice), no race.
func TestDecorConcurrentWriteBatch(t *testing.T) {
	n := NewNetwork(Impairments{}, 1)
	a, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
	b, _ := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
	f := NewFaults(7, &FaultRule{Kind: FaultDuplicate, Dir: Out, Prob: 0.2},
		&FaultRule{Kind: FaultDelay, Dir: Out, Prob: 0.3, Delay: time.Millisecond})
	var obsMu sync.Mutex
	observed := 0
	var last time.Time
	back := 0
	ca := WithObserver(WithFaults(a, f, nil), nil, func(e *Event) {
		obsMu.Lock()
		defer obsMu.Unlock()
		observed++
		if e.Time.Before(last) {
			back++
		}
		last = e.Time
	})
	const G, per = 6, 200
	var wg sync.WaitGroup
	for g := range G {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				d := []Datagram{{Data: rocePacket(t, bth.PSN(g*per+i)), Src: a.LocalAddr(), Dst: b.LocalAddr()},
					{Data: rocePacket(t, bth.PSN(g*per+i)+100000), Src: a.LocalAddr(), Dst: b.LocalAddr()}}
				k, err := ca.WriteBatch(d)
				assert.NoError(t, err)
				assert.Equal(t, 2, k)
			}
		}()
	}
	wg.Wait()
	want := G*per*2 - int(f.Dropped[Out]) + int(f.Duplicated[Out])
	got := 0
	ds := make([]Datagram, 64)
	for i := range ds {
		ds[i].Data = make([]byte, 0, 2048)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for got < want {
			k, err := b.ReadBatch(ds)
			if err != nil {
				return
			}
			got += k
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	b.Close()
	<-done
	assert.Equal(t, want, got, "datagrams delivered (dropped %d, duplicated %d, delayed %d)", f.Dropped[Out], f.Duplicated[Out], f.Delayed[Out])
	assert.Equal(t, G*per*2, observed, "observer sees each datagram handed to the fault conn once")
	assert.Zero(t, back, "observer times going backwards")
	ca.Close()
}

// Close while a delayed datagram is pending (both directions):
// goroutines go back to where they were.
func TestDecorCloseWithPendingDelayNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 5 {
		n := NewNetwork(Impairments{}, 1)
		a, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		b, _ := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
		f := NewFaults(1, &FaultRule{Kind: FaultDelay, Dir: Both, Delay: 200 * time.Millisecond})
		ca := WithFaults(a, f, nil)
		cb := WithFaults(b, NewFaults(2, &FaultRule{Kind: FaultDelay, Dir: Both, Delay: 200 * time.Millisecond}), nil)
		rd := make(chan error, 1)
		go func() {
			ds := make([]Datagram, 4)
			_, err := cb.ReadBatch(ds)
			rd <- err
		}()
		_, err := ca.WriteBatch([]Datagram{{Data: rocePacket(t, 1), Src: a.LocalAddr(), Dst: b.LocalAddr()}})
		require.NoError(t, err)
		time.Sleep(250 * time.Millisecond) // out delay done; now held inbound at b
		require.NoError(t, ca.Close())
		require.NoError(t, cb.Close())
		err = <-rd
		assert.ErrorIs(t, err, net.ErrClosed)
	}
	time.Sleep(400 * time.Millisecond)
	after := runtime.NumGoroutine()
	assert.LessOrEqual(t, after, before, "goroutines before %d after %d", before, after)
}

// same rules and seed through a Network (Impairments.Faults) and
// through the decorator on a fault-free Network: the same datagrams drop.
func TestDecorEngineSameDecisions(t *testing.T) {
	const N = 300
	run := func(viaNet bool) []bth.PSN {
		f := NewFaults(42, LossRule(0.3), &FaultRule{Kind: FaultDrop, Dir: Both, Nth: 7})
		imp := Impairments{}
		if viaNet {
			imp.Faults = f
		}
		n := NewNetwork(imp, 1)
		a, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		b, _ := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
		if !viaNet {
			a = WithFaults(a, f, nil)
		}
		defer a.Close()
		defer b.Close()
		for i := range N {
			_, err := a.WriteBatch([]Datagram{{Data: rocePacket(t, bth.PSN(i)), Src: a.LocalAddr(), Dst: b.LocalAddr()}})
			require.NoError(t, err)
		}
		var got []bth.PSN
		ds := make([]Datagram, 64)
		for i := range ds {
			ds[i].Data = make([]byte, 0, 2048)
		}
		var p bth.Packet
		want := N - int(f.Dropped[Both]+f.Dropped[Out])
		for len(got) < want {
			k, err := b.ReadBatch(ds)
			require.NoError(t, err)
			for _, d := range ds[:k] {
				require.NoError(t, p.Decode(d.Data))
				got = append(got, p.BTH.PSN)
			}
		}
		return got
	}
	assert.Equal(t, run(true), run(false))
}

// the portable Conn over IPv6 loopback.
func TestDecorStdUDPIPv6(t *testing.T) {
	a, err := listenStd(netip.MustParseAddrPort("[::1]:0"), UDPOptions{EphemeralPort: true})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer a.Close()
	b, err := listenStd(netip.MustParseAddrPort("[::1]:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer b.Close()
	_, err = a.WriteBatch([]Datagram{{Data: []byte("hello6"), Src: a.LocalAddr(), Dst: b.LocalAddr()}})
	require.NoError(t, err)
	ds := make([]Datagram, 1)
	ds[0].Data = make([]byte, 0, 64)
	n, err := b.ReadBatch(ds)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, "hello6", string(ds[0].Data))
	assert.Equal(t, a.LocalAddr(), ds[0].Src)
	// A v4-mapped destination from a v6 socket.
	_, err = a.WriteBatch([]Datagram{{Data: []byte("x"), Src: a.LocalAddr(), Dst: netip.MustParseAddrPort("[::ffff:127.0.0.1]:9")}})
	t.Logf("v6 socket to v4-mapped: %v", err)
}

// a datagram larger than the slot's capacity.
func TestDecorStdUDPTruncation(t *testing.T) {
	a, err := listenStd(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer a.Close()
	b, err := listenStd(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer b.Close()
	_, err = a.WriteBatch([]Datagram{{Data: []byte("0123456789"), Src: a.LocalAddr(), Dst: b.LocalAddr()}})
	require.NoError(t, err)
	ds := make([]Datagram, 1)
	ds[0].Data = make([]byte, 0, 4)
	n, err := b.ReadBatch(ds)
	t.Logf("n=%d err=%v data=%q", n, err, ds[0].Data)
	if err == nil && n == 1 {
		assert.NotEqual(t, "0123", string(ds[0].Data), "a truncated datagram is handed up as if whole")
	}
}

// after Close, SourcePort must not open new sockets.
func TestDecorStdUDPSourcePortAfterClose(t *testing.T) {
	a, err := listenStd(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	free := sourcePortAfterClose(t, a)
	_, err = a.WriteBatch([]Datagram{{Data: []byte("x"), Src: netip.AddrPortFrom(a.LocalAddr().Addr(), free), Dst: netip.MustParseAddrPort("127.0.0.1:9")}})
	assert.Error(t, err, "WriteBatch after Close")
}

// the same with ListenUDP (the Linux Conn here).
func TestDecorUDPSourcePortAfterClose(t *testing.T) {
	a, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	sourcePortAfterClose(t, a)
}

// sourcePortAfterClose closes a, asks it for a free port of 127.0.0.1 as
// a source port, checks that the port is still free (SourcePort opened no
// socket on it), and returns the port.
func sourcePortAfterClose(t *testing.T, a Conn) uint16 {
	t.Helper()
	probe, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	require.NoError(t, err)
	free := uint16(probe.LocalAddr().(*net.UDPAddr).Port)
	probe.Close()
	require.NoError(t, a.Close())
	got := a.SourcePort(free)
	again, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), free)))
	if err == nil {
		again.Close()
	}
	assert.NoError(t, err, "SourcePort(%d) after Close returned %d and left the port bound", free, got)
	return free
}

// Endpoints on faulted, observed Conns over a delaying Network,
// closed with delayed packets pending: goroutines return to their count.
func TestDecorEndpointCloseNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 3 {
		n := NewNetwork(Impairments{Delay: 50 * time.Millisecond}, 1)
		var cs [2]Conn
		for i, a := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
			c, err := n.Listen(netip.MustParseAddrPort(a))
			require.NoError(t, err)
			cs[i] = WithFaults(WithObserver(c, nil, func(*Event) {}), NewFaults(1, &FaultRule{Kind: FaultDelay, Dir: Both, Delay: 30 * time.Millisecond}), nil)
		}
		s := connect(t, cs, defaultPair())
		smr, _ := s[0].pd.RegMR(make([]byte, 4096), qp.IBV_ACCESS_LOCAL_WRITE)
		dmr, _ := s[1].pd.RegMR(make([]byte, 4096), qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
		for i := range 4 {
			_ = s[0].qp.PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 4096)}, RemoteAddr: dmr.VA, RKey: dmr.RKey})
		}
		time.Sleep(10 * time.Millisecond)
		require.NoError(t, s[0].ep.Close())
		require.NoError(t, s[1].ep.Close())
	}
	time.Sleep(300 * time.Millisecond)
	after := runtime.NumGoroutine()
	assert.LessOrEqual(t, after, before, "goroutines before %d after %d", before, after)
}
