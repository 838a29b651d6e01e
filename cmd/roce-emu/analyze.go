package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/roce-emu/roce-emu/bth"

	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/pcap/analyze"
)

func runAnalyze(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, `write one JSON object per file: {"file", "connections": [...], "summary": {...}}`)
	port := fs.Uint("udp-port", 4791, "UDP destination `port` that marks RoCEv2 packets")
	maxConns := fs.Int("max-connections", 4096, "connections tracked at once (beyond them the least recently active sixteenth is evicted and counted)")
	mtu := fs.Int("mtu", 0, "path MTU in bytes (0: inferred from FIRST and MIDDLE payloads)")
	minCNP := fs.Duration("min-cnp-interval", 0, "count CNP intervals shorter than this (0: not checked)")
	bin := fs.Duration("bin", 0, "throughput bin (0: 1ms)")
	plotDir := fs.String("plot", "", "write pictures to `DIR`: per connection PSN over time (resends and NAKs marked) and throughput, FILE-connN.png")
	ladder := fs.String("ladder", "", "with --plot, also draw a ladder diagram of frames `FROM-TO` (at most 200 frames), FILE-ladder.png")
	svg := fs.Bool("svg", false, "with --plot, write SVG instead of PNG")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu analyze [--json] [flags] FILE...")
		fmt.Fprintln(stderr, "\nRebuilds the RoCEv2 connections of pcap or pcapng captures and reports, per")
		fmt.Fprintln(stderr, "connection: messages (resends counted once), bytes, PSN range, go-back-N episodes")
		fmt.Fprintln(stderr, "(cause, first resend, delay), ACK timeouts, NAKs and RNR waits, RTT, CE marks and")
		fmt.Fprintln(stderr, "CNPs, throughput, and expert-info checks with frame numbers.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if err := parseInterspersed(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	files := fs.Args()
	if len(files) == 0 {
		fmt.Fprintln(stderr, "roce-emu analyze: no capture file given")
		fs.Usage()
		return 2
	}
	if *port == 0 || *port > 65535 {
		fmt.Fprintf(stderr, "roce-emu analyze: --udp-port %d: must be 1-65535\n", *port)
		return 2
	}
	if *maxConns < 1 || *mtu < 0 || *minCNP < 0 || *bin < 0 {
		fmt.Fprintln(stderr, "roce-emu analyze: --max-connections must be at least 1; --mtu, --min-cnp-interval and --bin not negative")
		return 2
	}
	cfg := analyze.Config{MaxConnections: *maxConns, PathMTU: *mtu, MinCNPInterval: *minCNP, Bin: *bin}
	var lad [2]int
	if *ladder != "" {
		if _, err := fmt.Sscanf(*ladder, "%d-%d", &lad[0], &lad[1]); err != nil || lad[0] < 1 || lad[1] < lad[0] || lad[1]-lad[0] >= maxLadder {
			fmt.Fprintf(stderr, "roce-emu analyze: --ladder %q: want FROM-TO, frame numbers from 1, at most %d frames\n", *ladder, maxLadder)
			return 2
		}
		if *plotDir == "" {
			fmt.Fprintln(stderr, "roce-emu analyze: --ladder needs --plot DIR")
			return 2
		}
	}
	if *plotDir != "" {
		cfg.Points = plotPoints
		if err := os.MkdirAll(*plotDir, 0o755); err != nil {
			fmt.Fprintf(stderr, "roce-emu analyze: %v\n", err)
			return 1
		}
	}
	ext := ".png"
	if *svg {
		ext = ".svg"
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	code := 0
	for _, name := range files {
		rep, frames, err := analyzeFile(name, uint16(*port), cfg, lad)
		if rep != nil && *plotDir != "" {
			base := filepath.Join(*plotDir, strings.TrimSuffix(filepath.Base(name), filepath.Ext(name)))
			for i, c := range rep.Connections {
				if perr := writeConnPlot(fmt.Sprintf("%s-conn%d%s", base, i+1, ext), c); perr != nil && err == nil {
					err = perr
				}
			}
			if *ladder != "" {
				title := fmt.Sprintf("%s frames %d-%d", filepath.Base(name), lad[0], lad[1])
				if perr := writeLadder(base+"-ladder"+ext, title, frames); perr != nil && err == nil {
					err = fmt.Errorf("%s: --ladder: %w", name, perr)
				}
			}
		}
		if rep != nil {
			if *asJSON {
				if err := json.NewEncoder(out).Encode(rep); err != nil {
					fmt.Fprintf(stderr, "roce-emu analyze: %v\n", err)
					return 1
				}
			} else {
				writeAnalysis(out, rep, len(files) > 1)
			}
		}
		if err != nil {
			out.Flush()
			fmt.Fprintf(stderr, "roce-emu analyze: %v\n", err)
			code = 1
		}
	}
	return code
}

// analyzeFile analyzes one capture. A capture that breaks off is reported
// as far as it was read, with the error.
func analyzeFile(name string, port uint16, cfg analyze.Config, lad [2]int) (*analyze.Report, []ladderFrame, error) {
	r, err := pcap.Open(name)
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	d := pcap.NewDecoder()
	d.Port = port
	a := analyze.New(cfg)
	var rec pcap.Record
	var readErr error
	var frames []ladderFrame
	var start time.Time
	for n := 1; ; n++ {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = fmt.Errorf("%s: %w", name, err)
			break
		}
		k, err := d.Decode(data, ci, lt, &rec)
		if err != nil {
			if errors.Is(err, pcap.ErrLinkType) {
				a.AddOtherLinkType(lt)
				continue
			}
			return nil, nil, fmt.Errorf("%s: frame %d: %w", name, n, err)
		}
		if n == 1 {
			start = rec.Time
		}
		a.Add(n, k, &rec)
		if k == pcap.KindRoCE && n >= lad[0] && n <= lad[1] {
			frames = append(frames, ladderFrame{frame: n, us: float64(rec.Time.Sub(start)) / 1e3,
				src: rec.Src.String(), dst: rec.Dst.String(), label: ladderLabel(&rec)})
		}
	}
	rep := a.Report()
	rep.File = name
	return rep, frames, readErr
}

