package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/transport"
)

func runSwitch(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("switch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.100", "the switch's IP `address`")
	var links multiFlag
	fs.Var(&links, "link", "a sender, as PORT=SENDER_ADDR:SENDER_PORT (repeatable): the sender and the receiver's QP for it both use the switch's address and PORT as their peer")
	var receivers multiFlag
	fs.Var(&receivers, "receiver", "the receiver's `address:port` (its RoCEv2 UDP port); given once per --link, in their order, each link's own receiver (several receiving processes on one host, one UDP port each)")
	rate := fs.String("rate", "1", "egress line `rate` (Gb/s, or 100Mbps)")
	q := cc.DefaultQueue(0)
	queueFlags(fs, &q)
	dur := fs.Duration("duration", 0, "stop after this long (default: until interrupted)")
	every := fs.Duration("stats", 0, "print the counters this often (default: only at the end)")
	asJSON := fs.Bool("json", false, "print the counters as JSON")
	seed := fs.Uint64("seed", 1, "random `seed` of the marking")
	pin := fs.Bool("pin-source-ports", false, "through each sender's port, forward the packets to each destination QPN only from the UDP source port of the first one (and other datagrams only from the sender's own address:port); others are dropped and counted as foreign port")
	holdBytes := fs.Int("hold-bytes", transport.DefaultSwitchHoldBytes, "with --pfc, the `bytes` of datagrams held while the egress is paused (on the wire, plus 128 each); beyond them datagrams are dropped and counted")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu switch --receiver ADDR:PORT --link PORT=SENDER:PORT [--link ...] [flags]")
		fmt.Fprintln(stderr, "\nA userspace switch between RoCEv2 peers on real sockets, for machines without red or")
		fmt.Fprintln(stderr, "netem: what senders send to their port goes through one egress queue (line rate,")
		fmt.Fprintln(stderr, "WRED-ECN marking, tail drop or PFC hold) to the receiver; what the receiver sends")
		fmt.Fprintln(stderr, "back goes straight to the sender. ICRCs are rewritten for the switch's headers.")
		fmt.Fprintln(stderr, "A port forwards only what comes from its sender's address (or the receiver's); the")
		fmt.Fprintln(stderr, "queue (--buffer) and the PFC hold (--hold-bytes) are bounded in bytes. Every drop")
		fmt.Fprintln(stderr, "is counted by cause in the counters.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "roce-emu switch: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() != 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	a, err := netip.ParseAddr(*addr)
	if err != nil {
		return fail("--addr %q is not an IP address", *addr)
	}
	var recvs []netip.AddrPort
	for _, r := range receivers {
		recv, err := netip.ParseAddrPort(r)
		if err != nil {
			return fail("--receiver %q: give ADDRESS:PORT, e.g. 127.0.0.2:4791", r)
		}
		recvs = append(recvs, recv)
	}
	if len(recvs) == 0 {
		return fail("--receiver: give the receiver's ADDRESS:PORT, e.g. 127.0.0.2:4791")
	}
	if *holdBytes < 1 {
		return fail("--hold-bytes %d: must be at least 1", *holdBytes)
	}
	cfg := transport.SwitchConfig{Addr: a, Egress: recvs[0], Seed: *seed, HoldBytes: *holdBytes, PinSourcePorts: *pin}
	for _, l := range links {
		p, s, ok := strings.Cut(l, "=")
		port, perr := strconv.ParseUint(p, 10, 16)
		sender, serr := netip.ParseAddrPort(s)
		if !ok || perr != nil || serr != nil || port == 0 {
			return fail("--link %q: give PORT=SENDER_ADDRESS:SENDER_PORT, e.g. 5001=127.0.0.1:4791", l)
		}
		cfg.Ports = append(cfg.Ports, uint16(port))
		cfg.Senders = append(cfg.Senders, sender)
	}
	if len(cfg.Ports) == 0 {
		return fail("no --link given")
	}
	switch {
	case len(recvs) == len(cfg.Ports):
		cfg.Receivers = recvs
	case len(recvs) != 1:
		return fail("%d --receiver for %d --link: give one for all, or one per --link", len(recvs), len(cfg.Ports))
	}
	r, err := cc.ParseRate(*rate)
	if err != nil || r <= 0 {
		return fail("--rate %q: give Gb/s, or a rate such as 100Mbps", *rate)
	}
	q.LineRate = r
	cfg.Queue = q
	if err := q.Check(); err != nil {
		return fail("%v", err)
	}
	sw, err := transport.NewSwitch(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "roce-emu switch: %v\n", err)
		return 1
	}
	defer sw.Close()
	_, restore := setSwitchMemoryLimit(cfg.HoldBytes, q.Buffer, q.PFC)
	defer restore()
	// With --json, stdout carries the JSON alone: the banner goes to stderr.
	banner := stdout
	if *asJSON {
		banner = stderr
	}
	fmt.Fprintf(banner, "switch at %s: egress %v to %s, WRED-ECN Kmin %d Kmax %d Pmax %g, buffer %d, PFC %v", a, r, receivers.String(), q.KMin, q.KMax, q.PMax, q.Buffer, q.PFC)
	if q.PFC {
		fmt.Fprintf(banner, " (hold %d)", cfg.HoldBytes)
	}
	fmt.Fprintln(banner)
	for i, p := range sw.Ports() {
		to := ""
		if len(cfg.Receivers) > 0 {
			to = ", receiver " + cfg.Receivers[i].String()
		}
		fmt.Fprintf(banner, "  port %d <-> sender %s%s\n", p.Port(), cfg.Senders[i], to)
	}
	print := func() {
		st := sw.Stats()
		if *asJSON {
			json.NewEncoder(stdout).Encode(st)
			return
		}
		fmt.Fprintf(stdout, "forwarded %d, returned %d, marked CE %d, dropped %d (tail %d, hold %d, foreign source %d, foreign port %d, oversize %d, send errors %d), pauses %d, not RoCE %d, bad ICRC %d, queue %d B (max %d B), held %d B (max %d B)\n",
			st.Forwarded, st.Returned, st.Marked, st.Dropped, st.TailDrops, st.HoldDrops, st.ForeignSource, st.ForeignPort, st.Oversize, st.SendErrors,
			st.Pauses, st.NotRoCE, st.BadICRC, st.QueueBytes, st.QueueMax, st.HeldBytes, st.HeldMax)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	var end <-chan time.Time
	if *dur > 0 {
		end = time.After(*dur)
	}
	var tick <-chan time.Time
	if *every > 0 {
		t := time.NewTicker(*every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-stop:
			print()
			return 0
		case <-end:
			print()
			return 0
		case <-tick:
			print()
		}
	}
}
