package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"
)

// maxSnaplen bounds the per-packet buffer a capture file can ask for. It is
// tcpdump's default snapshot length; a header that claims more is capped so
// that a corrupt file cannot make the reader allocate gigabytes.
const maxSnaplen = 262144

// Sentinel errors of the reader.
var (
	// ErrNotCapture: the file does not start with a pcap or pcapng magic number.
	ErrNotCapture = errors.New("not a pcap or pcapng capture")
	// ErrTruncatedCapture: the file ends inside its file header, a record or
	// a block.
	ErrTruncatedCapture = errors.New("capture file truncated")
	// ErrCorruptCapture: a length or field of the file breaks its format
	// (a pcapng block length under 12 or over 16 MiB, a captured length over
	// 262144 or over what its block holds, garbage after the last block, an
	// if_tsresol gopacket cannot convert, ...), or gopacket failed on it.
	ErrCorruptCapture = errors.New("corrupt capture")
	// ErrLinkType: a link type that does not carry Ethernet or IP.
	ErrLinkType = errors.New("link type carries neither Ethernet nor IP")
)

// LinkType is a capture's link-layer header type (LINKTYPE_* of
// tcpdump.org/linktypes.html) with all its bits: gopacket's layers.LinkType
// has 8 and would take 276 (Linux cooked v2) for 20, or 257 for Ethernet.
type LinkType uint32

// Link types Decoder handles.
const (
	LinkTypeNull      LinkType = 0   // BSD loopback, host byte order family
	LinkTypeEthernet  LinkType = 1   // Ethernet, 802.1Q tags included
	LinkTypeRawDLT    LinkType = 12  // raw IP, as DLT_RAW on some systems
	LinkTypeRaw       LinkType = 101 // raw IP, v4 or v6 by its version field
	LinkTypeLoop      LinkType = 108 // OpenBSD loopback, network byte order family
	LinkTypeLinuxSLL  LinkType = 113 // Linux cooked capture v1
	LinkTypeIPv4      LinkType = 228 // raw IPv4
	LinkTypeIPv6      LinkType = 229 // raw IPv6
	LinkTypeLinuxSLL2 LinkType = 276 // Linux cooked capture v2 (tcpdump -i any since libpcap 1.10)
)

// String names the link types Decoder handles, and gives the number of
// others.
func (lt LinkType) String() string {
	switch lt {
	case LinkTypeNull:
		return "NULL"
	case LinkTypeEthernet:
		return "ETHERNET"
	case LinkTypeRawDLT, LinkTypeRaw:
		return "RAW"
	case LinkTypeLoop:
		return "LOOP"
	case LinkTypeLinuxSLL:
		return "LINUX_SLL"
	case LinkTypeIPv4:
		return "IPV4"
	case LinkTypeIPv6:
		return "IPV6"
	case LinkTypeLinuxSLL2:
		return "LINUX_SLL2"
	}
	return fmt.Sprintf("LINKTYPE_%d", uint32(lt))
}

// SupportedLinkType reports whether Decoder handles frames of link type lt:
// Ethernet, raw IP (Raw, IPv4, IPv6), Linux cooked (SLL and SLL2), BSD
// loopback.
func SupportedLinkType(lt LinkType) bool {
	switch lt {
	case LinkTypeNull, LinkTypeEthernet, LinkTypeRawDLT, LinkTypeRaw, LinkTypeLoop,
		LinkTypeLinuxSLL, LinkTypeIPv4, LinkTypeIPv6, LinkTypeLinuxSLL2:
		return true
	}
	return false
}

