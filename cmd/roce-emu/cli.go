package main

// What every command shares on the command line: getopt-style flags
// anywhere, help CMD, version, the run's context (--timeout, SIGINT and
// SIGTERM) and the hint on an address in use.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// parseInterspersed parses args as GNU getopt does (perftest's and
// rdma-core's programs use getopt_long): flags may come before, between
// and after the positional arguments, and "--" ends the flags, everything
// after it being positional. Go's flag package stops at the first
// positional, so each stretch of flags after a positional is parsed again
// into the same set. On return fs.Args() holds the positionals, in order.
// The error is the flag package's (flag.ErrHelp for -h).
func parseInterspersed(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// A parse of "--" alone sets no flag and leaves the positionals as
	// the set's arguments, for fs.NArg and fs.Arg.
	return fs.Parse(append([]string{"--"}, pos...))
}

// runHelp is "roce-emu help [CMD]": the general help, or CMD's own usage
// (what "roce-emu CMD -h" prints) on stdout.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return 0
	}
	if len(args) > 1 {
		fmt.Fprintf(stderr, "roce-emu help: one command at a time (got %d)\n", len(args))
		return 2
	}
	switch args[0] {
	case "help":
		fmt.Fprintln(stdout, "usage: roce-emu help [COMMAND]: the list of commands, or COMMAND's usage and flags")
		return 0
	case "version":
		fmt.Fprintln(stdout, "usage: roce-emu version: the module's version, VCS revision and time, and the Go version")
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run([]string{"-h"}, stdout, stdout)
		}
	}
	fmt.Fprintf(stderr, "roce-emu help: unknown command %q; run 'roce-emu help' for the list\n", args[0])
	return 2
}

// runVersion is "roce-emu version" and "roce-emu --version": the main
// module's version from the build information (runtime/debug.ReadBuildInfo:
// a tag or pseudo-version when built by "go install module@version",
// "(devel)" otherwise), the VCS revision and time when it was built from a
// git checkout, and the Go version.
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintf(stderr, "roce-emu version: unexpected argument %q\n", args[0])
		return 2
	}
	fmt.Fprintln(stdout, versionLine())
	return 0
}

func versionLine() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "roce-emu (no build information) " + runtime.Version()
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)" // a test binary has no main module version
	}
	line := "roce-emu " + bi.Main.Path + " " + v
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = " (modified)"
			}
		}
	}
	if rev != "" {
		line += " revision " + rev + dirty
		if at != "" {
			line += " " + at
		}
	}
	return line + " " + bi.GoVersion
}

// runContext is a run's context: cancelled after timeout (none when 0, the
// default of the commands that wait for a peer: perftest, rc_pingpong and
// rping wait for ever) or on SIGINT or SIGTERM, whichever comes first, so
// that a command stopped either way ends through its error path, which
// prints its counters. The cause (context.Cause) names the signal.
func runContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancelCause := context.WithCancelCause(context.Background())
	ctx = context.WithValue(ctx, signalsHandled{}, true) // withSignals subscribes no second time
	sig, stopSigs := signalSource()
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			cancelCause(&signalStop{sig: s})
		case <-done:
		}
	}()
	tctx, tcancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		tctx, tcancel = context.WithTimeout(ctx, timeout)
	}
	return tctx, func() {
		stopSigs()
		close(done)
		tcancel()
		cancelCause(context.Canceled)
	}
}

// signalsHandled marks a context whose runContext listens for SIGINT
// and SIGTERM.
type signalsHandled struct{}

// signalStop is the cause of a run's context that a signal ended:
// "stopped by SIGINT" or "stopped by SIGTERM".
type signalStop struct{ sig os.Signal }

func (e *signalStop) Error() string { return "stopped by " + signalName(e.sig) }

// stoppedBy is the signal that cancelled ctx, as an error, or nil when
// none did.
func stoppedBy(ctx context.Context) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) && !errors.Is(c, context.DeadlineExceeded) {
		return c
	}
	return nil
}

