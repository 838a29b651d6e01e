package transport

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemConnAliasedRead: readBatchAliased hands out the network's own
// copies, in order and byte for byte, with capacity cut to their length,
// and gives them back to the pool at the next read, where the next
// datagrams reuse them; ReadBatch still copies into the caller's buffers.
func TestMemConnAliasedRead(t *testing.T) {
	cs := memConns(t)
	a, b := cs[0], cs[1].(*memConn)
	send := func(payloads ...[]byte) {
		ds := make([]Datagram, len(payloads))
		for i, p := range payloads {
			ds[i] = Datagram{Data: p, Src: a.LocalAddr(), Dst: b.LocalAddr()}
		}
		_, err := a.WriteBatch(ds)
		require.NoError(t, err)
	}
	one, two := bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 200)
	send(one, two)
	ds := make([]Datagram, 4)
	n, err := b.readBatchAliased(ds)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	assert.Equal(t, one, ds[0].Data)
	assert.Equal(t, two, ds[1].Data)
	assert.Equal(t, len(ds[1].Data), cap(ds[1].Data), "no room to write past the datagram")
	second := &ds[1].Data[0]
	b.net.mu.Lock()
	pooled := len(b.net.pool.free)
	b.net.mu.Unlock()

	three := bytes.Repeat([]byte{3}, 100)
	send(three)
	n, err = b.readBatchAliased(ds)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, three, ds[0].Data)
	b.net.mu.Lock()
	assert.Equal(t, pooled+2, len(b.net.pool.free), "the first batch's two buffers went back at the next read")
	b.net.mu.Unlock()
	send(three)
	n, err = b.readBatchAliased(ds)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, three, ds[0].Data)
	assert.Same(t, second, &ds[0].Data[0], "the pool handed the first batch's last buffer out again")

	send(one)
	own := []Datagram{{Data: make([]byte, 0, 2048)}}
	n, err = b.ReadBatch(own)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, one, own[0].Data)
	assert.Equal(t, 2048, cap(own[0].Data), "ReadBatch copies into the caller's buffer")
}
