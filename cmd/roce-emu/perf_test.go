package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runPerfPair(t *testing.T, kind string, extra ...string) (string, string) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := append([]string{kind, "--udp-port", udp, "-p", tcp, "--timeout", "30s"}, extra...)
	r := runPair(append(append([]string{}, common...), "--bind", "127.0.0.2"),
		append(append([]string{}, common...), "--bind", "127.0.0.1", "127.0.0.1"), "cannot reach", nil)
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	return r.cout, r.sout
}

func TestBW(t *testing.T) {
	for _, op := range []string{"send", "write", "read"} {
		t.Run(op, func(t *testing.T) {
			c, s := runPerfPair(t, "bw", "-o", op, "-s", "8192", "-n", "300", "--report_gbits", "--loss", "0.01")
			assert.Contains(t, c, "BW average[Gb/sec]")
			assert.Regexp(t, `\n 8192 +300 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, c)
			if op == "send" {
				assert.Regexp(t, `\n 8192 +300 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s, "the server of a SEND test counts receives")
			}
		})
	}
}

// The BW peak as perftest computes it: never below the average, also on
// a run of 5 (where windows between completions polled together made it
// absurd); off, with perftest's warning, on a SEND server and past 20000
// iterations.
func TestBWPeak(t *testing.T) {
	line := regexp.MustCompile(`\n (\d+) +(\d+) +([0-9.]+) +([0-9.]+) +[0-9.]+\n`)
	figures := func(out string) (peak, avg float64) {
		m := line.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		_, err := fmt.Sscan(m[3]+" "+m[4], &peak, &avg)
		require.NoError(t, err)
		return peak, avg
	}
	c, s := runPerfPair(t, "bw", "-o", "write", "-s", "65536", "-n", "5")
	peak, avg := figures(c)
	assert.Positive(t, avg)
	assert.GreaterOrEqual(t, peak, avg-0.01, "the whole run is one of the runs the peak is the best of")
	assert.NotContains(t, c+s, "WARNING")

	c, s = runPerfPair(t, "bw", "-o", "send", "-s", "4096", "-n", "50")
	assert.True(t, strings.HasPrefix(s, perftestNoPeak+"\n"), "the server warns first, as perftest: %s", s)
	peak, avg = figures(s)
	assert.Zero(t, peak, "no peak on a SEND server")
	assert.Positive(t, avg)
	peak, _ = figures(c)
	assert.Positive(t, peak, "the client measures its peak")
	assert.NotContains(t, c, "WARNING")

	c, _ = runPerfPair(t, "bw", "-o", "write", "-s", "2", "-n", "20001")
	assert.True(t, strings.HasPrefix(c, perftestNoPeak+"\n"), c)
	peak, _ = figures(c)
	assert.Zero(t, peak, "past 20000 iterations")
}

func TestLat(t *testing.T) {
	for _, op := range []string{"send", "write", "read"} {
		t.Run(op, func(t *testing.T) {
			c, _ := runPerfPair(t, "lat", "-o", op, "-n", "50")
			assert.Contains(t, c, "t_typical[usec]")
			assert.Regexp(t, `\n 2 +50 +[0-9.]+ `, c)
		})
	}
}

func TestPerfBadFlags(t *testing.T) {
	for _, args := range [][]string{{"bw", "-o", "atomic", "-s", "64"}, {"bw", "--run_infinitely"}, {"bw", "-q", "0"}, {"lat", "-q", "2"}, {"bw", "-c", "UD"}, {"bw", "-s", "0"}, {"lat", "-n", "-1"}, {"bw", "a", "b"}, {"lat", "-m", "9000"}, {"bw", "--max-cycle-buffer", "100"}, {"bw", "--max-cycle-buffer", "2147483648"}} {
		var o, e bytes.Buffer
		assert.Equal(t, 2, run(args, &o, &e), "%v", args)
		assert.NotEmpty(t, e.String())
	}
}

// A lost ACK lets the peer's reply arrive before our send completes; the
// latency test must take completions in either order.
func TestLatUnderLoss(t *testing.T) {
	for _, op := range []string{"send", "write"} {
		c, _ := runPerfPair(t, "lat", "-o", op, "-n", "60", "--fault", "drop:dir=in,opcode=ACKNOWLEDGE,nth=3", "--timeout", "30s")
		assert.Regexp(t, `\n 2 +60 +[0-9.]+ `, c, op)
	}
}

