package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/roce-emu/roce-emu/internal/transcript"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPerftestHelpers(t *testing.T) {
	// INC rounds up to the cache line; the offsets walk one cycle buffer.
	assert.Equal(t, 64, perftestInc(2, 64))
	assert.Equal(t, 128, perftestInc(100, 64))
	var offs []int
	for k := range 66 {
		offs = append(offs, perftestOffset(k, 64, 4096, 64))
	}
	assert.Equal(t, []int{0, 64, 128}, offs[:3])
	assert.Equal(t, []int{4032, 0, 64}, offs[63:])
	assert.Equal(t, 2048, perftestOffset(1, 2048, 4096, 64), "half the cycle buffer still walks")
	assert.Equal(t, 0, perftestOffset(5, 2049, 4096, 64), "more than half: always the start")
	assert.Equal(t, 0, perftestOffset(7, 65536, 4096, 64))
	// The local sources of WRITEs and SENDs walk the same steps.
	assert.Equal(t, 64, perftestSources(64, 4096, 64))
	assert.Equal(t, 2, perftestSources(2048, 4096, 64))
	assert.Equal(t, 1, perftestSources(2049, 4096, 64))
	assert.Equal(t, 1, perftestSources(65536, 4096, 64), "ib_write_bw -s 65536 sends every WRITE from one buffer")
	assert.Equal(t, 16, perftestSources(4000, 65536, 64))

	assert.Equal(t, "00:00:00:00:00:00:00:00:00:00:255:255:192:00:02:02", perftestGID(netip.MustParseAddr("192.0.2.2")))

}

// startPerftestServer runs roce-emu KIND --perftest as server and returns
// a connection to it (dialled once it listens) and a function that waits
// for it and returns its exit code and output.
func startPerftestServer(t *testing.T, args ...string) (net.Conn, func() (int, string)) {
	t.Helper()
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	s := goRun(append(args, "--perftest", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "--timeout", "20s"))
	c, err := dialListening("127.0.0.1:" + tcp)
	require.NoError(t, err)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, func() (int, string) {
		code := s.wait()
		return code, s.out.String() + s.err.String()
	}
}

// A fake ib_write_bw client sends exactly what the real one sent
// (../shared/testdata/perftest-6.06-ib_write_bw-client-exchange.txt, run
// with -s 4096 -n 5 --report_gbits); roce-emu answers each message with
// one of the same size, perftest's own values where they are fixed, and
// prints the client's results.
func TestPerftestServerAgainstRecordedClient(t *testing.T) {
	msgs, err := transcript.ReadPy(filepath.Join(filepath.Dir(testenv.SharedPcaps(t)), "perftest-6.06-ib_write_bw-client-exchange.txt"))
	require.NoError(t, err)
	require.Len(t, msgs, 15)
	// The recorded client announced its own host's GID, not the
	// loopback address this replay connects from.
	c, wait := startPerftestServer(t, "bw", "-o", "write", "-s", "4096", "-n", "5", "--report_gbits", "--allow-gid-mismatch")
	defer c.Close()
	var replies [][]byte
	for i, m := range msgs {
		require.True(t, m.FromClient)
		_, err := c.Write(m.Data)
		require.NoError(t, err, "message %d", i)
		r := make([]byte, len(m.Data))
		_, err = io.ReadFull(c, r)
		require.NoError(t, err, "reply to message %d (%d bytes)", i, len(m.Data))
		replies = append(replies, r)
	}
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "nothing after \"done\"")
	code, out := wait()
	require.Equal(t, 0, code, out)

	assert.Equal(t, msgs[0].Data, replies[0], "version 6.06")
	assert.Equal(t, []byte{0, 0, 0x10, 0}, replies[1], "cycle buffer 4096")
	assert.Equal(t, []byte{0, 0, 0, 64}, replies[2], "cache line 64")
	assert.Equal(t, []byte("3\x00"), replies[3], "MTU 1024")
	key, err := oob.ParsePerftestKey(replies[4])
	require.NoError(t, err)
	assert.Equal(t, uint16(1), key.OutReads)
	assert.Equal(t, netip.MustParseAddr("127.0.0.2"), key.GID)
	for _, i := range []int{5, 6, 7, 13} {
		assert.Equal(t, replies[4], replies[i], "barrier %d repeats the key", i)
	}
	assert.Equal(t, uint64(4096), binary.BigEndian.Uint64(replies[8]), "size")
	assert.Equal(t, uint64(5), binary.BigEndian.Uint64(replies[9]), "iterations")
	assert.Equal(t, []byte("done\x00"), replies[14])

	// The server prints what the client measured.
	dbl := func(b []byte) float64 { return math.Float64frombits(binary.BigEndian.Uint64(b)) }
	// Below 0.1 Gb/sec (0.03 here) perftest prints six decimals
	// (REPORT_FMT_EXT), and so does roce-emu.
	require.Less(t, dbl(msgs[11].Data), 0.1)
	want := fmt.Sprintf(" %-10d %-10d       %-18.6f %-20.6f %.6f\n", 4096, 5, dbl(msgs[10].Data), dbl(msgs[11].Data), dbl(msgs[12].Data))
	assert.Contains(t, out, "the client's results:\n #bytes     #iterations    BW peak[Gb/sec]")
	assert.Contains(t, out, want)
	assert.Contains(t, out, "QPN 0x0011 PSN 0x5df3ee RKey 0x0002d1 VAddr 0x00562bb641e000", "the recorded client's address")
}

