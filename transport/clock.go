package transport

import "time"

// Clock is the time source of an Endpoint and of the Conn decorators
// (WithFaults, WithObserver): what they read as now, and the timers they
// arm. The zero choice, a nil Clock, means SystemClock. gVisor's
// tcpip.Clock is the model.
//
// A test that wants simulated time runs its Endpoints under
// testing/synctest with SystemClock: inside a synctest bubble time.Now and
// time.AfterFunc are the bubble's fake clock. A Clock of its own lets a
// caller drive time by hand instead.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed, as
	// time.AfterFunc does, and returns a Timer that can stop or re-arm it.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer armed by a Clock's AfterFunc. Stop and Reset have the
// meaning of time.Timer's methods.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock is the real clock: time.Now and time.AfterFunc.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}

// clockOr returns c, or SystemClock when c is nil.
func clockOr(c Clock) Clock {
	if c == nil {
		return SystemClock
	}
	return c
}