// maxLadder bounds the frames of a ladder diagram.
const maxLadder = 200

func ladderLabel(rec *pcap.Record) string {
	p := &rec.Packet
	s := fmt.Sprintf("%s %d", p.BTH.Opcode, p.BTH.PSN)
	if p.BTH.Opcode.Info().Ext&bth.ExtAETH != 0 {
		s += " " + p.AETH.Syndrome.KindName()
	}
	if rec.ECN == bth.CE {
		s += " CE"
	}
	return s
}

// textEpisodes is how many go-back-N episodes the text report lists per
// connection.
const textEpisodes = 20

func writeAnalysis(out *bufio.Writer, rep *analyze.Report, many bool) {
	if many {
		fmt.Fprintf(out, "== %s\n", rep.File)
	}
	s := &rep.Summary
	fmt.Fprintf(out, "%d frames, %d RoCEv2 packets, %d malformed, %d non-RoCE, %d bad ICRC over %.6f s: %d connections",
		s.Frames, s.RoCE, s.Malformed, s.NonRoCE, s.BadICRC, s.DurationUs/1e6, s.Connections)
	if s.EvictedConnections > 0 {
		fmt.Fprintf(out, " (%d more evicted, not reported)", s.EvictedConnections)
	}
	out.WriteByte('\n')
	if s.IPFragments+s.Reassembled > 0 {
		fmt.Fprintf(out, "ip fragments: %d held, %d datagrams reassembled\n", s.IPFragments, s.Reassembled)
	}
	if len(s.OtherLinkTypes) > 0 {
		fmt.Fprintf(out, "other link types skipped:%s\n", counts(s.OtherLinkTypes))
	}
	if s.UnmatchedResponses+s.UnmatchedCNPs > 0 {
		fmt.Fprintf(out, "unmatched: %d responses, %d CNPs (their requests are not in the capture)\n", s.UnmatchedResponses, s.UnmatchedCNPs)
	}
	if len(s.CNPPorts) > 0 {
		keys := make([]string, 0, len(s.CNPPorts))
		for k := range s.CNPPorts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := s.CNPPorts[k]
			fmt.Fprintf(out, "CNPs from %s: %d, shortest interval %.1f us", k, p.CNPs, p.IntervalMinUs)
			if p.UnderMin > 0 {
				fmt.Fprintf(out, ", %d under the minimum interval", p.UnderMin)
			}
			out.WriteByte('\n')
		}
	}
	if len(s.UnmatchedCNPsTo) > 0 {
		fmt.Fprintf(out, "unmatched CNPs by destination QP:%s\n", counts(s.UnmatchedCNPsTo))
	}
	for _, x := range s.CM {
		writeCMExchange(out, &x)
	}
	if s.CMNotTracked > 0 {
		fmt.Fprintf(out, "CM: %d more REQs not tracked (--max-connections)\n", s.CMNotTracked)
	}
	for i, c := range rep.Connections {
		fmt.Fprintf(out, "\nconnection %d: %s %s -> %s", i+1, c.Transport, c.Requester, c.Responder)
		if c.Epoch > 0 {
			fmt.Fprintf(out, " (epoch %d: QPN reused)", c.Epoch)
		}
		fmt.Fprintf(out, "\n  frames %d..%d, %.6f s from %.6f s\n", c.FirstFrame, c.LastFrame, c.DurationUs/1e6, c.StartUs/1e6)
		fmt.Fprintf(out, "  requests: %d packets, %d messages%s, %d bytes", c.Packets, c.Messages, counts(c.MessagesByKind), c.Bytes)
		if c.ReadBytes > 0 {
			fmt.Fprintf(out, ", %d bytes read", c.ReadBytes)
		}
		if c.PSN != nil {
			fmt.Fprintf(out, ", PSN %d..%d (%d)", c.PSN.First, c.PSN.Last, c.PSN.Count)
		}
		if c.PathMTU > 0 {
			fmt.Fprintf(out, ", path MTU %d", c.PathMTU)
		}
		if c.CMStartingPSN != nil {
			fmt.Fprintf(out, ", CM starting PSN %d", *c.CMStartingPSN)
		}
		out.WriteByte('\n')
		if c.Transport == "RC" {
			fmt.Fprintf(out, "  responses: %d packets, %d ACKs, %d NAKs, %d RNR NAKs, %d re-ACKs, %d implied NAKs, %d READ responses resent\n",
				c.ResponsePackets, c.ACKs, c.NAKs, c.RNRNAKs, c.ReACKs, c.ImpliedNAKs, c.ReadResent)
			fmt.Fprintf(out, "  retransmitted: %d packets, %d bytes, in %d go-back-N episodes (%d after ACK timeouts), %d duplicates\n",
				c.RetransmittedPackets, c.RetransmittedBytes, len(c.GBNEpisodes)+c.EpisodesNotListed, c.Timeouts, c.Duplicates)
			for j, e := range c.GBNEpisodes {
				if j == textEpisodes {
					fmt.Fprintf(out, "    ... %d more (--json lists them)\n", len(c.GBNEpisodes)-j)
					break
				}
				if e.FirstResendFrame == 0 {
					fmt.Fprintf(out, "    %-8s frame %d: gone back again before any resend\n", e.Cause, e.StartFrame)
					continue
				}
				fmt.Fprintf(out, "    %-8s frame %d -> resend frame %d after %.1f us: from PSN %d (%s), %d packets, %d bytes\n",
					e.Cause, e.StartFrame, e.FirstResendFrame, e.DelayUs, e.FromPSN, e.ResendFrom, e.PacketsResent, e.BytesResent)
			}
			if c.EpisodesNotListed > 0 {
				fmt.Fprintf(out, "    ... %d more episodes\n", c.EpisodesNotListed)
			}
			for _, w := range c.RNRWaits {
				seen := "no resend seen"
				if w.ResendSeen {
					seen = fmt.Sprintf("waited %.1f us", w.SeenUs)
				}
				fmt.Fprintf(out, "    RNR NAK frame %d: timer code %d asks %.0f us, %s\n", w.Frame, w.TimerCode, w.AskedUs, seen)
			}
			if c.RTT.Samples > 0 {
				fmt.Fprintf(out, "  rtt: %d samples, p50 %.1f us, p99 %.1f us, min %.1f us, max %.1f us\n",
					c.RTT.Samples, *c.RTT.P50, *c.RTT.P99, *c.RTT.Min, *c.RTT.Max)
			}
		}
		if c.CEMarked+c.CEResponses+c.CNPs > 0 {
			fmt.Fprintf(out, "  congestion: %d requests and %d responses CE-marked, %d CNPs", c.CEMarked, c.CEResponses, c.CNPs)
			if c.CNPs > 0 {
				fmt.Fprintf(out, " from %s", c.CNPFrom)
			}
			if c.CNPs > 1 {
				fmt.Fprintf(out, ", shortest interval %.1f us", c.CNPIntervalMin)
			}
			if c.CNPsUnderMin > 0 {
				fmt.Fprintf(out, ", %d under the minimum interval", c.CNPsUnderMin)
			}
			out.WriteByte('\n')
		}
		if len(c.Throughput) > 1 {
			peak := 0.0
			for _, b := range c.Throughput {
				peak = max(peak, b.Gbps)
			}
			fmt.Fprintf(out, "  throughput: %d bins of %.0f us, peak %.3f Gb/s\n", len(c.Throughput), c.BinUs, peak)
		}
		if len(c.ChecksByKind) > 0 {
			fmt.Fprintf(out, "  checks:%s\n", counts(c.ChecksByKind))
			for _, k := range c.Checks {
				fmt.Fprintf(out, "    frame %d %s %s: %s\n", k.Frame, k.Severity, k.Kind, k.Message)
			}
		}
	}
}

