package oob

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/roce-emu/roce-emu/internal/transcript"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The key string perftest 6.06 on rxe sent (../shared/testdata/
// perftest-6.06-ib_write_bw-client-exchange.txt).
const perftestKey = "0000:0001:000011:5df3ee:000002d1:0000562bb641e000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:00:02:02:00000000:"

func TestPerftestKeyFormat(t *testing.T) {
	p := PerftestKey{OutReads: 1, QPN: 0x11, PSN: 0x5df3ee, RKey: 0x2d1, VA: 0x562bb641e000, GID: netip.MustParseAddr("192.0.2.2")}
	b, err := p.Append(nil)
	require.NoError(t, err)
	require.Len(t, b, 108)
	assert.Equal(t, perftestKey+"\x00", string(b))
	got, err := ParsePerftestKey([]byte(perftestKey + "\x00"))
	require.NoError(t, err)
	assert.Equal(t, uint16(1), got.OutReads)
	assert.Equal(t, p, got)
	for _, bad := range []string{"", "0000:0001", strings.Replace(perftestKey, "5df3ee", "5dg3ee", 1),
		strings.Replace(perftestKey, "000011", "1000011", 1), strings.Replace(perftestKey, ":ff:", ":100:", 1),
		strings.Replace(perftestKey, ":ff:", "::", 1), perftestKey + "00:"} {
		_, err := ParsePerftestKey([]byte(bad))
		assert.ErrorIs(t, err, ErrMalformed, "%q", bad)
	}
	// Truncation sweep: a prefix that stops before the SRQ number fails.
	for i := range len(perftestKey) - 8 {
		_, err := ParsePerftestKey([]byte(perftestKey[:i]))
		assert.ErrorIs(t, err, ErrMalformed, "%d bytes", i)
	}

	// Key strings as perftest sends them: NUL-terminated, parsed up to it.
	k, err := ParsePerftestKey([]byte(perftestKey + "\x00garbage"))
	require.NoError(t, err)
	assert.Equal(t, uint16(1), k.OutReads)
	assert.Equal(t, uint32(0x11), k.QPN)

	// RoCEv2 over IPv6: the GID is the address.
	p.GID, p.SRQN = netip.MustParseAddr("fd00::2"), 7
	b, err = p.Append(nil)
	require.NoError(t, err)
	assert.Contains(t, string(b), ":fd:00:00:00:00:00:00:00:00:00:00:00:00:00:00:02:00000007:\x00")
	got, err = ParsePerftestKey(b)
	require.NoError(t, err)
	assert.Equal(t, p, got)

	_, err = PerftestKey{QPN: 1 << 24}.Append(nil)
	assert.Error(t, err)
}

