//go:build linux

package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// extraPair adds a second RC pair, with CQs of its own, on the Endpoints of s.
func extraPair(t *testing.T, s [2]*side) ([2]*side, [2][]qp.SGE) {
	var b [2]*side
	for i := range 2 {
		cq := s[i].ep.NewCQ(1 << 12)
		q, err := s[i].ep.NewQP(s[i].pd, cq, cq, qp.InitAttr{MaxSendWR: 256, MaxRecvWR: 256, SQSigAll: true})
		require.NoError(t, err)
		b[i] = &side{s[i].ep, s[i].pd, cq, q}
	}
	for i := range 2 {
		require.NoError(t, b[i].qp.Connect(Remote{Addr: b[1-i].ep.LocalAddr(), QPN: b[1-i].qp.QPN(), PSN: 0x3000}, 0x3000, ConnectAttr{Timeout: 20}))
	}
	return b, pingBuffers(t, b)
}

// Direct reads under churn: on side 1, three goroutines wait on pair A's
// CQ and one on pair B's CQ, each Wait with a short random ctx of its own
// (cancelled while reading, or parked); side 0 sends on both pairs from
// two goroutines, each SEND only after the last was received. Every SEND
// must wake a goroutine on its CQ within 10 s (a lost wake-up would leave
// it waiting for the 3 s ctx at least, and with one waiter on B for ever
// if the socket stayed lent to nobody).
func TestDirectReadChurn(t *testing.T) {
	const msgs = 400
	a, sgeA := directPair(t, Options{}, steadyPair())
	b, sgeB := extraPair(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct{}
	recvA, recvB := make(chan got, msgs), make(chan got, msgs)
	var wg sync.WaitGroup
	waiter := func(s *side, sge []qp.SGE, recv chan got, seed int64) {
		defer wg.Done()
		r := rand.New(rand.NewSource(seed))
		wc := make([]qp.WC, 2)
		for ctx.Err() == nil {
			d := time.Duration(r.Intn(3000)) * time.Microsecond
			if r.Intn(4) == 0 {
				d = 30 * time.Second
			}
			wctx, wcancel := context.WithTimeout(ctx, d)
			n, err := s.cq.Wait(wctx, wc)
			wcancel()
			if errors.Is(err, ErrClosed) {
				return
			}
			for _, c := range wc[:n] {
				if !assert.Equal(t, qp.IBV_WC_SUCCESS, c.Status) {
					return
				}
				if c.Opcode == qp.IBV_WC_RECV {
					assert.NoError(t, s.qp.PostRecv(qp.RecvWR{SGEs: sge}))
					recv <- got{}
				}
			}
		}
	}
	for k := range 3 {
		wg.Add(1)
		go waiter(a[1], sgeA[1], recvA, int64(k))
	}
	wg.Add(1)
	go waiter(b[1], sgeB[1], recvB, 9)
	// Side 0's send completions are drained by a goroutine per CQ.
	for _, s := range []*side{a[0], b[0]} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wc := make([]qp.WC, 8)
			for {
				if _, err := s.cq.Wait(ctx, wc); err != nil {
					return
				}
			}
		}()
	}
	var failed atomic.Bool
	sender := func(s *side, sge []qp.SGE, recv chan got, name string) {
		defer wg.Done()
		for m := range msgs {
			if !assert.NoError(t, s.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge})) {
				return
			}
			select {
			case <-recv:
			case <-time.After(10 * time.Second):
				failed.Store(true)
				t.Errorf("pair %s message %d: no goroutine on its CQ woke (side 1: %+v)", name, m, a[1].ep.Stats())
				return
			}
		}
	}
	var sw sync.WaitGroup
	sw.Add(2)
	wg.Add(2)
	go func() { defer sw.Done(); sender(a[0], sgeA[0], recvA, "A") }()
	go func() { defer sw.Done(); sender(b[0], sgeB[0], recvB, "B") }()
	sw.Wait()
	st := a[1].ep.Stats()
	t.Logf("side 1: direct batches %d, lends %d", st.DirectBatches, a[1].ep.lends)
	cancel()
	a[1].ep.Close()
	a[0].ep.Close()
	wg.Wait()
}

