package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/conform"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

type conformFlags struct {
	self     bool
	json     bool
	list     bool
	pcapDir  string
	only     string
	bind     string
	udpPort  uint
	pingpong int
	writeBW  int
	readBW   int
	atomicBW int
	readBidi int
	mtu      int
	wait     time.Duration
	quiet    time.Duration
	setup    time.Duration
	caseTime time.Duration
}

func runConform(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f conformFlags
	fs.BoolVar(&f.self, "self", false, "run every case against roce-emu itself on an in-memory network (all must pass)")
	fs.BoolVar(&f.json, "json", false, `print {"cases": [{"name", "verdict", "ibta", "frames", ...}], ...} instead of a table`)
	fs.BoolVar(&f.list, "list", false, "list the cases and exit")
	fs.StringVar(&f.pcapDir, "pcap-dir", "", "write a capture per case, NN-name.pcap, into this `directory` (the frames cited are its frame numbers)")
	fs.StringVar(&f.only, "only", "", "run only these cases (comma-separated `names`)")
	fs.StringVar(&f.bind, "bind", "", "local IP `address` to send RoCEv2 from (the GID announced); default: the one the route to HOST uses")
	fs.UintVar(&f.udpPort, "udp-port", bth.UDPPort, "UDP `port` for RoCEv2, locally and at the peer")
	fs.IntVar(&f.pingpong, "pingpong", 18515, "TCP `port` of the peer's ibv_rc_pingpong server (0: none; its cases are n/a)")
	fs.IntVar(&f.writeBW, "write-bw", 0, "TCP `port` of the peer's ib_write_bw server (0: none; its cases are n/a)")
	fs.IntVar(&f.readBW, "read-bw", 0, "TCP `port` of the peer's ib_read_bw server (0: none; its cases are n/a)")
	fs.IntVar(&f.atomicBW, "atomic-bw", 0, "TCP `port` of the peer's ib_atomic_bw server (0: none; its cases are n/a)")
	fs.IntVar(&f.readBidi, "read-bw-bidir", 0, "TCP `port` of the peer's ib_read_bw -b server, which READs from the prober (0: none; its cases are n/a)")
	fs.IntVar(&f.mtu, "mtu", 1024, "the path `MTU` ibv_rc_pingpong runs with (its -m), and --self's")
	fs.DurationVar(&f.wait, "wait", time.Second, "how long the peer may take to answer")
	fs.DurationVar(&f.quiet, "quiet", 300*time.Millisecond, "how long the peer must stay silent to count as not answering")
	fs.DurationVar(&f.setup, "setup-wait", 10*time.Second, "how long to keep trying the peer's server for each case (it is restarted between cases)")
	fs.DurationVar(&f.caseTime, "case-timeout", 30*time.Second, "give up a case that takes longer than this")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu conform [--self] [--json] [--pcap-dir DIR] [flags] [HOST]")
		fmt.Fprintln(stderr, "\nRuns IBTA transport conformance cases against an RC peer and gives each a verdict:")
		fmt.Fprintln(stderr, "pass, fail or n/a, with the frames of the case's capture that show it. The peer sets up")
		fmt.Fprintln(stderr, "one connection per case through its own program's exchange: ibv_rc_pingpong's server")
		fmt.Fprintln(stderr, "(--pingpong), ib_write_bw's, ib_read_bw's, ib_atomic_bw's and ib_read_bw -b's (--write-bw,")
		fmt.Fprintln(stderr, "--read-bw, --atomic-bw, --read-bw-bidir). These servers")
		fmt.Fprintln(stderr, "serve one client and exit: run each in a loop on HOST, e.g.")
		fmt.Fprintln(stderr, "  while :; do ibv_rc_pingpong -g 1; done &")
		fmt.Fprintln(stderr, "  while :; do ib_write_bw -p 18516; done &")
		fmt.Fprintln(stderr, "  while :; do ib_read_bw -p 18517; done &")
		fmt.Fprintln(stderr, "  while :; do ib_atomic_bw -p 18518; done &")
		fmt.Fprintln(stderr, "  while :; do ib_read_bw -b -p 18519; done &")
		fmt.Fprintln(stderr, "and then: roce-emu conform --write-bw 18516 --read-bw 18517 --atomic-bw 18518 --read-bw-bidir 18519 HOST")
		fmt.Fprintln(stderr, "Exit status: 0 when nothing failed, 1 when a case failed or could not be set up, 2 for usage.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	cases := conform.Cases()
	if f.list {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CASE\tPEER\tIBTA")
		for _, c := range cases {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Peer, c.IBTA)
		}
		tw.Flush()
		return 0
	}
	if f.only != "" {
		var err error
		if cases, err = selectCases(cases, f.only); err != nil {
			fmt.Fprintf(stderr, "roce-emu conform: --only: %v\n", err)
			return 2
		}
	}
	mtu, err := qp.MTUFromBytes(f.mtu)
	if err != nil {
		fmt.Fprintf(stderr, "roce-emu conform: --mtu %d: path MTU must be 256, 512, 1024, 2048 or 4096\n", f.mtu)
		return 2
	}
	switch {
	case f.self && fs.NArg() != 0:
		fmt.Fprintln(stderr, "roce-emu conform: --self takes no HOST")
		return 2
	case !f.self && fs.NArg() != 1:
		fmt.Fprintln(stderr, "roce-emu conform: give the peer's HOST, or --self")
		fs.Usage()
		return 2
	case f.udpPort == 0 || f.udpPort > 65535:
		fmt.Fprintf(stderr, "roce-emu conform: --udp-port %d: must be 1-65535\n", f.udpPort)
		return 2
	case f.wait <= 0 || f.quiet <= 0 || f.setup <= 0 || f.caseTime <= 0:
		fmt.Fprintln(stderr, "roce-emu conform: --wait, --quiet, --setup-wait and --case-timeout must be positive")
		return 2
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"--pingpong", f.pingpong}, {"--write-bw", f.writeBW}, {"--read-bw", f.readBW}, {"--atomic-bw", f.atomicBW}, {"--read-bw-bidir", f.readBidi}} {
		if p.v < 0 || p.v > 65535 {
			fmt.Fprintf(stderr, "roce-emu conform: %s %d: TCP port must be 1-65535, or 0 for none\n", p.name, p.v)
			return 2
		}
	}
	if f.pcapDir != "" {
		if err := os.MkdirAll(f.pcapDir, 0o755); err != nil {
			fmt.Fprintf(stderr, "roce-emu conform: --pcap-dir: %v\n", err)
			return 1
		}
	}

	var tgt *conform.Target
	name := "self"
	if f.self {
		s, err := conform.NewSelf(conform.SelfOptions{MTU: mtu, Seed: 1})
		if err != nil {
			fmt.Fprintf(stderr, "roce-emu conform: %v\n", err)
			return 1
		}
		defer s.Close()
		tgt = s.Target()
	} else {
		name = fs.Arg(0)
		if tgt, err = liveTarget(name, &f); err != nil {
			fmt.Fprintf(stderr, "roce-emu conform: %v\n", err)
			return 1
		}
	}
	tgt.Wait, tgt.Quiet, tgt.PingpongMTU = f.wait, f.quiet, mtu.Bytes()
	rep, err := conform.Run(context.Background(), tgt, cases, conform.Options{PcapDir: f.pcapDir, CaseTimeout: f.caseTime})
	if err != nil {
		fmt.Fprintf(stderr, "roce-emu conform: %v\n", err)
		return 1
	}
	if f.json {
		out := struct {
			Target string `json:"target"`
			conform.Report
		}{name, rep}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "roce-emu conform: %v\n", err)
			return 1
		}
	} else {
		printConform(stdout, name, rep)
	}
	if rep.Failed > 0 || rep.NotRun > 0 {
		return 1
	}
	return 0
}

