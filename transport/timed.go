package transport

import "time"

// timed is one entry of a timedQueue: a value due at a time. seq orders
// entries due at the same time by when they were pushed.
type timed[T any] struct {
	at  time.Time
	seq uint64
	v   T
}

// timedQueue is a binary min-heap of values by due time, then push order.
// It is written out, not container/heap, so that a push does not box its
// value in an interface (an allocation per packet).
type timedQueue[T any] []timed[T]

func (q timedQueue[T]) less(i, j int) bool {
	if q[i].at.Equal(q[j].at) {
		return q[i].seq < q[j].seq
	}
	return q[i].at.Before(q[j].at)
}

func (q *timedQueue[T]) push(e timed[T]) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

// pop removes and returns the earliest entry; the queue must not be empty.
func (q *timedQueue[T]) pop() timed[T] {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	var zero timed[T]
	h[last] = zero // let the garbage collector have what it held
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if r < len(h) && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// due reports whether the earliest entry is due at now.
func (q timedQueue[T]) due(now time.Time) bool { return len(q) > 0 && !q[0].at.After(now) }

// bufPool is a free list of datagram buffers, so that a path that must
// keep a copy of a datagram (a delay, a queue) reuses the memory of copies
// it already gave back instead of allocating one per packet. Not safe for
// concurrent use: its owner's lock guards it.
type bufPool struct{ free [][]byte }

// get returns a buffer holding a copy of b.
func (p *bufPool) get(b []byte) []byte {
	var buf []byte
	if k := len(p.free); k > 0 {
		buf = p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
	}
	if cap(buf) < len(b) {
		buf = make([]byte, len(b), max(len(b), 2048))
	}
	buf = buf[:len(b)]
	copy(buf, b)
	return buf
}

// put gives a buffer back.
func (p *bufPool) put(b []byte) {
	if cap(b) > 0 && len(p.free) < 1<<14 {
		p.free = append(p.free, b[:0])
	}
}

// fill copies src into dst, into dst.Data's capacity; a slot too small
// for the datagram gets a new buffer.
func fill(dst, src *Datagram) {
	data := append(dst.Data[:0], src.Data...)
	*dst = *src
	dst.Data = data
}
