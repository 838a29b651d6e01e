package oob

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The message rxe's ibv_rc_pingpong sent in the guest (docs/wire-format.md section 6).
const pingpongRecorded = "0000:000011:d080f3:00000000000000000000ffffc0000202"

func TestPingpongMessageFormat(t *testing.T) {
	p := Dest{QPN: 0x11, PSN: 0xd080f3, GID: netip.MustParseAddr("192.0.2.2")}
	b, err := p.AppendPingpong(nil)
	require.NoError(t, err)
	require.Len(t, b, 52)
	assert.Equal(t, pingpongRecorded+"\x00", string(b))
	got, err := ParsePingpong([]byte(pingpongRecorded + "\x00"))
	require.NoError(t, err)
	assert.Equal(t, p, got)

	for _, bad := range []string{"", "hello", "0000:000011:d080f3:00000000000000000000ffffc00002", "zzzz:000011:d080f3:00000000000000000000ffffc0000202",
		"0000:000011:d080f3:00000000000000000000ffffc000020g", "0000-000011:d080f3:00000000000000000000ffffc0000202",
		"0000:000011:d080f3:00000000000000000000ffffc0000202x", "+000:000011:d080f3:00000000000000000000ffffc0000202"} {
		_, err := ParsePingpong([]byte(bad))
		assert.ErrorIs(t, err, ErrMalformed, "%q", bad)
	}
	// Truncation sweep: every prefix short of the GID's last digit fails.
	for i := range len(pingpongRecorded) {
		_, err := ParsePingpong([]byte(pingpongRecorded[:i]))
		assert.ErrorIs(t, err, ErrMalformed, "%d bytes", i)
	}

	_, err = Dest{QPN: 1 << 24}.AppendPingpong(nil)
	assert.Error(t, err, "a QPN is 24 bits")
	_, err = Dest{PSN: 1 << 24}.AppendPingpong(nil)
	assert.Error(t, err, "a PSN is 24 bits")
}

// An IPv6 address is its own GID (RoCEv2 over IPv6); an IPv4 address is
// IPv4-mapped (RoCEv2 over IPv4).
func TestPingpongGIDs(t *testing.T) {
	for _, c := range []struct{ addr, wire, printed string }{
		{"192.0.2.2", "00000000000000000000ffffc0000202", "::ffff:192.0.2.2"},
		{"fd00::1", "fd000000000000000000000000000001", "fd00::1"},
		{"fe80::5054:ff:fe12:3456", "fe80000000000000505400fffe123456", "fe80::5054:ff:fe12:3456"},
	} {
		d := Dest{LID: 0, QPN: 0x1234, PSN: 7, GID: netip.MustParseAddr(c.addr)}
		b, err := d.AppendPingpong(nil)
		require.NoError(t, err)
		assert.Equal(t, "0000:001234:000007:"+c.wire+"\x00", string(b))
		got, err := ParsePingpong(b)
		require.NoError(t, err)
		assert.Equal(t, d, got)
		assert.Equal(t, c.addr, got.GID.String())
		assert.Equal(t, c.printed, GIDString(got.GID))
	}
	// A zone is not carried: the peer does not know our interface's name.
	d := Dest{GID: netip.MustParseAddr("fe80::1%eth0")}
	b, err := d.AppendPingpong(nil)
	require.NoError(t, err)
	got, err := ParsePingpong(b)
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddr("fe80::1"), got.GID)
	// No GID: 32 zeros, read back as ::.
	b, err = Dest{}.AppendPingpong(nil)
	require.NoError(t, err)
	assert.Equal(t, "0000:000000:000000:"+strings.Repeat("0", 32)+"\x00", string(b))
	got, err = ParsePingpong(b)
	require.NoError(t, err)
	assert.Equal(t, netip.IPv6Unspecified(), got.GID)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Both sides over net.Pipe: each learns the other's Dest, connect is