// printLat follows perftest's print_report_lat: the two largest samples
// are left out (the first exchange carries the peer's start-up) and
// t_typical is the median of the rest.
func TestPrintLatLikePerftest(t *testing.T) {
	us := time.Microsecond
	samples := []time.Duration{113000 * us, 10 * us, 12 * us, 11 * us, 13 * us, 500 * us}
	var b bytes.Buffer
	printLat(&b, 64, 7, samples)
	fields := strings.Fields(strings.Split(b.String(), "\n")[1])
	require.GreaterOrEqual(t, len(fields), 7, b.String())
	assert.Equal(t, []string{"64", "7", "10.00", "13.00", "11.50", "11.50"}, fields[:6], "bytes, iterations, t_min, t_max, t_typical, t_avg")
	b.Reset()
	printLat(&b, 64, 1, nil)
	assert.Contains(t, b.String(), "no latency sample")
}

// -q 4: four QPs each run -n operations; both sides print the total, as
// perftest does (iterations times QPs), and every QP carried traffic.
func TestBWMultiQP(t *testing.T) {
	for _, op := range []string{"write", "read", "send"} {
		t.Run(op, func(t *testing.T) {
			c, s := runPerfPair(t, "bw", "-o", op, "-s", "4096", "-n", "50", "-q", "4")
			assert.Regexp(t, `\n 4096 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, c)
			assert.Regexp(t, `\n 4096 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s, "the server prints the client's results, or its own receives")
			for _, out := range []string{c, s} {
				assert.Equal(t, 4, strings.Count(out, " local address:"), out)
				assert.Equal(t, 4, strings.Count(out, " remote address:"), out)
				for q := range 4 {
					assert.Regexp(t, fmt.Sprintf(`QP %d counters: sent [1-9]`, q), out, "QP %d moved packets", q)
				}
			}
		})
	}
}

// ib_atomic_bw and ib_atomic_lat: 8-byte atomics, the client checks each
// original value against the one before it at the same offset, the bw
// server checks its region grew by the client's count of FETCH_AND_ADDs
// (or, for CMP_AND_SWAP of 0 with 0, did not change).
func TestAtomic(t *testing.T) {
	for _, typ := range []string{"FETCH_AND_ADD", "CMP_AND_SWAP"} {
		t.Run("bw-"+typ, func(t *testing.T) {
			c, s := runPerfPair(t, "bw", "-o", "atomic", "-A", typ, "-n", "300", "-q", "2")
			assert.Regexp(t, `\n 8 +600 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, c)
			assert.Regexp(t, `\n 8 +600 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s)
			assert.Contains(t, c, "Atomic "+typ+" BW Test")
			assert.Contains(t, c, "data check: 600 "+typ+"s at 128 offsets")
			if typ == "FETCH_AND_ADD" {
				assert.Contains(t, s, "added 600 to 128 words of the region")
			} else {
				assert.Contains(t, s, "left the region as it was")
			}
			assert.Contains(t, s, "0 SEND, 600 atomic")
		})
		t.Run("lat-"+typ, func(t *testing.T) {
			c, s := runPerfPair(t, "lat", "-o", "atomic", "--atomic_type", typ, "-n", "50")
			assert.Regexp(t, `\n 8 +50 +[0-9.]+ `, c)
			assert.Contains(t, c, "data check: 50 ")
			assert.Contains(t, s, "0 SEND, 50 atomic")
		})
	}
}

