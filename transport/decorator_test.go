package transport

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stepClock is a Clock whose every reading is 1 ms after the one before.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Millisecond)
	return c.now
}

func (c *stepClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// rocePacket returns an encoded SEND Only with the given PSN.
func rocePacket(t *testing.T, psn bth.PSN) []byte {
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x11, PSN: psn}, Payload: []byte("x")}
	e := bth.Encap{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 4791, DstPort: 4791}
	b, err := p.Append(nil, &e)
	require.NoError(t, err)
	return b
}

// The observer stamps each datagram of a batch with its own reading of the
// injected clock, and sees the decoded packet.
func TestObserverTimePerDatagram(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(Impairments{Delay: 5 * time.Microsecond}, 1)
		a, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		b, _ := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
		clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		type seen struct {
			dir Direction
			at  time.Time
			psn bth.PSN
		}
		var got []seen
		a = WithObserver(a, clk, func(e *Event) {
			require.NotNil(t, e.Packet)
			got = append(got, seen{e.Dir, e.Time, e.Packet.BTH.PSN})
		})
		var ds []Datagram
		for psn := range bth.PSN(3) {
			ds = append(ds, Datagram{Data: rocePacket(t, psn), Src: a.LocalAddr(), Dst: b.LocalAddr()})
		}
		k, err := a.WriteBatch(ds)
		require.NoError(t, err)
		require.Equal(t, 3, k)
		// B echoes them back; A reads them in one batch.
		rb := make([]Datagram, 8)
		k, err = b.ReadBatch(rb)
		require.NoError(t, err)
		for i := range rb[:k] {
			rb[i].Src, rb[i].Dst = b.LocalAddr(), a.LocalAddr()
		}
		_, err = b.WriteBatch(rb[:k])
		require.NoError(t, err)
		time.Sleep(10 * time.Microsecond)
		synctest.Wait()
		ra := make([]Datagram, 8)
		k, err = a.ReadBatch(ra)
		require.NoError(t, err)
		require.Equal(t, 3, k, "the three came back in one batch")
		require.Len(t, got, 6)
		for i, s := range got {
			dir := Out
			if i >= 3 {
				dir = In
			}
			assert.Equal(t, dir, s.dir, "event %d", i)
			assert.Equal(t, clk.now.Add(time.Duration(i-5)*time.Millisecond), s.at, "event %d has its own time", i)
			assert.Equal(t, bth.PSN(i%3), s.psn)
		}
		a.Close()
		b.Close()
	})
}