// The same with busy-polling on side 1 (Options.BusyPoll).
func TestDirectReadChurnBusyPoll(t *testing.T) {
	s, sge := directPair(t, Options{BusyPoll: 50 * time.Microsecond}, steadyPair())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recvd := make(chan struct{}, 300)
	var wg sync.WaitGroup
	for k := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(k)))
			wc := make([]qp.WC, 1)
			for ctx.Err() == nil {
				wctx, wcancel := context.WithTimeout(ctx, time.Duration(r.Intn(2000))*time.Microsecond)
				n, err := s[1].cq.Wait(wctx, wc)
				wcancel()
				if errors.Is(err, ErrClosed) {
					return
				}
				for _, c := range wc[:n] {
					if c.Opcode == qp.IBV_WC_RECV {
						assert.NoError(t, s[1].qp.PostRecv(qp.RecvWR{SGEs: sge[1]}))
						recvd <- struct{}{}
					}
				}
			}
		}()
	}
	for m := range 300 {
		require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sge[0]}))
		select {
		case <-recvd:
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d: received by no goroutine in Wait", m)
		}
		wait(t, s[0].cq, 1)
	}
	cancel()
	s[1].ep.Close()
	wg.Wait()
}

// unzoned is what the source check computed per packet before it kept
// peerIP: av.Remote.Addr().Unmap().WithZone("").
func TestUnzonedMatchesOld(t *testing.T) {
	addrs := []netip.Addr{{}}
	for _, s := range []string{"127.0.0.1", "::ffff:127.0.0.1", "::ffff:127.0.0.1%eth0", "fe80::1", "fe80::1%eth0", "fe80::1%2",
		"::1", "::", "0.0.0.0", "::ffff:0.0.0.0", "2001:db8::ffff:1.2.3.4", "::1.2.3.4", "::ffff:1.2.3.4%1"} {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	for _, a := range addrs {
		old := a.Unmap().WithZone("")
		if got := unzoned(a); got != old {
			t.Errorf("%v: unzoned %v, old %v", a, got, old)
		}
		for _, b := range addrs {
			if (unzoned(a) == unzoned(b)) != (a.Unmap().WithZone("") == b.Unmap().WithZone("")) {
				t.Errorf("%v vs %v differ", a, b)
			}
		}
	}
}

// The RC source check after every kind of Modify: peerIP always equals
// what q.q.Remote() gives (RESET clears the AV, ERR keeps it, a failed
// Modify changes nothing, a new AV from RTR).
func TestPeerIPFollowsAV(t *testing.T) {
	s := connect(t, udpPair(t), defaultPair())
	check := func(what string) {
		s[0].ep.mu.Lock()
		defer s[0].ep.mu.Unlock()
		_, av := s[0].qp.q.Remote()
		assert.Equal(t, av.Remote.Addr().Unmap().WithZone(""), s[0].qp.peerIP, what)
	}
	check("RTS")
	// A failed Modify (RTS->RTR is not a transition; AV with another family).
	assert.Error(t, s[0].qp.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, AV: qp.AddressVector{Remote: netip.MustParseAddrPort("[::1]:4791")}}, qp.IBV_QP_STATE|qp.IBV_QP_AV))
	check("failed Modify, other family")
	assert.Error(t, s[0].qp.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, AV: qp.AddressVector{Remote: netip.MustParseAddrPort("127.0.0.9:4791")}}, qp.IBV_QP_STATE|qp.IBV_QP_AV))
	check("failed Modify, bad transition")
	require.NoError(t, s[0].qp.Modify(&qp.Attr{State: qp.IBV_QPS_ERR}, qp.IBV_QP_STATE))
	check("ERR")
	require.NoError(t, s[0].qp.Modify(&qp.Attr{State: qp.IBV_QPS_RESET}, qp.IBV_QP_STATE))
	check("RESET")
	assert.False(t, s[0].qp.peerIP.IsValid(), "RESET clears the AV")
	require.NoError(t, s[0].qp.Connect(Remote{Addr: netip.MustParseAddrPort("[::ffff:127.0.0.2]:4791"), QPN: s[1].qp.QPN()}, 0, ConnectAttr{}))
	check("reconnected to an IPv4-mapped address")
	assert.Equal(t, netip.MustParseAddr("127.0.0.2"), s[0].qp.peerIP)
}

