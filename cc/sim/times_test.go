package sim

import (
	"testing"
	"time"
)

// A times queue that never empties (a flow with a packet always in a full
// port: one pushed for every one popped) keeps its memory bounded by what
// it holds and gives the times back in order.
func TestTimesQueueBounded(t *testing.T) {
	var q times
	for i := range 3 {
		q.push(time.Duration(i))
	}
	next := time.Duration(0)
	for i := 3; i < 1_000_000; i++ {
		q.push(time.Duration(i))
		at, ok := q.front()
		if !ok || at != next {
			t.Fatalf("front %v %v, want %v", at, ok, next)
		}
		q.pop()
		next++
	}
	if c := q.q.Cap(); c > 16384 {
		t.Errorf("capacity %d after a million pushes with 3 held, want it bounded (at most 16384)", c)
	}
}
