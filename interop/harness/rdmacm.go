package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// rdmacmScenarios run librdmacm's rping in the guest against roce-emu
// rping, each side as client, and connects to a port nobody listens on.
func (h *harness) rdmacmScenarios() []scenario {
	return []scenario{
		{"rdmacm-rping-rxe-client",
			"rxe's rping -c -C 100 -v -V connects to roce-emu rping -s through the CM over QP1 (REQ, REP, RTU), runs 100 pings (SEND, READ, SEND, SEND, WRITE, SEND), validates every one, prints each ping line as roce-emu's server does, and disconnects (DREQ, DREP)",
			func(h *harness) (string, error) { return h.rping(false, 100, "", nil, "") }},
		{"rdmacm-rping-roce-emu-client",
			"roce-emu rping -c -C 100 -v -V connects to rxe's rping -s through the CM over QP1, runs 100 pings with the data checked, and disconnects; rxe's server prints each ping line",
			func(h *harness) (string, error) { return h.rping(true, 100, "", nil, "") }},
		{"rdmacm-fault-drop-rep-to-rxe",
			"roce-emu's REP to rxe's rping client is lost: rxe resends its REQ after its CM response timeout (rxe's cm_tx_retries/req), roce-emu answers the duplicate REQ with its REP again, the connection comes up and 10 pings are validated",
			func(h *harness) (string, error) {
				return h.rping(false, 10, "drop:dir=out,opcode=UD_SEND_ONLY,nth=1", wantCM("duplicate REQs"), "cm_tx_retries/req")
			}},
		{"rdmacm-fault-drop-rep-from-rxe",
			"rxe's REP to roce-emu's rping client is lost on the way in: rxe resends its REP after its timeout (cm_tx_retries/rep) or answers roce-emu's resent REQ with it (cm_rx_duplicates/req), and 10 pings are validated",
			func(h *harness) (string, error) {
				return h.rping(true, 10, "drop:dir=in,opcode=UD_SEND_ONLY,nth=1", nil, "cm_tx_retries/rep|cm_rx_duplicates/req")
			}},
		{"rdmacm-fault-drop-rtu-from-rxe",
			"rxe's RTU to roce-emu's rping server is lost: the first RC packet of rxe's client on the accepted QP establishes the connection (the communication-established event, IBTA 12.9.6), long before a REP retry, and 10 pings are validated",
			func(h *harness) (string, error) {
				return h.rping(false, 10, "drop:dir=in,opcode=UD_SEND_ONLY,nth=2", wantCM("comm established"), "")
			}},
		{"rdmacm-fault-drop-rtu-to-rxe",
			"roce-emu's RTU to rxe's rping server is lost: rxe's passive side is established by roce-emu's first SEND or by its REP retry answered with the RTU again, and 10 pings are validated",
			func(h *harness) (string, error) {
				return h.rping(true, 10, "drop:dir=out,opcode=UD_SEND_ONLY,nth=2", nil, "")
			}},
		{"rdmacm-50-cycles-rxe-persistent-server",
			"50 runs of roce-emu rping -c -C 1 -V against rxe's persistent rping -s -P: each connects, pings once with the data checked and disconnects (DREQ, DREP), and afterwards rxe holds exactly the QPs, MRs and cm_ids it held before",
			func(h *harness) (string, error) { return h.rpingCycles(50) }},
		{"rdmacm-rej-unused-port-from-rxe",
			"roce-emu rping -c to a port the guest does not listen on: rxe's CM answers the REQ with a REJ (reason 8, invalid service ID) at once, and roce-emu reports it",
			func(h *harness) (string, error) { return h.rpingRejected(true) }},
		{"rdmacm-rej-unused-port-to-rxe",
			"rxe's rping -c to a port roce-emu does not listen on: roce-emu's CM answers the REQ with a REJ (reason 8) at once, and rping reports RDMA_CM_EVENT_REJECTED",
			func(h *harness) (string, error) { return h.rpingRejected(false) }},
		{"rdmacm-rej-no-cm-to-rxe",
			"rxe's rping -c against roce-emu server (rc_pingpong's protocol, no rdma_cm at all): roce-emu's Endpoint answers the REQ to its QP1 with a REJ (reason 8) at once, as Linux's CM with no listener, rping reports RDMA_CM_EVENT_REJECTED instead of retrying its REQ, and roce-emu says on stderr why",
			func(h *harness) (string, error) { return h.rpingNoCM() }},
	}
}

