package oob

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TCP payloads (tshark -T fields -e tcp.payload) of the handed captures
// ../shared/testdata/cases/interop/rxe-ibv_{uc,ud,srq}_pingpong-client.pcapng:
// rxe's clients at 192.0.2.2 (GID index 1) against roce-emu at 192.0.2.1.
const (
	ucClientHex  = "303030303a3030303034313a3363303634633a303030303030303030303030303030303030303066666666633030303032303200"
	ucServerHex  = "303030303a3030303031313a3330613733313a303030303030303030303030303030303030303066666666633030303032303100"
	udClientHex  = "303030303a3030303034323a6538306563653a303030303030303030303030303030303030303066666666633030303032303200"
	srqClient0   = "303030303a3030303034333a6164373235383a303030303030303030303030303030303030303066666666633030303032303200"
	srqClient1   = "303030303a3030303034343a6632396339393a303030303030303030303030303030303030303066666666633030303032303200"
	doneHex      = "646f6e6500"
	zeroEntryStr = "0000:000000:000000:00000000000000000000000000000000\x00"
)

func unhex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// The uc_pingpong and ud_pingpong messages rxe sent are rc_pingpong's.
func TestUCUDPingpongRecorded(t *testing.T) {
	guest := netip.MustParseAddr("192.0.2.2")
	for _, c := range []struct {
		hex  string
		want Dest
	}{
		{ucClientHex, Dest{QPN: 0x41, PSN: 0x3c064c, GID: guest}},
		{ucServerHex, Dest{QPN: 0x11, PSN: 0x30a731, GID: netip.MustParseAddr("192.0.2.1")}},
		{udClientHex, Dest{QPN: 0x42, PSN: 0xe80ece, GID: guest}},
		{srqClient0, Dest{QPN: 0x43, PSN: 0xad7258, GID: guest}},
		{srqClient1, Dest{QPN: 0x44, PSN: 0xf29c99, GID: guest}},
	} {
		b := unhex(t, c.hex)
		require.Len(t, b, PingpongMsgLen)
		d, err := ParsePingpong(b)
		require.NoError(t, err)
		assert.Equal(t, c.want, d)
		out, err := d.AppendPingpong(nil)
		require.NoError(t, err)
		assert.Equal(t, b, out, "encoded as rxe's program encodes it")
	}
	assert.Equal(t, doneMsg, string(unhex(t, doneHex)))
}

// rxe's ibv_ud_pingpong client, replayed from the capture, against our
// server side: the server connects before it answers and reads "done".
func TestUDPingpongServerAgainstRecordedClient(t *testing.T) {
	cl, sv := net.Pipe()
	defer cl.Close()
	defer sv.Close()
	ctx := ctxT(t, 5*time.Second)
	local := Dest{QPN: 0x11, PSN: 0x5ee664, GID: netip.MustParseAddr("192.0.2.1")}
	got := make(chan []byte, 1)
	msg, done := unhex(t, udClientHex), unhex(t, doneHex)
	go func() {
		cl.Write(msg)
		b := make([]byte, PingpongMsgLen)
		io.ReadFull(cl, b)
		got <- b
		cl.Write(done)
	}()
	connected := false
	remote, err := PingpongServer(ctx, sv, local, func(Dest) error { connected = true; return nil })
	require.NoError(t, err)
	assert.True(t, connected)
	assert.Equal(t, uint32(0x42), remote.QPN)
	want, _ := local.AppendPingpong(nil)
	assert.Equal(t, want, <-got)
}

// recordedSRQClientTable is what rxe's srq_pingpong -q 2 would write: the
// two recorded messages and 254 unused entries.
func recordedSRQClientTable(t *testing.T) []byte {
	b := append(unhex(t, srqClient0), unhex(t, srqClient1)...)
	return append(b, strings.Repeat(zeroEntryStr, SRQPingpongMaxQP-2)...)
}

func TestSRQPingpongTable(t *testing.T) {
	table := recordedSRQClientTable(t)
	require.Len(t, table, 13312)
	ds, err := ParseSRQPingpong(table)
	require.NoError(t, err)
	guest := netip.MustParseAddr("192.0.2.2")
	assert.Equal(t, []Dest{{QPN: 0x43, PSN: 0xad7258, GID: guest}, {QPN: 0x44, PSN: 0xf29c99, GID: guest}}, ds)
	out, err := appendSRQPingpong(nil, ds)
	require.NoError(t, err)
	assert.Equal(t, table, out, "256 messages, the unused ones zero, as srq_pingpong writes them")

	// Bad tables: short, a QP after an unused entry, no QP, garbage.
	for name, b := range map[string][]byte{
		"short":      table[:len(table)-1],
		"long":       append(append([]byte(nil), table...), 0),
		"gap":        append(append(append(unhex(t, srqClient0), zeroEntryStr...), unhex(t, srqClient1)...), strings.Repeat(zeroEntryStr, SRQPingpongMaxQP-3)...),
		"empty":      []byte(strings.Repeat(zeroEntryStr, SRQPingpongMaxQP)),
		"garbage":    bytes.Repeat([]byte{'x'}, len(table)),
		"zero-psn-1": append(unhex(t, srqClient0), strings.Repeat("0000:000000:000001:00000000000000000000000000000000\x00", SRQPingpongMaxQP-1)...),
	} {
		_, err := ParseSRQPingpong(b)
		assert.ErrorIs(t, err, ErrMalformed, name)
	}
	// 1 to 255 QPs; QPN 0 is the unused mark and cannot be sent.
	_, err = appendSRQPingpong(nil, nil)
	assert.Error(t, err)
	_, err = appendSRQPingpong(nil, make([]Dest, SRQPingpongMaxQP))
	assert.Error(t, err)
	_, err = appendSRQPingpong(nil, []Dest{{QPN: 0}})
	assert.Error(t, err)
	_, err = appendSRQPingpong(nil, []Dest{{QPN: 1, PSN: 1 << 24}})
	assert.Error(t, err)
}