func TestParsePerftestVersion(t *testing.T) {
	v, s := ParsePerftestVersion([]byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	assert.Equal(t, 6.06, v)
	assert.Equal(t, "6.06", s)
	v, _ = ParsePerftestVersion([]byte("5.33b\x00junk"))
	assert.Equal(t, 5.33, v)
	v, _ = ParsePerftestVersion([]byte("\x00"))
	assert.Zero(t, v)
	v, _ = ParsePerftestVersion([]byte("..."))
	assert.Zero(t, v)
}

// ptRun is what one side learnt in a run of a perftest program's exchange.
type ptRun struct {
	ver    string
	sys    SysData
	mtu    qp.MTU
	keys   []PerftestKey
	report BWReport
}

// drivePerftest runs prog's exchange as perftest 6.06 does it (the step
// order recorded in testdata), with one QP.
func drivePerftest(ctx context.Context, s *Perftest, prog string, mine []PerftestKey, mtu qp.MTU, sys SysData, rep BWReport) (ptRun, error) {
	var r ptRun
	var err error
	if r.ver, err = s.Versions(ctx); err != nil {
		return r, err
	}
	if r.sys, err = s.SysData(ctx, sys); err != nil {
		return r, err
	}
	if r.mtu, err = s.MTU(ctx, mtu); err != nil {
		return r, err
	}
	if r.keys, err = s.Keys(ctx, mine); err != nil {
		return r, err
	}
	for _, b := range []string{"after connecting", "addresses printed"} {
		if err := s.Barrier(ctx, b); err != nil {
			return r, err
		}
	}
	switch prog {
	case "ib_write_bw", "ib_read_bw":
		if err := s.Barrier(ctx, "traffic done"); err != nil {
			return r, err
		}
		if r.report, err = s.BWReports(ctx, rep); err != nil {
			return r, err
		}
	default:
		if err := s.Barrier(ctx, "before traffic"); err != nil {
			return r, err
		}
	}
	if prog == "ib_write_lat" {
		return r, nil // closes without a last barrier or "done"
	}
	return r, s.Done(ctx)
}

var programs = []string{"ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_read_lat", "ib_send_lat"}

// canonical puts each exchange's client message first, as the protocol
// orders them; the recorder saw the two "done"s of a bandwidth test the
// other way round, as both sides write theirs at once.
func canonical(msgs []transcript.Msg) []transcript.Msg {
	out := append([]transcript.Msg(nil), msgs...)
	for i := 0; i+1 < len(out); i += 2 {
		if !out[i].FromClient && out[i+1].FromClient {
			out[i], out[i+1] = out[i+1], out[i]
		}
	}
	return out
}

// replay plays the other side of a recording over net.Pipe: it writes
// that side's messages and reads ours, in order, then closes. It returns
// our messages as read, and an error if ours were cut short.
func replay(ctx context.Context, conn net.Conn, msgs []transcript.Msg, weAreClient bool) func() ([][]byte, error) {
	type res struct {
		got [][]byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		defer conn.Close()
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)
		}
		var r res
		for i, m := range msgs {
			if m.FromClient == weAreClient {
				b := make([]byte, len(m.Data))
				if _, err := io.ReadFull(conn, b); err != nil {
					r.err = fmt.Errorf("message %d (%d bytes): %v", i, len(b), err)
					break
				}
				r.got = append(r.got, b)
			} else if _, err := conn.Write(m.Data); err != nil {
				r.err = fmt.Errorf("writing message %d: %v", i, err)
				break
			}
		}
		ch <- r
	}()
	return func() ([][]byte, error) { r := <-ch; return r.got, r.err }
}