// rpingNoCM runs the guest's rping -c against roce-emu server, which runs
// no rdma_cm.
func (h *harness) rpingNoCM() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, buf := h.roceEmuCmd(ctx, "server", "server", "--bind", hostIP, "--timeout", "30s")
	if err := cmd.Start(); err != nil {
		return "", err
	}
	stopped := false
	stop := func() string {
		if !stopped {
			stopped = true
			cmd.Process.Kill()
			cmd.Wait()
			h.writeLog("server-roce-emu", buf.String())
		}
		return buf.String()
	}
	defer stop()
	time.Sleep(500 * time.Millisecond)
	out, rc, err := h.guest("time timeout 30 rping -c -a "+hostIP+" -C 1", 40*time.Second)
	h.writeLog("rping-guest", out)
	if err != nil {
		return "", fmt.Errorf("guest: %v", err)
	}
	if rc == 0 {
		return "", fmt.Errorf("rping connected to a roce-emu that runs no rdma_cm: %s", lastLines(out, 2))
	}
	if rc == 124 {
		return "", fmt.Errorf("rping hung until timeout: no REJ: %s", lastLines(out, 2))
	}
	if !strings.Contains(out, "RDMA_CM_EVENT_REJECTED") {
		return "", fmt.Errorf("rping did not report a REJ: %s", lastLines(out, 3))
	}
	if log := stop(); !strings.Contains(log, "CM REQ (rdma_cm: rping -c, perftest -R) came to QP1 and was rejected") {
		return "", fmt.Errorf("roce-emu server did not say it rejected a CM REQ: %s", lastLines(log, 2))
	}
	return "rping: " + lastLines(out, 4), nil
}

// rpingLine is what rping -v prints for ping i of a 64-byte buffer.
func rpingLine(i int) string {
	b := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
	c := byte(65 + i%58)
	for len(b) < 63 {
		b = append(b, c)
		if c++; c > 122 {
			c = 65
		}
	}
	return string(b)
}

// checkPingLines wants exactly count lines prefix+rpingLine(i), in order.
func checkPingLines(out, prefix string, count int) error {
	i := 0
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimRight(l, "\r")
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		if i >= count {
			return fmt.Errorf("more than %d lines %q", count, prefix)
		}
		if want := prefix + rpingLine(i); l != want {
			return fmt.Errorf("line %d is %q, want %q", i, l, want)
		}
		i++
	}
	if i != count {
		return fmt.Errorf("%d lines %q, want %d", i, prefix, count)
	}
	return nil
}

// stdoutFirst runs a guest command with its stderr after its stdout: the
// guest's output is a pipe, so rping's stdout is block-buffered and its
// unbuffered stderr ("client DISCONNECT EVENT...") would land inside a
// ping line.
func stdoutFirst(cmd string) string {
	return cmd + " 2>/tmp/stderr; rc=$?; cat /tmp/stderr; exit $rc"
}

// rping runs rping in the guest against roce-emu rping on the host,
// roce-emu as client (ourClient) or server.
// wantCM wants each of roce-emu's CM counters named (as rping -d prints
// them on its "cm counters:" line) to be at least 1.
func wantCM(names ...string) func(string) error {
	return func(out string) error {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "cm counters:") {
				line = l
			}
		}
		got := parseCounters(strings.TrimPrefix(line, "cm "))
		for _, n := range names {
			if got[n] < 1 {
				return fmt.Errorf("roce-emu CM counter %q is %d, want at least 1 (%s)", n, got[n], line)
			}
		}
		return nil
	}
}

// rxeCM reads the guest's ib_cm counters
// (/sys/class/infiniband/rxe0/ports/1/{cm_tx_msgs,cm_tx_retries,cm_rx_msgs,cm_rx_duplicates}/MESSAGE),
// keyed "cm_tx_retries/rep".
func (h *harness) rxeCM() (map[string]int64, error) {
	out, rc, err := h.guest("cd /sys/class/infiniband/rxe0/ports/1 && for f in cm_*/*; do echo $f $(cat $f); done", 10*time.Second)
	if err != nil || rc != 0 {
		return nil, fmt.Errorf("reading rxe's CM counters: %v (exit %d) %s", err, rc, lastLines(out, 2))
	}
	m := map[string]int64{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			m[f[0]] = v
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("reading rxe's CM counters: none found: %s", lastLines(out, 2))
	}
	return m, nil
}