// addrInUseHint adds to err, when it is EADDRINUSE, what to do about it
// on the same line: hint says who holds the address and which flags
// choose another.
func addrInUseHint(err error, hint string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w (%s)", err, hint)
}

// udpInUse and tcpInUse are addrInUseHint's hints for the RoCEv2 socket
// and the out-of-band exchange's listener.
const (
	udpInUse = "another roce-emu, or rxe, already receives RoCEv2 on this address and port: stop it, or use --bind with another address (127.0.0.2, 127.0.0.3, ... on loopback) or another --udp-port on both sides"
	tcpInUse = "another roce-emu or perftest/pingpong server already listens on this TCP port: stop it, or give both sides another -p"
)

// whyStopped is why a wait under ctx ended with err: the signal or the
// --timeout that cancelled ctx (context.Cause), rather than what closing a
// listener makes Accept say ("use of closed network connection").
func whyStopped(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil {
		if errors.Is(c, context.DeadlineExceeded) {
			return errors.New("--timeout expired")
		}
		return c
	}
	return err
}

// deadPathAfter is how many local ACK timeouts, with not one packet ever
// received from the peer, make watchDeadPath speak: past the first
// retries, well before retry_cnt (7) runs out or --timeout ends the run.
const deadPathAfter = 3

// watchDeadPath watches connected QPs and, when they have had
// deadPathAfter ACK timeouts without ever receiving a packet from their
// peer, says once on w what to check: the peer's RoCEv2 UDP port, the
// address it announced, a firewall. It stops watching once a packet came;
// the returned stop waits for the watcher to end.
func watchDeadPath(ctx context.Context, w io.Writer, qps ...*transport.QP) (stop func()) {
	if w == nil || len(qps) == 0 {
		return func() {}
	}
	return poll(ctx, 50*time.Millisecond, func(<-chan struct{}) bool {
		var timeouts, received uint64
		for _, q := range qps {
			c := q.Counters()
			timeouts += c.LocalAckTimeoutErr
			received += c.ReceivedPackets
		}
		if received > 0 {
			return false
		}
		if timeouts >= deadPathAfter {
			fmt.Fprintln(w, deadPathLine(timeouts, qps[0].Attr().AV))
			return false
		}
		return true
	}, nil)
}

// deadPathLine is watchDeadPath's line for a QP whose address vector is av.
func deadPathLine(timeouts uint64, av qp.AddressVector) string {
	port := av.Remote.Port()
	if port == 0 {
		port = bth.UDPPort
	}
	return fmt.Sprintf("roce-emu: %d ACK timeouts and not one RoCEv2 packet back from %s UDP port %d: check that the peer receives RoCEv2 on UDP port %d (--udp-port, the same on both sides; rxe uses 4791), that %s, the address it announced, is its own and reachable from this side's --bind address, and that no firewall drops UDP port %d",
		timeouts, av.Remote.Addr(), port, port, av.Remote.Addr(), port)
}

// defaultPeerTimeout is --peer-timeout's default: far longer than any
// ACK timeout of the run (-u 14: 67 ms, retried without end) and than the
// stalls of several seconds a guest under qemu's TCG makes (interop/run),
// short enough that a user whose peer died is told in half a minute.
const defaultPeerTimeout = 30 * time.Second

// checkPeerTimeout refuses a --peer-timeout watchPeerSilence cannot use:
// negative, or under the 1 ms its poll step needs (0 turns it off).
func checkPeerTimeout(d time.Duration) error {
	if d < 0 || (d > 0 && d < time.Millisecond) {
		return fmt.Errorf("--peer-timeout %v: give 0 (never) or at least 1ms", d)
	}
	return nil
}

// errPeerSilent is the cause of a run watchPeerSilence stopped.
var errPeerSilent = errors.New("stopped: nothing from the peer (said above)")