// rxe's srq_pingpong client replayed against our server side: the server
// reads all 256 messages (the old server took the second for "done"),
// connects, answers with 256 and reads "done".
func TestSRQPingpongServerAgainstRecordedClient(t *testing.T) {
	cl, sv := net.Pipe()
	defer cl.Close()
	defer sv.Close()
	ctx := ctxT(t, 5*time.Second)
	host := netip.MustParseAddr("192.0.2.1")
	local := []Dest{{QPN: 0x11, PSN: 1, GID: host}, {QPN: 0x12, PSN: 2, GID: host}}
	got := make(chan []byte, 1)
	table, done := recordedSRQClientTable(t), unhex(t, doneHex)
	go func() {
		cl.Write(table)
		b := make([]byte, SRQPingpongMaxQP*PingpongMsgLen)
		io.ReadFull(cl, b)
		got <- b
		cl.Write(done)
	}()
	var connected []Dest
	remote, err := SRQPingpongServer(ctx, sv, local, func(r []Dest) error { connected = r; return nil })
	require.NoError(t, err)
	require.Len(t, remote, 2)
	assert.Equal(t, remote, connected)
	assert.Equal(t, bth.PSN(0xf29c99), remote[1].PSN)
	want, _ := appendSRQPingpong(nil, local)
	assert.Equal(t, want, <-got)
}

// Our client and our server with 16 QPs each, and bad peers.
func TestSRQPingpongSession(t *testing.T) {
	cl, sv := net.Pipe()
	defer cl.Close()
	defer sv.Close()
	ctx := ctxT(t, 5*time.Second)
	mk := func(base uint32, addr string) []Dest {
		ds := make([]Dest, 16)
		for i := range ds {
			ds[i] = Dest{QPN: base + uint32(i), PSN: bth.PSN(base*100 + uint32(i)), GID: netip.MustParseAddr(addr)}
		}
		return ds
	}
	cd, sd := mk(0x20, "fd00::1"), mk(0x40, "fd00::2")
	type res struct {
		d   []Dest
		err error
	}
	ch := make(chan res, 1)
	go func() {
		d, err := SRQPingpongServer(ctx, sv, sd, nil)
		ch <- res{d, err}
	}()
	var connected []Dest
	got, err := SRQPingpongClient(ctx, cl, cd, func(r []Dest) error { connected = r; return nil })
	require.NoError(t, err)
	r := <-ch
	require.NoError(t, r.err)
	assert.Equal(t, sd, got)
	assert.Equal(t, sd, connected)
	assert.Equal(t, cd, r.d)

	local := []Dest{{QPN: 1, GID: netip.MustParseAddr("192.0.2.1")}}
	table := recordedSRQClientTable(t)
	// A peer that stops after one message (as the old roce-emu server
	// did), one that sends garbage, one that never says done, one silent.
	_, err = SRQPingpongClient(ctxT(t, time.Second), rawPeer(t, unhex(t, ucServerHex), true), local, nil)
	assert.Error(t, err)
	_, err = SRQPingpongServer(ctxT(t, time.Second), rawPeer(t, bytes.Repeat([]byte{'x'}, len(table)), true), local, nil)
	assert.ErrorIs(t, err, ErrMalformed)
	_, err = SRQPingpongServer(ctxT(t, time.Second), rawPeer(t, append(table, "nope\x00"...), true), local, nil)
	assert.ErrorIs(t, err, ErrMalformed)
	_, err = SRQPingpongServer(ctxT(t, 200*time.Millisecond), rawPeer(t, nil, false), local, nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// FuzzParseSRQPingpong fuzzes one 52-byte entry of the table at index at
// (the entries before it a used one, those after it unused): small inputs,
// which the fuzzing engine mutates quickly (a whole 13,312-byte table as
// the input ran a handful of executions in 30 s).
func FuzzParseSRQPingpong(f *testing.F) {
	m0, _ := hex.DecodeString(srqClient0)
	f.Add([]byte(zeroEntryStr), uint8(0))
	f.Add(m0, uint8(0))
	f.Add(m0, uint8(5))
	f.Add([]byte(zeroEntryStr), uint8(255))
	f.Fuzz(func(t *testing.T, entry []byte, at uint8) {
		if len(entry) != PingpongMsgLen {
			return
		}
		b := make([]byte, 0, SRQPingpongMaxQP*PingpongMsgLen)
		for range int(at) {
			b = append(b, m0...)
		}
		b = append(b, entry...)
		b = append(b, strings.Repeat(zeroEntryStr, SRQPingpongMaxQP-1-int(at))...)
		ds, err := ParseSRQPingpong(b)
		if err != nil {
			return
		}
		out, err := appendSRQPingpong(nil, ds)
		if err != nil {
			t.Fatalf("parsed %d QPs that do not encode: %v", len(ds), err)
		}
		if _, err := ParseSRQPingpong(out); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	})
}
