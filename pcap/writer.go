package pcap

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/roce-emu/roce-emu/bth"
)

// Writer records frames in a pcap file: link type Ethernet, nanosecond
// timestamps, snapshot length 262144. tshark decodes what it writes as
// RoCEv2 (UDP port 4791). A Writer is safe for concurrent use: a transport
// may record sends and receives from different goroutines.
type Writer struct {
	mu     sync.Mutex
	bw     *bufio.Writer
	w      *pcapgo.Writer
	closer io.Closer
	buf    []byte
	err    error
}

// Create creates (or truncates) the file at path and writes a pcap header.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.closer = f
	return w, nil
}

// NewWriter writes a pcap header to out and returns a Writer that appends
// frames to it. Close flushes.
func NewWriter(out io.Writer) (*Writer, error) {
	bw := bufio.NewWriterSize(out, 1<<16)
	w := pcapgo.NewWriterNanos(bw)
	if err := w.WriteFileHeader(maxSnaplen, layers.LinkTypeEthernet); err != nil {
		return nil, err
	}
	return &Writer{bw: bw, w: w}, nil
}

// WriteFrame records one Ethernet frame captured at ts. Frames longer than
// the snapshot length are recorded cut short, as a capture would.
func (w *Writer) WriteFrame(ts time.Time, frame []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(ts, frame)
}

func (w *Writer) writeLocked(ts time.Time, frame []byte) error {
	if w.err != nil {
		return w.err
	}
	ci := gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(frame), Length: len(frame)}
	if ci.CaptureLength > maxSnaplen {
		ci.CaptureLength = maxSnaplen
		frame = frame[:maxSnaplen]
	}
	w.err = w.w.WritePacket(ci, frame)
	return w.err
}

// WritePacket encodes p inside the headers e describes, ICRC included, and
// records the frame.
func (w *Writer) WritePacket(ts time.Time, e *bth.Encap, p *bth.Packet) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, err := e.AppendFrame(w.buf[:0], p)
	if err != nil {
		return err
	}
	w.buf = b
	return w.writeLocked(ts, b)
}

// WriteDatagram records a UDP payload that is already a whole RoCEv2 packet
// (ICRC included), as it travelled inside the headers e describes. This is
// what a UDP transport hands over for packets it sent or received.
func (w *Writer) WriteDatagram(ts time.Time, e *bth.Encap, udpPayload []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], e.DstMAC[:]...)
	b = append(b, e.SrcMAC[:]...)
	if e.IsIPv4() {
		b = append(b, 0x08, 0x00)
	} else {
		b = append(b, 0x86, 0xDD)
	}
	b, err := e.AppendIPUDP(b, len(udpPayload))
	if err != nil {
		return err
	}
	b = append(b, udpPayload...)
	w.buf = b
	return w.writeLocked(ts, b)
}

// Flush writes buffered frames to the file.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = w.bw.Flush()
	}
	return w.err
}

// Close flushes and closes the file Create opened.
func (w *Writer) Close() error {
	err := w.Flush()
	if w.closer != nil {
		if cerr := w.closer.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// SetICRC recomputes and writes the ICRC of a RoCEv2 packet inside an
// Ethernet frame, for frames built with gopacket.SerializeLayers (whose BTH
// layer cannot know the IP header the ICRC covers).
func SetICRC(frame []byte) error {
	d := NewDecoder()
	var rec Record
	k, err := d.Decode(frame, gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}, LinkTypeEthernet, &rec)
	if err != nil {
		return err
	}
	if k == KindOther {
		return bth.ErrNotRoCE
	}
	if k == KindMalformed {
		return rec.Err
	}
	if !rec.ICRCChecked {
		return fmt.Errorf("pcap: no ICRC is defined over this frame (cut short, or IPv6 with extension headers): %w", bth.ErrBadIPHeader)
	}
	n := len(rec.UDPPayload) - bth.ICRCLen
	crc := rec.ICRCComputed
	tail := rec.UDPPayload[n:]
	tail[0], tail[1], tail[2], tail[3] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
	return nil
}
