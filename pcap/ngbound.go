package pcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// The capture readers hand gopacket's pcapgo a stream that has been checked
// first. pcapgo trusts the lengths in a file: it allocates what a block, a
// record or an interface's snapshot length asks for, reads across block
// boundaries when a captured length exceeds its block, divides by zero on
// some timestamp resolutions, and reports a file cut inside a block as a
// clean io.EOF. The validators below follow the file's structure as the
// bytes pass, refuse what would mislead pcapgo with an error naming the
// offset, and never hand out bytes past the end of the current block or
// record in one Read, so that what they know about the file (the link type
// of each interface) is what pcapgo is reading.

// Limits on the lengths a capture may use.
const (
	// maxBlockLen bounds a pcapng block.
	maxBlockLen = 16 << 20
)

// formatError is a capture that breaks its format. It wraps
// ErrTruncatedCapture or ErrCorruptCapture.
type formatError struct {
	kind error
	unit string // "pcapng block", "pcap record"
	off  int64
	msg  string
}

func (e *formatError) Error() string { return fmt.Sprintf("%s at offset %d: %s", e.unit, e.off, e.msg) }
func (e *formatError) Unwrap() error { return e.kind }

// readError is an I/O error of the file underneath (not its end).
type readError struct{ err error }

func (e *readError) Error() string {
	msg := e.err.Error()
	var pe *fs.PathError
	if errors.As(e.err, &pe) {
		msg = pe.Err.Error() // Open names the file already
	}
	return "read error: " + msg
}

func (e *readError) Unwrap() error { return e.err }

// passThrough is what both validators share: bytes already checked (out),
// then body bytes passed through from r unread, then the next unit, which
// next checks.
type passThrough struct {
	r     io.Reader
	off   int64  // bytes read from r
	out   []byte // checked bytes to hand out first
	body  int64  // bytes to pass through after out
	err   error  // returned once out and body are handed out
	eof   bool   // r returned io.EOF at the end of a unit
	unit  string // "pcapng block" or "pcap record", for errors
	start int64  // offset of the current unit
	size  int64  // its length
	next  func() error
}

func (v *passThrough) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for len(v.out) == 0 && v.body == 0 {
		if v.err != nil {
			return 0, v.err
		}
		v.err = v.next()
	}
	if len(v.out) > 0 {
		n := copy(p, v.out)
		v.out = v.out[n:]
		return n, nil
	}
	if int64(len(p)) > v.body {
		p = p[:v.body]
	}
	n, err := v.r.Read(p)
	v.off += int64(n)
	v.body -= int64(n)
	switch {
	case err == nil:
	case err == io.EOF && v.body == 0:
		v.eof = true
	case err == io.EOF:
		v.err = v.cut()
		v.body = 0
	default:
		v.err = &readError{err}
		v.body = 0
	}
	if n == 0 && v.err != nil {
		return 0, v.err
	}
	return n, nil
}

// readFull reads len(b) bytes of a unit's header. n < len(b) comes with an
// error: io.EOF when nothing was read at all.
func (v *passThrough) readFull(b []byte) (int, error) {
	if v.eof {
		return 0, io.EOF
	}
	n, err := io.ReadFull(v.r, b)
	v.off += int64(n)
	switch {
	case err == io.EOF:
		v.eof = true
	case err == io.ErrUnexpectedEOF:
		return n, v.cut()
	case err != nil:
		return n, &readError{err}
	}
	return n, err
}

// cut is the error for a file that ends inside the current unit.
func (v *passThrough) cut() error {
	if v.size == 0 {
		return v.errorf(ErrTruncatedCapture, "the file ends after %d bytes of its header", v.off-v.start)
	}
	return v.errorf(ErrTruncatedCapture, "the file ends after %d of its %d bytes", v.off-v.start, v.size)
}

func (v *passThrough) errorf(kind error, format string, args ...any) error {
	return &formatError{kind: kind, unit: v.unit, off: v.start, msg: fmt.Sprintf(format, args...)}
}

// pcapng block types (pcapng draft, section 4).
const (
	ngSHB = 0x0A0D0D0A // section header
	ngIDB = 1          // interface description
	ngPB  = 2          // packet (obsolete)
	ngSPB = 3          // simple packet
	ngISB = 5          // interface statistics
	ngEPB = 6          // enhanced packet
)

// ngInterface is what the validator keeps of an interface description
// block.
type ngInterface struct {
	linkType LinkType // all 16 bits; gopacket's layers.LinkType keeps 8
	snaplen  uint32   // as handed to pcapgo, at most maxSnaplen
}