// GRO messages of two sources with different TOS, each coalesced (GSO on
// loopback), read one and three slots at a time so that messages split
// across ReadBatch calls: every segment carries its own message's source
// and TOS. Both the copying ReadBatch and the aliased read.
func TestGROSourceTOSAcrossSplits(t *testing.T) {
	for _, alias := range []bool{false, true} {
		for _, slots := range []int{1, 3, 7} {
			z := offloadConn(t, "127.0.0.2", false, true)
			senders := []Conn{offloadConn(t, "127.0.0.1", true, false), offloadConn(t, "127.0.0.3", true, false)}
			tos := []uint8{0x02, 0xb9}
			// An extra source port of sender 0, sending with TOS 0x01.
			xport := senders[0].SourcePort(40000 + uint16(rand.Intn(20000)))
			type key struct {
				src netip.AddrPort
				tos uint8
			}
			want := map[int]key{}
			seq := 0
			for round := range 4 {
				for i, s := range senders {
					var out []Datagram
					for range 9 + round {
						d := numbered(s.LocalAddr(), z.LocalAddr(), seq, 1052, tos[i])
						binary.BigEndian.PutUint32(d.Data, uint32(seq))
						want[seq] = key{s.LocalAddr(), tos[i]}
						seq++
						out = append(out, d)
					}
					if i == 0 {
						for range 5 {
							d := numbered(s.LocalAddr(), z.LocalAddr(), seq, 1052, 0x01)
							d.Src = netip.AddrPortFrom(s.LocalAddr().Addr(), xport)
							want[seq] = key{d.Src, 0x01}
							seq++
							out = append(out, d)
						}
					}
					n, err := s.WriteBatch(out)
					require.NoError(t, err)
					require.Equal(t, len(out), n)
				}
			}
			got := 0
			ds := make([]Datagram, slots)
			uc := z.(*udpConn)
			deadline := time.Now().Add(5 * time.Second)
			for got < seq && time.Now().Before(deadline) {
				for i := range ds {
					ds[i].Data = make([]byte, 0, 2048)
				}
				var k int
				var err error
				if alias {
					k, err = uc.readBatchAliased(ds)
				} else {
					k, err = z.ReadBatch(ds)
				}
				require.NoError(t, err)
				for _, d := range ds[:k] {
					sq := int(binary.BigEndian.Uint32(d.Data))
					w, ok := want[sq]
					require.True(t, ok, "seq %d", sq)
					assert.Equal(t, w.src, d.Src, "alias %v slots %d seq %d", alias, slots, sq)
					assert.True(t, d.TOSKnown)
					assert.Equal(t, w.tos, d.TOS, "alias %v slots %d seq %d", alias, slots, sq)
					got++
				}
			}
			require.Equal(t, seq, got)
			o, _ := Offloads(z)
			assert.NotZero(t, o.GROReads, "some messages coalesced")
			t.Logf("alias %v slots %d: %d datagrams, %d GRO reads, %d segments", alias, slots, got, o.GROReads, o.GROSegments)
		}
	}
}