// rping runs rping in the guest against roce-emu rping on the host,
// roce-emu as client (ourClient) or server, roce-emu with the fault rule
// given. check, when set, judges roce-emu's output; rxeGrew, when set,
// names rxe CM counters ("a|b": either) one of which must grow.
func (h *harness) rping(ourClient bool, count int, fault string, check func(ours string) error, rxeGrew string) (string, error) {
	if err := h.setMTU(1024); err != nil {
		return "", err
	}
	var cmBefore map[string]int64
	if rxeGrew != "" {
		var err error
		if cmBefore, err = h.rxeCM(); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := strconv.Itoa(count)
	type res struct {
		out string
		rc  int
		err error
	}
	guestDone := make(chan res, 1)
	var ours *strings.Builder
	var oursErr error
	if ourClient {
		go func() {
			out, rc, err := h.guest(stdoutFirst("timeout 120 rping -s -a "+guestIP+" -v -C "+c), 130*time.Second)
			guestDone <- res{out, rc, err}
		}()
		// rping's server needs a moment to listen (TCG is slow); until it
		// does, rxe's CM answers our REQ with a REJ. Wait until rdma_cm
		// shows its listener, so that a fault rule meets the REP and not
		// such a REJ.
		if out, rc, err := h.guest("for i in $(seq 60); do rdma resource show cm_id | grep -q LISTEN && exit 0; sleep 0.5; done; exit 1", 40*time.Second); err != nil || rc != 0 {
			return "", fmt.Errorf("the guest's rping server shows no listening cm_id: %v %s", err, lastLines(out, 2))
		}
		for try := 0; try < 60; try++ {
			time.Sleep(500 * time.Millisecond)
			cmd, buf := h.roceEmuCmd(ctx, "rping", append([]string{"rping", "-c", "--bind", hostIP, "-a", guestIP, "-C", c, "-v", "-V", "-d", "--timeout", "100s"}, faultArgs(fault)...)...)
			oursErr = cmd.Run()
			ours = buf
			if oursErr == nil || !strings.Contains(buf.String(), "REJECTED") {
				break
			}
		}
	} else {
		cmd, buf := h.roceEmuCmd(ctx, "rping", append([]string{"rping", "-s", "--bind", hostIP, "-v", "-d", "--timeout", "120s"}, faultArgs(fault)...)...)
		if err := cmd.Start(); err != nil {
			return "", err
		}
		time.Sleep(500 * time.Millisecond)
		out, rc, err := h.guest(stdoutFirst("timeout 120 rping -c -a "+hostIP+" -C "+c+" -v -V"), 130*time.Second)
		guestDone <- res{out, rc, err}
		oursErr = cmd.Wait()
		ours = buf
	}
	g := <-guestDone
	h.writeLog("rping-roce-emu", ours.String())
	h.writeLog("rping-guest", g.out)
	switch {
	case g.err != nil:
		return "", fmt.Errorf("guest: %v", g.err)
	case g.rc != 0:
		return "", fmt.Errorf("rping exited %d: %s", g.rc, lastLines(g.out, 3))
	case oursErr != nil:
		return "", fmt.Errorf("roce-emu: %v: %s", oursErr, lastLines(ours.String(), 3))
	}
	client, server := ours.String(), g.out
	if !ourClient {
		client, server = g.out, ours.String()
	}
	if err := checkPingLines(client, "ping data: ", count); err != nil {
		return "", fmt.Errorf("client: %v", err)
	}
	if err := checkPingLines(server, "server ping data: ", count); err != nil {
		return "", fmt.Errorf("server: %v", err)
	}
	if strings.Contains(client, "data mismatch") {
		return "", fmt.Errorf("client: data mismatch")
	}
	if check != nil {
		if err := check(ours.String()); err != nil {
			return "", err
		}
	}
	cm := ""
	if rxeGrew != "" {
		after, err := h.rxeCM()
		if err != nil {
			return "", err
		}
		grew := ""
		for _, k := range strings.Split(rxeGrew, "|") {
			if d := after[k] - cmBefore[k]; d > 0 {
				grew += fmt.Sprintf(" %s+%d", k, d)
			}
		}
		if grew == "" {
			return "", fmt.Errorf("none of rxe's CM counters %s grew (rxe CM counters changed:%s)", rxeGrew, fmtCounters(delta(cmBefore, after)))
		}
		cm = "; rxe CM:" + grew
	}
	for _, l := range strings.Split(ours.String(), "\n") {
		if strings.HasPrefix(l, "cm counters:") {
			cm += "; roce-emu " + l
		}
	}
	return fmt.Sprintf("%d pings, each line as rping prints it on both sides, -V validated%s", count, cm), nil
}

// rpingRejected connects to rdma_cm port 9, where nobody listens: from
// roce-emu to rxe (ourClient) or from rxe to roce-emu. The REJ must come
// at once, well before the REQ's first retry (about 6.4 s).
func (h *harness) rpingRejected(ourClient bool) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if ourClient {
		start := time.Now()
		cmd, buf := h.roceEmuCmd(ctx, "rping", "rping", "-c", "--bind", hostIP, "-a", guestIP, "-p", "9", "-C", "1", "--timeout", "30s")
		err := cmd.Run()
		took := time.Since(start)
		h.writeLog("rping-roce-emu", buf.String())
		if err == nil {
			return "", fmt.Errorf("roce-emu rping connected to a port nobody listens on")
		}
		if !strings.Contains(buf.String(), "RDMA_CM_EVENT_REJECTED, error 8") {
			return "", fmt.Errorf("no REJ with reason 8: %s", lastLines(buf.String(), 2))
		}
		if took > 5*time.Second {
			return "", fmt.Errorf("the REJ took %.1fs", took.Seconds())
		}
		return fmt.Sprintf("REJ (invalid service ID) after %.2fs: %s", took.Seconds(), lastLines(buf.String(), 1)), nil
	}
	cmd, buf := h.roceEmuCmd(ctx, "rping", "rping", "-s", "--bind", hostIP, "--timeout", "30s")
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		h.writeLog("rping-roce-emu", buf.String())
	}()
	time.Sleep(500 * time.Millisecond)
	out, rc, err := h.guest("time timeout 30 rping -c -a "+hostIP+" -p 9 -C 1", 40*time.Second)
	h.writeLog("rping-guest", out)
	if err != nil {
		return "", fmt.Errorf("guest: %v", err)
	}
	if rc == 0 {
		return "", fmt.Errorf("rping connected to a port nobody listens on: %s", lastLines(out, 2))
	}
	if rc == 124 {
		return "", fmt.Errorf("rping hung until timeout: no REJ: %s", lastLines(out, 2))
	}
	if !strings.Contains(out, "RDMA_CM_EVENT_REJECTED") {
		return "", fmt.Errorf("rping did not report a REJ: %s", lastLines(out, 3))
	}
	return "rping: " + lastLines(out, 4), nil
}