// watchPeerSilence watches a run's QPs while traffic runs and, when not
// one packet has come to them for timeout, says so on w in one line
// naming what to check, and cancels the returned context with
// errPeerSilent. During traffic a live peer sends all the time: ACKs for
// this side's requests, its own requests, or both; a side waiting for the
// peer's next message (a latency test, a ping-pong) has nothing
// outstanding, which is why silence alone counts. A QP's retry_cnt of 7
// never runs out (rxe's reading, qp.InitAttr.StrictRetryCount off), so
// without this a side whose peer died or whose path went dead would wait
// or retry for ever. timeout 0 watches nothing. stop waits for the
// watcher to end.
func watchPeerSilence(ctx context.Context, w io.Writer, kind string, timeout time.Duration, qps ...*transport.QP) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if timeout <= 0 || len(qps) == 0 {
		return ctx, func() { cancel(context.Canceled) }
	}
	every := max(time.Millisecond, min(time.Second, timeout/10))
	start := time.Now()
	stop := poll(ctx, every, func(<-chan struct{}) bool {
		if time.Since(lastHeard(start, qps...)) < timeout {
			return true
		}
		var timeouts, resent uint64
		outstanding := 0
		for _, q := range qps {
			c := q.Counters()
			timeouts += c.LocalAckTimeoutErr
			resent += c.RetransmittedPkts
			outstanding += q.SendQueued()
		}
		av := qps[0].Attr().AV
		port := av.Remote.Port()
		if port == 0 {
			port = bth.UDPPort
		}
		fmt.Fprintf(w, "roce-emu %s: not one RoCEv2 packet from the peer %s UDP port %d for %v (%d work requests outstanding, %d ACK timeouts, %d packets resent): the peer has stopped or the path is dead: check that the peer still runs, that %s is reachable from this side's --bind address, that both sides use the same --udp-port, and that no firewall drops UDP port %d (--peer-timeout sets this wait, 0 never ends it)\n",
			kind, av.Remote.Addr(), port, timeout, outstanding, timeouts, resent, av.Remote.Addr(), port)
		cancel(errPeerSilent)
		return false
	}, nil)
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// saidAbove is err, or errPeerSilent when watchPeerSilence, which has
// said why on stderr, cancelled ctx: the exchange step its cancel
// interrupted (a server waiting on the barrier after traffic) would
// otherwise add "context canceled" under that line. watchMismatch's stop
// keeps the step's error: it names what the peer's test sent.
func saidAbove(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), errPeerSilent) {
		return errPeerSilent
	}
	return err
}

// lastHeard is when the peer was last heard from by any of qps (the last
// packet handed to one of them, transport.QP.LastReceived), or since when
// it was not later than that.
func lastHeard(since time.Time, qps ...*transport.QP) time.Time {
	for _, q := range qps {
		if t := q.LastReceived(); t.After(since) {
			since = t
		}
	}
	return since
}

// mismatchRNRs is how many RNR NAKs, making at least half of all the
// packets that came back, tell a SEND side that its peer posts no
// receives at all (a side of -o write, read or atomic) rather than
// being a little behind.
const mismatchRNRs = 4

// mismatchLinger is how long a side that found a mismatch keeps its QP
// before stopping, so that the peer finds it too.
const mismatchLinger = 250 * time.Millisecond

// watchMismatch watches the QP of a perftest run (bw or lat) for the
// signs of a peer that runs another test, since perftest's exchange
// carries neither operation nor size: RNR NAKs sent by a side that posts
// no receives (the peer sends SENDs to a WRITE, READ or atomic side);
// nothing but RNR NAKs back at a SEND side (the peer posts no receives);
// remote access errors answered (the peer's WRITE, READ or atomic goes
// beyond the region this side advertised: another -s or -o). On the first
// it says so in one line on w and cancels the returned context, with the
// line as the cause. stop waits for the watcher to end.
func watchMismatch(ctx context.Context, w io.Writer, kind string, op qp.WROpcode, f *perfFlags, q *transport.QP) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := poll(ctx, 20*time.Millisecond, func(stopping <-chan struct{}) bool {
		msg := mismatchLine(op, f, q.Counters())
		if msg == "" {
			return true
		}
		fmt.Fprintf(w, "roce-emu %s: %s\n", kind, msg)
		// A moment for the peer to see the same before this
		// side's QP goes.
		select {
		case <-time.After(mismatchLinger):
		case <-stopping:
		}
		cancel(errMismatch)
		return false
	}, nil)
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// errMismatch is the cause of a run watchMismatch stopped.
var errMismatch = errors.New("stopped: the peer runs another test (said above)")

