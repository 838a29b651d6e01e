package oob

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A peer's cycle buffer above the limit (256 KiB by default) is refused
// with ErrCycleBuffer; a limit raised by the caller lets it through, up to
// MaxCycleBuffer.
func TestPerftestCycleBufferLimit(t *testing.T) {
	ctx := ctxT(t, 2*time.Second)
	ver := []byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	sys := func(cycle uint32) []byte {
		b := binary.BigEndian.AppendUint32(append([]byte(nil), ver...), cycle)
		return binary.BigEndian.AppendUint32(b, 64)
	}
	for _, c := range []struct {
		limit, cycle int
		want         error
	}{
		{0, 1 << 30, ErrCycleBuffer},
		{0, DefaultCycleBufferLimit + 1, ErrCycleBuffer},
		{0, DefaultCycleBufferLimit, nil},
		{1 << 30, 1 << 30, nil},
		{1 << 20, 1<<20 + 4096, ErrCycleBuffer},
	} {
		s := NewPerftestServer(rawPeer(t, sys(uint32(c.cycle)), false))
		s.CycleBufferLimit = c.limit
		_, err := s.Versions(ctx)
		require.NoError(t, err)
		got, err := s.SysData(ctx, SysData{DefaultCycleBuffer, DefaultCacheLine})
		if c.want != nil {
			assert.ErrorIs(t, err, c.want, "limit %d, peer's cycle buffer %d", c.limit, c.cycle)
			assert.ErrorContains(t, err, "above the limit")
			continue
		}
		require.NoError(t, err, "limit %d, peer's cycle buffer %d", c.limit, c.cycle)
		assert.Equal(t, c.cycle, got.CycleBuffer)
	}
	s := NewPerftestServer(rawPeer(t, ver, false))
	s.CycleBufferLimit = 2 << 30
	_, err := s.Versions(ctx)
	require.NoError(t, err)
	_, err = s.SysData(ctx, SysData{DefaultCycleBuffer, DefaultCacheLine})
	assert.ErrorContains(t, err, "limit", "a limit above MaxCycleBuffer")
}

// A server's KeysAfter makes its keys (and what they need) only once the
// peer's first key has arrived and parsed; a peer that sends garbage or
// nothing never gets it to.
func TestPerftestKeysAfter(t *testing.T) {
	ctx := ctxT(t, 2*time.Second)
	ver := []byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	peerKey := PerftestKey{OutReads: 1, QPN: 0x21, PSN: 5, RKey: 9, VA: 0x1000, GID: netip.MustParseAddr("192.0.2.7")}
	kb, err := peerKey.Append(nil)
	require.NoError(t, err)
	mine := PerftestKey{OutReads: 1, QPN: 0x22, PSN: 6, RKey: 10, VA: 0x2000, GID: netip.MustParseAddr("192.0.2.8")}
	for _, c := range []struct {
		name  string
		peer  []byte
		close bool
		ok    bool
	}{
		{"a key", kb, false, true},
		{"garbage", bytes.Repeat([]byte("x"), PerftestKeyLen), false, false},
		{"nothing", nil, false, false}, // until the context ends
		{"half a key", kb[:50], true, false},
	} {
		s := NewPerftestServer(rawPeer(t, append(append([]byte(nil), ver...), c.peer...), c.close))
		_, err := s.Versions(ctx)
		require.NoError(t, err)
		kctx := ctx
		if c.peer == nil {
			kctx = ctxT(t, 100*time.Millisecond)
		}
		called := 0
		rem, err := s.KeysAfter(kctx, 1, func() ([]PerftestKey, error) {
			called++
			return []PerftestKey{mine}, nil
		})
		if !c.ok {
			assert.Error(t, err, c.name)
			assert.Zero(t, called, "%s: no keys made, nothing allocated", c.name)
			continue
		}
		require.NoError(t, err, c.name)
		assert.Equal(t, 1, called)
		assert.Equal(t, []PerftestKey{peerKey}, rem)
		// The barriers send this side's key.
		assert.Len(t, s.keys, 1)
	}
	// A client writes first: its keys are made at once.
	c := NewPerftestClient(rawPeer(t, append(append([]byte(nil), ver...), kb...), false))
	_, err = c.Versions(ctx)
	require.NoError(t, err)
	called := 0
	rem, err := c.KeysAfter(ctx, 1, func() ([]PerftestKey, error) { called++; return []PerftestKey{mine}, nil })
	require.NoError(t, err)
	assert.Equal(t, 1, called)
	assert.Equal(t, []PerftestKey{peerKey}, rem)
}
