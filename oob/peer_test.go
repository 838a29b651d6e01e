package oob

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckGID(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		gid, from netip.Addr
		ok        bool
	}{
		{a("192.0.2.2"), a("192.0.2.2"), true},
		{a("::ffff:192.0.2.2"), a("192.0.2.2"), true}, // an IPv4-mapped GID is its IPv4 address
		{a("192.0.2.2"), a("::ffff:192.0.2.2"), true}, // a dual-stack socket's view of an IPv4 peer
		{a("fe80::2"), a("fe80::2%eth0"), true},       // a GID carries no zone
		{a("fd00::2"), a("fd00::2"), true},
		{a("127.0.0.2"), a("127.0.0.1"), true}, // one host
		{a("::1"), a("127.0.0.1"), true},
		{a("192.0.2.99"), a("192.0.2.2"), false}, // a third host
		{a("192.0.2.99"), a("127.0.0.1"), false}, // a local client aiming elsewhere
		{a("fd00::2"), a("192.0.2.2"), false},    // multi-homed: allowed only by the caller
		{a("192.0.2.99"), netip.Addr{}, true},    // not an IP connection: nothing to check
	} {
		err := CheckGID(c.gid, c.from, 0x11)
		if c.ok {
			assert.NoError(t, err, "GID %s from %s", c.gid, c.from)
			continue
		}
		require.Error(t, err, "GID %s from %s", c.gid, c.from)
		assert.ErrorIs(t, err, ErrGIDMismatch)
		var m *GIDMismatchError
		require.True(t, errors.As(err, &m))
		assert.Equal(t, c.gid.Unmap(), m.GID)
		assert.Equal(t, uint32(0x11), m.QPN)
		assert.Contains(t, err.Error(), "announced GID "+GIDString(c.gid))
	}
}

func TestRemoteIP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, netip.MustParseAddr("127.0.0.1"), RemoteIP(c))
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	assert.False(t, RemoteIP(p1).IsValid())
}
