package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
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
	// ErrTruncatedCapture: the file ends inside a packet record.
	ErrTruncatedCapture = errors.New("capture file truncated")
	// ErrLinkType: a link type that does not carry Ethernet or IP.
	ErrLinkType = errors.New("link type carries neither Ethernet nor IP")
)

// Reader reads the frames of a pcap or pcapng capture, in file order.
// Timestamps come at whatever precision the file has (micro- or
// nanoseconds, pcapng's if_tsresol); gopacket's pcapgo does the parsing.
// A Reader is not safe for concurrent use.
type Reader struct {
	format string // "pcap" or "pcapng"
	pcap   *pcapgo.Reader
	ng     *pcapgo.NgReader
	bound  *ngBoundary
	closer io.Closer
	frames int
}

// Open opens a capture file. Errors name the file.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.closer = f
	return r, nil
}

// NewReader reads a capture from r, telling pcap from pcapng by the magic
// number. It returns ErrNotCapture for anything else, and ErrLinkType when a
// pcap file's link type is not one Decoder handles.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(4)
	if err != nil {
		return nil, fmt.Errorf("%w: the file is %d bytes long", ErrNotCapture, len(magic))
	}
	switch binary.LittleEndian.Uint32(magic) {
	case 0xA1B2C3D4, 0xD4C3B2A1, 0xA1B23C4D, 0x4D3CB2A1:
		pr, err := pcapgo.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: bad pcap header: %v", ErrNotCapture, err)
		}
		if pr.Snaplen() > maxSnaplen || pr.Snaplen() == 0 {
			pr.SetSnaplen(maxSnaplen)
		}
		if !SupportedLinkType(pr.LinkType()) {
			return nil, fmt.Errorf("%w: %s (%d)", ErrLinkType, pr.LinkType(), int(pr.LinkType()))
		}
		return &Reader{format: "pcap", pcap: pr}, nil
	case 0x0A0D0D0A:
		bound := &ngBoundary{r: br}
		nr, err := pcapgo.NewNgReader(bound, pcapgo.NgReaderOptions{WantMixedLinkType: true, SkipUnknownVersion: true})
		if err != nil {
			return nil, fmt.Errorf("%w: bad pcapng section header: %v", ErrNotCapture, err)
		}
		return &Reader{format: "pcapng", ng: nr, bound: bound}, nil
	}
	return nil, fmt.Errorf("%w: the file starts with % x", ErrNotCapture, magic)
}

// Format returns "pcap" or "pcapng".
func (r *Reader) Format() string { return r.format }

// Next returns the next frame and its link type. data is valid until the
// next call. At the end of the capture it returns io.EOF; a file that ends
// inside a record returns an error wrapping ErrTruncatedCapture, after every
// whole frame before it was returned.
func (r *Reader) Next() (data []byte, ci gopacket.CaptureInfo, lt layers.LinkType, err error) {
	if r.pcap != nil {
		data, ci, err = r.pcap.ZeroCopyReadPacketData()
		lt = r.pcap.LinkType()
	} else {
		data, ci, err = r.ng.ZeroCopyReadPacketData()
		if err == nil && len(ci.AncillaryData) > 0 {
			lt, _ = ci.AncillaryData[0].(layers.LinkType)
		}
	}
	switch {
	case err == io.EOF && (ci.CaptureLength > 0 || r.bound != nil && r.bound.cut()):
		// pcapgo says io.EOF when a record's header was read but none of
		// its data, and for any short read inside a pcapng block.
		return nil, ci, lt, fmt.Errorf("%w after %d frames", ErrTruncatedCapture, r.frames)
	case err == io.EOF:
		return nil, ci, lt, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, ci, lt, fmt.Errorf("%w after %d frames", ErrTruncatedCapture, r.frames)
	case err != nil:
		return nil, ci, lt, fmt.Errorf("bad record after %d frames: %v", r.frames, err)
	}
	if r.ng != nil && !SupportedLinkType(lt) {
		return nil, ci, lt, fmt.Errorf("%w: frame %d is %s (%d)", ErrLinkType, r.frames+1, lt, int(lt))
	}
	r.frames++
	return data, ci, lt, nil
}

// Close closes the file Open opened.
func (r *Reader) Close() error {
	if r.closer != nil {
		return r.closer.Close()
	}
	return nil
}

// SupportedLinkType reports whether Decoder handles frames of link type lt:
// Ethernet, raw IP (Raw, IPv4, IPv6), Linux cooked (SLL), BSD loopback.
func SupportedLinkType(lt layers.LinkType) bool {
	switch lt {
	case layers.LinkTypeEthernet, layers.LinkTypeRaw, 12, layers.LinkTypeIPv4, layers.LinkTypeIPv6,
		layers.LinkTypeLinuxSLL, layers.LinkTypeNull, layers.LinkTypeLoop:
		return true
	}
	return false
}
