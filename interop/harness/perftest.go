package main

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// perftestCase is one perftest program run against roce-emu --perftest.
type perftestCase struct {
	kind, op    string // "bw" or "lat"; "send", "write", "read" or "atomic"
	size, iters int    // iters per QP
	// perftest's modes: -q, -a (then size is the last, 2^23), -D seconds
	// (then iters is unknown: -1), -A for atomics.
	qps      int
	all      bool
	duration int
	atomic   string
	bidir    bool
	rdmaCM   bool // -R: no TCP; the exchange and every QP over rdma_cm
	rdmaCMz  bool // -z: no TCP; the exchange over rdma_cm, the QPs by hand
}

func (c perftestCase) program() string { return "ib_" + c.op + "_" + c.kind }

// totalIters is the #iterations perftest prints: per QP times QPs, or any
// (-1) in duration mode.
func (c perftestCase) totalIters() int {
	if c.duration > 0 {
		return -1
	}
	return c.iters * max(c.qps, 1)
}

// modeArgs are the mode flags, the same for perftest and roce-emu.
func (c perftestCase) modeArgs() []string {
	var a []string
	if c.qps > 1 {
		a = append(a, "-q", strconv.Itoa(c.qps))
	}
	if c.all {
		a = append(a, "-a")
	}
	if c.duration > 0 {
		a = append(a, "-D", strconv.Itoa(c.duration))
	}
	if c.atomic != "" {
		a = append(a, "-A", c.atomic)
	}
	if c.bidir {
		a = append(a, "-b")
	}
	if c.rdmaCM {
		a = append(a, "-R")
	}
	if c.rdmaCMz {
		a = append(a, "-z")
	}
	return a
}

// sizeArgs are -s and -n as the mode allows them: perftest refuses a size
// with -a and atomics (8 bytes), and -D replaces -n.
func (c perftestCase) sizeArgs() []string {
	var a []string
	if !c.all && c.op != "atomic" {
		a = append(a, "-s", strconv.Itoa(c.size))
	}
	if c.duration == 0 {
		a = append(a, "-n", strconv.Itoa(c.iters))
	}
	return a
}

