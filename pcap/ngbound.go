package pcap

import (
	"encoding/binary"
	"io"
)

// ngBoundary passes a pcapng byte stream through unchanged while following
// its block structure, so that the end of the stream can be told apart: at a
// block boundary (a whole file) or inside a block (a file cut short).
// gopacket's NgReader reports both as io.EOF.
type ngBoundary struct {
	r     io.Reader
	pos   int64 // bytes passed through
	next  int64 // offset where the next block starts
	hdr   [12]byte
	hdrN  int
	order binary.ByteOrder
	ended bool // the underlying reader returned an error
}

func (b *ngBoundary) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.follow(p[:n])
	if err != nil {
		b.ended = true
	}
	return n, err
}

func (b *ngBoundary) follow(p []byte) {
	for len(p) > 0 {
		if b.pos < b.next { // inside a block body: skip to its end
			k := b.next - b.pos
			if int64(len(p)) < k {
				k = int64(len(p))
			}
			b.pos += k
			p = p[k:]
			continue
		}
		// Collect a block header: type and length, plus the byte-order
		// magic for a section header block.
		c := copy(b.hdr[b.hdrN:], p)
		need := 8
		if b.hdrN+c >= 4 && binary.LittleEndian.Uint32(b.hdr[:4]) == 0x0A0D0D0A {
			need = 12
		}
		if b.hdrN+c < need {
			b.hdrN += c
			b.pos += int64(c)
			return
		}
		used := need - b.hdrN
		b.pos += int64(used)
		p = p[used:]
		if need == 12 {
			if binary.LittleEndian.Uint32(b.hdr[8:12]) == 0x1A2B3C4D {
				b.order = binary.LittleEndian
			} else {
				b.order = binary.BigEndian
			}
		}
		if b.order == nil {
			b.order = binary.LittleEndian
		}
		blockLen := int64(b.order.Uint32(b.hdr[4:8]))
		start := b.pos - int64(need)
		if blockLen < int64(need) {
			blockLen = int64(need) // corrupt: the NgReader reports it
		}
		b.next = start + blockLen
		b.hdrN = 0
	}
}

// cut reports whether the stream ended inside a block.
func (b *ngBoundary) cut() bool { return b.ended && (b.pos != b.next || b.hdrN != 0) }
