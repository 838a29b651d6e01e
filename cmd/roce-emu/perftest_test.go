package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ptMsg is one recorded TCP message of a perftest run.
type ptMsg struct {
	fromClient bool
	data       []byte
}

// readPyTranscript reads ../shared/testdata/perftest-6.06-ib_write_bw-
// client-exchange.txt: "C->S LEN b'...'" per line, Python byte literals.
func readPyTranscript(t *testing.T, name string) []ptMsg {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	var msgs []ptMsg
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, " ", 3)
		require.Len(t, f, 3, "line %q", line)
		n, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		data, err := parsePyBytes(f[2])
		require.NoError(t, err, "line %q", line)
		require.Len(t, data, n, "line %q", line)
		msgs = append(msgs, ptMsg{fromClient: f[0] == "C->S", data: data})
	}
	return msgs
}

// parsePyBytes decodes a Python bytes literal such as b'3\x00'.
func parsePyBytes(s string) ([]byte, error) {
	if len(s) < 3 || s[0] != 'b' || (s[1] != '\'' && s[1] != '"') || s[len(s)-1] != s[1] {
		return nil, fmt.Errorf("not a bytes literal: %q", s)
	}
	s = s[2 : len(s)-1]
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		i++
		if i == len(s) {
			return nil, fmt.Errorf("dangling backslash")
		}
		switch c := s[i]; c {
		case 'x':
			if i+3 > len(s) {
				return nil, fmt.Errorf("short \\x escape")
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return nil, err
			}
			out = append(out, byte(v))
			i += 2
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case '0':
			out = append(out, 0)
		case '\\', '\'', '"':
			out = append(out, c)
		default:
			return nil, fmt.Errorf("unknown escape \\%c", c)
		}
	}
	return out, nil
}

// readHexTranscript reads testdata/perftest-6.06-*-exchange.txt: "C->S LEN
// HEX" per message, "C->S EOF" when a side closed, '#' comments.
func readHexTranscript(t *testing.T, name string) []ptMsg {
	t.Helper()
	f, err := os.Open(name)
	require.NoError(t, err)
	defer f.Close()
	var msgs []ptMsg
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fs := strings.Fields(line)
		if fs[1] == "EOF" {
			continue
		}
		require.Len(t, fs, 3, "line %q", line)
		data, err := hex.DecodeString(fs[2])
		require.NoError(t, err)
		n, _ := strconv.Atoi(fs[1])
		require.Len(t, data, n)
		msgs = append(msgs, ptMsg{fromClient: fs[0] == "C->S", data: data})
	}
	require.NoError(t, sc.Err())
	return msgs
}

func sizesOf(msgs []ptMsg, fromClient bool) []int {
	var n []int
	for _, m := range msgs {
		if m.fromClient == fromClient {
			n = append(n, len(m.data))
		}
	}
	return n
}

func TestPerftestHelpers(t *testing.T) {
	v, s := parsePerftestVersion([]byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	assert.Equal(t, 6.06, v)
	assert.Equal(t, "6.06", s)
	v, _ = parsePerftestVersion([]byte("5.33b\x00junk"))
	assert.Equal(t, 5.33, v)
	v, _ = parsePerftestVersion([]byte("\x00"))
	assert.Zero(t, v)

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

	assert.Equal(t, "00:00:00:00:00:00:00:00:00:00:255:255:192:00:02:02", perftestGID(netip.MustParseAddr("192.0.2.2")))

	// Key strings as perftest sends them: NUL-terminated, parsed up to it.
	p, reads, err := parsePerftestKey([]byte(perftestKey + "\x00garbage"))
	require.NoError(t, err)
	assert.Equal(t, 1, reads)
	assert.Equal(t, uint32(0x11), p.QPN)
}

// startPerftestServer runs roce-emu KIND --perftest as server and returns
// a connection to it (dialled once it listens) and a function that waits
// for it and returns its exit code and output.
func startPerftestServer(t *testing.T, args ...string) (net.Conn, func() (int, string)) {
	t.Helper()
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	var out, errb bytes.Buffer
	var code int
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = run(append(args, "--perftest", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "--timeout", "20s"), &out, &errb)
	}()
	var c net.Conn
	var err error
	for try := 0; try < 200; try++ {
		if c, err = net.Dial("tcp", "127.0.0.1:"+tcp); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, err)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, func() (int, string) {
		<-done
		return code, out.String() + errb.String()
	}
}