// Reader reads the frames of a pcap or pcapng capture, in file order.
// gopacket's pcapgo does the parsing, behind a validator that follows the
// file's structure first and refuses lengths pcapgo would trust (see
// ErrCorruptCapture), so that a corrupt file cannot make it allocate more
// than a few hundred KiB per packet (16 MiB for a pcapng header block) or
// read one block as another.
//
// Timestamps come at whatever precision the file has: micro- or
// nanoseconds, or pcapng's if_tsresol. pcapgo converts binary resolutions
// (if_tsresol 0x80|n, units of 2^-n s) with integer factors, so those
// timestamps are off by up to 0.35 ms at 2^-10 and 2^-20 and 71 ms at 2^-30
// (a known gap; every capture tool we know writes decimal resolutions).
//
// A Reader is not safe for concurrent use.
type Reader struct {
	format string // "pcap" or "pcapng"
	pcap   *pcapgo.Reader
	lt     LinkType // of a pcap file
	ng     *pcapgo.NgReader
	ngv    *ngValidator
	closer io.Closer
	frames int
	err    error // the error that ended reading
}

// Open opens a capture file. Errors name the file. On Linux a regular file
// of 1 MiB or more is read through a memory mapping, which saves a copy per
// byte; a file truncated while it is read then gives a "read error" where
// the mapping would crash the process. Elsewhere, and for smaller files
// and pipes, the file is read a MiB at a time.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	src, unmap := openSource(f)
	r, err := NewReader(src)
	if err != nil {
		unmap()
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.closer = fileCloser{f, unmap}
	return r, nil
}

// fileCloser closes what Open opened: the mapping, then the file.
type fileCloser struct {
	f     *os.File
	unmap func() error
}

func (c fileCloser) Close() error {
	err := c.unmap()
	if cerr := c.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// peekReader is a reader NewReader can peek at without a buffer of its
// own: a bufio.Reader, or Open's mapping.
type peekReader interface {
	io.Reader
	Peek(n int) ([]byte, error)
}

// pcapRecordSource is a source that checks the records of a classic pcap
// file itself, as pcapValidator does, with fewer copies and calls: Open's
// mapping (mapped_linux.go).
type pcapRecordSource interface {
	pcapRecords(order binary.ByteOrder, fileHeader []byte) io.Reader
}

// NewReader reads a capture from r, telling pcap from pcapng by the magic
// number. It returns an error wrapping ErrNotCapture for anything else,
// ErrTruncatedCapture when the file ends inside its file header,
// ErrCorruptCapture when its first block is corrupt, and ErrLinkType when a
// pcap file's link type is not one Decoder handles. I/O errors of r are
// returned as "read error: ..." wrapping them.
func NewReader(r io.Reader) (rd *Reader, err error) {
	defer func() {
		if p := recover(); p != nil {
			rd, err = nil, fmt.Errorf("%w: gopacket failed on the file header: %v", ErrCorruptCapture, p)
		}
	}()
	br, ok := r.(peekReader)
	if !ok {
		br = bufio.NewReaderSize(r, 1<<16)
	}
	magic, err := br.Peek(4)
	if err != nil {
		if err != io.EOF {
			return nil, &readError{err}
		}
		return nil, fmt.Errorf("%w: the file is %d bytes long", ErrNotCapture, len(magic))
	}
	switch binary.LittleEndian.Uint32(magic) {
	case 0xA1B2C3D4, 0xD4C3B2A1, 0xA1B23C4D, 0x4D3CB2A1:
		var hdr [24]byte
		n, err := io.ReadFull(br, hdr[:])
		if err == io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("%w: the file ends after %d of the 24 bytes of the pcap file header", ErrTruncatedCapture, n)
		} else if err != nil {
			return nil, &readError{err}
		}
		var order binary.ByteOrder = binary.LittleEndian
		if m := binary.LittleEndian.Uint32(hdr[:]); m == 0xD4C3B2A1 || m == 0x4D3CB2A1 {
			order = binary.BigEndian
		}
		var src io.Reader
		if m, ok := br.(pcapRecordSource); ok {
			src = m.pcapRecords(order, hdr[:])
		} else {
			src = newPcapValidator(br, order, hdr[:])
		}
		pr, err := pcapgo.NewReader(src)
		if err != nil {
			return nil, fmt.Errorf("%w: bad pcap header: %v", ErrNotCapture, err)
		}
		// The header's snapshot length is advice: tshark reads records
		// longer than it, and pcapgo allocates it. The validator bounds
		// records to maxSnaplen.
		pr.SetSnaplen(maxSnaplen)
		// The link type field's top 6 bits carry the FCS length
		// (libpcap's LT_LINKTYPE).
		lt := LinkType(order.Uint32(hdr[20:]) & 0x03FFFFFF)
		if !SupportedLinkType(lt) {
			return nil, fmt.Errorf("%w: %s", ErrLinkType, lt)
		}
		return &Reader{format: "pcap", pcap: pr, lt: lt}, nil
	case ngSHB:
		v := newNgValidator(br)
		nr, err := pcapgo.NewNgReader(v, pcapgo.NgReaderOptions{WantMixedLinkType: true, SkipUnknownVersion: true})
		if err != nil {
			var fe *formatError
			var re *readError
			switch {
			case errors.As(err, &fe):
				return nil, fmt.Errorf("%w: %w", fe.kind, fe)
			case errors.As(err, &re):
				return nil, re
			}
			return nil, fmt.Errorf("%w: bad pcapng section header: %v", ErrNotCapture, err)
		}
		return &Reader{format: "pcapng", ng: nr, ngv: v}, nil
	}
	return nil, fmt.Errorf("%w: the file starts with % x", ErrNotCapture, magic)
}