// mismatchLine is watchMismatch's line for counters c, or "".
func mismatchLine(op qp.WROpcode, f *perfFlags, c qp.Counters) string {
	side := fmt.Sprintf("this side's -o %s -s %d", f.op, f.size)
	if f.all {
		side = fmt.Sprintf("this side's -o %s -a", f.op)
	}
	switch {
	case op != qp.IBV_WR_SEND && c.SendRNRErr > 0:
		return fmt.Sprintf("the peer sends SENDs, which %s posts no receive for (%d RNR NAKs sent): start both sides with the same -o", side, c.SendRNRErr)
	case op == qp.IBV_WR_SEND && c.RNRNakRetryErr >= mismatchRNRs && 2*c.RNRNakRetryErr >= c.ReceivedPackets:
		return fmt.Sprintf("the peer answers %s with RNR NAKs (%d of %d packets back): it posts no receives, as a side of -o write, read or atomic: start both sides with the same -o", side, c.RNRNakRetryErr, c.ReceivedPackets)
	case c.RespRemoteAccessErr > 0:
		return fmt.Sprintf("the peer's requests go beyond the region %s advertised (%d remote access errors sent): start both sides with the same -o and -s (or -a on both)", side, c.RespRemoteAccessErr)
	}
	return ""
}

// remoteAccessLine is what a side whose request failed with
// IBV_WC_REM_ACCESS_ERR adds to its error when it runs one size (-a has
// its own hint): the peer's region is smaller, or it runs another test.
func remoteAccessLine(failed qp.WCStatus, f *perfFlags) string {
	if failed != qp.IBV_WC_REM_ACCESS_ERR || f.all {
		return ""
	}
	return fmt.Sprintf(" (the peer refused a request of -s %d with a remote access error: its buffer is smaller, or it runs another -o: start both sides with the same -o and -s)", f.size)
}

// jsonOut is --json on the commands that run traffic (server, client,
// bw, lat): stdout gets one JSON object at the end, and the human text
// that would have gone there goes to stderr, so that stdout can be piped
// to jq as it is.
type jsonOut struct {
	on bool
	w  io.Writer // stdout
}

func (j *jsonOut) register(fs *flag.FlagSet, what string) {
	fs.BoolVar(&j.on, "json", false, "print "+what+" as one JSON object on stdout (64-bit counts as strings, as tshark's JSON; rates with their unit in the key), the text on stderr")
}

// text is where the human text goes: stderr under --json, else stdout.
func (j *jsonOut) text(stdout, stderr io.Writer) io.Writer {
	j.w = stdout
	if j.on {
		return stderr
	}
	return stdout
}

// emit writes v as one line of JSON, under --json.
func (j *jsonOut) emit(v any) error {
	if !j.on || j.w == nil {
		return nil
	}
	return json.NewEncoder(j.w).Encode(v)
}

// countersJSON is a struct of counters (qp.Counters, transport.Stats) as
// a JSON object under its own keys (the rxe and mlx5 names), every integer
// a decimal string: tshark's JSON writes 64-bit fields so, since jq and
// JavaScript read numbers as doubles, exact only below 2^53.
func countersJSON(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	for k, x := range m {
		if n, ok := x.(json.Number); ok {
			if _, err := strconv.ParseUint(string(n), 10, 64); err == nil {
				m[k] = string(n)
			}
		}
	}
	return m, nil
}