// WriteBatch against SourcePort opening ports meanwhile, from several
// goroutines, and Close at the end: every datagram leaves from the port
// its Src names once that port is open, and from the main port before.
func TestWriteBatchSenderCache(t *testing.T) {
	a := offloadConn(t, "127.0.0.1", false, false)
	z := offloadConn(t, "127.0.0.2", false, false)
	base := 40000 + uint16(rand.Intn(20000))
	const ports = 6
	var opened [ports]atomic.Bool
	var wg sync.WaitGroup
	// Port p is opened by one goroutine while others write from it.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for p := range ports {
			time.Sleep(2 * time.Millisecond)
			if a.SourcePort(base+uint16(p)) == base+uint16(p) {
				opened[p].Store(true)
			}
		}
	}()
	type rec struct {
		port   uint16
		before bool // sent before the port was known open
	}
	var mu sync.Mutex
	sent := map[uint32]rec{}
	seq := atomic.Uint32{}
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			for range 60 {
				var out []Datagram
				for range 1 + r.Intn(6) {
					p := base + uint16(r.Intn(ports))
					sq := seq.Add(1)
					d := numbered(netip.AddrPortFrom(a.LocalAddr().Addr(), p), z.LocalAddr(), int(sq), 64, 0)
					wasOpen := opened[p-base].Load()
					mu.Lock()
					sent[sq] = rec{p, !wasOpen}
					mu.Unlock()
					// Runs of one port, and port changes.
					out = append(out, d)
					if r.Intn(2) == 0 {
						d2 := numbered(d.Src, z.LocalAddr(), int(seq.Add(1)), 64, 0)
						mu.Lock()
						sent[uint32(binary.BigEndian.Uint32(d2.Data))] = rec{p, !wasOpen}
						mu.Unlock()
						out = append(out, d2)
					}
				}
				n, err := a.WriteBatch(out)
				assert.NoError(t, err)
				assert.Equal(t, len(out), n)
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	total := int(seq.Load())
	got := readN(t, z, total, 64, 2048)
	wrong := 0
	for _, d := range got {
		sq := binary.BigEndian.Uint32(d.Data)
		w := sent[sq]
		switch {
		case d.Src.Port() == w.port:
		case w.before && d.Src.Port() == a.LocalAddr().Port():
		default:
			wrong++
			t.Errorf("seq %d left from port %d, want %d (before open: %v)", sq, d.Src.Port(), w.port, w.before)
		}
	}
	// After all ports are open, every port sends from its own socket.
	var out []Datagram
	for p := range ports {
		out = append(out, numbered(netip.AddrPortFrom(a.LocalAddr().Addr(), base+uint16(p)), z.LocalAddr(), p, 64, 0))
		out = append(out, numbered(netip.AddrPortFrom(a.LocalAddr().Addr(), 1), z.LocalAddr(), 100+p, 64, 0)) // no socket: main
	}
	_, err := a.WriteBatch(out)
	require.NoError(t, err)
	for _, d := range readN(t, z, len(out), 64, 2048) {
		sq := int(binary.BigEndian.Uint32(d.Data))
		if sq >= 100 {
			assert.Equal(t, a.LocalAddr().Port(), d.Src.Port(), "unopened port sends from main")
		} else {
			assert.Equal(t, base+uint16(sq), d.Src.Port())
		}
	}
	// Close while WriteBatch runs: errors, no panic, no race.
	var cw sync.WaitGroup
	for range 2 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for range 200 {
				if _, err := a.WriteBatch(out); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(time.Millisecond)
	a.Close()
	cw.Wait()
	_, err = a.WriteBatch(out)
	assert.Error(t, err, "WriteBatch after Close")
}

// A port WriteBatch found without a socket (sent from the main one) and
// opened afterwards: the next WriteBatch, starting with that port, sends
// from its own socket (no negative caching). And a port found, then
// another, then the first again.
func TestWriteBatchPortOpenedLater(t *testing.T) {
	a := offloadConn(t, "127.0.0.1", false, false)
	z := offloadConn(t, "127.0.0.2", false, false)
	p := 40000 + uint16(rand.Intn(20000))
	q := p + 1
	from := func(port uint16, seq int) Datagram {
		return numbered(netip.AddrPortFrom(a.LocalAddr().Addr(), port), z.LocalAddr(), seq, 64, 0)
	}
	_, err := a.WriteBatch([]Datagram{from(p, 0)})
	require.NoError(t, err)
	require.Equal(t, p, a.SourcePort(p))
	_, err = a.WriteBatch([]Datagram{from(p, 1)})
	require.NoError(t, err)
	require.Equal(t, q, a.SourcePort(q))
	_, err = a.WriteBatch([]Datagram{from(q, 2), from(p, 3)})
	require.NoError(t, err)
	_, err = a.WriteBatch([]Datagram{from(p, 4), from(q, 5), from(1, 6), from(q, 7)})
	require.NoError(t, err)
	want := []uint16{a.LocalAddr().Port(), p, q, p, p, q, a.LocalAddr().Port(), q}
	for _, d := range readN(t, z, len(want), 64, 2048) {
		sq := binary.BigEndian.Uint32(d.Data)
		assert.Equal(t, want[sq], d.Src.Port(), "datagram %d", sq)
	}
}
