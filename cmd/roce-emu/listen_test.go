package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// listenTries bounds the loops in which a test's client retries a server
// that is not listening yet, each try 10 to 20 ms apart: up to 10 to 20 s,
// what a server started in a goroutine can take under -race on a loaded
// machine (50 tries, one second, were not always enough).
const listenTries = 1000

// pairRun is what a server and a client run by runPair left: each one's
// exit code, stdout and stderr.
type pairRun struct {
	scode, ccode           int
	sout, serr, cout, cerr string
}

// runPair runs the command line server (run's args) in a goroutine, calls
// ready (when not nil) with the server's stdout, then runs the command
// line client, again while its stderr holds notYet (what the client
// prints when the server is not listening yet: "cannot reach" for a TCP
// exchange, "REJECTED" for rdma_cm), at most listenTries times 20 ms
// apart; it waits for the server to end and returns both runs. The
// outputs of a client try that is run again are dropped.
func runPair(server, client []string, notYet string, ready func(sout *lockedBuffer)) pairRun {
	s := goRun(server)
	if ready != nil {
		ready(&s.out)
	}
	var cout, cerr lockedBuffer
	var ccode int
	for range listenTries {
		cout.Reset()
		cerr.Reset()
		ccode = run(client, &cout, &cerr)
		if ccode == 0 || !strings.Contains(cerr.String(), notYet) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the server may not be listening yet (a loaded machine)
	}
	scode := s.wait()
	return pairRun{scode: scode, ccode: ccode, sout: s.out.String(), serr: s.err.String(), cout: cout.String(), cerr: cerr.String()}
}

// bgRun is a command line run in a goroutine (goRun): its outputs, which
// the test may read while it runs, and its exit code once it has ended.
type bgRun struct {
	out, err lockedBuffer
	done     chan struct{}
	code     int
}

// goRun runs the command line args (run's) in a goroutine.
func goRun(args []string) *bgRun {
	r := &bgRun{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.code = run(args, &r.out, &r.err)
	}()
	return r
}

// startServer is goRun of a server's command line that returns once the
// server's stdout shows banner (it listens: "listening on" for rping -s,
// "Waiting for client" for bw and lat), failing the test if that takes
// longer than waitFor waits.
func startServer(t *testing.T, args []string, banner string) *bgRun {
	t.Helper()
	r := goRun(args)
	waitFor(t, "the server to listen", func() bool { return strings.Contains(r.out.String(), banner) })
	return r
}

// wait waits for the run to end and returns its exit code.
func (r *bgRun) wait() int {
	<-r.done
	return r.code
}

// dialListening dials the TCP address addr until a server takes it, at
// most listenTries times 10 ms apart, and returns the connection or the
// last try's error.
func dialListening(addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	for range listenTries {
		if c, err = net.Dial("tcp", addr); err == nil {
			return c, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, err
}