// pingpongJSON is server's and client's --json object.
type pingpongJSON struct {
	Program    string         `json:"program"` // ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong or ibv_srq_pingpong
	Role       string         `json:"role"`    // server or client
	Size       int            `json:"size"`    // -s, bytes per message
	Iters      int            `json:"iters"`   // -n
	Bytes      string         `json:"bytes"`   // both directions, as rc_pingpong's "bytes in"
	Seconds    float64        `json:"seconds"`
	MbitPerSec float64        `json:"bandwidth_mbit_per_sec"` // rc_pingpong's Mbit/sec (10^6 bits)
	UsecIter   float64        `json:"usec_per_iter"`
	Counters   map[string]any `json:"counters"` // QP 0's (qp.Counters keys)
	Endpoint   map[string]any `json:"endpoint"` // the RoCEv2 socket's (transport.Stats keys)
}

// emitPingpong writes server's and client's --json object.
func emitPingpong(f *pingpongFlags, mode string, bytes int64, secs float64, c qp.Counters, st transport.Stats) error {
	if !f.js.on {
		return nil
	}
	cj, err := countersJSON(c)
	if err != nil {
		return err
	}
	sj, err := countersJSON(st)
	if err != nil {
		return err
	}
	return f.js.emit(pingpongJSON{Program: f.program(), Role: mode, Size: f.size, Iters: f.iters, Bytes: strconv.FormatInt(bytes, 10),
		Seconds: secs, MbitPerSec: float64(bytes) * 8 / secs / 1e6, UsecIter: secs * 1e6 / float64(f.iters), Counters: cj, Endpoint: sj})
}

// perfJSONOut is bw's and lat's --json object: perftest's --out_json
// object (its keys, BW_peak and BW_average in bw_unit), the unit, and QP
// 0's counters.
type perfJSONOut struct {
	Perftest *perfJSON      `json:"perftest"`
	BWUnit   string         `json:"bw_unit,omitempty"` // "MB/sec" (2^20 bytes) or "Gb/sec" (--report_gbits)
	Counters map[string]any `json:"counters"`
}

// writePerfJSON writes --out_json's file and --json's object.
func writePerfJSON(j *perfJSON, f *perfFlags, kind string, c qp.Counters) error {
	if f.outJSON {
		if err := j.write(f.jsonFile); err != nil {
			return err
		}
	}
	if !f.js.on {
		return nil
	}
	cj, err := countersJSON(c)
	if err != nil {
		return err
	}
	o := perfJSONOut{Perftest: j, Counters: cj}
	if kind == "bw" {
		o.BWUnit = "MB/sec"
		if f.gbits {
			o.BWUnit = "Gb/sec"
		}
	}
	return f.js.emit(o)
}

// isTerminal reports whether w is a terminal (a character device), as the
// progress line asks of both stdout and stderr.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressEvery is how often the progress line is redrawn, and how long a
// run goes before it first appears.
const progressEvery = time.Second

// watchProgress draws a progress line on w every progressEvery while a run
// goes on, when on (stdout and stderr are terminals): the time so far and
// the packets QPs sent, received and sent again. The line is drawn from
// the first column, cleared to its end, and the cursor left at its start,
// so that the next line the run prints overwrites it (it is shorter than
// any result line). stop clears it.
func watchProgress(ctx context.Context, on bool, w io.Writer, qps ...*transport.QP) (stop func()) {
	if !on || w == nil || len(qps) == 0 {
		return func() {}
	}
	start := time.Now()
	drawn := false
	return poll(ctx, progressEvery, func(<-chan struct{}) bool {
		var c qp.Counters
		for _, q := range qps {
			k := q.Counters()
			c.SentPackets += k.SentPackets
			c.ReceivedPackets += k.ReceivedPackets
			c.RetransmittedPkts += k.RetransmittedPkts
		}
		fmt.Fprint(w, "\r\x1b[K"+progressLine(time.Since(start), c)+"\r")
		drawn = true
		return true
	}, func() {
		if drawn {
			fmt.Fprint(w, "\r\x1b[K")
		}
	})
}

