package pcap

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An if_tsresol gopacket turns into a zero divisor must be an error, not a
// panic; one whose power of ten wraps 64 bits too.
func TestReaderTimestampResolutionOverflow(t *testing.T) {
	f := frameOf(t, 1, 8)
	for _, r := range []byte{64, 0x80 | 64, 0x80 | 127, 20, 127} {
		w := newNg(le).shb()
		w.idb(1, 0, w.tsresol(r)).epb(0, 12345, f)
		res := readAll(t, w.b)
		assert.ErrorIs(t, res.err, ErrCorruptCapture, "if_tsresol %#x", r)
		assert.Contains(t, res.err.Error(), "pcapng block at offset 28", "if_tsresol %#x", r)
		assert.Contains(t, res.err.Error(), "if_tsresol", "if_tsresol %#x", r)
		assert.Empty(t, res.frames)
	}
	// The largest that fit: 10^-19 and 2^-63; and the usual 10^-9.
	for _, c := range []struct {
		r    byte
		ts   uint64
		want time.Time
	}{
		{19, 10_000_000_000_000_000_000 - 1, time.Unix(0, 999999999).UTC()},
		{0x80 | 63, 1 << 63, time.Unix(1, 0).UTC()},
		{9, 1_700_000_000_123_456_789, time.Unix(1_700_000_000, 123_456_789).UTC()},
	} {
		w := newNg(le).shb()
		w.idb(1, 0, w.tsresol(c.r)).epb(0, c.ts, f)
		res := readAll(t, w.b)
		require.NoError(t, res.err, "if_tsresol %#x", c.r)
		require.Len(t, res.frames, 1)
		assert.Equal(t, c.want, res.cis[0].Timestamp, "if_tsresol %#x", c.r)
	}
	// An if_tsresol of another length than 1 is refused: pcapgo would read
	// a stale byte.
	w := newNg(le).shb()
	w.idb(1, 0, w.opt(9, []byte{6, 0})).epb(0, 1, f)
	assert.ErrorIs(t, readAll(t, w.b).err, ErrCorruptCapture)
}

// panicReader panics once it has handed out its bytes.
type panicReader struct{ b []byte }