// WithFaults on a bare Conn: out and in rules act on their direction only,
// with drop, duplicate and delay, and count what they did.
func TestFaultsDecorator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(Impairments{}, 1)
		ra, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		b, _ := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
		rules := []string{"drop:dir=out,psn=1", "dup:dir=out,psn=2", "delay=3ms:dir=in,psn=4", "drop:dir=in,psn=5,nth=1"}
		f := NewFaults(1)
		for _, r := range rules {
			fr, err := ParseFault(r)
			require.NoError(t, err)
			f.Add(fr)
		}
		a := WithFaults(ra, f, nil)
		var out []Datagram
		for psn := range bth.PSN(4) {
			out = append(out, Datagram{Data: rocePacket(t, psn), Src: a.LocalAddr(), Dst: b.LocalAddr()})
		}
		k, err := a.WriteBatch(out)
		require.NoError(t, err)
		assert.Equal(t, 4, k)
		synctest.Wait()
		rb := make([]Datagram, 8)
		for i := range rb {
			rb[i].Data = make([]byte, 0, 2048)
		}
		k, err = b.ReadBatch(rb)
		require.NoError(t, err)
		var psns []bth.PSN
		var p bth.Packet
		for _, d := range rb[:k] {
			require.NoError(t, p.Decode(d.Data))
			psns = append(psns, p.BTH.PSN)
		}
		assert.Equal(t, []bth.PSN{0, 2, 2, 3}, psns, "PSN 1 dropped, PSN 2 sent twice")

		// Inbound: PSN 4 is held 3 ms; PSN 5 is dropped once, then passes.
		start := time.Now()
		_, err = b.WriteBatch([]Datagram{{Data: rocePacket(t, 4), Src: b.LocalAddr(), Dst: a.LocalAddr()},
			{Data: rocePacket(t, 5), Src: b.LocalAddr(), Dst: a.LocalAddr()}, {Data: rocePacket(t, 5), Src: b.LocalAddr(), Dst: a.LocalAddr()}})
		require.NoError(t, err)
		ra2 := make([]Datagram, 8)
		for i := range ra2 {
			ra2[i].Data = make([]byte, 0, 2048)
		}
		k, err = a.ReadBatch(ra2)
		require.NoError(t, err)
		require.Equal(t, 1, k)
		require.NoError(t, p.Decode(ra2[0].Data))
		assert.Equal(t, bth.PSN(5), p.BTH.PSN, "the second PSN 5 first")
		assert.Zero(t, time.Since(start))
		k, err = a.ReadBatch(ra2)
		require.NoError(t, err)
		require.Equal(t, 1, k)
		require.NoError(t, p.Decode(ra2[0].Data))
		assert.Equal(t, bth.PSN(4), p.BTH.PSN)
		assert.Equal(t, 3*time.Millisecond, time.Since(start), "PSN 4 delivered when its delay ran out")

		assert.Equal(t, uint64(1), f.Dropped[Out])
		assert.Equal(t, uint64(1), f.Duplicated[Out])
		assert.Equal(t, uint64(1), f.Delayed[In])
		assert.Equal(t, uint64(1), f.Dropped[In])
		for i, r := range f.Rules() {
			assert.Equal(t, 1, r.Acted(), rules[i])
		}
		require.NoError(t, a.Close())
		_, err = a.ReadBatch(ra2)
		assert.ErrorIs(t, err, net.ErrClosed)
		b.Close()
	})
}

// manualClock is a Clock that moves only when Advance is called.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	c      *manualClock
	at     time.Time
	f      func()
	active bool
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(d), f: f, active: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.at, t.active = t.c.now.Add(d), true
	return was
}

// Advance moves the clock on by d and runs the timers that fall due.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if t.active && !t.at.After(c.now) {
			t.active = false
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// The Endpoint reads time and arms its timer through Options.Clock: a
// request to a peer that never answers is retransmitted when the manual
// clock passes the ACK timeout, and not before, whatever the real time.
func TestEndpointInjectedClock(t *testing.T) {
	n := NewNetwork(Impairments{}, 1)
	c, err := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
	require.NoError(t, err)
	clk := &manualClock{now: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}
	ep := NewEndpoint(c, Options{Clock: clk})
	defer ep.Close()
	pd := ep.NewPD()
	cq := ep.NewCQ(4)
	q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true})
	require.NoError(t, err)
	// Nobody listens at 192.0.2.2: every packet is lost.
	require.NoError(t, q.Connect(Remote{Addr: netip.MustParseAddrPort("192.0.2.2:4791"), QPN: 0x11, PSN: 0}, 0,
		ConnectAttr{Timeout: 14})) // 4.096 us * 2^14 = 67 ms
	mr, _ := pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, q.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr.SGE(0, 8)}}))
	assert.Equal(t, uint64(1), q.Counters().SentPackets)
	time.Sleep(100 * time.Millisecond) // real time does not count
	clk.Advance(50 * time.Millisecond)
	assert.Zero(t, q.Counters().LocalAckTimeoutErr, "no timeout before 67 ms of the Endpoint's clock")
	clk.Advance(20 * time.Millisecond)
	c2 := q.Counters()
	assert.Equal(t, uint64(1), c2.LocalAckTimeoutErr, "%+v", c2)
	assert.Equal(t, uint64(1), c2.RetransmittedPkts, "%+v", c2)
	n.mu.Lock()
	assert.Equal(t, uint64(2), n.Lost)
	n.mu.Unlock()
}