// -a runs every size from 2 to 2^23 bytes against a server started with
// -a (its buffer sized for 8 MiB), one line each; the server prints the
// last size's results, as perftest's does.
func TestBWAllSizes(t *testing.T) {
	for _, op := range []string{"write", "read", "send"} {
		t.Run(op, func(t *testing.T) {
			c, s := runPerfPair(t, "bw", "-o", op, "-a", "-n", "4", "-m", "4096")
			for sz := 2; sz <= 1<<23; sz *= 2 {
				assert.Regexp(t, fmt.Sprintf(`\n %d +4 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, sz), c)
				if op == "send" {
					assert.Regexp(t, fmt.Sprintf(`\n %d +4 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, sz), s, "send_bw's server reports every size")
				}
			}
			assert.Regexp(t, `\n 8388608 +4 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s)
			if op == "read" {
				assert.Contains(t, c, "data check: 92 READs of sizes 2 to 8388608 bytes")
			}
		})
	}
}

// lat -a: one line per size from 2 bytes to 8 MiB; the ping-pongs of
// each size start from count 0 (write polls the new last byte).
func TestLatAllSizes(t *testing.T) {
	for _, op := range []string{"send", "write", "read"} {
		t.Run(op, func(t *testing.T) {
			c, s := runPerfPair(t, "lat", "-o", op, "-a", "-n", "5", "-m", "4096")
			for sz := 2; sz <= 1<<23; sz *= 2 {
				assert.Regexp(t, fmt.Sprintf(`\n %d +5 +[0-9.]+ `, sz), c)
				if op != "read" {
					assert.Regexp(t, fmt.Sprintf(`\n %d +5 +[0-9.]+ `, sz), s)
				}
			}
			assert.Equal(t, 1, strings.Count(c, "t_typical"), "one table")
		})
	}
}

// -D runs for the duration and reports what completed between the
// margins, with no peak, as perftest does.
func TestBWDuration(t *testing.T) {
	c, s := runPerfPair(t, "bw", "-o", "write", "-s", "4096", "-D", "2", "-q", "2")
	m := regexp.MustCompile(`\n 4096 +([0-9]+) +0\.00 +([0-9.]+) +[0-9.]+\n`).FindStringSubmatch(c)
	require.NotNil(t, m, c)
	assert.NotEqual(t, "0", m[1])
	assert.Contains(t, s, strings.TrimPrefix(m[0], "\n"), "the server prints the client's")
}

// perftest's flags that mean nothing here are accepted with one line
// each; -R is refused in one line.
func TestPerftestFlags(t *testing.T) {
	c, s := runPerfPair(t, "bw", "-o", "write", "-s", "4096", "-n", "10", "-d", "rxe0", "-i", "1", "-x", "1", "-F", "--tclass", "2")
	assert.Regexp(t, `\n 4096 +10 `, c)
	assert.Contains(t, s, "the client's results")
	var o, e bytes.Buffer
	assert.Equal(t, 2, run([]string{"bw", "--run_infinitely", "192.0.2.2"}, &o, &e))
	assert.Equal(t, "roce-emu bw: --run_infinitely is not supported yet; -D SECONDS runs for a given time\n", e.String())
}

// A client's -a against a server without it: the server's buffer holds
// 65536 bytes, the client's first larger WRITE is refused, and both sides
// say to give the server -a.
func TestBWAllSizesServerWithoutA(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := []string{"bw", "-o", "write", "-n", "2", "--udp-port", udp, "-p", tcp, "--timeout", "30s"}
	r := runPair(append(slices.Clone(common), "--bind", "127.0.0.2"),
		append(slices.Clone(common), "-a", "--bind", "127.0.0.1", "127.0.0.1"), "cannot reach", nil)
	assert.Equal(t, 1, r.ccode)
	assert.Contains(t, r.cerr, "size 131072: ")
	assert.Contains(t, r.cerr, "work completion REM_ACCESS_ERR")
	assert.Contains(t, r.cerr, "start it with -a too")
	assert.Regexp(t, `\n 65536 +2 `, r.cout, "the sizes up to the server's buffer ran")
	assert.Equal(t, 1, r.scode)
	assert.Contains(t, r.serr, "if it runs -a, start this server with -a too")
}

// -b: both sides run the traffic and print the same sums; with -a a
// barrier after each size; atomics check both regions.
func TestBWBidirectional(t *testing.T) {
	for _, c := range [][]string{
		{"-o", "write", "-s", "4096", "-n", "100", "-q", "2"},
		{"-o", "read", "-s", "4096", "-n", "100"},
		{"-o", "atomic", "-n", "100"},
		{"-o", "write", "-a", "-n", "2", "-m", "4096"},
		{"-o", "write", "-s", "4096", "-D", "2"},
	} {
		t.Run(strings.Join(c, ""), func(t *testing.T) {
			cl, sv := runPerfPair(t, "bw", append([]string{"-b"}, c...)...)
			re := regexp.MustCompile(`(?m)^ [0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$`)
			lines := re.FindAllString(cl, -1)
			require.NotEmpty(t, lines, cl)
			svLines := re.FindAllString(sv, -1)
			if slices.Contains(c, "-D") {
				// Each side prints its own count of measured operations.
				strip := func(ls []string) (o []string) {
					for _, l := range ls {
						f := strings.Fields(l)
						o = append(o, strings.Join(append(f[:1:1], f[2:]...), " "))
					}
					return o
				}
				lines, svLines = strip(lines), strip(svLines)
			}
			assert.Equal(t, lines, svLines, "both sides print the same sums")
			if slices.Contains(c, "-a") {
				assert.Len(t, lines, 23)
			}
			for _, out := range []string{cl, sv} {
				switch {
				case slices.Contains(c, "atomic"):
					assert.Contains(t, out, "added 100 to 64 words")
					assert.Contains(t, out, "0 SEND, 100 atomic")
				case slices.Contains(c, "-D"):
					assert.NotContains(t, out, " 0 RDMA WRITE")
				case slices.Contains(c, "read"):
					assert.Contains(t, out, "0 RDMA WRITE, 100 RDMA READ")
				case slices.Contains(c, "-a"):
					assert.Contains(t, out, " 46 RDMA WRITE")
				default:
					assert.Contains(t, out, " 200 RDMA WRITE")
				}
			}
		})
	}
}

// What perftest users type: each flag with no meaning here gets one line
// saying so; a flag roce-emu does not know gets two lines, not the list;
// modes not built are refused in one line.
func TestPerftestFlagLines(t *testing.T) {
	var o, e bytes.Buffer
	code := run([]string{"bw", "-d", "rxe0", "-x", "3", "-F", "--tclass", "2", "-p", freeTCPPort(t), "--udp-port", freeUDPPort(t), "--timeout", "300ms"}, &o, &e)
	assert.Equal(t, 1, code, "the server waited for a client that did not come")
	assert.Equal(t, []string{
		"roce-emu bw: -d rxe0 accepted, no effect: roce-emu has no RDMA device: --bind picks the address it sends from",
		"roce-emu bw: -x 3 accepted, no effect: roce-emu's GID is --bind's address",
		"roce-emu bw: -F accepted, no effect: roce-emu times with the monotonic clock, not CPU cycles",
		"roce-emu bw: --tclass 2 accepted, no effect: roce-emu sends with traffic class 0 (no per-QP traffic class yet)",
	}, strings.Split(e.String(), "\n")[:4])
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bw", "--bogus"}, "flag provided but not defined: -bogus\nusage: roce-emu bw [flags] [HOST]; roce-emu bw -h lists the flags\n"},
		{[]string{"bw", "--run_infinitely"}, "roce-emu bw: --run_infinitely is not supported yet; -D SECONDS runs for a given time\n"},
		{[]string{"lat", "-b", "-o", "write"}, "roce-emu lat: -b: bidirectional is built for bw with write, read and atomic (not lat write yet)\n"},
		{[]string{"bw", "-o", "send", "-D", "3"}, "roce-emu bw: -D: duration mode is built for bw with write, read and atomic (not bw send yet)\n"},
		{[]string{"bw", "-D", "4", "-f", "2"}, "roce-emu bw: -D 4 -f 2: the duration must be more than twice the margin\n"},
		{[]string{"bw", "-o", "atomic", "-A", "SWAP"}, "roce-emu bw: -A \"SWAP\": atomic type must be CMP_AND_SWAP or FETCH_AND_ADD\n"},
	} {
		o.Reset()
		e.Reset()
		assert.Equal(t, 2, run(c.args, &o, &e), "%v", c.args)
		assert.Equal(t, c.want, e.String(), "%v", c.args)
	}
	o.Reset()
	e.Reset()
	assert.Equal(t, 0, run([]string{"bw", "-h"}, &o, &e))
	assert.Contains(t, e.String(), "-q int")
}

// --out_json writes perftest's keys, as valid JSON, with the figures the
// table shows: the client's own, and the server of write_bw the client's.
func TestPerfOutJSON(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		kind string
		args []string
		test string
	}{
		{"bw", []string{"-o", "write", "-s", "4096", "-n", "50", "-q", "2"}, "RDMA_Write_BW_Test"},
		{"bw", []string{"-o", "atomic", "-A", "CMP_AND_SWAP", "-n", "50", "-b"}, "Atomic_CMP_AND_SWAP_Bidirectional_BW_Test"},
		{"lat", []string{"-o", "send", "-n", "50"}, "Send_Latency_Test"},
	} {
		t.Run(c.test, func(t *testing.T) {
			file := filepath.Join(dir, c.test+".json")
			// Both sides write the file (the same name here): it holds
			// one side's figures, whole.
			cl, sv := runPerfPair(t, c.kind, append(c.args, "--out_json", "--out_json_file", file)...)
			b, err := os.ReadFile(file)
			require.NoError(t, err)
			var j map[string]map[string]any
			require.NoError(t, json.Unmarshal(b, &j), string(b))
			assert.Equal(t, c.test, j["test_info"]["test"])
			assert.Equal(t, "RC", j["test_info"]["Connection_type"])
			res := j["results"]
			require.NotNil(t, res, string(b))
			re := regexp.MustCompile(`(?m)^ ([0-9]+) +([0-9]+) +([0-9.]+) +([0-9.]+) +([0-9.]+)`)
			var fromJSON string
			if c.kind == "bw" {
				fromJSON = fmt.Sprintf("%v %v %.2f %.6f", res["MsgSize"], res["n_iterations"], res["BW_average"], res["MsgRate"])
			} else {
				fromJSON = fmt.Sprintf("%v %v %.2f %.2f", res["MsgSize"], res["n_iterations"], res["t_min"], res["t_max"])
				assert.Contains(t, res, "percentile_99.9")
			}
			var printed []string
			for _, out := range []string{cl, sv} {
				if l := re.FindStringSubmatch(out); l != nil {
					if c.kind == "bw" {
						printed = append(printed, strings.Join([]string{l[1], l[2], l[4], l[5]}, " "))
					} else {
						printed = append(printed, strings.Join([]string{l[1], l[2], l[3], l[4]}, " "))
					}
				}
			}
			require.NotEmpty(t, printed)
			assert.Contains(t, printed, fromJSON, "the file says what a side printed")
		})
	}
}

// perftest's BW peak (print_report_bw's opt_delta) by its own quadratic
// search over every run of consecutive messages: what perftestPeakDelta
// must find.
func peakDeltaPairs(posted, completed []time.Time) float64 {
	best := math.Inf(1)
	for i := range completed {
		for j := i; j < len(completed); j++ {
			best = min(best, completed[j].Sub(posted[i]).Seconds()/float64(j-i+1))
		}
	}
	return best
}

func TestPerftestPeak(t *testing.T) {
	t0 := time.Unix(1000, 0)
	us := func(v float64) time.Time { return t0.Add(time.Duration(v * 1000)) }
	// -n 5, all posted at once, the completions polled in two batches 1 µs
	// apart: the peak is the average (the whole run is the best run), not
	// 5 messages over 1 µs.
	posted := []time.Time{us(0), us(0), us(0), us(0), us(0)}
	done := []time.Time{us(100), us(100), us(100), us(101), us(101)}
	r := bwStats(4096, t0, posted, done, false)
	assert.InDelta(t, r.avg, r.peak, r.avg*1e-9, "-n 5 in two polls")
	assert.InDelta(t, 5*4096/101e-6/(1<<20), r.avg, 1e-6)
	// Without post times (-N, a SEND server): 0, as perftest prints.
	assert.Zero(t, bwStats(4096, t0, nil, done, false).peak)

	// One message at a time (-t 1): the fastest single message sets the
	// peak.
	posted = []time.Time{us(0), us(10), us(30), us(34), us(50)}
	done = []time.Time{us(10), us(30), us(34), us(50), us(60)}
	assert.InDelta(t, 4e-6, perftestPeakDelta(posted, done), 1e-12)
	r = bwStats(1000, t0, posted, done, true)
	assert.InDelta(t, 1000*8/4e-6/1e9, r.peak, 1e-9, "Gb/s")

	// Random runs: the bisection finds what the quadratic search finds.
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range 200 {
		n := 1 + rng.IntN(60)
		posted, done = make([]time.Time, n), make([]time.Time, n)
		var tp, tc float64
		for i := range n {
			tp += rng.Float64() * 5
			tc = max(tc, tp) + rng.Float64()*20
			posted[i], done[i] = us(tp), us(tc)
		}
		want := peakDeltaPairs(posted, done)
		assert.InDelta(t, want, perftestPeakDelta(posted, done), want*1e-9, "run %d", k)
	}
}

// A peer's bandwidth report carries no unit: its message rate tells it,
// and a side that prints or adds the peer's figures gives them in its own
// unit.
func TestPeerReportUnit(t *testing.T) {
	// 65536 bytes at 0.018 Mpps: 1179.648 MB/s of 10^6 bytes, 1125 MB/sec
	// of 2^20 bytes, 9.437184 Gb/sec.
	mb := oob.BWReport{Size: 65536, Iters: 1000, PeakBW: 1200, AvgBW: 1125, MsgRate: 0.018}
	gb := oob.BWReport{Size: 65536, Iters: 1000, PeakBW: 10, AvgBW: 9.437184, MsgRate: 0.018}
	g, ok := peerReportUnit(mb)
	assert.True(t, ok)
	assert.False(t, g)
	g, ok = peerReportUnit(gb)
	assert.True(t, ok)
	assert.True(t, g)
	_, ok = peerReportUnit(oob.BWReport{Size: 65536, Iters: 1000}) // perftest's write_bw server's report: zeros
	assert.False(t, ok)
	_, ok = peerReportUnit(oob.BWReport{Size: 65536, AvgBW: 5000, MsgRate: 0.018}) // neither unit
	assert.False(t, ok)

	r, note := inUnit(gb, false)
	assert.InDelta(t, 1125, r.avg, 1e-9)
	assert.InDelta(t, 10/(float64(1<<20)*8/1e9), r.peak, 1e-9)
	assert.Equal(t, 0.018, r.mpps)
	assert.Equal(t, " (the peer reported in Gb/sec, --report_gbits on one side only: its figures converted to MB/sec)", note)
	r, note = inUnit(mb, true)
	assert.InDelta(t, 9.437184, r.avg, 1e-9)
	assert.Contains(t, note, "converted to Gb/sec")
	r, note = inUnit(mb, false)
	assert.Equal(t, bwResult{peak: 1200, avg: 1125, mpps: 0.018}, r)
	assert.Empty(t, note)
}

// A write_bw server prints the client's figures: in its own unit, with
// its own bw_unit in --json, when the client ran --report_gbits and it
// did not.
func TestBWServerUnit(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	common := []string{"-o", "write", "-n", "200", "-s", "65536", "-p", tcp, "--udp-port", udp, "--timeout", "30s"}
	sout, serr, sdone := startCLI(append([]string{"bw", "--json", "--bind", "127.0.0.2"}, common...))
	waitForOutput(t, serr, sout, sdone, "Waiting for client")
	time.Sleep(50 * time.Millisecond)
	code, cout, cerr := runCLI(t, append([]string{"bw", "--report_gbits", "--bind", "127.0.0.1"}, append(common, "127.0.0.2")...)...)
	require.Equal(t, 0, code, cerr)
	require.Equal(t, 0, <-sdone, serr.String())
	m := regexp.MustCompile(`\n 65536 +200 +([0-9.]+) +([0-9.]+) +([0-9.]+)\n`).FindStringSubmatch(cout)
	require.NotNil(t, m, cout)
	var gpeak, gavg float64
	_, err := fmt.Sscan(m[1]+" "+m[2], &gpeak, &gavg)
	require.NoError(t, err)
	assert.Contains(t, serr.String(), " the client's results: (the peer reported in Gb/sec, --report_gbits on one side only: its figures converted to MB/sec)")
	var j struct {
		Perftest struct {
			Results struct {
				Peak float64 `json:"BW_peak"`
				Avg  float64 `json:"BW_average"`
			} `json:"results"`
		} `json:"perftest"`
		Unit string `json:"bw_unit"`
	}
	require.NoError(t, json.Unmarshal([]byte(sout.String()), &j), sout.String())
	assert.Equal(t, "MB/sec", j.Unit)
	mbPerGb := 1e9 / 8 / (1 << 20)
	// The client's figures went across unrounded; the table rounds them
	// to 2 decimals.
	assert.InDelta(t, gavg*mbPerGb, j.Perftest.Results.Avg, 0.01*mbPerGb+0.01)
	assert.InDelta(t, gpeak*mbPerGb, j.Perftest.Results.Peak, 0.01*mbPerGb+0.01)
}

// BenchmarkPerftestPeak times the BW peak of a run of perftest's default
// 5000 iterations (tx depth 128, completions polled in batches): the
// bisection roce-emu uses against perftest's quadratic search over every
// pair, side by side.
func BenchmarkPerftestPeak(b *testing.B) {
	const n = 5000
	t0 := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	posted, done := make([]time.Time, n), make([]time.Time, n)
	var clock time.Duration
	for i := range n {
		if i >= 128 { // a post waits for the completion 128 before it
			clock = max(clock, done[i-128].Sub(t0))
		}
		posted[i] = t0.Add(clock)
		clock += time.Duration(rng.IntN(200))
		done[i] = t0.Add(clock + 5*time.Microsecond)
		if i > 0 && done[i].Before(done[i-1]) {
			done[i] = done[i-1]
		}
	}
	b.Run("bisection", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			perftestPeakDelta(posted, done)
		}
	})
	b.Run("pairs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			peakDeltaPairs(posted, done)
		}
	})
}
