package main

import (
	"net"
	"strings"
	"sync"
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
	var wg sync.WaitGroup
	var sout, serr lockedBuffer
	var scode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		scode = run(server, &sout, &serr)
	}()
	if ready != nil {
		ready(&sout)
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
	wg.Wait()
	return pairRun{scode: scode, ccode: ccode, sout: sout.String(), serr: serr.String(), cout: cout.String(), cerr: cerr.String()}
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