// Our client and server sessions, each against the other side of a real
// perftest run replayed message for message (testdata), send messages of
// the recorded sizes in the recorded order with the recorded fixed
// contents, and learn what the real peer said.
func TestPerftestTranscripts(t *testing.T) {
	for _, prog := range programs {
		msgs, err := transcript.ReadHex(filepath.Join("testdata", "perftest-6.06-"+prog+"-exchange.txt"))
		require.NoError(t, err)
		msgs = canonical(msgs)
		for _, client := range []bool{true, false} {
			role := map[bool]string{true: "client", false: "server"}[client]
			t.Run(prog+"/"+role, func(t *testing.T) {
				ctx := ctxT(t, 5*time.Second)
				a, b := net.Pipe()
				defer a.Close()
				wait := replay(ctx, b, msgs, client)
				s := NewPerftestServer(a)
				if client {
					s = NewPerftestClient(a)
				}
				reads := uint16(1)
				if strings.Contains(prog, "read") {
					reads = 16
				}
				mine := PerftestKey{OutReads: reads, QPN: 0x42, PSN: 0x123456, RKey: 0x99, VA: 0x7f0000001000, GID: netip.MustParseAddr("192.0.2.1")}
				rep := BWReport{Size: 4096, Iters: 5, PeakBW: 1.5, AvgBW: 1.25, MsgRate: 0.04}
				r, err := drivePerftest(ctx, s, prog, []PerftestKey{mine}, qp.IBV_MTU_1024, SysData{DefaultCycleBuffer, DefaultCacheLine}, rep)
				require.NoError(t, err)
				got, err := wait()
				require.NoError(t, err)

				ours, theirs := transcript.From(msgs, client), transcript.From(msgs, !client)
				require.Len(t, got, len(ours))
				for i := range 4 { // version, cycle buffer, cache line, MTU
					assert.Equal(t, ours[i], got[i], "message %d", i)
				}
				key, err := ParsePerftestKey(got[4])
				require.NoError(t, err)
				assert.Equal(t, mine, key)
				recKey, err := ParsePerftestKey(ours[4])
				require.NoError(t, err)
				assert.Equal(t, recKey.OutReads > 1, key.OutReads > 1, "out_reads above 1 only for READ tests")
				for i, m := range got[5:] {
					if len(m) == PerftestKeyLen {
						assert.Equal(t, got[4], m, "barrier %d repeats the key", i)
					}
				}
				if prog != "ib_write_lat" {
					assert.Equal(t, []byte("done\x00"), got[len(got)-1])
				}

				assert.Equal(t, "6.06", r.ver)
				assert.Equal(t, SysData{4096, 64}, r.sys)
				assert.Equal(t, qp.IBV_MTU_1024, r.mtu)
				peerKey, err := ParsePerftestKey(theirs[4])
				require.NoError(t, err)
				assert.Equal(t, []PerftestKey{peerKey}, r.keys)
				assert.True(t, r.keys[0].GID.Is4(), "rxe's GID index 1 is IPv4-mapped")
				if strings.HasSuffix(prog, "_bw") && prog != "ib_send_bw" {
					if client {
						assert.Equal(t, ours[8], got[8], "size")
						assert.Equal(t, ours[9], got[9], "iterations")
					}
					u := func(b []byte) uint64 { return binary.BigEndian.Uint64(b) }
					f := func(b []byte) float64 { return math.Float64frombits(u(b)) }
					assert.Equal(t, BWReport{Size: u(theirs[8]), Iters: u(theirs[9]), PeakBW: f(theirs[10]), AvgBW: f(theirs[11]), MsgRate: f(theirs[12])}, r.report)
					assert.Equal(t, rep, BWReport{Size: u(got[8]), Iters: u(got[9]), PeakBW: f(got[10]), AvgBW: f(got[11]), MsgRate: f(got[12])})
				}
			})
		}
	}
}

// Our server against the messages the real ib_write_bw client sent to an
// echoing peer (-s 4096 -n 5 --report_gbits): it answers each with one of
// the same size and reads the client's results.
func TestPerftestServerAgainstRecordedClient(t *testing.T) {
	msgs, err := transcript.ReadPy(filepath.Join(filepath.Dir(testenv.SharedPcaps(t)), "perftest-6.06-ib_write_bw-client-exchange.txt"))
	require.NoError(t, err)
	require.Len(t, msgs, 15)
	var echoed []transcript.Msg
	for _, m := range msgs {
		require.True(t, m.FromClient)
		echoed = append(echoed, m, transcript.Msg{Data: m.Data})
	}
	ctx := ctxT(t, 5*time.Second)
	a, b := net.Pipe()
	defer a.Close()
	wait := replay(ctx, b, echoed, false)
	mine := PerftestKey{OutReads: 1, QPN: 0x42, PSN: 1, RKey: 2, VA: 3, GID: netip.MustParseAddr("127.0.0.2")}
	r, err := drivePerftest(ctx, NewPerftestServer(a), "ib_write_bw", []PerftestKey{mine}, qp.IBV_MTU_1024, SysData{DefaultCycleBuffer, DefaultCacheLine}, BWReport{})
	require.NoError(t, err)
	replies, err := wait()
	require.NoError(t, err)
	require.Len(t, replies, 15)
	assert.Equal(t, msgs[0].Data, replies[0], "version 6.06")
	assert.Equal(t, []byte{0, 0, 0x10, 0}, replies[1], "cycle buffer 4096")
	assert.Equal(t, []byte{0, 0, 0, 64}, replies[2], "cache line 64")
	assert.Equal(t, []byte("3\x00"), replies[3], "MTU 1024")
	for _, i := range []int{5, 6, 7, 13} {
		assert.Equal(t, replies[4], replies[i], "barrier %d repeats the key", i)
	}
	assert.Equal(t, []byte("done\x00"), replies[14])
	dbl := func(b []byte) float64 { return math.Float64frombits(binary.BigEndian.Uint64(b)) }
	assert.Equal(t, BWReport{Size: 4096, Iters: 5, PeakBW: dbl(msgs[10].Data), AvgBW: dbl(msgs[11].Data), MsgRate: dbl(msgs[12].Data)}, r.report)
	assert.Equal(t, PerftestKey{OutReads: 1, QPN: 0x11, PSN: 0x5df3ee, RKey: 0x2d1, VA: 0x562bb641e000, GID: netip.MustParseAddr("192.0.2.2")}, r.keys[0])
}

