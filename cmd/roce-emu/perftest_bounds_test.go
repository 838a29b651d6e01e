package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"testing"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakePerftestClient plays perftest's client up to the key exchange on c,
// announcing a cycle buffer of cycle bytes, and reads each reply.
func fakePerftestClient(t *testing.T, c net.Conn, cycle uint32) error {
	t.Helper()
	for _, m := range [][]byte{
		[]byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
		binary.BigEndian.AppendUint32(nil, cycle),
		binary.BigEndian.AppendUint32(nil, 64),
		[]byte("3\x00"),
	} {
		if _, err := c.Write(m); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, make([]byte, len(m))); err != nil {
			return err
		}
	}
	return nil
}

// totalAlloc is the bytes the process has allocated so far.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// A peer's 40-byte opening (version, system data, MTU) that announces a
// cycle buffer of 1 GiB costs the server nothing before a key arrives:
// with the limit raised to 1 GiB, a server given a key that does not parse
// allocates no more than a few MiB; with the default limit, the 1 GiB is
// refused with a message naming the flag. A key that parses after a
// 64 MiB cycle buffer does make the server allocate its regions: the
// measurement sees them.
func TestPerftestCycleBufferCostsNothingBeforeKeys(t *testing.T) {
	const slack = 16 << 20
	t.Run("1 GiB, garbage key", func(t *testing.T) {
		runtime.GC()
		before := totalAlloc()
		c, wait := startPerftestServer(t, "bw", "-o", "write", "--max-cycle-buffer", strconv.Itoa(oob.MaxCycleBuffer))
		defer c.Close()
		require.NoError(t, fakePerftestClient(t, c, 1<<30))
		_, err := c.Write(bytes.Repeat([]byte("x"), oob.PerftestKeyLen))
		require.NoError(t, err)
		code, out := wait()
		alloc := totalAlloc() - before
		t.Logf("allocated %d KiB; exit %d: %s", alloc>>10, code, out)
		assert.NotEqual(t, 0, code)
		assert.Contains(t, out, "malformed")
		assert.Less(t, alloc, uint64(slack), "the 1 GiB cycle buffer was not allocated")
	})
	t.Run("1 GiB, default limit", func(t *testing.T) {
		runtime.GC()
		before := totalAlloc()
		c, wait := startPerftestServer(t, "bw", "-o", "write")
		defer c.Close()
		fakePerftestClient(t, c, 1<<30) // the server hangs up after the system data
		code, out := wait()
		alloc := totalAlloc() - before
		t.Logf("allocated %d KiB; exit %d: %s", alloc>>10, code, out)
		assert.NotEqual(t, 0, code)
		assert.Contains(t, out, "cycle buffer of 1073741824 bytes, above the limit of 262144")
		assert.Contains(t, out, "--max-cycle-buffer")
		assert.Less(t, alloc, uint64(slack))
	})
	t.Run("64 MiB, a key", func(t *testing.T) {
		runtime.GC()
		before := totalAlloc()
		c, wait := startPerftestServer(t, "bw", "-o", "write", "--max-cycle-buffer", strconv.Itoa(64<<20))
		require.NoError(t, fakePerftestClient(t, c, 64<<20))
		k, err := oob.PerftestKey{OutReads: 1, QPN: 0x11, PSN: 1, RKey: 2, VA: 0x1000, GID: netip.MustParseAddr("127.0.0.1")}.Append(nil)
		require.NoError(t, err)
		_, err = c.Write(k)
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, oob.PerftestKeyLen))
		require.NoError(t, err, "the server's key")
		c.Close()
		code, out := wait()
		alloc := totalAlloc() - before
		t.Logf("allocated %d MiB; exit %d", alloc>>20, code)
		assert.NotEqual(t, 0, code, out)
		assert.GreaterOrEqual(t, alloc, uint64(64<<20), "the regions, once the key came")
	})
}