// ngValidator passes a pcapng stream through to pcapgo, block by block,
// after checking each block:
//
//   - a block's length is at least 12, a multiple of 4, at most 16 MiB, at
//     least the fixed part of its type, and the same at its end;
//   - the options of section header, interface description and interface
//     statistics blocks (which pcapgo parses) lie inside their block;
//     if_tsresol has one byte and a resolution that fits 64 bits;
//   - a packet block names an interface of its section, and its captured
//     length fits its block and is at most 262144 bytes.
//
// An interface's snapshot length above 262144 is handed to pcapgo as 262144
// (pcapgo allocates it), and a packet's original length below its captured
// length is raised to it. Bytes after the last block must be another block:
// trailing garbage is an error, not an end.
type ngValidator struct {
	passThrough
	buf     []byte
	order   binary.ByteOrder
	ifaces  []ngInterface // of the current section
	skip    bool          // the section has a version pcapgo skips
	trailer uint32        // block length the current block must end with
	inBody  bool          // the trailer of the current block is still to come
}

func newNgValidator(r io.Reader) *ngValidator {
	v := &ngValidator{buf: make([]byte, 64)}
	v.passThrough = passThrough{r: r, unit: "pcapng block", next: v.nextBlock}
	return v
}

// linkType returns the link type of interface i of the section pcapgo is
// reading.
func (v *ngValidator) linkType(i int) (LinkType, bool) {
	if i < 0 || i >= len(v.ifaces) {
		return 0, false
	}
	return v.ifaces[i].linkType, true
}

// grow returns v.buf with room for n bytes.
func (v *ngValidator) grow(n int) []byte {
	if cap(v.buf) < n {
		v.buf = make([]byte, n)
	}
	return v.buf[:n]
}

func (v *ngValidator) nextBlock() error {
	if v.inBody {
		// The block's body went through: check its trailing length.
		v.inBody = false
		b := v.buf[:4]
		if _, err := v.readFull(b); err != nil {
			if err == io.EOF {
				return v.cut()
			}
			return err
		}
		if got := v.order.Uint32(b); got != v.trailer {
			return v.errorf(ErrCorruptCapture, "block length %d at its start, %d at its end", v.trailer, got)
		}
		v.out = b
		return nil
	}
	v.start, v.size = v.off, 0
	h := v.grow(12)[:8]
	if n, err := v.readFull(h); err != nil {
		if err == io.EOF && n == 0 {
			return io.EOF
		}
		return err
	}
	typ := binary.LittleEndian.Uint32(h) // the SHB type reads the same either way
	hl := 8
	if typ == ngSHB {
		h = v.buf[:12]
		if _, err := v.readFull(h[8:]); err != nil {
			if err == io.EOF {
				return v.cut()
			}
			return err
		}
		switch binary.LittleEndian.Uint32(h[8:]) {
		case 0x1A2B3C4D:
			v.order = binary.LittleEndian
		case 0x4D3C2B1A:
			v.order = binary.BigEndian
		default:
			return v.errorf(ErrCorruptCapture, "section header with byte-order magic % x", h[8:12])
		}
		hl = 12
	} else if v.order == nil {
		return v.errorf(ErrCorruptCapture, "the file does not start with a section header block")
	} else {
		typ = v.order.Uint32(h)
	}
	n := v.order.Uint32(h[4:8])
	v.size = int64(n)
	switch {
	case n < 12:
		return v.errorf(ErrCorruptCapture, "block length %d is less than 12", n)
	case n%4 != 0:
		return v.errorf(ErrCorruptCapture, "block length %d is not a multiple of 4", n)
	case n > maxBlockLen:
		return v.errorf(ErrCorruptCapture, "block length %d exceeds %d", n, maxBlockLen)
	}
	var fixed uint32 // the least length of a block of this type
	switch typ {
	case ngSHB:
		fixed = 28
	case ngIDB:
		fixed = 20
	case ngSPB:
		fixed = 16
	case ngISB:
		fixed = 24
	case ngEPB, ngPB:
		fixed = 32
	}
	if typ != ngSHB && v.skip {
		fixed = 0 // pcapgo skips the blocks of this section unread
	}
	if n < fixed {
		return v.errorf(ErrCorruptCapture, "block of type %d has length %d, less than the %d its type needs", typ, n, fixed)
	}
	v.trailer = n
	switch {
	case typ == ngSHB || (typ == ngIDB || typ == ngISB) && !v.skip:
		return v.wholeBlock(typ, hl, int(n))
	case (typ == ngEPB || typ == ngPB || typ == ngSPB) && !v.skip:
		return v.packetBlock(typ, int(n))
	}
	v.out = h
	v.body = int64(n) - int64(hl) - 4
	v.inBody = true
	return nil
}