// Our client and server against each other over net.Pipe, with two QPs
// (perftest -q 2), different MTUs and cycle buffers, over IPv6.
func TestPerftestSessionPair(t *testing.T) {
	ctx := ctxT(t, 5*time.Second)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ckeys := []PerftestKey{{OutReads: 16, QPN: 0x11, PSN: 1, RKey: 0x100, VA: 0x1000, GID: netip.MustParseAddr("fd00::1")},
		{OutReads: 16, QPN: 0x12, PSN: 2, RKey: 0x100, VA: 0x2000, GID: netip.MustParseAddr("fd00::1")}}
	skeys := []PerftestKey{{OutReads: 128, QPN: 0x21, PSN: 3, RKey: 0x200, VA: 0x3000, GID: netip.MustParseAddr("fd00::2")},
		{OutReads: 128, QPN: 0x22, PSN: 4, RKey: 0x200, VA: 0x4000, GID: netip.MustParseAddr("fd00::2")}}
	crep := BWReport{Size: 65536, Iters: 1000, PeakBW: 9.5, AvgBW: 9.25, MsgRate: 0.0176}
	type res struct {
		r   ptRun
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := drivePerftest(ctx, NewPerftestServer(b), "ib_read_bw", skeys, qp.IBV_MTU_4096, SysData{4096, 128}, BWReport{})
		ch <- res{r, err}
	}()
	cr, err := drivePerftest(ctx, NewPerftestClient(a), "ib_read_bw", ckeys, qp.IBV_MTU_1024, SysData{8192, 64}, crep)
	require.NoError(t, err)
	sr := <-ch
	require.NoError(t, sr.err)
	assert.Equal(t, skeys, cr.keys)
	assert.Equal(t, ckeys, sr.r.keys)
	for _, r := range []ptRun{cr, sr.r} {
		assert.Equal(t, qp.IBV_MTU_1024, r.mtu, "the smaller MTU")
		assert.Equal(t, SysData{8192, 128}, r.sys, "the larger cycle buffer and cache line")
		assert.Equal(t, PerftestVersion, r.ver)
	}
	assert.Equal(t, crep, sr.r.report)
	assert.Equal(t, BWReport{}, cr.report)
}