// echoServer answers each message with itself, as the host peer that
// recorded the shared transcript did; it returns the messages it saw.
func echoServer(t *testing.T) (string, func() []transcript.Msg) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var msgs []transcript.Msg
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer l.Close()
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			if n > 0 {
				msgs = append(msgs, transcript.Msg{FromClient: true, Data: bytes.Clone(b[:n])})
				c.Write(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), func() []transcript.Msg { <-done; return msgs }
}

// roce-emu as client against a peer that echoes: it sends what the real
// ib_write_bw client sent, message for message, and its QP, connected to
// itself, runs the test.
func TestPerftestClientAgainstEcho(t *testing.T) {
	rec, err := transcript.ReadPy(filepath.Join(filepath.Dir(testenv.SharedPcaps(t)), "perftest-6.06-ib_write_bw-client-exchange.txt"))
	require.NoError(t, err)
	for _, op := range []string{"write", "read"} {
		t.Run(op, func(t *testing.T) {
			port, msgs := echoServer(t)
			var out, errb bytes.Buffer
			code := run([]string{"bw", "--perftest", "-o", op, "-s", "4096", "-n", "5", "--report_gbits", "--bind", "127.0.0.1",
				"--udp-port", freeUDPPort(t), "-p", port, "--timeout", "20s", "127.0.0.1"}, &out, &errb)
			require.Equal(t, 0, code, "%s%s", out.String(), errb.String())
			got := msgs()
			require.Equal(t, transcript.Sizes(rec, true), transcript.Sizes(got, true), "message sizes, in order")
			for _, i := range []int{0, 1, 2, 3, 8, 9, 14} { // version, cycle, cache line, MTU, size, iterations, done
				assert.Equal(t, rec[i].Data, got[i].Data, "message %d", i)
			}
			key, err := oob.ParsePerftestKey(got[4].Data)
			require.NoError(t, err)
			assert.Equal(t, map[string]uint16{"write": 1, "read": 16}[op], key.OutReads, "out_reads")
			assert.Equal(t, netip.MustParseAddr("127.0.0.1"), key.GID)
			for _, i := range []int{5, 6, 7, 13} {
				assert.Equal(t, got[4].Data, got[i].Data, "barrier %d", i)
			}
			assert.Regexp(t, `\n 4096 +5 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, out.String())
			if op == "read" {
				assert.Contains(t, out.String(), "data check: 5 READs of 4096 bytes")
			}
		})
	}
}

// relay sits between a roce-emu client and server and cuts each
// direction into the messages a real perftest run of the same program
// sent (testdata/perftest-6.06-*-exchange.txt): it fails on a message of
// another size, a short one, or bytes after the last.
type relay struct {
	t    *testing.T
	port string
	mu   sync.Mutex
	got  []transcript.Msg
	errs []string
	done sync.WaitGroup
}

func newRelay(t *testing.T, to string, want []transcript.Msg) *relay {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &relay{t: t, port: strconv.Itoa(l.Addr().(*net.TCPAddr).Port)}
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		defer l.Close()
		cl, err := l.Accept()
		if err != nil {
			return
		}
		defer cl.Close()
		sv, err := dialListening("127.0.0.1:" + to)
		if err != nil {
			r.fail("relay cannot reach the server: %v", err)
			return
		}
		defer sv.Close()
		deadline := time.Now().Add(20 * time.Second)
		cl.SetDeadline(deadline)
		sv.SetDeadline(deadline)
		var wg sync.WaitGroup
		wg.Add(2)
		go r.pipe(&wg, cl, sv, true, transcript.Sizes(want, true))
		go r.pipe(&wg, sv, cl, false, transcript.Sizes(want, false))
		wg.Wait()
	}()
	return r
}

func (r *relay) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *relay) pipe(wg *sync.WaitGroup, from, to net.Conn, fromClient bool, sizes []int) {
	defer wg.Done()
	dir := map[bool]string{true: "client", false: "server"}[fromClient]
	for i, n := range sizes {
		b := make([]byte, n)
		if _, err := io.ReadFull(from, b); err != nil {
			r.fail("the %s's message %d (%d bytes as perftest's): %v", dir, i, n, err)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, transcript.Msg{FromClient: fromClient, Data: b})
		r.mu.Unlock()
		if _, err := to.Write(b); err != nil {
			r.fail("relaying the %s's message %d: %v", dir, i, err)
			return
		}
	}
	extra, err := from.Read(make([]byte, 1))
	if extra > 0 || (err != io.EOF && !isReset(err)) {
		r.fail("the %s sent more than perftest does, or did not close: %d bytes, %v", dir, extra, err)
	}
	to.(*net.TCPConn).CloseWrite()
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// Our client and server, with --perftest or without (one dialect: the
// flag is kept for compatibility), exchange over TCP exactly the messages,
// in size and order per direction, that real perftest 6.06 programs
// exchanged on rxe, with the same fixed contents; and the tests run.
func TestPerftestPairsMatchRecordings(t *testing.T) {
	for _, c := range []struct{ kind, op, flag string }{
		{"bw", "write", "--perftest"}, {"bw", "read", "--perftest"}, {"bw", "send", "--perftest"},
		{"lat", "send", "--perftest"}, {"lat", "write", "--perftest"}, {"lat", "read", "--perftest"},
		{"bw", "write", ""}, {"bw", "read", ""}, {"bw", "send", ""}, {"lat", "send", ""}, {"lat", "write", ""}, {"lat", "read", ""},
	} {
		prog := "ib_" + c.op + "_" + c.kind
		t.Run(prog+c.flag, func(t *testing.T) {
			want, err := transcript.ReadHex(filepath.Join("..", "..", "oob", "testdata", "perftest-6.06-"+prog+"-exchange.txt"))
			require.NoError(t, err)
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			common := []string{c.kind, "-o", c.op, "-s", "4096", "-n", "5", "--udp-port", udp, "--timeout", "20s"}
			if c.flag != "" {
				common = append(common, c.flag)
			}
			common = slices.Clip(common) // the server's and the client's appends must not share an array
			s := goRun(append(common, "--bind", "127.0.0.2", "-p", tcp))
			rl := newRelay(t, tcp, want)
			var cout, cerr bytes.Buffer
			ccode := run(append(common, "--bind", "127.0.0.1", "-p", rl.port, "127.0.0.1"), &cout, &cerr)
			scode := s.wait()
			rl.done.Wait()
			require.Equal(t, 0, ccode, "client: %s%s", cout.String(), cerr.String())
			require.Equal(t, 0, scode, "server: %s%s", s.out.String(), s.err.String())
			require.Empty(t, rl.errs)
			for _, dir := range []bool{true, false} {
				var got, rec [][]byte
				for _, m := range rl.got {
					if m.FromClient == dir {
						got = append(got, m.Data)
					}
				}
				for _, m := range want {
					if m.FromClient == dir {
						rec = append(rec, m.Data)
					}
				}
				require.Len(t, got, len(rec))
				for i := range 4 { // version, cycle buffer, cache line, MTU
					assert.Equal(t, rec[i], got[i], "message %d from the client=%v", i, dir)
				}
				key, err := oob.ParsePerftestKey(got[4])
				require.NoError(t, err)
				recKey, err := oob.ParsePerftestKey(rec[4])
				require.NoError(t, err)
				assert.Equal(t, recKey.OutReads > 1, key.OutReads > 1, "out_reads above 1 only for READ tests")
				if c.kind == "bw" && c.op != "send" && dir {
					assert.Equal(t, rec[8], got[8], "size")
					assert.Equal(t, rec[9], got[9], "iterations")
				}
			}
			assert.Regexp(t, `\n 4096 +5 +[0-9.]+ `, cout.String())
		})
	}
}
