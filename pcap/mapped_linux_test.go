package pcap

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mappedCapture writes a pcap file of frames SEND_ONLYs of 1000 bytes
// (about 1.1 KB a record) and returns its path and bytes.
func mappedCapture(t *testing.T, frames int) (string, []byte) {
	w := newPcap(le, 1, 65535)
	for i := range frames {
		w.frame(uint32(i), frameOf(t, uint32(i), 1000))
	}
	path := filepath.Join(t.TempDir(), "big.pcap")
	require.NoError(t, os.WriteFile(path, w.b, 0o644))
	return path, w.b
}

// Open maps a file of minMapped bytes or more; its frames are the ones a
// Reader over the same bytes in memory gives, and Close unmaps it.
func TestOpenMappedSameFrames(t *testing.T) {
	path, b := mappedCapture(t, 2*minMapped/1000)
	m, ok := openSourceOf(t, path)
	require.True(t, ok, "a file of %d bytes is mapped", len(b))
	require.NoError(t, m.close())
	r, err := Open(path)
	require.NoError(t, err)
	want := readAll(t, b)
	require.NoError(t, want.err)
	n := 0
	for ; ; n++ {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.Less(t, n, len(want.frames))
		require.Equal(t, want.frames[n], data, "frame %d", n+1)
		require.Equal(t, want.cis[n], ci, "frame %d", n+1)
		require.Equal(t, want.lts[n], lt, "frame %d", n+1)
	}
	assert.Equal(t, len(want.frames), n)
	require.NoError(t, r.Close())
}

// openSourceOf opens path as Open does and returns its mapping.
func openSourceOf(t *testing.T, path string) (*mappedFile, bool) {
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	src, _ := openSource(f)
	m, ok := src.(*mappedFile)
	return m, ok
}

// Files under minMapped bytes, and what is not a regular file, are read.
func TestOpenSourceSmallOrNotRegular(t *testing.T) {
	path, _ := mappedCapture(t, 10)
	_, ok := openSourceOf(t, path)
	assert.False(t, ok, "a small file is read, not mapped")
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer pr.Close()
	defer pw.Close()
	src, unmap := openSource(pr)
	_, ok = src.(*mappedFile)
	assert.False(t, ok, "a pipe is read, not mapped")
	assert.NoError(t, unmap())
}

// A capture that grows after Open (still being written) is read to its
// new end: past the mapping, by read calls.
func TestOpenMappedGrows(t *testing.T) {
	path, b := mappedCapture(t, 2*minMapped/1000)
	r, err := Open(path)
	require.NoError(t, err)
	defer r.Close()
	more := newPcap(le, 1, 65535)
	for i := range 5 {
		more.frame(uint32(i), frameOf(t, 1_000_000+uint32(i), 1000))
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(more.b[24:]) // the records, without a file header
	require.NoError(t, err)
	require.NoError(t, f.Close())
	want := readAll(t, append(append([]byte(nil), b...), more.b[24:]...))
	require.NoError(t, want.err)
	n := 0
	for ; ; n++ {
		data, _, _, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.Equal(t, want.frames[n], data, "frame %d", n+1)
	}
	assert.Equal(t, len(want.frames), n)
}

// A capture truncated under its mapping is an error that says so, where
// the copy from the mapping would crash the process (SIGBUS).
func TestOpenMappedTruncated(t *testing.T) {
	path, _ := mappedCapture(t, 4*minMapped/1000)
	r, err := Open(path)
	require.NoError(t, err)
	defer r.Close()
	_, _, _, err = r.Next()
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, 8192))
	for range 10000 {
		_, _, _, err = r.Next()
		if err != nil {
			break
		}
	}
	require.Error(t, err)
	assert.True(t, errors.Is(err, errFileChanged), "%v", err)
	assert.Contains(t, err.Error(), "truncated while it was read")
}