// poll runs step every interval on a goroutine of its own until step
// returns false, ctx ends or the returned stop is called (step sees that
// as stopping closed); then end, if not nil, runs. stop waits for all of
// it to finish. The watchers of this file are polls.
func poll(ctx context.Context, every time.Duration, step func(stopping <-chan struct{}) bool, end func()) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		if end != nil {
			defer end()
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !step(done) {
				return
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

// progressLine is the progress line's text.
func progressLine(el time.Duration, c qp.Counters) string {
	return fmt.Sprintf(" %4.0f s: packets sent %d, received %d, resent %d", el.Seconds(), c.SentPackets, c.ReceivedPackets, c.RetransmittedPkts)
}

// demoRecord is demo's --json object: a row per line of its table, then
// the totals and both peers' counters. Counts are strings, as in the
// other commands' JSON; nil records nothing (demo without --json).
type demoRecord struct {
	Rows          []demoRow      `json:"rows"`
	Messages      int            `json:"messages"`
	Bytes         string         `json:"bytes"`
	Requester     map[string]any `json:"requester_counters"` // A's QP (qp.Counters keys)
	Responder     map[string]any `json:"responder_counters"` // B's QP
	Endpoint      map[string]any `json:"requester_endpoint"` // A's socket (transport.Stats keys)
	InjectedDrops string         `json:"injected_drops"`     // packets --loss and --fault dropped, both ways
	Capture       string         `json:"capture,omitempty"`  // the --pcap file
}

// demoRow is one line of demo's table; the counters are A's during the
// line, under qp.Counters' keys.
type demoRow struct {
	Loss      float64  `json:"loss"`
	Operation string   `json:"operation"`
	Size      int      `json:"size"` // bytes per message
	Msgs      int      `json:"msgs"`
	TimeMs    float64  `json:"time_ms"`
	Gbps      *float64 `json:"bandwidth_gbit_per_sec,omitempty"` // none for atomics
	Retrans   string   `json:"retransmitted_pkts"`
	SeqNAK    string   `json:"packet_seq_err"`
	Timeout   string   `json:"local_ack_timeout_err"`
	Implied   string   `json:"implied_nak_seq_err"`
	Data      string   `json:"data"` // "verified": every byte checked
}

func (r *demoRecord) row(loss float64, op string, size, msgs int, el time.Duration, bw bool, before, c qp.Counters) {
	if r == nil {
		return
	}
	u := func(a, b uint64) string { return strconv.FormatUint(a-b, 10) }
	row := demoRow{Loss: loss, Operation: op, Size: size, Msgs: msgs, TimeMs: float64(el.Microseconds()) / 1000,
		Retrans: u(c.RetransmittedPkts, before.RetransmittedPkts), SeqNAK: u(c.PacketSeqErr, before.PacketSeqErr),
		Timeout: u(c.LocalAckTimeoutErr, before.LocalAckTimeoutErr), Implied: u(c.ImpliedNakSeqErr, before.ImpliedNakSeqErr), Data: "verified"}
	if bw {
		g := float64(size*msgs) * 8 / el.Seconds() / 1e9
		row.Gbps = &g
	}
	r.Rows = append(r.Rows, row)
}

func (r *demoRecord) finish(msgs, bytes int, a, b qp.Counters, st transport.Stats, drops uint64, capture string) error {
	if r == nil {
		return nil
	}
	var err error
	r.Messages, r.Bytes, r.InjectedDrops, r.Capture = msgs, strconv.Itoa(bytes), strconv.FormatUint(drops, 10), capture
	if r.Requester, err = countersJSON(a); err != nil {
		return err
	}
	if r.Responder, err = countersJSON(b); err != nil {
		return err
	}
	r.Endpoint, err = countersJSON(st)
	return err
}
