package transport

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// WithFaults returns a Conn that applies f's rules to every datagram
// crossing c: datagrams written are asked about as Out, datagrams read as
// In. A rule drops a datagram, sends or delivers it twice, or holds it
// back for its delay (timed by clock; nil means SystemClock) and then
// sends or delivers it. Datagrams that are not RoCEv2 packets pass
// untouched. Closing the returned Conn closes c; datagrams still held back
// are then lost.
//
// To capture what the wire carries, put the observer inside the faults:
// WithFaults(WithObserver(c, ...), f, clock) records outgoing packets after
// the rules acted on them and incoming ones before.
//
// Reading happens on a goroutine of the decorator, which copies each
// datagram into a queue of buffers it reuses (at most 4096 datagrams wait;
// beyond that it stops reading c until ReadBatch takes some), so that
// delayed datagrams can be delivered while no other arrives.
func WithFaults(c Conn, f *Faults, clock Clock) Conn {
	return &faultConn{inner: c, f: f, clock: clockOr(clock), notify: make(chan struct{}, 1),
		space: make(chan struct{}, 1), done: make(chan struct{})}
}

// faultQueueLimit bounds the datagrams a faultConn holds for ReadBatch.
const faultQueueLimit = 4096

type faultConn struct {
	inner Conn
	f     *Faults
	clock Clock

	start     sync.Once
	closeOnce sync.Once
	notify    chan struct{} // something is ready for ReadBatch (or the pump ended)
	space     chan struct{} // ReadBatch took datagrams: the pump may read on
	done      chan struct{} // closed by Close

	wmu     sync.Mutex // serialises writes to inner (WriteBatch and the timer)
	wpkt    bth.Packet
	wbatch  []Datagram
	worigin []int
	wdue    []Datagram

	mu      sync.Mutex
	ready   []Datagram // datagrams for ReadBatch, from rhead on
	rhead   int
	held    timedQueue[heldDatagram]
	seq     uint64
	timer   Timer
	timerAt time.Time
	pool    bufPool
	err     error // the pump's read error
}

type heldDatagram struct {
	d   Datagram
	out bool
}

func (c *faultConn) LocalAddr() netip.AddrPort     { return c.inner.LocalAddr() }
func (c *faultConn) SourcePort(want uint16) uint16 { return c.inner.SourcePort(want) }
func (c *faultConn) Unwrap() Conn                  { return c.inner }

func (c *faultConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.done)
		c.mu.Lock()
		if c.timer != nil {
			c.timer.Stop()
		}
		c.mu.Unlock()
		err = c.inner.Close()
	})
	return err
}

func (c *faultConn) WriteBatch(ds []Datagram) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	out, origin := c.wbatch[:0], c.worigin[:0]
	for i := range ds {
		var a Action
		if c.wpkt.Decode(ds[i].Data) == nil {
			a = c.f.Apply(Out, &c.wpkt)
		}
		if a.Drop {
			continue
		}
		copies := 1
		if a.Duplicate {
			copies = 2
		}
		if a.Delay > 0 {
			c.mu.Lock()
			for range copies {
				c.holdLocked(ds[i], a.Delay, true)
			}
			c.mu.Unlock()
			continue
		}
		for range copies {
			out = append(out, ds[i])
			origin = append(origin, i)
		}
	}
	c.wbatch, c.worigin = out, origin
	if len(out) == 0 {
		return len(ds), nil
	}
	n, err := c.inner.WriteBatch(out)
	clear(out) // keep no reference to the caller's buffers
	if err != nil {
		if n < len(origin) {
			return origin[n], err
		}
		return len(ds), err
	}
	return len(ds), nil
}

// holdLocked keeps a copy of d for delay, to be sent (out) or delivered
// when it is due; c.mu is held.
func (c *faultConn) holdLocked(d Datagram, delay time.Duration, out bool) {
	d.Data = c.pool.get(d.Data)
	c.seq++
	at := c.clock.Now().Add(delay)
	c.held.push(timed[heldDatagram]{at: at, seq: c.seq, v: heldDatagram{d: d, out: out}})
	if c.timer == nil {
		c.timer = c.clock.AfterFunc(delay, c.onTimer)
		c.timerAt = at
	} else if c.timerAt.IsZero() || at.Before(c.timerAt) {
		c.timer.Reset(delay)
		c.timerAt = at
	}
}

// onTimer sends or delivers the held datagrams that are due.
func (c *faultConn) onTimer() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	now := c.clock.Now()
	c.timerAt = time.Time{}
	due := c.wdue[:0]
	delivered := false
	for c.held.due(now) {
		h := c.held.pop().v
		if h.out {
			due = append(due, h.d)
		} else {
			c.ready = append(c.ready, h.d)
			delivered = true
		}
	}
	if len(c.held) > 0 {
		c.timerAt = c.held[0].at
		c.timer.Reset(c.timerAt.Sub(now))
	}
	c.mu.Unlock()
	if delivered {
		c.signal(c.notify)
	}
	select {
	case <-c.done:
	default:
		if len(due) > 0 {
			c.inner.WriteBatch(due)
		}
	}
	c.mu.Lock()
	for i := range due {
		c.pool.put(due[i].Data)
	}
	c.mu.Unlock()
	clear(due)
	c.wdue = due[:0]
}

func (c *faultConn) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *faultConn) ReadBatch(ds []Datagram) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	c.start.Do(func() { go c.pump() })
	for {
		c.mu.Lock()
		if n := len(c.ready) - c.rhead; n > 0 {
			n = min(n, len(ds))
			for i := range n {
				d := &c.ready[c.rhead+i]
				fill(&ds[i], d)
				c.pool.put(d.Data)
				*d = Datagram{}
			}
			c.rhead += n
			if c.rhead == len(c.ready) {
				c.ready, c.rhead = c.ready[:0], 0
			}
			c.mu.Unlock()
			c.signal(c.space)
			return n, nil
		}
		err := c.err
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
		select {
		case <-c.notify:
		case <-c.done:
			return 0, net.ErrClosed
		}
	}
}

// pump reads c.inner, applies the In rules and queues what is delivered.
func (c *faultConn) pump() {
	ds := make([]Datagram, 64)
	for i := range ds {
		ds[i].Data = make([]byte, 0, 16<<10)
	}
	var p bth.Packet
	for {
		n, err := c.inner.ReadBatch(ds)
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			c.signal(c.notify)
			return
		}
		c.mu.Lock()
		for i := range n {
			var a Action
			if p.Decode(ds[i].Data) == nil {
				a = c.f.Apply(In, &p)
			}
			if a.Drop {
				continue
			}
			copies := 1
			if a.Duplicate {
				copies = 2
			}
			for range copies {
				if a.Delay > 0 {
					c.holdLocked(ds[i], a.Delay, false)
					continue
				}
				d := ds[i]
				d.Data = c.pool.get(d.Data)
				c.ready = append(c.ready, d)
			}
		}
		queued := len(c.ready) - c.rhead + len(c.held)
		c.mu.Unlock()
		c.signal(c.notify)
		for queued >= faultQueueLimit {
			select {
			case <-c.space:
			case <-c.done:
				return
			}
			c.mu.Lock()
			queued = len(c.ready) - c.rhead + len(c.held)
			c.mu.Unlock()
		}
	}
}