// perftestModeScenarios run perftest's modes against roce-emu, each with
// rxe as client and with roce-emu as client: -q 4, ib_atomic_bw and
// ib_atomic_lat with both atomic types, -a, -D 2.
func (h *harness) perftestModeScenarios() []scenario {
	cases := []struct {
		c    perftestCase
		name string
		what string
		// rxe as client only: roce-emu reading 8 MiB at once from rxe
		// under TCG does not finish (see docs/interop.md).
		rxeClientOnly bool
	}{
		{perftestCase{kind: "bw", op: "write", size: 65536, iters: 100, qps: 4}, "ib_write_bw-q4",
			"-q 4: four QPs, four key strings each way, 100 RDMA WRITEs of 65536 bytes on each QP, 400 reported", false},
		{perftestCase{kind: "bw", op: "atomic", size: 8, iters: 200, atomic: "FETCH_AND_ADD"}, "ib_atomic_bw-fetch_and_add",
			"200 FETCH_AND_ADDs walking the cache lines of the peer's cycle buffer, each original value checked", false},
		{perftestCase{kind: "bw", op: "atomic", size: 8, iters: 200, atomic: "CMP_AND_SWAP"}, "ib_atomic_bw-cmp_and_swap",
			"200 CMP_AND_SWAPs (compare 0, swap 0) walking the cache lines of the peer's cycle buffer", false},
		{perftestCase{kind: "lat", op: "atomic", size: 8, iters: 200, atomic: "FETCH_AND_ADD"}, "ib_atomic_lat-fetch_and_add",
			"200 FETCH_AND_ADDs one at a time, each original value one more than the last", false},
		{perftestCase{kind: "lat", op: "atomic", size: 8, iters: 200, atomic: "CMP_AND_SWAP"}, "ib_atomic_lat-cmp_and_swap",
			"200 CMP_AND_SWAPs one at a time, each finding the same value", false},
		{perftestCase{kind: "bw", op: "write", size: 1 << 23, iters: 5, all: true}, "ib_write_bw-a",
			"-a: 5 RDMA WRITEs of each size from 2 bytes to 8 MiB, the server's buffer sized for the largest", false},
		{perftestCase{kind: "bw", op: "send", size: 1 << 23, iters: 5, all: true}, "ib_send_bw-a",
			"-a: 5 SENDs of each size from 2 bytes to 8 MiB, a barrier before (receives posted) and after each size; both sides print every size", false},
		{perftestCase{kind: "lat", op: "read", size: 1 << 23, iters: 5, all: true}, "ib_read_lat-a",
			"-a: 5 RDMA READs of each size from 2 bytes to 8 MiB, one at a time", true},
		{perftestCase{kind: "bw", op: "write", size: 65536, iters: 0, duration: 2}, "ib_write_bw-D2",
			"-D 2: RDMA WRITEs of 65536 bytes for 2 seconds, the results of the measured part crossing intact", false},
		{perftestCase{kind: "bw", op: "write", size: 65536, iters: 100, bidir: true}, "ib_write_bw-b",
			"-b: both sides write 100 RDMA WRITEs of 65536 bytes at once, exchange results and print the same sums", false},
		{perftestCase{kind: "bw", op: "atomic", size: 8, iters: 200, atomic: "FETCH_AND_ADD", bidir: true}, "ib_atomic_bw-b",
			"-b: both sides run 200 FETCH_AND_ADDs at once; roce-emu checks the values it got and that its region grew by rxe's 200", false},
	}
	var ss []scenario
	for _, m := range cases {
		c := m.c
		ss = append(ss,
			scenario{"perftest-mode-" + m.name + "-rxe-client",
				fmt.Sprintf("rxe's %s client against roce-emu %s as server: %s", c.program(), c.kind, m.what),
				func(h *harness) (string, error) { return h.perftest(c, false, 1024, 1024, nil) }})
		if m.rxeClientOnly {
			continue
		}
		ss = append(ss,
			scenario{"perftest-mode-" + m.name + "-roce-emu-client",
				fmt.Sprintf("roce-emu %s as client against rxe's %s server: %s", c.kind, c.program(), m.what),
				func(h *harness) (string, error) { return h.perftest(c, true, 1024, 1024, nil) }})
	}
	return ss
}