func (r *panicReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		panic("boom")
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// A panic under pcapgo (here from the reader below it) is a corrupt
// capture, in NewReader and in Next.
func TestReaderRecoversPanics(t *testing.T) {
	f := frameOf(t, 1, 8)
	for _, ng := range []bool{false, true} {
		var b []byte
		if ng {
			b = newNg(le).shb().idb(1, 0).epb(0, 1, f).b
		} else {
			b = newPcap(le, 1, 65535).frame(1, f).b
		}
		r, err := NewReader(&panicReader{b: b})
		require.NoError(t, err)
		_, _, _, err = r.Next()
		require.NoError(t, err)
		_, _, _, err = r.Next()
		assert.ErrorIs(t, err, ErrCorruptCapture, "pcapng %v", ng)
		assert.Contains(t, err.Error(), "after 1 frames")
		_, _, _, again := r.Next()
		assert.Equal(t, err, again)

		_, err = NewReader(&panicReader{b: b[:8]})
		assert.ErrorIs(t, err, ErrCorruptCapture, "pcapng %v", ng)
	}
}

func TestReaderBlockLengths(t *testing.T) {
	f := frameOf(t, 1, 8)
	good := func() *ngBuilder { return newNg(le).shb().idb(1, 0).epb(0, 1, f) }
	off := len(good().b)
	cases := []struct {
		name string
		tail []byte
		want string
	}{
		{"length under 12", newNg(le).blockLen(0x0BAD, 8, nil).b, "block length 8 is less than 12"},
		{"length 0", make([]byte, 16), "block length 0 is less than 12"},
		{"length not a multiple of 4", newNg(le).blockLen(0x0BAD, 18, make([]byte, 6)).b[:18], "block length 18 is not a multiple of 4"},
		{"length over 16 MiB", newNg(le).blockLen(0x0BAD, 16<<20+4, nil).b, "block length 16777220 exceeds 16777216"},
		{"EPB shorter than its fixed part", newNg(le).blockLen(ngEPB, 28, make([]byte, 16)).b, "block of type 6 has length 28"},
		{"trailing length differs", func() []byte {
			b := newNg(le).epb(0, 1, f).b
			b[len(b)-1] = 0x7F
			return b
		}(), "at its start"},
		{"4096 zero bytes after the last block", make([]byte, 4096), "block length 0 is less than 12"},
	}
	for _, c := range cases {
		b := append(good().b, c.tail...)
		res := readAll(t, b)
		require.Len(t, res.frames, 1, c.name)
		require.ErrorIs(t, res.err, ErrCorruptCapture, c.name)
		assert.Contains(t, res.err.Error(), "corrupt capture after 1 frames: pcapng block at offset ", c.name)
		assert.Contains(t, res.err.Error(), c.want, c.name)
		assert.Contains(t, res.err.Error(), "at offset "+strconv.Itoa(off)+":", c.name)
	}
	// A few bytes after the last block: a block header cut short.
	res := readAll(t, append(good().b, 0, 0, 0))
	assert.Len(t, res.frames, 1)
	assert.ErrorIs(t, res.err, ErrTruncatedCapture)
}

func TestReaderCapturedLengths(t *testing.T) {
	f := frameOf(t, 1, 8)
	big := make([]byte, maxSnaplen+4)
	cases := []struct {
		name  string
		block func(w *ngBuilder)
		want  string
	}{
		{"EPB caplen over its block", func(w *ngBuilder) {
			w.block(ngEPB, w.epbBody(0, 1, uint32(len(f)+40), uint32(len(f)+40), f))
		}, "exceeds the 68 bytes its block holds"},
		{"EPB caplen 2^31", func(w *ngBuilder) {
			w.block(ngEPB, w.epbBody(0, 1, 1<<31, 1<<31, f))
		}, "captured length 2147483648 exceeds"},
		{"EPB caplen over 262144 in a block that holds it", func(w *ngBuilder) {
			w.block(ngEPB, w.epbBody(0, 1, uint32(len(big)), uint32(len(big)), big))
		}, "captured length 262148 exceeds 262144"},
		{"SPB over its block", func(w *ngBuilder) { w.spb(uint32(len(f)+8), f) }, "exceeds the 68 bytes its block holds"},
		{"SPB over 262144", func(w *ngBuilder) { w.spb(uint32(len(big)), big) }, "captured length 262148 exceeds 262144"},
		{"obsolete packet block over its block", func(w *ngBuilder) {
			w.pb(0, uint32(len(f)+4), uint32(len(f)+4), f)
		}, "exceeds the 68 bytes its block holds"},
		{"packet of an interface the section lacks", func(w *ngBuilder) { w.epb(3, 1, f) }, "packet for interface 3; the section has 1"},
		{"statistics of an interface the section lacks", func(w *ngBuilder) { w.isb(1) }, "statistics for interface 1"},
		{"option past its block", func(w *ngBuilder) {
			b := w.opt(2, []byte("eth0"))
			w.order.PutUint16(b[2:], 200)
			w.idb(1, 0, b)
		}, "option 2 of length 200 runs past the end of the block"},
		{"end of options with a length", func(w *ngBuilder) {
			fixed := append(w.order.AppendUint32(nil, 1), w.order.AppendUint32(nil, 0)...)
			w.block(ngIDB, append(fixed, 0, 0, 4, 0, 1, 2, 3, 4)) // code 0, length 4
		}, "end-of-options option of length 4"},
	}
	for _, c := range cases {
		w := newNg(le).shb().idb(1, 0).epb(0, 1, f)
		c.block(w)
		res := readAll(t, w.b)
		require.ErrorIs(t, res.err, ErrCorruptCapture, c.name)
		assert.Contains(t, res.err.Error(), "pcapng block at offset", c.name)
		assert.Contains(t, res.err.Error(), c.want, c.name)
		assert.NotContains(t, res.err.Error(), "bufio", c.name)
		assert.Len(t, res.frames, 1, c.name)
	}

	// A captured length above the original length is raised to it; a simple
	// packet block is cut to the interface's snapshot length.
	w := newNg(le).shb().idb(1, 40)
	w.block(ngEPB, w.epbBody(0, 1, uint32(len(f)), 10, f))
	w.spb(uint32(len(f)), f[:40])
	res := readAll(t, w.b)
	require.NoError(t, res.err)
	require.Len(t, res.frames, 2)
	assert.Equal(t, len(f), res.cis[0].Length)
	assert.Equal(t, len(f), res.cis[0].CaptureLength)
	assert.Equal(t, f[:40], res.frames[1])
	assert.Equal(t, len(f), res.cis[1].Length)
}

// heapGrowth returns the bytes allocated while f ran.
func heapGrowth(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// pcapgo allocates an interface's snapshot length for its packet buffer: a
// file that claims 1 GiB must not cost 1 GiB.
func TestReaderSnaplenBounded(t *testing.T) {
	f := frameOf(t, 1, 8)
	for _, snap := range []uint32{1 << 30, 0xFFFFFFFF} {
		b := newNg(le).shb().idb(1, snap).epb(0, 1, f).spb(uint32(len(f)), f).b
		var res readResult
		grew := heapGrowth(func() { res = readAll(t, b) })
		require.NoError(t, res.err)
		require.Len(t, res.frames, 2)
		assert.Equal(t, f, res.frames[1])
		assert.Less(t, grew, uint64(2<<20), "snaplen %d: bytes allocated", snap)
	}
}

// gopacket keeps 8 bits of a link type; the reader has all 16 (pcapng) or 32
// (pcap) and gives each packet its interface's, also across sections and
// with many small packets that fit one read-ahead buffer.
func TestReaderLinkTypes(t *testing.T) {
	f := frameOf(t, 1, 8)
	w := newNg(be).shb().idb(1, 0).idb(276, 0)
	w.epb(0, 1, f).epb(1, 2, f).epb(0, 3, f)
	w.shb().idb(276, 0).idb(113, 0)
	w.epb(0, 4, f).epb(1, 5, f).epb(0, 6, f)
	w.shb().idb(257, 0).epb(0, 7, f).idb(1, 0).epb(1, 8, f)
	res := readAll(t, w.b)
	// An interface of a link type Decoder does not handle is not the end
	// of the capture: its frame comes with that link type (Decoder refuses
	// it), and the frames after it are read.
	assert.Equal(t, []LinkType{LinkTypeEthernet, LinkTypeLinuxSLL2, LinkTypeEthernet,
		LinkTypeLinuxSLL2, LinkTypeLinuxSLL, LinkTypeLinuxSLL2, 257, LinkTypeEthernet}, res.lts)
	require.NoError(t, res.err)
	var rec Record
	_, err := NewDecoder().Decode(res.frames[6], res.cis[6], res.lts[6], &rec)
	require.ErrorIs(t, err, ErrLinkType)

	for _, c := range []struct {
		field uint32
		want  LinkType
		ok    bool
	}{{276, LinkTypeLinuxSLL2, true}, {1, LinkTypeEthernet, true}, {0x10000001, LinkTypeEthernet, true},
		{257, 257, false}, {256 + 113, 369, false}} {
		b := newPcap(le, c.field, 65535).frame(1, f).b
		res := readAll(t, b)
		if !c.ok {
			assert.ErrorIs(t, res.err, ErrLinkType, "link type field %#x", c.field)
			continue
		}
		require.NoError(t, res.err)
		assert.Equal(t, []LinkType{c.want}, res.lts, "link type field %#x", c.field)
	}
}

func TestReaderClassicRecords(t *testing.T) {
	f := frameOf(t, 1, 8)
	// Header snapshot length below the records, and a record whose captured
	// length exceeds its original length: tshark reads both.
	b := newPcap(le, 1, 20).frame(1, f).record(2, uint32(len(f)), 10, f).b
	res := readAll(t, b)
	require.NoError(t, res.err)
	require.Len(t, res.frames, 2)
	assert.Equal(t, len(f), res.cis[1].Length)
	assert.Equal(t, f, res.frames[1])

	// A captured length over 262144 is refused before it is allocated.
	huge := newPcap(be, 1, 65535).frame(1, f).record(2, 1<<31-1, 1<<31-1, f).b
	var hres readResult
	grew := heapGrowth(func() { hres = readAll(t, huge) })
	require.ErrorIs(t, hres.err, ErrCorruptCapture)
	assert.Contains(t, hres.err.Error(), "pcap record at offset 106: captured length 2147483647 exceeds 262144")
	assert.Len(t, hres.frames, 1)
	assert.Less(t, grew, uint64(2<<20))
	big := make([]byte, maxSnaplen+1)
	res = readAll(t, newPcap(le, 1, 0).frame(1, f).frame(2, big).b)
	require.ErrorIs(t, res.err, ErrCorruptCapture)
	assert.Len(t, res.frames, 1)
	// 262144 itself is fine.
	res = readAll(t, newPcap(le, 1, 0).frame(1, big[:maxSnaplen]).b)
	require.NoError(t, res.err)
	assert.Len(t, res.frames, 1)

	// Cut inside a record header, inside its data, inside the file header.
	whole := newPcap(le, 1, 65535).frame(1, f).frame(2, f).b
	for _, cut := range []int{24 + 16 + len(f) + 3, len(whole) - 1} {
		res := readAll(t, whole[:cut])
		require.ErrorIs(t, res.err, ErrTruncatedCapture, "cut at %d", cut)
		assert.Contains(t, res.err.Error(), "capture file truncated after 1 frames: pcap record at offset 106: the file ends after")
		assert.Len(t, res.frames, 1)
	}
	for _, cut := range []int{4, 10, 23} {
		_, err := NewReader(bytes.NewReader(whole[:cut]))
		assert.ErrorIs(t, err, ErrTruncatedCapture, "cut at %d", cut)
		assert.Contains(t, err.Error(), "pcap file header")
	}
}

func TestReaderPcapngCuts(t *testing.T) {
	f := frameOf(t, 1, 8)
	whole := newNg(le).shb(newNg(le).opt(4, []byte("roce-emu"))).idb(1, 0).epb(0, 1, f).epb(0, 2, f).b
	shbLen := int(le.Uint32(whole[4:]))
	for _, cut := range []int{5, 10, 20, shbLen - 1} {
		_, err := NewReader(bytes.NewReader(whole[:cut]))
		assert.ErrorIs(t, err, ErrTruncatedCapture, "cut at %d", cut)
	}
	epb2 := len(whole) - (len(whole)-shbLen-20)/2
	for _, cut := range []int{epb2 + 4, epb2 + 30, len(whole) - 1} {
		res := readAll(t, whole[:cut])
		assert.ErrorIs(t, res.err, ErrTruncatedCapture, "cut at %d", cut)
		assert.Len(t, res.frames, 1, "cut at %d", cut)
	}
}

func TestReaderIOErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(dir)
	require.Error(t, err)
	assert.ErrorIs(t, err, syscall.EISDIR)
	assert.Equal(t, dir+": read error: is a directory", err.Error())
	assert.NotErrorIs(t, err, ErrNotCapture)

	f := frameOf(t, 1, 8)
	for _, b := range [][]byte{newPcap(le, 1, 65535).frame(1, f).frame(2, f).b, newNg(le).shb().idb(1, 0).epb(0, 1, f).epb(0, 2, f).b} {
		r, err := NewReader(&errReader{b: b[:len(b)-10], err: errDisk})
		require.NoError(t, err)
		_, _, _, err = r.Next()
		require.NoError(t, err)
		_, _, _, err = r.Next()
		require.ErrorIs(t, err, errDisk)
		assert.Contains(t, err.Error(), "read error: disk on fire")
		assert.NotErrorIs(t, err, ErrTruncatedCapture)
	}
	_, err = NewReader(&errReader{err: errDisk})
	assert.ErrorIs(t, err, errDisk)
	assert.Equal(t, "read error: disk on fire", err.Error())

	// Only a file that ends before its magic is "not a capture ... bytes long".
	_, err = NewReader(bytes.NewReader([]byte{0xd4, 0xc3}))
	assert.ErrorIs(t, err, ErrNotCapture)
}

// Sections of a version pcapgo skips are followed for their lengths only.
func TestReaderSkipsUnknownSectionVersion(t *testing.T) {
	f := frameOf(t, 1, 8)
	w := newNg(le).shb().idb(1, 0).epb(0, 1, f)
	odd := newNg(le).shb()
	le.PutUint16(odd.b[12:], 2) // major version 2
	w.raw(odd.b...)
	w.epb(7, 1, f) // interface 7 of a section nobody reads
	w.shb().idb(276, 0).epb(0, 2, f)
	res := readAll(t, w.b)
	require.NoError(t, res.err)
	assert.Equal(t, []LinkType{LinkTypeEthernet, LinkTypeLinuxSLL2}, res.lts)
}

// The files the reader is handed in the real world still read: the shared
// captures (when they are beside the clone) and those we ship.
func TestReaderShippedCaptures(t *testing.T) {
	names, _ := filepath.Glob(filepath.Join("..", "testdata", "*.pcap*"))
	require.NotEmpty(t, names)
	for _, name := range names {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		res := readAll(t, b)
		assert.NoError(t, res.err, name)
		assert.NotEmpty(t, res.frames, name)
	}
}