func faultArgs(spec string) []string {
	if spec == "" {
		return nil
	}
	return []string{"--fault", spec}
}

// rxeResources counts the guest's RDMA QPs, MRs and rdma_cm IDs (rdma
// resource show).
func (h *harness) rxeResources() (string, error) {
	out, rc, err := h.guest("for r in qp mr cm_id; do echo $r $(rdma resource show $r | wc -l); done", 20*time.Second)
	if err != nil || rc != 0 {
		return "", fmt.Errorf("rdma resource show: %v (exit %d) %s", err, rc, lastLines(out, 2))
	}
	return strings.Join(strings.Fields(out), " "), nil
}

// rpingCycles runs n roce-emu rping clients, one after the other, against
// rping -s -P in the guest, and compares rxe's resources before and after.
func (h *harness) rpingCycles(n int) (string, error) {
	if err := h.setMTU(1024); err != nil {
		return "", err
	}
	start := "rping -s -P -a " + guestIP + " >/tmp/rping-P.out 2>&1 & echo $! >/tmp/rping-P.pid; " +
		"for i in $(seq 60); do rdma resource show cm_id | grep -q LISTEN && exit 0; sleep 0.5; done; exit 1"
	if out, rc, err := h.guest(start, 40*time.Second); err != nil || rc != 0 {
		return "", fmt.Errorf("rping -s -P did not listen: %v %s", err, lastLines(out, 2))
	}
	defer func() {
		out, _, _ := h.guest("kill $(cat /tmp/rping-P.pid); sleep 0.5; cat /tmp/rping-P.out", 20*time.Second)
		h.writeLog("rping-guest", out)
	}()
	before, err := h.rxeResources()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n)*5*time.Second)
	defer cancel()
	var log strings.Builder
	for i := range n {
		cmd, buf := h.roceEmuCmd(ctx, "rping", "rping", "-c", "--bind", hostIP, "-a", guestIP, "-C", "1", "-v", "-V", "--timeout", "30s")
		err := cmd.Run()
		log.WriteString(buf.String())
		if err != nil {
			h.writeLog("rping-roce-emu", log.String())
			return "", fmt.Errorf("cycle %d: roce-emu: %v: %s", i, err, lastLines(buf.String(), 2))
		}
		if !strings.Contains(buf.String(), "ping data: "+rpingLine(0)) {
			h.writeLog("rping-roce-emu", log.String())
			return "", fmt.Errorf("cycle %d: no ping line: %s", i, lastLines(buf.String(), 2))
		}
	}
	h.writeLog("rping-roce-emu", log.String())
	// rping's per-connection threads free their QP, MRs and cm_id after
	// the disconnect: give them a moment under TCG.
	var after string
	for try := 0; try < 20; try++ {
		time.Sleep(500 * time.Millisecond)
		if after, err = h.rxeResources(); err != nil {
			return "", err
		}
		if after == before {
			break
		}
	}
	if after != before {
		return "", fmt.Errorf("rxe's resources before %q, after %d cycles %q", before, n, after)
	}
	return fmt.Sprintf("%d cycles, each ping validated; rxe's resources before and after: %s", n, after), nil
}