// called with it before "done", and the exchange is rc_pingpong's.
func TestPingpongSession(t *testing.T) {
	for _, fam := range []struct{ c, s string }{{"192.0.2.1", "192.0.2.2"}, {"fd00::1", "fd00::2"}} {
		t.Run(fam.c, func(t *testing.T) {
			cl, sv := net.Pipe()
			defer cl.Close()
			defer sv.Close()
			ctx := ctxT(t, 5*time.Second)
			cd := Dest{QPN: 0x11, PSN: 0xd080f3, GID: netip.MustParseAddr(fam.c)}
			sd := Dest{LID: 1, QPN: 0x12, PSN: 0x000001, GID: netip.MustParseAddr(fam.s)}
			type res struct {
				d         Dest
				err       error
				connected Dest
			}
			ch := make(chan res, 1)
			go func() {
				var r res
				r.d, r.err = PingpongServer(ctx, sv, sd, func(d Dest) error { r.connected = d; return nil })
				ch <- r
			}()
			var connected Dest
			gotS, err := PingpongClient(ctx, cl, cd, func(d Dest) error { connected = d; return nil })
			require.NoError(t, err)
			r := <-ch
			require.NoError(t, r.err)
			assert.Equal(t, sd, gotS)
			assert.Equal(t, sd, connected)
			assert.Equal(t, cd, r.d)
			assert.Equal(t, cd, r.connected)
		})
	}
}

// rawPeer plays a peer that writes what and closes, after reading
// whatever comes (so that net.Pipe writes do not block).
func rawPeer(t *testing.T, what []byte, closeAfter bool) net.Conn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go func() {
		go func() {
			buf := make([]byte, 256)
			for {
				if _, err := b.Read(buf); err != nil {
					return
				}
			}
		}()
		b.Write(what)
		if closeAfter {
			b.Close()
		}
	}()
	return a
}

// Truncated, garbage and silent peers give errors, not panics or hangs.
func TestPingpongBadPeers(t *testing.T) {
	good := []byte(pingpongRecorded + "\x00")
	local := Dest{QPN: 1, GID: netip.MustParseAddr("192.0.2.1")}
	for _, c := range []struct {
		name  string
		peer  []byte
		close bool
		want  error
	}{
		{"truncated", good[:20], true, nil},
		{"garbage", []byte(strings.Repeat("x", 52)), true, ErrMalformed},
		{"silent", nil, false, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := PingpongClient(ctxT(t, 200*time.Millisecond), rawPeer(t, c.peer, c.close), local, nil)
			require.Error(t, err)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			_, err = PingpongServer(ctxT(t, 200*time.Millisecond), rawPeer(t, c.peer, c.close), local, nil)
			require.Error(t, err)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			assert.Less(t, time.Since(start), 2*time.Second)
		})
	}
	// The client's address then something other than "done".
	_, err := PingpongServer(ctxT(t, time.Second), rawPeer(t, append(good, "nope\x00"...), true), local, nil)
	assert.ErrorIs(t, err, ErrMalformed)
	// A connect that fails is reported, and the client does not say done.
	boom := errors.New("boom")
	_, err = PingpongClient(ctxT(t, time.Second), rawPeer(t, good, false), local, func(Dest) error { return boom })
	assert.ErrorIs(t, err, boom)
	// A cancelled context stops a blocked exchange.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = PingpongServer(ctx, rawPeer(t, nil, false), local, nil)
	assert.ErrorIs(t, err, context.Canceled)
}

func FuzzParsePingpong(f *testing.F) {
	f.Add([]byte(pingpongRecorded + "\x00"))
	f.Add([]byte("0000:001234:000007:fd000000000000000000000000000001\x00"))
	f.Add([]byte("zzzz"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePingpong(b)
		if err != nil {
			return
		}
		out, err := d.AppendPingpong(nil)
		if err != nil {
			t.Fatalf("parsed %q to %+v, which does not encode: %v", b, d, err)
		}
		d2, err := ParsePingpong(out)
		if err != nil || d2 != d {
			t.Fatalf("round trip of %q: %+v, then %+v, %v", b, d, d2, err)
		}
	})
}

// The encoders do not allocate into a buffer with room, and appendHex
// pads as printf's %0*x.
func TestAppendAllocs(t *testing.T) {
	d := Dest{QPN: 0x11, PSN: 0xd080f3, GID: netip.MustParseAddr("fd00::1")}
	k := PerftestKey{OutReads: 1, QPN: 0x11, PSN: 0x5df3ee, RKey: 0x2d1, VA: 0x562bb641e000, GID: netip.MustParseAddr("192.0.2.2")}
	buf := make([]byte, 0, 128)
	assert.Zero(t, testing.AllocsPerRun(100, func() { d.AppendPingpong(buf[:0]) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { k.Append(buf[:0]) }))
	for _, c := range []struct {
		v     uint64
		width int
	}{{0, 4}, {0, 0}, {0xabc, 2}, {0xabc, 6}, {1<<64 - 1, 16}, {1 << 24, 6}} {
		assert.Equal(t, fmt.Sprintf("%0*x", c.width, c.v), string(appendHex(nil, c.v, c.width)))
	}
}
