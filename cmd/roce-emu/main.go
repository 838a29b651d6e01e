// Command roce-emu is a userspace RoCEv2 peer and capture tool.
//
// Usage:
//
//	roce-emu decode [--json] FILE...
//	roce-emu analyze [--json] FILE...
//
// Run "roce-emu help" for the list of commands.
package main

import (
	"fmt"
	"io"
	"os"
)

// command is one subcommand: its name, one line of help, and its entry
// point, which returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = []command{
	{"demo", "two peers on loopback run SEND, WRITE, READ and atomics with and without loss, check every byte, write demo.pcap", runDemo},
	{"dcqcn", "N-to-1 incast through an emulated switch in simulated time, with DCQCN or none: CSV, plot, summary", runDCQCN},
	{"switch", "a userspace congestion point between UDP peers: egress queue, WRED-ECN, tail drop or PFC hold", runSwitch},
	{"decode", "decode RoCEv2 packets in pcap/pcapng captures, one line (or JSON object) per packet", runDecode},
	{"analyze", "rebuild the RoCEv2 connections of captures: messages, go-back-N episodes, timeouts, RNR, RTT, CNPs, checks", runAnalyze},
	{"server", "the server side of ibv_rc_pingpong: RC SEND ping-pong after rc_pingpong's TCP exchange", runServer},
	{"client", "the client side of ibv_rc_pingpong (client HOST)", runClient},
	{"bw", "perftest's bandwidth tests, with another roce-emu or with ib_{send,write,read}_bw (-o send|write|read)", runBW},
	{"conform", "IBTA transport conformance cases against an RC peer (--self: roce-emu itself): verdicts with the frames that show them", runConform},
	{"rping", "rdma_cm's rping: -s server or -c client, connected through the CM over QP1, ping data by RDMA READ and WRITE", runRping},
	{"lat", "perftest's latency tests, with another roce-emu or with ib_{send,write,read}_lat (-o send|write|read)", runLat},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: roce-emu COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "help", "help COMMAND: COMMAND's usage and flags (as roce-emu COMMAND -h)")
	fmt.Fprintf(w, "  %-10s %s\n", "version", "the module version, VCS revision and Go version (also --version)")
	fmt.Fprintln(w, "\nflags may come before or after the arguments, as getopt takes them; -- ends the flags")
	fmt.Fprintln(w, "run 'roce-emu help COMMAND' or 'roce-emu COMMAND -h' for a command's flags")
}

func main() {
	ownProcess = true
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help":
		usage(stdout)
		return 0
	case "help":
		return runHelp(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		return runVersion(args[1:], stdout, stderr)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "roce-emu: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}