// A peer of an older perftest gets the messages its version expects:
// no system data before 5.32, a 4-byte MTU before 5.31, none before 5.1,
// a 4-byte iteration count before 5.33; before 5.0 the session refuses.
func TestPerftestOlderPeers(t *testing.T) {
	for _, c := range []struct {
		ver   string
		sizes []int // what our client sends, up to and including the results
	}{
		{"5.33", []int{16, 4, 4, 2, 108, 8, 8, 8, 8, 8}},
		{"5.32", []int{16, 4, 4, 2, 108, 8, 4, 8, 8, 8}},
		{"5.31", []int{16, 2, 108, 8, 4, 8, 8, 8}},
		{"5.2", []int{16, 4, 108, 8, 4, 8, 8, 8}},
		{"5.0", []int{16, 108, 8, 4, 8, 8, 8}},
	} {
		t.Run(c.ver, func(t *testing.T) {
			ctx := ctxT(t, 5*time.Second)
			a, b := net.Pipe()
			defer a.Close()
			// The peer answers each message with one of the same size:
			// its version first, then what we sent (the key, the MTU).
			var got []int
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer b.Close()
				for i, n := range c.sizes {
					m := make([]byte, n)
					if _, err := io.ReadFull(b, m); err != nil {
						return
					}
					got = append(got, n)
					if i == 0 {
						m = make([]byte, 16)
						copy(m, c.ver)
					}
					b.Write(m)
				}
			}()
			s := NewPerftestClient(a)
			_, err := s.Versions(ctx)
			require.NoError(t, err)
			v, txt := s.PeerVersion()
			assert.Equal(t, c.ver, txt)
			assert.Greater(t, v, 4.9)
			sys, err := s.SysData(ctx, SysData{4096, 64})
			require.NoError(t, err)
			assert.Equal(t, SysData{4096, 64}, sys)
			mtu, err := s.MTU(ctx, qp.IBV_MTU_2048)
			require.NoError(t, err)
			assert.Equal(t, qp.IBV_MTU_2048, mtu, "the peer echoed ours")
			_, err = s.Keys(ctx, []PerftestKey{{QPN: 1, GID: netip.MustParseAddr("192.0.2.1")}})
			require.NoError(t, err)
			rep, err := s.BWReports(ctx, BWReport{Size: 64, Iters: 7, PeakBW: 1, AvgBW: 2, MsgRate: 3})
			require.NoError(t, err)
			assert.Equal(t, BWReport{Size: 64, Iters: 7, PeakBW: 1, AvgBW: 2, MsgRate: 3}, rep, "the echo")
			<-done
			assert.Equal(t, c.sizes, got)
		})
	}
	_, err := NewPerftestClient(rawPeer(t, []byte("4.99\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), true)).Versions(ctxT(t, time.Second))
	assert.ErrorIs(t, err, ErrVersion)
	_, err = NewPerftestClient(rawPeer(t, []byte("not a version!!!"), true)).Versions(ctxT(t, time.Second))
	assert.ErrorIs(t, err, ErrVersion)
}

// Steps out of order, bad local values and bad peer values are errors.
func TestPerftestErrors(t *testing.T) {
	ctx := ctxT(t, 2*time.Second)
	s := NewPerftestClient(rawPeer(t, nil, false))
	_, err := s.SysData(ctx, SysData{4096, 64})
	assert.ErrorIs(t, err, ErrState)
	assert.ErrorIs(t, s.Barrier(ctx, "x"), ErrState)

	ver := []byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	peer := func(rest ...[]byte) *Perftest {
		s := NewPerftestClient(rawPeer(t, append(ver, bytesJoin(rest)...), true))
		_, err := s.Versions(ctx)
		require.NoError(t, err)
		return s
	}
	_, err = peer().SysData(ctx, SysData{4096, 8192})
	assert.Error(t, err, "a cache line larger than the cycle buffer")
	_, err = peer([]byte{0x40, 0, 0, 1}, []byte{0, 0, 0, 64}).SysData(ctx, SysData{4096, 64})
	assert.ErrorIs(t, err, ErrMalformed, "a cycle buffer above 1 GiB")
	_, err = peer([]byte{0, 0, 0x10, 0}, []byte{0, 0, 0x20, 0}).SysData(ctx, SysData{4096, 64})
	assert.ErrorIs(t, err, ErrMalformed, "a cache line above the cycle buffer")
	_, err = peer([]byte("9\x00")).MTU(ctx, qp.IBV_MTU_1024)
	assert.ErrorIs(t, err, ErrMalformed)
	_, err = peer([]byte("x\x00")).MTU(ctx, qp.IBV_MTU_1024)
	assert.ErrorIs(t, err, ErrMalformed)
	_, err = peer().MTU(ctx, 0)
	assert.Error(t, err)
	_, err = peer().Keys(ctx, nil)
	assert.Error(t, err)
	// An IPv4 GID against an IPv6 one.
	k6 := PerftestKey{QPN: 1, GID: netip.MustParseAddr("fd00::2")}
	b6, _ := k6.Append(nil)
	_, err = peer(b6).Keys(ctx, []PerftestKey{{QPN: 2, GID: netip.MustParseAddr("192.0.2.1")}})
	assert.ErrorIs(t, err, ErrGIDType)
	// A barrier answered with something that is not a key string.
	k4 := PerftestKey{QPN: 1, GID: netip.MustParseAddr("192.0.2.2")}
	b4, _ := k4.Append(nil)
	s = peer(b4, make([]byte, 108))
	_, err = s.Keys(ctx, []PerftestKey{{QPN: 2, GID: netip.MustParseAddr("192.0.2.1")}})
	require.NoError(t, err)
	assert.ErrorIs(t, s.Barrier(ctx, "x"), ErrMalformed)
	// "done" that is not.
	s = peer(b4, b4, []byte("nope\x00"))
	_, err = s.Keys(ctx, []PerftestKey{{QPN: 2, GID: netip.MustParseAddr("192.0.2.1")}})
	require.NoError(t, err)
	assert.ErrorIs(t, s.Done(ctx), ErrMalformed)
	// A client that closes instead of saying done is fine, as perftest;
	// the server does not answer it.
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		defer b.Close()
		for _, m := range [][]byte{ver, b4, b4} {
			b.Write(m)
			io.ReadFull(b, make([]byte, len(m)))
		}
	}()
	s = NewPerftestServer(a)
	_, err = s.Versions(ctx)
	require.NoError(t, err)
	_, err = s.Keys(ctx, []PerftestKey{{QPN: 2, GID: netip.MustParseAddr("192.0.2.1")}})
	require.NoError(t, err)
	assert.NoError(t, s.Done(ctx))
}

func bytesJoin(bs [][]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// A peer that sends any prefix of a real server's messages and closes, or
// stays silent, makes the client's run fail with an error in time; a
// prefix that holds every message but part of the last "done" does not.
func TestPerftestTruncatedPeer(t *testing.T) {
	msgs, err := transcript.ReadHex(filepath.Join("testdata", "perftest-6.06-ib_write_bw-exchange.txt"))
	require.NoError(t, err)
	server := bytesJoin(transcript.From(msgs, false))
	lastDone := len(server) - len(doneMsg)
	key := []PerftestKey{{QPN: 1, GID: netip.MustParseAddr("192.0.2.1")}}
	for n := 0; n <= len(server); n += 1 + n%7 {
		start := time.Now()
		_, err := drivePerftest(ctxT(t, 2*time.Second), NewPerftestClient(rawPeer(t, server[:n], true)), "ib_write_bw", key,
			qp.IBV_MTU_1024, SysData{4096, 64}, BWReport{})
		if n < lastDone {
			require.Error(t, err, "%d of %d bytes", n, len(server))
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "%d bytes: an EOF is seen at once", n)
		} else if err != nil {
			assert.ErrorIs(t, err, ErrMalformed, "%d bytes", n)
		}
		assert.Less(t, time.Since(start), time.Second)
	}
	// Silent: the context ends the run.
	_, err = drivePerftest(ctxT(t, 100*time.Millisecond), NewPerftestServer(rawPeer(t, nil, false)), "ib_send_lat", key,
		qp.IBV_MTU_1024, SysData{4096, 64}, BWReport{})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func FuzzParsePerftestKey(f *testing.F) {
	f.Add([]byte(perftestKey + "\x00"))
	f.Add([]byte("0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0"))
	f.Add([]byte("::::"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParsePerftestKey(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("%q: %v does not wrap ErrMalformed", b, err)
			}
			return
		}
		out, err := k.Append(nil)
		if err != nil || len(out) != PerftestKeyLen {
			t.Fatalf("parsed %q to %+v, which encodes to %q, %v", b, k, out, err)
		}
		k2, err := ParsePerftestKey(out)
		if err != nil || k2 != k {
			t.Fatalf("round trip of %q: %+v, then %+v, %v", b, k, k2, err)
		}
	})
}

// A server session fed arbitrary bytes ends with an error or, for bytes
// that make a whole exchange, none; never a panic or a hang.
func FuzzPerftestServer(f *testing.F) {
	msgs, err := transcript.ReadHex(filepath.Join("testdata", "perftest-6.06-ib_write_bw-exchange.txt"))
	if err != nil {
		f.Fatal(err)
	}
	client := bytesJoin(transcript.From(msgs, true))
	f.Add(client)
	f.Add(client[:100])
	f.Add([]byte("5.1\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x003\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		a, p := net.Pipe()
		defer a.Close()
		go func() {
			go io.Copy(io.Discard, p)
			p.Write(b)
			p.Close()
		}()
		key := []PerftestKey{{QPN: 1, GID: netip.MustParseAddr("192.0.2.1")}}
		_, err := drivePerftest(ctx, NewPerftestServer(a), "ib_write_bw", key, qp.IBV_MTU_1024, SysData{4096, 64}, BWReport{})
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a peer that closed made the session wait for the deadline: %v", err)
		}
	})
}