// wholeBlock reads and checks a section header, interface description or
// interface statistics block, whose options pcapgo parses.
func (v *ngValidator) wholeBlock(typ uint32, hl, n int) error {
	var h [12]byte
	copy(h[:], v.buf[:hl])
	b := v.grow(n)
	copy(b, h[:hl])
	if _, err := v.readFull(b[hl:]); err != nil {
		if err == io.EOF {
			return v.cut()
		}
		return err
	}
	if got := v.order.Uint32(b[n-4:]); got != uint32(n) {
		return v.errorf(ErrCorruptCapture, "block length %d at its start, %d at its end", n, got)
	}
	switch typ {
	case ngSHB:
		v.ifaces = v.ifaces[:0]
		// pcapgo skips sections of another version than 1.0 unread.
		v.skip = v.order.Uint16(b[12:]) != 1 || v.order.Uint16(b[14:]) != 0
		if !v.skip {
			if err := v.checkOptions(b, 24, false); err != nil {
				return err
			}
		}
	case ngIDB:
		if err := v.checkOptions(b, 16, true); err != nil {
			return err
		}
		snap := v.order.Uint32(b[12:])
		if snap > maxSnaplen {
			snap = maxSnaplen
			v.order.PutUint32(b[12:], snap)
		}
		v.ifaces = append(v.ifaces, ngInterface{linkType: LinkType(v.order.Uint16(b[8:])), snaplen: snap})
	case ngISB:
		if id := v.order.Uint32(b[8:]); int64(id) >= int64(len(v.ifaces)) {
			return v.errorf(ErrCorruptCapture, "statistics for interface %d; the section has %d", id, len(v.ifaces))
		}
		if err := v.checkOptions(b, 20, false); err != nil {
			return err
		}
	}
	v.out = b
	return nil
}

// checkOptions walks the options of block b from offset at as pcapgo's
// readOption does, and refuses what would make it read outside the block or
// divide by zero.
func (v *ngValidator) checkOptions(b []byte, at int, idb bool) error {
	rem := len(b) - at // the options and the trailing length
	for rem > 4 {
		code, olen := v.order.Uint16(b[at:]), int(v.order.Uint16(b[at+2:]))
		at, rem = at+4, rem-4
		if code == 0 {
			if olen != 0 {
				return v.errorf(ErrCorruptCapture, "end-of-options option of length %d", olen)
			}
			return nil
		}
		padded := (olen + 3) &^ 3
		if padded > 0xFFFF { // pcapgo adds length and padding in 16 bits
			return v.errorf(ErrCorruptCapture, "option %d has length %d", code, olen)
		}
		if padded > rem-4 {
			return v.errorf(ErrCorruptCapture, "option %d of length %d runs past the end of the block", code, olen)
		}
		if idb && code == 9 { // if_tsresol
			if olen != 1 {
				return v.errorf(ErrCorruptCapture, "if_tsresol option of length %d, not 1", olen)
			}
			// pcapgo computes 2^e or 10^e in 64 bits; past these it wraps
			// to garbage or to zero, which it then divides by.
			r := b[at]
			if e := r & 0x7F; r&0x80 != 0 && e > 63 {
				return v.errorf(ErrCorruptCapture, "if_tsresol %#x: resolution 2^-%d is beyond 64 bits", r, e)
			} else if r&0x80 == 0 && e > 19 {
				return v.errorf(ErrCorruptCapture, "if_tsresol %#x: resolution 10^-%d is beyond 64 bits", r, e)
			}
		}
		at, rem = at+padded, rem-padded
	}
	return nil
}

// packetBlock checks the fixed part of an enhanced, simple or obsolete
// packet block and passes the rest through.
func (v *ngValidator) packetBlock(typ uint32, n int) error {
	hl := 28
	if typ == ngSPB {
		hl = 12
	}
	b := v.grow(hl)
	if _, err := v.readFull(b[8:]); err != nil {
		if err == io.EOF {
			return v.cut()
		}
		return err
	}
	room := n - hl - 4
	var capLen uint32
	switch typ {
	case ngSPB:
		if len(v.ifaces) == 0 {
			return v.errorf(ErrCorruptCapture, "simple packet block before any interface description block")
		}
		capLen = v.order.Uint32(b[8:])
		if s := v.ifaces[0].snaplen; s != 0 && capLen > s {
			capLen = s
		}
	default:
		id := v.order.Uint32(b[8:])
		if typ == ngPB {
			id = uint32(v.order.Uint16(b[8:]))
		}
		if int64(id) >= int64(len(v.ifaces)) {
			return v.errorf(ErrCorruptCapture, "packet for interface %d; the section has %d", id, len(v.ifaces))
		}
		capLen = v.order.Uint32(b[20:])
		if orig := v.order.Uint32(b[24:]); orig < capLen {
			v.order.PutUint32(b[24:], capLen)
		}
	}
	switch {
	case int64(capLen) > int64(room):
		return v.errorf(ErrCorruptCapture, "captured length %d exceeds the %d bytes its block holds", capLen, room)
	case capLen > maxSnaplen:
		return v.errorf(ErrCorruptCapture, "captured length %d exceeds %d", capLen, maxSnaplen)
	}
	v.out = b
	v.body = int64(room)
	v.inBody = true
	return nil
}
