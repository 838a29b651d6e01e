package transport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// Network is an in-memory datagram network for tests. Conns attach to it
// by address; a datagram sent to an address nobody listens on is lost.
// Impairments apply to every datagram, in both directions: loss,
// duplication, delay with jitter (which reorders), corruption, and fault
// rules (Faults, the rule engine of WithFaults) that drop, duplicate or
// delay chosen packets.
//
// Delivery uses goroutines and timers, so under testing/synctest a test on
// a Network runs in deterministic simulated time. The random impairments
// draw from a generator seeded by Seed.
type Network struct {
	mu    sync.Mutex
	conns map[netip.AddrPort]*memConn
	rng   *rand.Rand
	imp   Impairments
	seq   uint64
	cps   map[netip.AddrPort]*CongestionPoint
	timed timedQueue[func()]
	timer *time.Timer
	pool  bufPool    // the copies in flight, reused once delivered
	pkt   bth.Packet // scratch for Faults
	// Stats.
	Delivered, Lost, Duplicated, Corrupted, Overflowed uint64
	// ZeroChecksumDropped counts IPv6 datagrams with UDP checksum 0 that a
	// Conn with ListenOptions.RejectZeroChecksum6 dropped.
	ZeroChecksumDropped uint64
}

// Impairments configure a Network. The zero value is a perfect network
// with no delay.
type Impairments struct {
	Delay     time.Duration // one-way delay
	Jitter    time.Duration // extra delay drawn uniformly from [0, Jitter): reorders
	Loss      float64       // probability a datagram is lost
	Duplicate float64       // probability a datagram is delivered twice
	Corrupt   float64       // probability one byte of a datagram is flipped
	// Faults, when set, are asked about every datagram that is a RoCEv2
	// packet (as Faults.Apply with direction Both: a rule acts whatever
	// its Dir, and is counted under Both) and may drop, duplicate or
	// delay it.
	Faults *Faults
	// QueueLen is each Conn's receive queue in datagrams (default 8192);
	// datagrams beyond it are dropped, as by a full socket buffer.
	QueueLen int
}

// NewNetwork returns a network with the given impairments and random seed.
func NewNetwork(imp Impairments, seed uint64) *Network {
	if imp.QueueLen == 0 {
		imp.QueueLen = 8192
	}
	return &Network{conns: map[netip.AddrPort]*memConn{}, rng: rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15)), imp: imp}
}

// SetImpairments replaces the impairments; datagrams in flight keep theirs.
func (n *Network) SetImpairments(imp Impairments) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if imp.QueueLen == 0 {
		imp.QueueLen = n.imp.QueueLen
	}
	n.imp = imp
}

// ListenOptions configure one Conn on a Network. They model the UDP
// socket choices of UDPOptions, so that what a kernel socket would do to
// a datagram happens here too.
type ListenOptions struct {
	// ComputeUDPChecksum: datagrams sent carry a computed UDP checksum.
	// By default they carry checksum 0, as UDPOptions.ComputeUDPChecksum
	// and rxe.
	ComputeUDPChecksum bool
	// RejectZeroChecksum6 makes the Conn behave as a stock Linux UDP/IPv6
	// socket: IPv6 datagrams that arrive with UDP checksum 0 are dropped
	// (RFC 8200 section 8.1; the kernel counts them in Udp6InErrors unless
	// the socket sets UDP_NO_CHECK6_RX), here counted in
	// Network.ZeroChecksumDropped. roce-emu's own sockets accept them, so
	// the default accepts too.
	RejectZeroChecksum6 bool
}

// Listen attaches a Conn at addr (port 0 means 4791) with the default
// ListenOptions.
func (n *Network) Listen(addr netip.AddrPort) (Conn, error) {
	return n.ListenWith(addr, ListenOptions{})
}

// ListenWith attaches a Conn at addr (port 0 means 4791) with opts.
func (n *Network) ListenWith(addr netip.AddrPort, opts ListenOptions) (Conn, error) {
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), bth.UDPPort)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.conns[addr]; ok {
		return nil, fmt.Errorf("transport: %s is already in use on this network", addr)
	}
	c := &memConn{net: n, addr: addr, opts: opts, in: make(chan Datagram, n.imp.QueueLen), done: make(chan struct{})}
	n.conns[addr] = c
	return c, nil
}

