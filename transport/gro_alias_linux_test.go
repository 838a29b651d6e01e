//go:build linux

package transport

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readBatchAliased hands out the segments of a coalesced read in the
// Conn's buffer, each whole and with no room beyond it, in order, across
// calls with fewer slots than segments; ReadBatch still copies.
func TestGROAliasedRead(t *testing.T) {
	a := offloadConn(t, "127.0.0.1", true, false)
	b := offloadConn(t, "127.0.0.2", false, true)
	const n, size = 20, 1052
	out := make([]Datagram, n)
	for i := range out {
		out[i] = numbered(a.LocalAddr(), b.LocalAddr(), i, size, 0)
	}
	_, err := a.WriteBatch(out)
	require.NoError(t, err)
	u := b.(*udpConn)
	ds := make([]Datagram, 8)
	for i := range ds {
		ds[i].Data = make([]byte, 0, 16<<10)
	}
	got := 0
	for got < n {
		k, err := u.readBatchAliased(ds)
		require.NoError(t, err)
		for _, d := range ds[:k] {
			assert.Equal(t, out[got].Data, d.Data, "datagram %d", got)
			assert.Equal(t, len(d.Data), cap(d.Data), "an aliased segment has no room beyond it")
			assert.Equal(t, a.LocalAddr(), d.Src)
			got++
		}
	}
	o, _ := Offloads(b)
	assert.NotZero(t, o.GROReads, "the kernel coalesced the segmented send")
}