// Format returns "pcap" or "pcapng".
func (r *Reader) Format() string { return r.format }

// Next returns the next frame and its link type (a pcapng file's may differ
// from one interface to the next). data is valid until the next call. At the
// end of the capture it returns io.EOF. A frame of a pcapng interface whose
// link type Decoder does not handle (802.11, USB, ...) is returned like any
// other, with that link type: Decoder.Decode refuses it with ErrLinkType,
// and callers skip and count it (as tshark shows such frames and goes on).
// After every whole frame before it was returned, it returns an error
// wrapping ErrTruncatedCapture for a file that ends inside a record or
// block, ErrCorruptCapture for a corrupt one (gopacket panicking on it
// included), and "read error: ..." for an I/O error. The error ends the
// capture: later calls return it again.
func (r *Reader) Next() (data []byte, ci gopacket.CaptureInfo, lt LinkType, err error) {
	if r.err != nil {
		return nil, ci, 0, r.err
	}
	defer func() {
		if p := recover(); p != nil {
			data, err = nil, fmt.Errorf("%w after %d frames: gopacket failed: %v", ErrCorruptCapture, r.frames, p)
			r.err = err
		}
	}()
	if r.pcap != nil {
		data, ci, err = r.pcap.ZeroCopyReadPacketData()
		lt = r.lt
	} else {
		data, ci, err = r.ng.ZeroCopyReadPacketData()
		if err == nil {
			var ok bool
			if lt, ok = r.ngv.linkType(ci.InterfaceIndex); !ok {
				// The validator checks interfaces; this is a bug.
				r.err = fmt.Errorf("%w after %d frames: packet of interface %d, which its section lacks", ErrCorruptCapture, r.frames, ci.InterfaceIndex)
				return nil, ci, 0, r.err
			}
		}
	}
	if err != nil {
		return nil, ci, lt, r.fail(err)
	}
	r.frames++
	return data, ci, lt, nil
}

// fail turns what pcapgo returned into the error that ends the capture.
func (r *Reader) fail(err error) error {
	var fe *formatError
	var re *readError
	switch {
	case err == io.EOF, errors.Is(err, ErrLinkType):
	case errors.As(err, &fe):
		err = fmt.Errorf("%w after %d frames: %w", fe.kind, r.frames, fe)
	case errors.As(err, &re):
		err = fmt.Errorf("%w (after %d frames)", re, r.frames)
	case errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("%w after %d frames", ErrTruncatedCapture, r.frames)
	default:
		err = fmt.Errorf("%w after %d frames: gopacket: %v", ErrCorruptCapture, r.frames, err)
	}
	r.err = err
	return err
}

// Close closes the file Open opened.
func (r *Reader) Close() error {
	if r.closer != nil {
		return r.closer.Close()
	}
	return nil
}