type memConn struct {
	net     *Network
	addr    netip.AddrPort
	opts    ListenOptions
	in      chan Datagram
	done    chan struct{}
	closed  sync.Once
	pending timedQueue[pending] // guarded by net.mu
	timer   *time.Timer         // guarded by net.mu
	// aliased: the network's buffers the last readBatchAliased handed
	// out, back to its pool at the next (one reader: the read loop).
	aliased [][]byte
}

func (c *memConn) LocalAddr() netip.AddrPort     { return c.addr }
func (c *memConn) SourcePort(want uint16) uint16 { return want }

func (c *memConn) Close() error {
	c.closed.Do(func() {
		c.net.mu.Lock()
		delete(c.net.conns, c.addr)
		if c.timer != nil {
			c.timer.Stop()
		}
		c.net.mu.Unlock()
		close(c.done)
	})
	return nil
}

func (c *memConn) ReadBatch(ds []Datagram) (int, error) { return c.readBatch(ds, false) }

// readBatchAliased is ReadBatch, except that each ds[i].Data is the
// network's own copy of the datagram (capacity cut to its length) instead
// of a copy into ds[i].Data: valid until the next read, and not to be
// written. The Endpoint's read loop, which is done with a batch before it
// reads the next, saves a copy of every datagram so (as with the Linux UDP
// Conn's). Only the Endpoint calls it, from one goroutine, and never
// ReadBatch on the same Conn: ReadBatch would copy into the network's
// buffers left in ds.
func (c *memConn) readBatchAliased(ds []Datagram) (int, error) { return c.readBatch(ds, true) }

func (c *memConn) readBatch(ds []Datagram, alias bool) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	if alias && len(c.aliased) > 0 {
		c.net.mu.Lock()
		for i, b := range c.aliased {
			c.net.pool.put(b)
			c.aliased[i] = nil
		}
		c.net.mu.Unlock()
		c.aliased = c.aliased[:0]
	}
	var d Datagram
	select {
	case d = <-c.in:
	case <-c.done:
		return 0, net.ErrClosed
	}
	// A delivery in progress (deliver holds the lock while it queues
	// what is due) finishes first: a batch written at once is read at
	// once.
	c.net.mu.Lock()
	//lint:ignore SA2001 the empty critical section is the point
	c.net.mu.Unlock()
	// The network's copies go back to its pool under one lock per batch
	// (at the next read, when aliased).
	var spent [64][]byte
	k := 0
	defer func() {
		if alias {
			c.aliased = append(c.aliased, spent[:k]...)
			return
		}
		c.net.mu.Lock()
		for _, b := range spent[:k] {
			c.net.pool.put(b)
		}
		c.net.mu.Unlock()
	}()
	n := 0
	for {
		if alias {
			ds[n] = d
			ds[n].Data = d.Data[:len(d.Data):len(d.Data)]
		} else {
			fill(&ds[n], &d)
		}
		ds[n].TOSKnown = true
		ds[n].zeroChecksum = false
		spent[k] = d.Data
		k++
		n++
		if n == len(ds) || k == len(spent) {
			return n, nil
		}
		select {
		case d = <-c.in:
		default:
			return n, nil
		}
	}
}

func (c *memConn) WriteBatch(ds []Datagram) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	// One lock for the batch: its datagrams are all pending before any
	// of them is delivered, and delivered together (ReadBatch waits for
	// a delivery in progress), as a socket takes a GSO send whole.
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	for i := range ds {
		d := ds[i]
		d.Src = netip.AddrPortFrom(c.addr.Addr(), d.Src.Port())
		d.zeroChecksum = !c.opts.ComputeUDPChecksum
		c.net.sendLocked(d)
	}
	return len(ds), nil
}

// sendLocked applies the impairments and schedules delivery of a copy of
// d (n.mu held).
func (n *Network) sendLocked(d Datagram) {
	imp := n.imp
	lost := imp.Loss > 0 && n.rng.Float64() < imp.Loss
	dup := imp.Duplicate > 0 && n.rng.Float64() < imp.Duplicate
	delay := imp.Delay
	if imp.Jitter > 0 {
		delay += time.Duration(n.rng.Int64N(int64(imp.Jitter)))
	}
	corrupt := -1
	if imp.Corrupt > 0 && n.rng.Float64() < imp.Corrupt && len(d.Data) > 0 {
		corrupt = n.rng.IntN(len(d.Data))
	}
	if imp.Faults != nil && n.pkt.Decode(d.Data) == nil {
		a := imp.Faults.Apply(Both, &n.pkt)
		lost = lost || a.Drop
		dup = dup || a.Duplicate
		delay += a.Delay
	}
	if lost {
		n.Lost++
		return
	}
	data := d.Data
	d.Data = n.pool.get(data)
	if corrupt >= 0 {
		d.Data[corrupt] ^= 0x55
		n.Corrupted++
	}
	if dup {
		n.Duplicated++
		c := d
		c.Data = n.pool.get(d.Data)
		n.route(d, delay)
		n.route(c, delay+time.Microsecond)
		return
	}
	n.route(d, delay)
}