// A fake ib_write_bw client sends exactly what the real one sent
// (../shared/testdata/perftest-6.06-ib_write_bw-client-exchange.txt, run
// with -s 4096 -n 5 --report_gbits); roce-emu answers each message with
// one of the same size, perftest's own values where they are fixed, and
// prints the client's results.
func TestPerftestServerAgainstRecordedClient(t *testing.T) {
	msgs := readPyTranscript(t, filepath.Join(filepath.Dir(testenv.SharedPcaps(t)), "perftest-6.06-ib_write_bw-client-exchange.txt"))
	require.Len(t, msgs, 15)
	c, wait := startPerftestServer(t, "bw", "-o", "write", "-s", "4096", "-n", "5", "--report_gbits")
	defer c.Close()
	var replies [][]byte
	for i, m := range msgs {
		require.True(t, m.fromClient)
		_, err := c.Write(m.data)
		require.NoError(t, err, "message %d", i)
		r := make([]byte, len(m.data))
		_, err = io.ReadFull(c, r)
		require.NoError(t, err, "reply to message %d (%d bytes)", i, len(m.data))
		replies = append(replies, r)
	}
	_, err := c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "nothing after \"done\"")
	code, out := wait()
	require.Equal(t, 0, code, out)

	assert.Equal(t, msgs[0].data, replies[0], "version 6.06")
	assert.Equal(t, []byte{0, 0, 0x10, 0}, replies[1], "cycle buffer 4096")
	assert.Equal(t, []byte{0, 0, 0, 64}, replies[2], "cache line 64")
	assert.Equal(t, []byte("3\x00"), replies[3], "MTU 1024")
	key, reads, err := parsePerftestKey(replies[4])
	require.NoError(t, err)
	assert.Equal(t, 1, reads)
	assert.Equal(t, netip.MustParseAddr("127.0.0.2"), key.GID)
	for _, i := range []int{5, 6, 7, 13} {
		assert.Equal(t, replies[4], replies[i], "barrier %d repeats the key", i)
	}
	assert.Equal(t, uint64(4096), binary.BigEndian.Uint64(replies[8]), "size")
	assert.Equal(t, uint64(5), binary.BigEndian.Uint64(replies[9]), "iterations")
	assert.Equal(t, []byte("done\x00"), replies[14])

	// The server prints what the client measured.
	dbl := func(b []byte) float64 { return math.Float64frombits(binary.BigEndian.Uint64(b)) }
	want := fmt.Sprintf(" %-10d %-10d       %-18.2f %-20.2f %.6f\n", 4096, 5, dbl(msgs[10].data), dbl(msgs[11].data), dbl(msgs[12].data))
	assert.Contains(t, out, "the client's results:\n #bytes     #iterations    BW peak[Gb/sec]")
	assert.Contains(t, out, want)
	assert.Contains(t, out, "QPN 0x0011 PSN 0x5df3ee RKey 0x0002d1 VAddr 0x00562bb641e000", "the recorded client's address")
}

// echoServer answers each message with itself, as the host peer that
// recorded the shared transcript did; it returns the messages it saw.
func echoServer(t *testing.T) (string, func() []ptMsg) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var msgs []ptMsg
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
				msgs = append(msgs, ptMsg{fromClient: true, data: bytes.Clone(b[:n])})
				c.Write(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), func() []ptMsg { <-done; return msgs }
}

