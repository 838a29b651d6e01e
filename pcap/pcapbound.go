package pcap

import (
	"encoding/binary"
	"io"
)

// pcapValidator passes a classic pcap stream through to pcapgo, record by
// record, after checking each 16-byte record header: a captured length
// above 262144 is an error before pcapgo allocates it, and an original
// length below the captured length is raised to it (tshark reads such
// records; pcapgo refuses them). A file that ends inside a record is
// reported as truncated, where pcapgo sees io.EOF or io.ErrUnexpectedEOF.
// The file header, read and checked by NewReader, is handed out first.
type pcapValidator struct {
	passThrough
	order binary.ByteOrder
	hdr   [24]byte
	rec   [16]byte
}

func newPcapValidator(r io.Reader, order binary.ByteOrder, fileHeader []byte) *pcapValidator {
	v := &pcapValidator{order: order}
	copy(v.hdr[:], fileHeader)
	v.passThrough = passThrough{r: r, unit: "pcap record", off: int64(len(v.hdr)), next: v.nextRecord}
	v.out = v.hdr[:]
	return v
}

// plainRecord reports whether nextRecord hands a record header with
// these lengths on unchanged: no error, no length mended. The mapped
// reader (mapped_linux.go) checks headers in place with it and leaves
// every other record to a pcapValidator.
func plainRecord(capLen, orig uint32) bool { return capLen <= maxSnaplen && orig >= capLen }

func (v *pcapValidator) nextRecord() error {
	v.start, v.size = v.off, 0
	b := v.rec[:]
	if n, err := v.readFull(b); err != nil {
		if err == io.EOF && n == 0 {
			return io.EOF
		}
		return err
	}
	capLen, orig := v.order.Uint32(b[8:]), v.order.Uint32(b[12:])
	if capLen > maxSnaplen {
		return v.errorf(ErrCorruptCapture, "captured length %d exceeds %d", capLen, maxSnaplen)
	}
	if orig < capLen {
		v.order.PutUint32(b[12:], capLen)
	}
	v.size = 16 + int64(capLen)
	v.out = b
	v.body = int64(capLen)
	return nil
}
