package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/rdmacm"
)

// cmDisconnectWait bounds how long a command that stops early (a signal,
// --timeout, an error) waits for the DREP of each rdma_cm connection it
// still holds: a DREP comes back within a round trip; a peer that is gone
// does not hold the command up longer than this.
const cmDisconnectWait = 2 * time.Second

// signalSource tells a run of SIGINT and SIGTERM; stop undoes it. Tests
// replace it to deliver signals of their own.
var signalSource = func() (sigs <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	return c, func() { signal.Stop(c) }
}

// interrupt records the signal that stopped a run.
type interrupt struct {
	mu     sync.Mutex
	sig    os.Signal
	parent context.Context
}

// caught returns the signal that came, or nil: to this interrupt, or to
// the run's context (runContext) that withSignals wraps, whichever saw it
// first.
func (i *interrupt) caught() os.Signal {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.sig == nil && i.parent != nil {
		var s *signalStop
		if errors.As(context.Cause(i.parent), &s) {
			i.sig = s.sig
		}
	}
	return i.sig
}

// withSignals returns a context that ends at SIGINT or SIGTERM, which the
// interrupt then names; stop releases the signals (the default action, to
// end the process, comes back).
func withSignals(parent context.Context) (ctx context.Context, intr *interrupt, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	intr = &interrupt{parent: parent}
	if parent.Value(signalsHandled{}) != nil {
		// runContext listens already: its cause names the signal.
		return ctx, intr, cancel
	}
	sigs, stopSigs := signalSource()
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			intr.mu.Lock()
			intr.sig = s
			intr.mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	return ctx, intr, func() {
		close(done)
		stopSigs()
		cancel()
	}
}

// interruptedError ends a run stopped by a signal: the command exits with
// 128 + the signal's number, as a shell reports a process the signal
// killed (130 for SIGINT, 143 for SIGTERM), after it has disconnected its
// rdma_cm connections and closed its capture.
type interruptedError struct {
	sig    os.Signal
	detail string
	// cause is the run's own error, when it had one: with no rdma_cm
	// connection to report (detail "stopped"), it says where the run
	// stood: "interrupted by SIGTERM: stopped (no client came)".
	cause error
}

func (e *interruptedError) Error() string {
	if e.detail == "stopped" && e.cause != nil {
		m := strings.TrimSuffix(e.cause.Error(), ": stopped by "+signalName(e.sig))
		return fmt.Sprintf("interrupted by %s: stopped (%s)", signalName(e.sig), m)
	}
	return fmt.Sprintf("interrupted by %s: %s", signalName(e.sig), e.detail)
}

// exitCode is 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
func (e *interruptedError) exitCode() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130
}

func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// disconnectCM sends a DREQ on each rdma_cm connection still up and waits
// for the DREPs, at most cmDisconnectWait in all (rdma_disconnect as the
// programs do before they exit). It reports what happened, one phrase,
// and how many DREQs went unanswered.
func disconnectCM(conns ...*rdmacm.Conn) (detail string, unanswered int) {
	return disconnectCMWithin(cmDisconnectWait, conns...)
}

// disconnectCMWithin is disconnectCM waiting at most wait for the DREPs;
// 0 sends the DREQs without waiting (a peer already found gone, say).
func disconnectCMWithin(wait time.Duration, conns ...*rdmacm.Conn) (detail string, unanswered int) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	n, answered, gone := 0, 0, 0
	for _, c := range conns {
		if c == nil {
			continue
		}
		select {
		case <-c.Disconnected():
			gone++ // the peer or an earlier Disconnect did it
			continue
		default:
		}
		n++
		if c.Disconnect(ctx) == nil {
			answered++
		}
	}
	switch {
	case n == 0 && gone > 0:
		return fmt.Sprintf("%d rdma_cm connection(s) already disconnected", gone), 0
	case n == 0:
		return "no rdma_cm connection was up", 0
	case answered == n:
		return fmt.Sprintf("DREQ sent on %d rdma_cm connection(s), each answered with a DREP", n), 0
	}
	return fmt.Sprintf("DREQ sent on %d rdma_cm connection(s), %d answered with a DREP within %v", n, answered, wait), n - answered
}

// cmCounters describes a Service's CM counters on one line, with the
// datagrams QP1 dropped for a Q_Key other than 0x80010000 (they never
// reach the CM).
func cmCounters(st rdmacm.Stats) string {
	c := st.CM
	return fmt.Sprintf("MADs sent %d, received %d, retransmits %d, duplicate REQs %d, duplicate REPs %d, comm established %d, rejects sent %d, received %d, REQs refused (GID %d, transport %d, private data %d, no listener %d, accept failed %d), dropped %d, QP1 Q_Key violations %d",
		c.MADsSent, c.MADsReceived, c.Retransmits, c.DuplicateREQs, c.DuplicateREPs, c.CommEstablished, c.RejectsSent, c.RejectsReceived,
		c.DropBadGID, c.DropBadTransport, c.DropBadPrivateData, c.NoListener, st.AcceptFailures,
		c.DropMalformed+c.DropUnknownAttr+c.DropUnknownConn+c.DropBadState+c.DropBadQPN+c.DropQueueFull, st.QP1.QKeyViolations)
}

// drainCM waits, at most cmDisconnectWait, until the REJs of connection
// attempts given up (a signal or --timeout while a REQ or a REP waited
// for its answer) have left QP1, so that the peer learns of it before the
// Service closes, as Linux's rdma_destroy_id at exit tells it. It reports
// what happened, one phrase, or "" when no attempt was given up.
func drainCM(svc *rdmacm.Service) string {
	n := svc.Stats().Abandoned
	if n == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmDisconnectWait)
	defer cancel()
	if err := svc.Drain(ctx); err != nil {
		return fmt.Sprintf("%d rdma_cm connection attempt(s) given up, the REJ not sent within %v", n, cmDisconnectWait)
	}
	return fmt.Sprintf("%d rdma_cm connection attempt(s) given up, the peer told with a REJ", n)
}