// route sends d towards its destination: through the destination's
// congestion point when it has one (after the link delay), or straight
// to its receive queue.
func (n *Network) route(d Datagram, delay time.Duration) {
	cp := n.cps[d.Dst]
	if cp == nil {
		n.scheduleLocked(d, delay, nil)
		return
	}
	if delay <= 0 {
		n.admitLocked(cp, d)
		return
	}
	n.laterLocked(delay, func() { n.admitLocked(cp, d) })
}

// laterLocked runs fn (with n.mu held) after delay. Functions due at the
// same time run in the order they were scheduled, which separate timers
// would not guarantee: datagrams on one link must not overtake each other.
func (n *Network) laterLocked(delay time.Duration, fn func()) {
	n.seq++
	n.timed.push(timed[func()]{at: time.Now().Add(delay), seq: n.seq, v: fn})
	if n.timer == nil {
		n.timer = time.AfterFunc(delay, n.runTimed)
	} else if n.timed[0].seq == n.seq {
		n.timer.Reset(delay)
	}
}

func (n *Network) runTimed() {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for n.timed.due(now) {
		n.timed.pop().v()
	}
	if len(n.timed) > 0 {
		n.timer.Reset(n.timed[0].at.Sub(now))
	}
}

// scheduleLocked queues d for delivery after delay (n.mu held). Each Conn delivers in order
// of due time, and in sending order for equal times, from one timer, so
// that equal delays never reorder.
func (n *Network) scheduleLocked(d Datagram, delay time.Duration, onDeliver func(*Datagram)) {
	c := n.conns[d.Dst]
	if c == nil {
		n.Lost++
		n.pool.put(d.Data)
		if onDeliver != nil {
			dd := d // only this copy escapes to onDeliver, and only here
			onDeliver(&dd)
		}
		return
	}
	if delay <= 0 && onDeliver == nil && len(c.pending) == 0 {
		// Nothing queued ahead of it and nothing to wait for: straight
		// to the receive queue, without the timer and its goroutine.
		c.enqueueLocked(d)
		return
	}
	n.seq++
	at := time.Now().Add(delay)
	c.pending.push(timed[pending]{at: at, seq: n.seq, v: pending{d: d, done: onDeliver}})
	if c.timer == nil {
		c.timer = time.AfterFunc(delay, c.deliver)
	} else if c.pending[0].seq == n.seq {
		c.timer.Reset(delay)
	}
}

// deliver moves the datagrams that are due into the receive queue.
func (c *memConn) deliver() {
	n := c.net
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for c.pending.due(now) {
		p := c.pending.pop().v
		if p.done != nil {
			d := p.d // a copy for the callback, so that p itself stays on the stack
			p.done(&d)
			p.d = d
		}
		if !c.enqueueLocked(p.d) {
			return
		}
	}
	if len(c.pending) > 0 {
		c.timer.Reset(c.pending[0].at.Sub(now))
	}
}

// enqueueLocked puts d on c's receive queue, or counts and drops it (a
// zero UDP checksum refused, the queue full); n.mu held. It reports false
// once c is closed.
func (c *memConn) enqueueLocked(d Datagram) bool {
	n := c.net
	if d.zeroChecksum && c.opts.RejectZeroChecksum6 && !d.Dst.Addr().Unmap().Is4() {
		n.ZeroChecksumDropped++
		n.pool.put(d.Data)
		return true
	}
	select {
	case c.in <- d:
		n.Delivered++
	case <-c.done:
		return false
	default:
		n.Overflowed++
		n.pool.put(d.Data)
	}
	return true
}

type pending struct {
	d    Datagram
	done func(*Datagram) // runs (with the network's lock) when d is delivered; may change d
}