// perftestScenarios runs perftest in the guest (Debian 12's perftest,
// "6.06" on the wire) against roce-emu bw/lat --perftest, each program
// with rxe as client and with roce-emu as client, then MTU negotiation and
// a lost READ response.
func (h *harness) perftestScenarios() []scenario {
	cases := []perftestCase{
		{kind: "bw", op: "write", size: 65536, iters: 200}, {kind: "bw", op: "send", size: 65536, iters: 200}, {kind: "bw", op: "read", size: 65536, iters: 200},
		{kind: "lat", op: "send", size: 64, iters: 200}, {kind: "lat", op: "write", size: 64, iters: 200}, {kind: "lat", op: "read", size: 64, iters: 200},
	}
	var ss []scenario
	for _, c := range cases {
		what := fmt.Sprintf("%d %s of %d bytes", c.iters, map[string]string{"send": "SENDs", "write": "RDMA WRITEs", "read": "RDMA READs"}[c.op], c.size)
		if c.kind == "lat" {
			what = fmt.Sprintf("%d %s ping-pongs of %d bytes", c.iters, c.op, c.size)
			if c.op == "read" {
				what = fmt.Sprintf("%d RDMA READs of %d bytes one at a time", c.iters, c.size)
			}
		}
		ss = append(ss,
			scenario{"perftest-" + c.program() + "-rxe-client",
				fmt.Sprintf("rxe's %s client runs perftest's whole TCP exchange and %s against roce-emu %s --perftest as server", c.program(), what, c.kind),
				func(h *harness) (string, error) { return h.perftest(c, false, 1024, 1024, nil) }},
			scenario{"perftest-" + c.program() + "-roce-emu-client",
				fmt.Sprintf("roce-emu %s --perftest as client runs perftest's whole TCP exchange and %s against rxe's %s server", c.kind, what, c.program()),
				func(h *harness) (string, error) { return h.perftest(c, true, 1024, 1024, nil) }})
	}
	ss = append(ss,
		scenario{"perftest-ib_write_bw-rxe-client-s64",
			"rxe's ib_write_bw client walks 64-byte WRITEs over one 4096-byte cycle buffer of roce-emu's advertised region, as perftest does, and roce-emu serves them all",
			func(h *harness) (string, error) {
				return h.perftest(perftestCase{kind: "bw", op: "write", size: 64, iters: 1000}, false, 1024, 1024, nil)
			}},
		scenario{"perftest-ib_read_bw-roce-emu-client-s64",
			"roce-emu's ib_read_bw client walks 64-byte READs over the 64 cache lines of rxe's cycle buffer, as perftest does, and every READ of one line brings the same bytes",
			func(h *harness) (string, error) {
				return h.perftest(perftestCase{kind: "bw", op: "read", size: 64, iters: 1000}, true, 1024, 1024, nil)
			}},
		scenario{"perftest-ib_write_bw-mtu-negotiation",
			"rxe offers MTU 4096 in perftest's MTU exchange, roce-emu 1024: both use the smaller, and every WRITE packet carries at most 1024 bytes",
			func(h *harness) (string, error) {
				return h.perftest(perftestCase{kind: "bw", op: "write", size: 65536, iters: 100}, false, 4096, 1024, nil)
			}},
		scenario{"perftest-fault-drop-read-response-from-rxe",
			"roce-emu reading from rxe's ib_read_bw server loses the 3rd RDMA READ response MIDDLE: it requests the rest again, rxe answers the duplicate READ, and every READ brings the same bytes",
			func(h *harness) (string, error) {
				return h.perftest(perftestCase{kind: "bw", op: "read", size: 65536, iters: 200}, true, 1024, 1024,
					&faultCheck{spec: "drop:dir=in,opcode=RDMA_READ_RESPONSE_MIDDLE,nth=3",
						ours: map[string]int{"retransmitted": 1}, rxe: []string{"duplicate_request"}, naks: 0})
			}},
		scenario{"perftest-fault-drop-write-middle-towards-rxe",
			"roce-emu writing to rxe's ib_write_bw server loses the 5th RDMA WRITE Middle it sends: rxe counts out_of_seq_request and NAKs the sequence error once, roce-emu goes back N, and every WRITE completes",
			func(h *harness) (string, error) {
				return h.perftest(perftestCase{kind: "bw", op: "write", size: 65536, iters: 200}, true, 1024, 1024,
					&faultCheck{spec: "drop:dir=out,opcode=RDMA_WRITE_MIDDLE,nth=5",
						ours: map[string]int{"seq NAKs received": 1}, rxe: []string{"out_of_seq_request"}, naks: 1})
			}},
		scenario{"perftest-fault-drop-write-middle-from-rxe",
			"rxe's ib_write_bw client writing to roce-emu loses the 5th RDMA WRITE Middle on the way in: roce-emu NAKs the sequence error once, rxe counts rcvd_seq_err and goes back N, and every WRITE is served",
			func(h *harness) (string, error) {
				return h.perftest(perftestCase{kind: "bw", op: "write", size: 65536, iters: 200}, false, 1024, 1024,
					&faultCheck{spec: "drop:dir=in,opcode=RDMA_WRITE_MIDDLE,nth=5",
						ours: map[string]int{"out-of-sequence": 1}, rxe: []string{"rcvd_seq_err"}, naks: 1})
			}},
	)
	return ss
}

