package pcap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/google/gopacket"
	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/require"
)

// Byte builders for the reader tests: pcap and pcapng files made field by
// field, so that every length can be made to lie.

// order reads and appends in one byte order.
type order interface {
	binary.ByteOrder
	binary.AppendByteOrder
}

var le, be order = binary.LittleEndian, binary.BigEndian

// pcapBuilder writes a classic pcap file.
type pcapBuilder struct {
	order order
	b     []byte
}

// newPcap starts a microsecond pcap file with the given link type field and
// snapshot length.
func newPcap(order order, linkType, snaplen uint32) *pcapBuilder {
	w := &pcapBuilder{order: order}
	w.b = order.AppendUint32(w.b, 0xA1B2C3D4)
	w.b = order.AppendUint16(w.b, 2)
	w.b = order.AppendUint16(w.b, 4)
	w.b = append(w.b, make([]byte, 8)...) // thiszone, sigfigs
	w.b = order.AppendUint32(w.b, snaplen)
	w.b = order.AppendUint32(w.b, linkType)
	return w
}

// record appends a record whose header gives caplen and orig, followed by
// data (which need not be caplen bytes long).
func (w *pcapBuilder) record(sec uint32, caplen, orig uint32, data []byte) *pcapBuilder {
	w.b = w.order.AppendUint32(w.b, sec)
	w.b = w.order.AppendUint32(w.b, 0)
	w.b = w.order.AppendUint32(w.b, caplen)
	w.b = w.order.AppendUint32(w.b, orig)
	w.b = append(w.b, data...)
	return w
}

// frame appends a whole frame.
func (w *pcapBuilder) frame(sec uint32, data []byte) *pcapBuilder {
	return w.record(sec, uint32(len(data)), uint32(len(data)), data)
}

// ngBuilder writes a pcapng file.
type ngBuilder struct {
	order order
	b     []byte
}

func newNg(order order) *ngBuilder { return &ngBuilder{order: order} }

// block appends a block of type typ around body, padded to 4 bytes.
func (w *ngBuilder) block(typ uint32, body []byte) *ngBuilder {
	n := 12 + (len(body)+3)&^3
	return w.blockLen(typ, uint32(n), body)
}

// blockLen appends a block that claims length n at both ends, whatever the
// size of body.
func (w *ngBuilder) blockLen(typ, n uint32, body []byte) *ngBuilder {
	w.b = w.order.AppendUint32(w.b, typ)
	w.b = w.order.AppendUint32(w.b, n)
	w.b = append(w.b, body...)
	for len(body)%4 != 0 {
		body = append(body, 0)
		w.b = append(w.b, 0)
	}
	w.b = w.order.AppendUint32(w.b, n)
	return w
}

// opt returns an option: code, length, value, padding.
func (w *ngBuilder) opt(code uint16, val []byte) []byte {
	b := w.order.AppendUint16(nil, code)
	b = w.order.AppendUint16(b, uint16(len(val)))
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func (w *ngBuilder) shb(opts ...[]byte) *ngBuilder {
	body := w.order.AppendUint32(nil, 0x1A2B3C4D)
	body = w.order.AppendUint16(body, 1)
	body = w.order.AppendUint16(body, 0)
	body = append(body, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
	return w.block(ngSHB, appendOpts(body, opts))
}

func (w *ngBuilder) idb(linkType uint16, snaplen uint32, opts ...[]byte) *ngBuilder {
	body := w.order.AppendUint16(nil, linkType)
	body = w.order.AppendUint16(body, 0)
	body = w.order.AppendUint32(body, snaplen)
	return w.block(ngIDB, appendOpts(body, opts))
}

// tsresol is an if_tsresol option.
func (w *ngBuilder) tsresol(r byte) []byte { return w.opt(9, []byte{r}) }

// epbBody is the body of an enhanced packet block with the given lengths.
func (w *ngBuilder) epbBody(ifid uint32, ts uint64, caplen, orig uint32, data []byte) []byte {
	body := w.order.AppendUint32(nil, ifid)
	body = w.order.AppendUint32(body, uint32(ts>>32))
	body = w.order.AppendUint32(body, uint32(ts))
	body = w.order.AppendUint32(body, caplen)
	body = w.order.AppendUint32(body, orig)
	return append(body, data...)
}

func (w *ngBuilder) epb(ifid uint32, ts uint64, data []byte) *ngBuilder {
	return w.block(ngEPB, w.epbBody(ifid, ts, uint32(len(data)), uint32(len(data)), data))
}

func (w *ngBuilder) spb(orig uint32, data []byte) *ngBuilder {
	return w.block(ngSPB, append(w.order.AppendUint32(nil, orig), data...))
}

// pb is an obsolete packet block.
func (w *ngBuilder) pb(ifid uint16, caplen, orig uint32, data []byte) *ngBuilder {
	body := w.order.AppendUint16(nil, ifid)
	body = w.order.AppendUint16(body, 0)
	body = append(body, make([]byte, 8)...)
	body = w.order.AppendUint32(body, caplen)
	body = w.order.AppendUint32(body, orig)
	return w.block(ngPB, append(body, data...))
}

func (w *ngBuilder) isb(ifid uint32, opts ...[]byte) *ngBuilder {
	body := w.order.AppendUint32(nil, ifid)
	body = append(body, make([]byte, 8)...)
	return w.block(ngISB, appendOpts(body, opts))
}

func (w *ngBuilder) raw(b ...byte) *ngBuilder {
	w.b = append(w.b, b...)
	return w
}

func appendOpts(body []byte, opts [][]byte) []byte {
	for _, o := range opts {
		body = append(body, o...)
	}
	if len(opts) > 0 {
		body = append(body, 0, 0, 0, 0) // end of options
	}
	return body
}

// readResult is what reading a whole capture gave.
type readResult struct {
	frames [][]byte
	lts    []LinkType
	cis    []gopacket.CaptureInfo
	err    error // what ended it; nil for io.EOF
}

// readAll reads a capture from memory to its end.
func readAll(t *testing.T, b []byte) readResult {
	t.Helper()
	var res readResult
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		res.err = err
		return res
	}
	for i := 0; i < 100000; i++ {
		data, ci, lt, err := r.Next()
		if err != nil {
			if err != io.EOF {
				res.err = err
				// The error sticks.
				_, _, _, again := r.Next()
				require.Equal(t, err, again, "a second Next after the error")
			}
			return res
		}
		res.frames = append(res.frames, append([]byte(nil), data...))
		res.lts = append(res.lts, lt)
		res.cis = append(res.cis, ci)
	}
	t.Fatal("more than 100000 frames")
	return res
}

// frameOf returns an Ethernet frame of an RC SEND_ONLY with n payload bytes
// and PSN psn.
func frameOf(t testing.TB, psn uint32, n int) []byte {
	p := samplePacket(bth.RCSendOnly, n)
	p.BTH.PSN = bth.PSN(psn)
	f, err := encap4().AppendFrame(nil, p)
	require.NoError(t, err)
	return f
}

// errReader returns its bytes, then err.
type errReader struct {
	b   []byte
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.err
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

var errDisk = errors.New("disk on fire")
