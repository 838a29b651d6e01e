// Package fifo is a first-in-first-out queue whose backing array is
// reused: popping is O(1), and a queue that never empties (as many pushed
// as popped) is compacted, so that its memory is bounded by what it holds,
// not by how many went through it. The Endpoint's active QPs
// (transport) and the incast simulation's event lanes and due times
// (cc/sim) use it.
package fifo

// compactAfter is how many popped slots a queue keeps at its front, at
// least, before it moves what it holds back to the start.
const compactAfter = 64

// Queue is a FIFO of T. The zero value is an empty queue.
type Queue[T any] struct {
	q    []T
	head int
}

// Len returns how many the queue holds.
func (f *Queue[T]) Len() int { return len(f.q) - f.head }

// Cap returns the capacity of the backing array: the memory the queue
// keeps, in elements.
func (f *Queue[T]) Cap() int { return cap(f.q) }

// Push adds v at the back.
func (f *Queue[T]) Push(v T) {
	if f.head > 0 && f.head == len(f.q) {
		clear(f.q[:f.head])
		f.q, f.head = f.q[:0], 0
	} else if f.head >= compactAfter && 2*f.head >= len(f.q) {
		n := copy(f.q, f.q[f.head:])
		clear(f.q[n:])
		f.q, f.head = f.q[:n], 0
	}
	f.q = append(f.q, v)
}

// Pop removes and returns the front; the queue must not be empty.
func (f *Queue[T]) Pop() T {
	v := f.q[f.head]
	var zero T
	f.q[f.head] = zero
	f.head++
	return v
}

// Front returns the front, nil when the queue is empty. It stays valid
// until the next Push or Pop.
func (f *Queue[T]) Front() *T {
	if f.head == len(f.q) {
		return nil
	}
	return &f.q[f.head]
}

// Back returns the back, nil when the queue is empty. It stays valid
// until the next Push or Pop.
func (f *Queue[T]) Back() *T {
	if f.head == len(f.q) {
		return nil
	}
	return &f.q[len(f.q)-1]
}
