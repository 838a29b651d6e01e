package pcap

import (
	"errors"
	"fmt"
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

// The mapping hands pcapgo runs of checked records and leaves the first
// record its checks refuse or would change to a pcapValidator: the frames
// and the error that ends them are those of a Reader over the same bytes
// in memory, for such a record at the start, in the middle and at the end
// of a mapped file, in both byte orders.
func TestOpenMappedIrregularRecords(t *testing.T) {
	frame := frameOf(t, 1, 1000)
	big := uint32(maxSnaplen + 1)
	cases := map[string]func(w *pcapBuilder){
		"original length below captured": func(w *pcapBuilder) { w.record(7, uint32(len(frame)), 60, frame) },
		"captured length over 262144":    func(w *pcapBuilder) { w.record(7, big, big, frame) },
		"cut inside the record":          func(w *pcapBuilder) { w.record(7, uint32(len(frame)), uint32(len(frame)), frame[:500]) },
		"cut inside the record header":   func(w *pcapBuilder) { w.b = le.AppendUint32(w.b, 7) },
	}
	for name, odd := range cases {
		for _, ord := range []order{le, be} {
			for _, at := range []int{0, minMapped / 2000, -1} {
				w := newPcap(ord, 1, 65535)
				n := 2 * minMapped / len(frame)
				for i := range n {
					if i == at {
						odd(w)
					}
					w.frame(uint32(i), frame)
				}
				if at < 0 {
					odd(w)
				}
				path := filepath.Join(t.TempDir(), "odd.pcap")
				require.NoError(t, os.WriteFile(path, w.b, 0o644))
				want := readAll(t, w.b)
				r, err := Open(path)
				require.NoError(t, err)
				var got readResult
				for range n + 2 {
					data, ci, lt, err := r.Next()
					if err != nil {
						if err != io.EOF {
							got.err = err
						}
						break
					}
					got.frames = append(got.frames, append([]byte(nil), data...))
					got.cis, got.lts = append(got.cis, ci), append(got.lts, lt)
				}
				require.NoError(t, r.Close())
				msg := fmt.Sprintf("%s at record %d, %v", name, at, ord)
				require.Equal(t, len(want.frames), len(got.frames), msg)
				assert.Equal(t, want.frames, got.frames, msg)
				assert.Equal(t, want.cis, got.cis, msg)
				assert.Equal(t, want.lts, got.lts, msg)
				if want.err == nil {
					assert.NoError(t, got.err, msg)
				} else {
					require.Error(t, got.err, msg)
					assert.Equal(t, want.err.Error(), got.err.Error(), msg)
				}
			}
		}
	}
}
