package pcap

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// IPv4 and IPv6 fragment reassembly (RFC 791 section 3.2; RFC 8200
// section 4.5, for a Fragment header right after the fixed header; RFC
// 815's hole list kept as a sorted list of received ranges). Decoder holds
// the fragments of UDP datagrams until the last one arrives, then decodes
// the whole datagram in the frame that completed it, as tshark does
// ("Reassembled IPv4 in frame N"). Memory is bounded by configuration: at
// most MaxFragmented datagrams in reassembly at once (the oldest is dropped
// for a new one), each at most 65535 bytes, and one whose last fragment is
// older than FragmentTimeout in capture time is dropped (Linux's
// ipfrag_time is 30 s).

// Reassembly defaults.
const (
	DefaultMaxFragmented   = 64
	DefaultFragmentTimeout = 30 * time.Second
	maxIPv4Datagram        = 65535
)

type fragKey struct {
	src, dst netip.Addr
	id       uint32 // IPv4 identification, or IPv6 Fragment header identification
	proto    uint8
}

// fragDatagram is one datagram in reassembly.
type fragDatagram struct {
	key    fragKey
	header []byte   // the first fragment's IP header, once it came
	data   []byte   // the payload, grown to the highest end seen
	have   [][2]int // received byte ranges [start, end), sorted, merged
	total  int      // payload length, known from the last fragment (-1 before)
	frags  int      // fragments received
	last   time.Time
}

func (f *fragDatagram) add(off int, b []byte) {
	end := off + len(b)
	if end > len(f.data) {
		f.data = append(f.data, make([]byte, end-len(f.data))...)
	}
	copy(f.data[off:end], b)
	// Insert [off, end) and merge.
	rs := append(f.have, [2]int{off, end})
	for i := len(rs) - 1; i > 0 && rs[i][0] < rs[i-1][0]; i-- {
		rs[i], rs[i-1] = rs[i-1], rs[i]
	}
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	f.have = out
}

func (f *fragDatagram) complete() bool {
	return f.total >= 0 && f.header != nil && len(f.have) == 1 && f.have[0][0] == 0 && f.have[0][1] >= f.total
}

// reassembler holds datagrams in reassembly, oldest first.
type reassembler struct {
	max     int
	timeout time.Duration
	pending []*fragDatagram
	dropped int // datagrams dropped unfinished: timed out, evicted or impossible
	buf     []byte
	hdr6    []byte // an IPv6 header being made the first fragment's
}

// fragment adds one IPv4 fragment (hdr: its IP header, payload: what follows
// it, off: the fragment offset in bytes, more: the MF flag). It returns the
// whole datagram (header then payload, valid until the next call) and the
// number of fragments it came in when this one completed it.
func (r *reassembler) fragment(key fragKey, hdr, payload []byte, off int, more bool, now time.Time) ([]byte, int) {
	kept := r.pending[:0]
	for _, f := range r.pending {
		if now.Sub(f.last) > r.timeout {
			r.dropped++
			continue
		}
		kept = append(kept, f)
	}
	for i := len(kept); i < len(r.pending); i++ {
		r.pending[i] = nil
	}
	r.pending = kept
	var f *fragDatagram
	idx := -1
	for i, p := range r.pending {
		if p.key == key {
			f, idx = p, i
			break
		}
	}
	end := off + len(payload)
	if end > maxIPv4Datagram-len(hdr) {
		if f != nil {
			r.remove(idx)
			r.dropped++
		}
		return nil, 0
	}
	if f == nil {
		if len(r.pending) >= r.max {
			r.remove(0)
			r.dropped++
		}
		f = &fragDatagram{key: key, total: -1}
		r.pending = append(r.pending, f)
		idx = len(r.pending) - 1
	}
	f.frags++
	f.last = now
	if off == 0 {
		f.header = append(f.header[:0], hdr...)
	}
	if !more {
		f.total = end
	}
	f.add(off, payload)
	if !f.complete() {
		return nil, 0
	}
	r.remove(idx)
	n := len(f.header) + f.total
	r.buf = append(append(r.buf[:0], f.header...), f.data[:f.total]...)
	if r.buf[0]>>4 == 6 {
		// IPv6 without the Fragment header: the payload length of all.
		binary.BigEndian.PutUint16(r.buf[4:], uint16(f.total))
		return r.buf, f.frags
	}
	// The IPv4 datagram as it was before fragmentation: its total length,
	// no MF flag, offset 0 (the DF bit stays as the first fragment had it).
	binary.BigEndian.PutUint16(r.buf[2:], uint16(n))
	binary.BigEndian.PutUint16(r.buf[6:], binary.BigEndian.Uint16(r.buf[6:])&0x4000)
	return r.buf, f.frags
}

func (r *reassembler) remove(i int) {
	copy(r.pending[i:], r.pending[i+1:])
	r.pending[len(r.pending)-1] = nil
	r.pending = r.pending[:len(r.pending)-1]
}