// perftestRDMACMScenarios run perftest with -R against roce-emu -R, both
// roles: no TCP connection; perftest's exchange runs as SENDs on an RC QP
// that rdma_cm connected on port 18515, and each data QP gets its own
// rdma_cm connection. With -z only the exchange goes over rdma_cm.
func (h *harness) perftestRDMACMScenarios() []scenario {
	var ss []scenario
	for _, c := range []perftestCase{
		{kind: "bw", op: "write", size: 65536, iters: 200, rdmaCM: true}, {kind: "bw", op: "read", size: 65536, iters: 200, rdmaCM: true},
		{kind: "bw", op: "send", size: 65536, iters: 200, rdmaCM: true}, {kind: "bw", op: "write", size: 65536, iters: 100, qps: 2, rdmaCM: true},
		{kind: "lat", op: "send", size: 64, iters: 200, rdmaCM: true}, {kind: "lat", op: "write", size: 64, iters: 200, rdmaCM: true},
		{kind: "lat", op: "read", size: 64, iters: 200, rdmaCM: true},
		{kind: "bw", op: "write", size: 65536, iters: 200, rdmaCMz: true}, {kind: "lat", op: "send", size: 64, iters: 200, rdmaCMz: true},
	} {
		name := c.program() + map[bool]string{true: "-R", false: "-z"}[c.rdmaCM]
		if c.qps > 1 {
			name += "-q" + strconv.Itoa(c.qps)
		}
		flag, what := "-R", "the exchange and each QP over rdma_cm"
		if !c.rdmaCM {
			flag, what = "-z", "the exchange over rdma_cm, the QPs connected from the keys"
		}
		ss = append(ss,
			scenario{"perftest-" + name + "-rxe-client",
				fmt.Sprintf("rxe's %s %s client against roce-emu %s %s as server: %d x %d bytes on %d QP(s), no TCP, %s", c.program(), flag, c.kind, flag, c.iters, c.size, max(c.qps, 1), what),
				func(h *harness) (string, error) { return h.perftest(c, false, 1024, 1024, nil) }},
			scenario{"perftest-" + name + "-roce-emu-client",
				fmt.Sprintf("roce-emu %s %s as client against rxe's %s %s server: %d x %d bytes on %d QP(s), no TCP, %s", c.kind, flag, c.program(), flag, c.iters, c.size, max(c.qps, 1), what),
				func(h *harness) (string, error) { return h.perftest(c, true, 1024, 1024, nil) }})
	}
	return ss
}

// lockedBuffer collects a process's output and may be read while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// resultLine finds perftest's result line for size and iterations (the
// line under "#bytes").
func resultLine(out string, size, iters int) string {
	it := strconv.Itoa(iters)
	if iters < 0 {
		it = `[0-9]+` // duration mode: what completed
	}
	re := regexp.MustCompile(`(?m)^ *` + strconv.Itoa(size) + ` +` + it + ` +[0-9].*$`)
	return strings.Join(strings.Fields(re.FindString(out)), " ")
}