// roce-emu as client against a peer that echoes: it sends what the real
// ib_write_bw client sent, message for message, and its QP, connected to
// itself, runs the test.
func TestPerftestClientAgainstEcho(t *testing.T) {
	rec := readPyTranscript(t, filepath.Join(filepath.Dir(testenv.SharedPcaps(t)), "perftest-6.06-ib_write_bw-client-exchange.txt"))
	for _, op := range []string{"write", "read"} {
		t.Run(op, func(t *testing.T) {
			port, msgs := echoServer(t)
			var out, errb bytes.Buffer
			code := run([]string{"bw", "--perftest", "-o", op, "-s", "4096", "-n", "5", "--report_gbits", "--bind", "127.0.0.1",
				"--udp-port", freeUDPPort(t), "-p", port, "--timeout", "20s", "127.0.0.1"}, &out, &errb)
			require.Equal(t, 0, code, "%s%s", out.String(), errb.String())
			got := msgs()
			require.Equal(t, sizesOf(rec, true), sizesOf(got, true), "message sizes, in order")
			for _, i := range []int{0, 1, 2, 3, 8, 9, 14} { // version, cycle, cache line, MTU, size, iterations, done
				assert.Equal(t, rec[i].data, got[i].data, "message %d", i)
			}
			key, reads, err := parsePerftestKey(got[4].data)
			require.NoError(t, err)
			assert.Equal(t, map[string]int{"write": 1, "read": 16}[op], reads, "out_reads")
			assert.Equal(t, netip.MustParseAddr("127.0.0.1"), key.GID)
			for _, i := range []int{5, 6, 7, 13} {
				assert.Equal(t, got[4].data, got[i].data, "barrier %d", i)
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
	got  []ptMsg
	errs []string
	done sync.WaitGroup
}

func newRelay(t *testing.T, to string, want []ptMsg) *relay {
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
		var sv net.Conn
		for try := 0; try < 200; try++ {
			if sv, err = net.Dial("tcp", "127.0.0.1:"+to); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
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
		go r.pipe(&wg, cl, sv, true, sizesOf(want, true))
		go r.pipe(&wg, sv, cl, false, sizesOf(want, false))
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
		r.got = append(r.got, ptMsg{fromClient: fromClient, data: b})
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

// Our client and server in --perftest mode exchange over TCP exactly the
// messages, in size and order per direction, that real perftest 6.06
// programs exchanged on rxe, with the same fixed contents; and the tests
// run.
func TestPerftestPairsMatchRecordings(t *testing.T) {
	for _, c := range []struct{ kind, op string }{
		{"bw", "write"}, {"bw", "read"}, {"bw", "send"}, {"lat", "send"}, {"lat", "write"}, {"lat", "read"},
	} {
		prog := "ib_" + c.op + "_" + c.kind
		t.Run(prog, func(t *testing.T) {
			want := readHexTranscript(t, filepath.Join("..", "..", "oob", "testdata", "perftest-6.06-"+prog+"-exchange.txt"))
			tcp, udp := freeTCPPort(t), freeUDPPort(t)
			common := []string{c.kind, "--perftest", "-o", c.op, "-s", "4096", "-n", "5", "--udp-port", udp, "--timeout", "20s"}
			var sout, serr bytes.Buffer
			var scode int
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				scode = run(append(common, "--bind", "127.0.0.2", "-p", tcp), &sout, &serr)
			}()
			rl := newRelay(t, tcp, want)
			var cout, cerr bytes.Buffer
			ccode := run(append(common, "--bind", "127.0.0.1", "-p", rl.port, "127.0.0.1"), &cout, &cerr)
			wg.Wait()
			rl.done.Wait()
			require.Equal(t, 0, ccode, "client: %s%s", cout.String(), cerr.String())
			require.Equal(t, 0, scode, "server: %s%s", sout.String(), serr.String())
			require.Empty(t, rl.errs)
			for _, dir := range []bool{true, false} {
				var got, rec [][]byte
				for _, m := range rl.got {
					if m.fromClient == dir {
						got = append(got, m.data)
					}
				}
				for _, m := range want {
					if m.fromClient == dir {
						rec = append(rec, m.data)
					}
				}
				require.Len(t, got, len(rec))
				for i := range 4 { // version, cycle buffer, cache line, MTU
					assert.Equal(t, rec[i], got[i], "message %d from the client=%v", i, dir)
				}
				_, reads, err := parsePerftestKey(got[4])
				require.NoError(t, err)
				_, recReads, err := parsePerftestKey(rec[4])
				require.NoError(t, err)
				assert.Equal(t, recReads > 1, reads > 1, "out_reads above 1 only for READ tests")
				if c.kind == "bw" && c.op != "send" && dir {
					assert.Equal(t, rec[8], got[8], "size")
					assert.Equal(t, rec[9], got[9], "iterations")
				}
			}
			assert.Regexp(t, `\n 4096 +5 +[0-9.]+ `, cout.String())
		})
	}
}