// rxe's ib_write_bw -q 4 client (testdata/rxe-ib_write_bw-q4-client.txt):
// our server reads its four key strings, one per QP, answers each with
// one of its own, then takes the barriers as perftest sends them, one per
// QP with that QP's key string and one with QP 0's.
func TestPerftestServerAgainstRxeQ4Client(t *testing.T) {
	rec, err := transcript.ReadHex(filepath.Join("testdata", "rxe-ib_write_bw-q4-client.txt"))
	require.NoError(t, err)
	require.Len(t, rec, 9, "version, cycle buffer, cache line, MTU, 4 keys, the first barrier")
	require.Equal(t, rec[4].Data, rec[8].Data, "the first barrier repeats QP 0's key")
	// perftest's barriers after connecting: QP i's key for each QP (the
	// first recorded), then QP 0's.
	client := append(slices.Clone(rec), rec[5], rec[6], rec[7], rec[4])
	var msgs []transcript.Msg
	for _, m := range client {
		msgs = append(msgs, m, transcript.Msg{Data: m.Data})
	}
	ctx := ctxT(t, 5*time.Second)
	a, b := net.Pipe()
	defer a.Close()
	wait := replay(ctx, b, msgs, false)
	s := NewPerftestServer(a)
	_, err = s.Versions(ctx)
	require.NoError(t, err)
	_, err = s.SysData(ctx, SysData{DefaultCycleBuffer, DefaultCacheLine})
	require.NoError(t, err)
	mtu, err := s.MTU(ctx, qp.IBV_MTU_1024)
	require.NoError(t, err)
	assert.Equal(t, qp.IBV_MTU_1024, mtu, "rxe offers 4096 (\"5\"), we 1024")
	var mine []PerftestKey
	for i := range 4 {
		mine = append(mine, PerftestKey{OutReads: 1, QPN: uint32(0x11 + i), PSN: bth.PSN(i), RKey: 0x130, VA: 0x7f0000064000 + uint64(i)*0x10000, GID: netip.MustParseAddr("192.0.2.1")})
	}
	rem, err := s.Keys(ctx, mine)
	require.NoError(t, err)
	require.Len(t, rem, 4)
	for i, k := range rem {
		assert.Equal(t, PerftestKey{OutReads: 1, QPN: uint32(0x36 + i), PSN: k.PSN, RKey: 0x27de, VA: 0x7fb978f3b000 + uint64(i)*0x10000, GID: netip.MustParseAddr("192.0.2.2")}, k,
			"QP %d: its own QPN and region, 64 KiB apart (perftest's BUFF_SIZE)", i)
	}
	assert.Equal(t, []bth.PSN{0x76acba, 0xf6111c, 0x65f236, 0xf3444d}, []bth.PSN{rem[0].PSN, rem[1].PSN, rem[2].PSN, rem[3].PSN})
	require.NoError(t, s.BarrierEach(ctx, "after connecting"))
	require.NoError(t, s.Barrier(ctx, "addresses printed"))
	replies, err := wait()
	require.NoError(t, err)
	require.Len(t, replies, 13)
	for i := range 4 {
		k, err := ParsePerftestKey(replies[4+i])
		require.NoError(t, err)
		assert.Equal(t, mine[i], k, "key string of QP %d", i)
		assert.Equal(t, replies[4+i], replies[8+i], "barrier %d carries QP %d's key", i, i)
	}
	assert.Equal(t, replies[4], replies[12], "the last barrier carries QP 0's key")
}