// perftest runs c's perftest program in the guest against roce-emu
// --perftest on the host, roce-emu as client (ourClient) or server. The
// guest's interface MTU makes rxe offer guestMTU; roce-emu offers ourMTU.
func (h *harness) perftest(c perftestCase, ourClient bool, guestMTU, ourMTU int, fault *faultCheck) (string, error) {
	if err := h.setMTU(guestMTU); err != nil {
		return "", err
	}
	h.lastFault = fault
	wantMTU := min(guestMTU, ourMTU)
	// -a moves 23 sizes up to 8 MiB: under TCG that takes half a minute
	// or more, so it gets three times the time.
	limit := 50
	if c.all {
		limit = 150
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(limit+5)*time.Second)
	defer cancel()
	sn := strings.Join(append(c.sizeArgs(), c.modeArgs()...), " ")
	args := append([]string{c.kind, "--perftest", "-o", c.op, "--bind", h.hostRoCE(), "-m", strconv.Itoa(ourMTU), "--timeout", strconv.Itoa(limit-5) + "s"}, append(c.sizeArgs(), c.modeArgs()...)...)
	if fault != nil {
		args = append(args, "--fault", fault.spec)
	}
	// perftest's TCP exchange stays on IPv4; the GID (-x) and roce-emu's
	// --bind choose the family RoCEv2 runs on. Over IPv6 the GIDs are
	// then not the exchange's addresses: roce-emu is told to allow it.
	if h.v6 {
		args = append(args, "--allow-gid-mismatch")
	}
	guestCmd := fmt.Sprintf("timeout %d %s -d rxe0 -x %d %s", limit, c.program(), h.gid(), sn)
	type res struct {
		out string
		rc  int
		err error
	}
	guestDone := make(chan res, 1)
	ours := &lockedBuffer{}
	var oursErr error
	if ourClient {
		go func() {
			out, rc, err := h.guest(guestCmd, time.Duration(limit+5)*time.Second)
			guestDone <- res{out, rc, err}
		}()
		// The guest's server needs a moment to listen (TCG is slow).
		for try := 0; try < 40; try++ {
			time.Sleep(500 * time.Millisecond)
			ours = &lockedBuffer{}
			cmd := exec.CommandContext(ctx, h.roceEmu, append(args, guestIP)...)
			cmd.Stdout, cmd.Stderr = ours, ours
			oursErr = cmd.Run()
			if oursErr == nil || !strings.Contains(ours.String(), "cannot reach") {
				break
			}
		}
	} else {
		cmd := exec.CommandContext(ctx, h.roceEmu, args...)
		cmd.Stdout, cmd.Stderr = ours, ours
		if err := cmd.Start(); err != nil {
			return "", err
		}
		for i := 0; i < 100 && !strings.Contains(ours.String(), "Waiting for client"); i++ {
			time.Sleep(50 * time.Millisecond)
		}
		out, rc, err := h.guest(guestCmd+" "+hostIP, time.Duration(limit+5)*time.Second)
		guestDone <- res{out, rc, err}
		oursErr = cmd.Wait()
	}
	g := <-guestDone
	side := map[bool]string{true: "roce-emu-client", false: "rxe-client"}[ourClient]
	logName := fmt.Sprintf("perftest-%s-%s-mtu%d-%s", c.program(), side, guestMTU, map[bool]string{true: "fault", false: "clean"}[fault != nil])
	if h.v6 {
		logName += "-ipv6"
	}
	h.writeLog(logName+"-roce-emu", ours.String())
	h.writeLog(logName+"-guest", g.out)
	o := ours.String()
	switch {
	case g.err != nil:
		return "", fmt.Errorf("guest: %v", g.err)
	case g.rc != 0:
		return "", fmt.Errorf("%s exited %d: %s", c.program(), g.rc, lastLines(g.out, 3))
	case oursErr != nil:
		return "", fmt.Errorf("roce-emu: %v: %s", oursErr, lastLines(o, 3))
	}

	// Who reports what: every client; perftest's bandwidth servers print
	// the client's results (write, read) or their own (send); the latency
	// servers their own, except ib_read_lat's, which prints none.
	theirs, mine := resultLine(g.out, c.size, c.totalIters()), resultLine(o, c.size, c.totalIters())
	serverOnly := c.kind == "lat" && (c.op == "read" || c.op == "atomic") // the server prints nothing
	rxeReports := !ourClient || !serverOnly
	emuReports := ourClient || !serverOnly
	if rxeReports && theirs == "" {
		return "", fmt.Errorf("%s printed no result line for %d x %d bytes: %s", c.program(), c.totalIters(), c.size, lastLines(g.out, 3))
	}
	if emuReports && mine == "" {
		return "", fmt.Errorf("roce-emu printed no result line for %d x %d bytes: %s", c.totalIters(), c.size, lastLines(o, 3))
	}
	// For write, read and atomic the client's results cross over TCP: the
	// server prints the very numbers the client printed (with -b both
	// print the sum of both sides' results, the same numbers).
	if c.kind == "bw" && c.op != "send" && theirs != mine {
		return "", fmt.Errorf("the results did not cross intact: %s printed %q, roce-emu %q", c.program(), theirs, mine)
	}
	// send_bw: each side measures its own figures (the client from its
	// first post to its last completion, the server from its first receive
	// to its last), on the same run: their BW averages agree within 10%.
	// The server's clock starts at its first receive, so it counts n
	// messages over the time of n-1: with n iterations its figure is up to
	// n/(n-1) above the client's (perftest's servers and roce-emu's alike;
	// -a's 5 iterations: 25%, seen as 1.25 and 1.32 on rxe). Below 100
	// iterations (at most 1% of that) the figures are recorded, not
	// compared.
	var figures string
	if c.kind == "bw" && c.op == "send" && rxeReports && emuReports && c.iters < 100 {
		t, m := resultField(theirs, 3), resultField(mine, 3)
		figures = fmt.Sprintf("; BW average %s %.2f, roce-emu %.2f (recorded, not compared: %d iterations, the server's first receive starts its clock)", c.program(), t, m, c.iters)
	}
	if c.kind == "bw" && c.op == "send" && rxeReports && emuReports && c.iters >= 100 {
		t, m, err := resultField(theirs, 3), resultField(mine, 3), error(nil)
		switch {
		case t <= 0 || m <= 0:
			err = fmt.Errorf("no BW average to compare: %s printed %q, roce-emu %q", c.program(), theirs, mine)
		case math.Abs(t-m) > 0.1*math.Max(t, m):
			err = fmt.Errorf("the BW averages of the same run differ by more than 10%%: %s %.2f, roce-emu %.2f", c.program(), t, m)
		}
		if err != nil {
			return "", err
		}
		figures = fmt.Sprintf("; BW average %s %.2f, roce-emu %.2f (%.1f%% apart, at most 10%%)", c.program(), t, m, 100*math.Abs(t-m)/math.Max(t, m))
	}
	// Latency: both sides' t_typical, recorded, not compared (each side
	// times its own half round trips; under TCG one stall moves them).
	if c.kind == "lat" && rxeReports && emuReports {
		figures = fmt.Sprintf("; t_typical[usec] %s %.2f, roce-emu %.2f (recorded, not compared)", c.program(), resultField(theirs, 4), resultField(mine, 4))
	}
	// -a: the client prints every size from 2 bytes; the server the last.
	if c.all {
		client := map[bool]string{true: o, false: g.out}[ourClient]
		for sz := 2; sz <= 1<<23; sz *= 2 {
			if resultLine(client, sz, c.iters) == "" {
				return "", fmt.Errorf("the -a client printed no result line for %d bytes: %s", sz, lastLines(client, 3))
			}
		}
	}
	if c.rdmaCM || c.rdmaCMz {
		if !strings.Contains(g.out, "Data ex. method : rdma_cm") {
			return "", fmt.Errorf("%s does not say its exchange ran over rdma_cm: %s", c.program(), lastLines(g.out, 3))
		}
		qps := map[bool]string{true: "ON", false: "OFF"}[c.rdmaCM]
		if !strings.Contains(g.out, "rdma_cm QPs	 : "+qps) {
			return "", fmt.Errorf("%s does not say \"rdma_cm QPs : %s\": %s", c.program(), qps, lastLines(g.out, 3))
		}
		want := fmt.Sprintf("rdma_cm: %d data QPs disconnected", max(c.qps, 1))
		if c.rdmaCM != strings.Contains(o, want) {
			return "", fmt.Errorf("roce-emu with -R %v printed %q %v: %s", c.rdmaCM, want, !c.rdmaCM, lastLines(o, 3))
		}
	}
	for _, out := range []string{g.out, o} {
		if !strings.Contains(out, fmt.Sprintf("Mtu             : %d[B]", wantMTU)) {
			return "", fmt.Errorf("a side does not report the negotiated MTU %d: %s", wantMTU, lastLines(out, 2))
		}
	}
	// What roce-emu's QP served as responder.
	served := regexp.MustCompile(`requests served: (\d+) RDMA WRITE, (\d+) RDMA READ, (\d+) SEND, (\d+) atomic`).FindStringSubmatch(o)
	if served == nil {
		return "", fmt.Errorf("roce-emu printed no \"requests served\" line: %s", lastLines(o, 3))
	}
	idx := map[string]int{"write": 1, "read": 2, "send": 3, "atomic": 4}[c.op]
	got, _ := strconv.Atoi(served[idx])
	wantServed := c.totalIters()
	serving := !ourClient || c.bidir // with -b both sides serve the other's traffic
	if c.all {
		wantServed = 23 * c.iters // sizes 2^1 to 2^23
	}
	switch {
	case serving && c.duration > 0:
		if n, _ := strconv.Atoi(strings.Fields(mine + " 0 0")[1]); got < n {
			return "", fmt.Errorf("roce-emu served %d %s requests, fewer than the %d %s measured", got, c.op, n, c.program())
		}
	case serving && got != wantServed:
		return "", fmt.Errorf("roce-emu served %d %s requests from %s, not %d", got, c.op, c.program(), wantServed)
	case serving && c.op == "atomic" && c.kind == "bw" && !strings.Contains(o, "data check: the client's"):
		return "", fmt.Errorf("roce-emu did not check what the atomics did to its region: %s", lastLines(o, 3))
	case ourClient && c.op == "send" && c.kind == "lat" && got != c.iters:
		return "", fmt.Errorf("roce-emu received %d of %s's %d SENDs", got, c.program(), c.iters)
	case ourClient && c.op == "write" && c.kind == "lat" && got != c.iters:
		return "", fmt.Errorf("roce-emu received %d of %s's %d RDMA WRITEs", got, c.program(), c.iters)
	}
	if (ourClient || c.bidir) && (c.op == "read" || c.op == "atomic") && !strings.Contains(o, "data check:") {
		return "", fmt.Errorf("roce-emu did not check the data it read: %s", lastLines(o, 3))
	}
	// Small bandwidth READs walk perftest's cycle buffer, one cache line
	// (64 bytes) or more per step.
	if ourClient && c.op == "read" && c.kind == "bw" && c.size <= 2048 {
		inc := (c.size + 63) / 64 * 64
		if want := fmt.Sprintf("from %d offsets", 4096/inc); !strings.Contains(o, want) {
			return "", fmt.Errorf("roce-emu's READs did not come %s of rxe's buffer: %s", want, lastLines(o, 3))
		}
	}
	counters := counterLine(o)
	// Data towards roce-emu came in packets of the negotiated MTU.
	if c.kind == "bw" && (ourClient == (c.op == "read")) && !c.all && c.duration == 0 && c.op != "atomic" {
		want := c.totalIters() * ((c.size + wantMTU - 1) / wantMTU)
		if rcvd := parseCounters(counters)["received"]; rcvd < want {
			return "", fmt.Errorf("roce-emu received %d packets, fewer than the %d that %d x %d bytes make at MTU %d", rcvd, want, c.iters, c.size, wantMTU)
		}
	}
	if fault != nil {
		got := parseCounters(counters)
		for k, min := range fault.ours {
			if got[k] < min {
				return "", fmt.Errorf("roce-emu counter %q is %d, want at least %d (%s)", k, got[k], min, counters)
			}
		}
	}
	detail := fmt.Sprintf("MTU %d; %s: %q; roce-emu: %q", wantMTU, c.program(), theirs, mine)
	if !rxeReports {
		detail = fmt.Sprintf("MTU %d; roce-emu: %q", wantMTU, mine)
	}
	if !emuReports {
		detail = fmt.Sprintf("MTU %d; %s: %q", wantMTU, c.program(), theirs)
	}
	if i := strings.Index(o, "data check:"); i >= 0 {
		detail += "; " + strings.TrimSpace(strings.SplitN(o[i:], "\n", 2)[0])
	}
	detail += figures
	detail += "; roce-emu " + strings.TrimSpace(served[0]) + "; " + counters
	return detail, nil
}

// resultField is field i (from 0) of a result line as resultLine gives
// it, as a number: bw lines are #bytes, #iterations, BW peak, BW average,
// MsgRate; lat lines #bytes, #iterations, t_min, t_max, t_typical, ...
// It is -1 when the line has no such number.
func resultField(line string, i int) float64 {
	f := strings.Fields(line)
	if i >= len(f) {
		return -1
	}
	v, err := strconv.ParseFloat(f[i], 64)
	if err != nil {
		return -1
	}
	return v
}
