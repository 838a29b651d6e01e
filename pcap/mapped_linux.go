package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"syscall"
)

// minMapped is the smallest file Open maps: below it one read costs less
// than a mapping.
const minMapped = 1 << 20

// releaseEvery is how many bytes a mappedFile hands out between releasing
// the pages behind them, so that its resident memory stays bounded.
const releaseEvery = 32 << 20

// errFileChanged is a mapped capture file cut shorter while it was read.
var errFileChanged = errors.New("the file was truncated while it was read")

// mappedFile reads a capture file through a read-only shared mapping of
// the length it had when opened, then (when it has grown since, as a
// capture still being written does) through read calls from there. A
// mapping saves the copy a read call makes from the page cache: pcapgo's
// copy of each record comes from the page cache itself. The pages handed
// out are released every releaseEvery bytes (MADV_DONTNEED: the file's
// pages stay cached, the mapping drops them). A file truncated under the
// mapping makes the copy fault; Read turns that into an error
// (debug.SetPanicOnFault), where it would crash the process.
type mappedFile struct {
	data []byte
	off  int // next byte of data to hand out
	rel  int // bytes of data released
	tail *bufio.Reader
	f    *os.File
}

// openSource returns f as the reader Open gives NewReader: a mapping of
// a regular file of at least minMapped bytes, or f behind a MiB buffer.
// close undoes the mapping, not f.
func openSource(f *os.File) (src io.Reader, close func() error) {
	buffered := func() (io.Reader, func() error) {
		// A MiB at a time: fewer system calls (NewReader keeps a
		// bufio.Reader this large as it is).
		return bufio.NewReaderSize(f, 1<<20), func() error { return nil }
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < minMapped || fi.Size() != int64(int(fi.Size())) {
		return buffered()
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return buffered()
	}
	_ = syscall.Madvise(data, syscall.MADV_SEQUENTIAL)
	if _, err := f.Seek(int64(len(data)), io.SeekStart); err != nil {
		syscall.Munmap(data)
		return buffered()
	}
	m := &mappedFile{data: data, f: f}
	return m, m.close
}

// Read copies the next bytes of the file into p.
func (m *mappedFile) Read(p []byte) (n int, err error) {
	if m.off >= len(m.data) {
		if m.tail == nil {
			m.tail = bufio.NewReaderSize(m.f, 1<<16)
		}
		return m.tail.Read(p)
	}
	defer guardFault(&n, &err)(debug.SetPanicOnFault(true))
	n = copy(p, m.data[m.off:])
	m.advance(n)
	return n, nil
}

// advance hands out n more bytes of the mapping, releasing the pages
// behind them every releaseEvery bytes.
func (m *mappedFile) advance(n int) {
	m.off += n
	if m.off-m.rel >= releaseEvery {
		end := m.off &^ (os.Getpagesize() - 1)
		_ = syscall.Madvise(m.data[m.rel:end], syscall.MADV_DONTNEED)
		m.rel = end
	}
}

// guardFault is the deferred half of a read of the mapping:
//
//	defer guardFault(&n, &err)(debug.SetPanicOnFault(true))
//
// restores the fault setting, and turns a fault of the mapping (the file
// cut shorter under it) into 0 bytes read and errFileChanged.
func guardFault(n *int, err *error) func(old bool) {
	return func(old bool) {
		debug.SetPanicOnFault(old)
		if v := recover(); v != nil {
			if _, ok := v.(interface{ Addr() uintptr }); !ok {
				panic(v)
			}
			*n, *err = 0, errFileChanged
		}
	}
}

// pcapRecords returns the records of a classic pcap file as NewReader
// hands them to pcapgo, fileHeader first, with one call per read of
// pcapgo's 4 KiB buffer where a pcapValidator over the mapping takes four
// per record: each read copies as many bytes as it asks for in one copy,
// then checks in place the headers of the records that start in them, as
// pcapValidator does (a captured length of at most maxSnaplen, an original
// length not below it) and that the record ends inside the mapping, and
// hands out the bytes before the first header that fails. From that record
// on a pcapValidator reads (from the mapping, then the file), so that such
// records and errors come out as from any other reader.
func (m *mappedFile) pcapRecords(order binary.ByteOrder, fileHeader []byte) io.Reader {
	return &mappedPcap{m: m, order: order, hdr: slices.Clone(fileHeader), next: m.off}
}

// mappedPcap is what pcapRecords returns.
type mappedPcap struct {
	m     *mappedFile
	order binary.ByteOrder
	hdr   []byte         // the file header, handed out first
	next  int            // the next record header to check, in m.data
	slow  *pcapValidator // reads on from the first record not checked here
}

func (r *mappedPcap) Read(p []byte) (n int, err error) {
	if len(r.hdr) > 0 {
		n = copy(p, r.hdr)
		r.hdr = r.hdr[n:]
		return n, nil
	}
	if r.slow == nil {
		if n, err = r.read(p); err != nil {
			return 0, &readError{err}
		}
		if n > 0 || len(p) == 0 {
			return n, nil
		}
		r.slow = &pcapValidator{order: r.order}
		r.slow.passThrough = passThrough{r: r.m, unit: "pcap record", off: int64(r.m.off), next: r.slow.nextRecord}
	}
	return r.slow.Read(p)
}

// read copies the next bytes of the mapping into p and hands out those
// before the first record header that fails the checks: none when the
// next header does.
func (r *mappedPcap) read(p []byte) (n int, err error) {
	defer guardFault(&n, &err)(debug.SetPanicOnFault(true))
	m, d := r.m, r.m.data
	end := m.off + copy(p, d[m.off:])
	for r.next < end && r.next+16 <= len(d) {
		h := d[r.next : r.next+16]
		capLen, orig := r.order.Uint32(h[8:]), r.order.Uint32(h[12:])
		if !plainRecord(capLen, orig) || int(capLen) > len(d)-r.next-16 {
			break
		}
		r.next += 16 + int(capLen)
	}
	n = min(end, r.next) - m.off
	m.advance(n)
	return n, nil
}

// Peek returns the next n bytes without handing them out; NewReader peeks
// at the magic number, well inside the minMapped bytes mapped.
func (m *mappedFile) Peek(n int) ([]byte, error) {
	if m.off+n > len(m.data) {
		return m.data[m.off:], io.EOF
	}
	return m.data[m.off : m.off+n], nil
}

func (m *mappedFile) close() error {
	if m.data == nil {
		return nil
	}
	err := syscall.Munmap(m.data)
	m.data = nil
	return err
}