func selectCases(all []conform.Case, names string) ([]conform.Case, error) {
	var out []conform.Case
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		found := false
		for _, c := range all {
			if c.Name == n {
				out, found = append(out, c), true
			}
		}
		if !found {
			return nil, fmt.Errorf("no case %q (roce-emu conform --list shows them)", n)
		}
	}
	return out, nil
}

func printConform(w io.Writer, target string, rep conform.Report) {
	// The rows are aligned as one table; each case's detail line goes
	// under its row afterwards (a line without tabs would end the
	// tabwriter's column block and misalign the rows after it).
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tVERDICT\tFRAMES\tIBTA")
	for _, r := range rep.Cases {
		frames := make([]string, len(r.Frames))
		for i, n := range r.Frames {
			frames[i] = strconv.Itoa(n)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, r.Verdict, strings.Join(frames, ","), r.IBTA)
	}
	tw.Flush()
	rows := strings.SplitAfter(table.String(), "\n")
	io.WriteString(w, rows[0])
	for i, r := range rep.Cases {
		if i+1 < len(rows) {
			io.WriteString(w, rows[i+1])
		}
		if r.Detail != "" {
			fmt.Fprintf(w, "  %s\n", r.Detail)
		}
	}
	fmt.Fprintf(w, "%s: %d passed, %d failed, %d n/a", target, rep.Passed, rep.Failed, rep.NA)
	if rep.NotRun > 0 {
		fmt.Fprintf(w, " (%d of them not run)", rep.NotRun)
	}
	fmt.Fprintln(w)
}

// liveTarget opens the prober's UDP socket and dials the peer's servers
// on host, trying each until it answers (it is restarted between cases).
func liveTarget(host string, f *conformFlags) (*conform.Target, error) {
	var local netip.Addr
	if f.bind != "" {
		a, err := netip.ParseAddr(f.bind)
		if err != nil || a.Unmap().IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("--bind %q: give this host's own unicast address (it becomes the GID the peer sends to)", f.bind)
		}
		local = a
	} else {
		// The address the route to host leaves from (no packet is sent).
		c, err := net.Dial("udp", net.JoinHostPort(host, strconv.Itoa(int(f.udpPort))))
		if err != nil {
			return nil, fmt.Errorf("cannot find a route to %s: %v (give --bind)", host, err)
		}
		local = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}
	conn, err := transport.ListenUDP(netip.AddrPortFrom(local, uint16(f.udpPort)), transport.UDPOptions{})
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s UDP port %d: %v", local, f.udpPort, err)
	}
	ports := map[conform.Peer]int{conform.Pingpong: f.pingpong, conform.WriteBW: f.writeBW, conform.ReadBW: f.readBW,
		conform.AtomicBW: f.atomicBW, conform.ReadBWBidir: f.readBidi}
	dial := func(ctx context.Context, p conform.Peer) (net.Conn, error) {
		port := ports[p]
		if port == 0 {
			return nil, conform.ErrNoPeer
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		ctx, cancel := context.WithTimeout(ctx, f.setup)
		defer cancel()
		for {
			// From the prober's address, the GID it announces.
			c, err := dialExchange(ctx, local, host, port)
			if err == nil {
				return c, nil
			}
			if ctx.Err() != nil || !errors.Is(err, syscall.ECONNREFUSED) {
				return nil, fmt.Errorf("%s at %s: %v", p, addr, err)
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%s at %s: %v", p, addr, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return &conform.Target{Conn: conn, Dial: dial, UDPPort: uint16(f.udpPort)}, nil
}