// counts formats a map as " (k=v, ...)" for messages and " k=v ..." for
// the rest, sorted by key.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, m[k])
	}
	return b.String()
}

// writeCMExchange prints one rdma_cm exchange on a line: who asked whom
// for which service, the frames of each message, and where it ended.
func writeCMExchange(out *bufio.Writer, x *analyze.CMExchange) {
	fmt.Fprintf(out, "CM %s/%s -> %s service %s: REQ #%d", x.Active, x.ActiveQPN, x.Passive, x.ServiceID, x.REQFrame)
	if x.REQs > 1 {
		fmt.Fprintf(out, " (sent %d times)", x.REQs)
	}
	if x.MRAs > 0 {
		fmt.Fprintf(out, ", %d MRA", x.MRAs)
	}
	if x.REPFrame != 0 {
		fmt.Fprintf(out, ", REP #%d from QP %s", x.REPFrame, x.PassiveQPN)
	}
	if x.RTUFrame != 0 {
		fmt.Fprintf(out, ", RTU #%d (set up in %.0f us)", x.RTUFrame, x.SetupUs)
	}
	if x.REJFrame != 0 {
		fmt.Fprintf(out, ", REJ #%d from the %s side: %s", x.REJFrame, x.REJFrom, x.REJReason)
	}
	if x.DREQFrame != 0 {
		fmt.Fprintf(out, ", DREQ #%d from the %s side", x.DREQFrame, x.DREQFrom)
	}
	if x.DREPFrame != 0 {
		fmt.Fprintf(out, ", DREP #%d", x.DREPFrame)
	}
	fmt.Fprintf(out, ": %s\n", x.State)
}
