package fifo

import "testing"

// Values come out in the order they went in, through resets and
// compactions, and a queue that never empties keeps its memory bounded.
func TestQueueOrderAndBound(t *testing.T) {
	var q Queue[int]
	if q.Front() != nil || q.Back() != nil || q.Len() != 0 {
		t.Fatal("a zero queue is empty")
	}
	next, in := 0, 0
	for round := range 1000 {
		for range round%7 + 1 {
			q.Push(in)
			in++
		}
		if b := q.Back(); b == nil || *b != in-1 {
			t.Fatalf("back %v, want %d", b, in-1)
		}
		for range round%5 + 1 {
			if q.Len() == 0 {
				break
			}
			if f := q.Front(); *f != next {
				t.Fatalf("front %d, want %d", *f, next)
			}
			if v := q.Pop(); v != next {
				t.Fatalf("pop %d, want %d", v, next)
			}
			next++
		}
	}
	for q.Len() > 0 {
		if v := q.Pop(); v != next {
			t.Fatalf("pop %d, want %d", v, next)
		}
		next++
	}
	if next != in {
		t.Fatalf("%d out, %d in", next, in)
	}
	// Never empty: 3 held, a million through.
	q = Queue[int]{}
	for i := range 3 {
		q.Push(i)
	}
	for i := 3; i < 1_000_000; i++ {
		q.Push(i)
		if v := q.Pop(); v != i-3 {
			t.Fatalf("pop %d, want %d", v, i-3)
		}
	}
	if c := cap(q.q); c > 1024 {
		t.Errorf("capacity %d with 3 held, want it bounded", c)
	}
}
