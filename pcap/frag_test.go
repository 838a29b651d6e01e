package pcap

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fragments splits an Ethernet/IPv4 frame's IP payload at the byte
// offsets given (multiples of 8), as a router would: each fragment gets
// the header with its own total length, offset and MF flag, DF cleared.
func fragments(frame []byte, id uint16, cuts ...int) [][]byte {
	const eth = 14
	ihl := int(frame[eth]&0xF) * 4
	hdr := frame[:eth+ihl]
	payload := frame[eth+ihl:]
	bounds := append(append([]int{0}, cuts...), len(payload))
	var out [][]byte
	for i := 0; i+1 < len(bounds); i++ {
		f := append(append([]byte(nil), hdr...), payload[bounds[i]:bounds[i+1]]...)
		binary.BigEndian.PutUint16(f[eth+2:], uint16(ihl+bounds[i+1]-bounds[i]))
		binary.BigEndian.PutUint16(f[eth+4:], id)
		flags := uint16(bounds[i] / 8)
		if i+2 < len(bounds) {
			flags |= 0x2000
		}
		binary.BigEndian.PutUint16(f[eth+6:], flags)
		out = append(out, f)
	}
	return out
}

func decodeAt(t *testing.T, d *Decoder, frame []byte, at time.Time) (Kind, *Record) {
	t.Helper()
	var r Record
	k, err := d.Decode(frame, gopacket.CaptureInfo{Timestamp: at, CaptureLength: len(frame), Length: len(frame)}, LinkTypeEthernet, &r)
	require.NoError(t, err)
	return k, &r
}

func TestDecoderReassemblesIPv4Fragments(t *testing.T) {
	whole, err := encap4().AppendFrame(nil, samplePacket(bth.RCSendOnly, 200))
	require.NoError(t, err)
	t0 := time.Unix(1700000000, 0)

	// In order, out of order, with a duplicate: the frame that completes
	// the datagram decodes it, ICRC and all.
	for name, order := range map[string][]int{"in order": {0, 1, 2}, "reversed": {2, 1, 0}, "duplicate middle": {1, 1, 0, 2}} {
		d := NewDecoder()
		fr := fragments(whole, binary.BigEndian.Uint16(whole[18:]), 64, 128)
		for i, idx := range order {
			k, r := decodeAt(t, d, fr[idx], t0)
			if i < len(order)-1 {
				assert.Equal(t, KindFragment, k, "%s: fragment %d", name, idx)
				continue
			}
			require.Equal(t, KindRoCE, k, "%s: %v", name, r.Err)
			assert.Equal(t, len(order), r.Fragments, "%s: frames that carried it", name)
			assert.Equal(t, 200, r.PayloadLen, name)
			assert.True(t, r.ICRCChecked && r.ICRCOK, name)
			assert.Equal(t, len(fr[idx]), r.Length, "%s: the frame's own length", name)
		}
		assert.Zero(t, d.PendingFragments(), name)
	}

	// Bounded: MaxFragmented datagrams at once, the oldest dropped.
	d := NewDecoder()
	d.MaxFragmented = 2
	for id := range uint16(3) {
		k, _ := decodeAt(t, d, fragments(whole, id, 64)[0], t0)
		assert.Equal(t, KindFragment, k)
	}
	assert.Equal(t, 2, d.PendingFragments())
	assert.Equal(t, 1, d.FragmentsDropped())
	k, _ := decodeAt(t, d, fragments(whole, 0, 64)[1], t0)
	assert.Equal(t, KindFragment, k, "datagram 0 was evicted: its last fragment completes nothing")
	k, _ = decodeAt(t, d, fragments(whole, 2, 64)[1], t0)
	assert.Equal(t, KindRoCE, k)

	// Timed out in capture time.
	d = NewDecoder()
	d.FragmentTimeout = time.Second
	fr := fragments(whole, 9, 64)
	decodeAt(t, d, fr[0], t0)
	k, _ = decodeAt(t, d, fr[1], t0.Add(2*time.Second))
	assert.Equal(t, KindFragment, k)
	assert.Equal(t, 1, d.FragmentsDropped())

	// A fragment of another protocol is not held.
	other := append([]byte(nil), fr[0]...)
	other[14+9] = 6 // TCP
	k, _ = decodeAt(t, NewDecoder(), other, t0)
	assert.Equal(t, KindOther, k)
}

// fragments6 splits an Ethernet/IPv6 frame's payload at the byte offsets
// given (multiples of 8), each piece behind a Fragment header.
func fragments6(frame []byte, id uint32, cuts ...int) [][]byte {
	const eth = 14
	hdr := frame[:eth+40]
	payload := frame[eth+40:]
	next := hdr[eth+6]
	bounds := append(append([]int{0}, cuts...), len(payload))
	var out [][]byte
	for i := 0; i+1 < len(bounds); i++ {
		f := append([]byte(nil), hdr...)
		f[eth+6] = 44
		binary.BigEndian.PutUint16(f[eth+4:], uint16(8+bounds[i+1]-bounds[i]))
		om := uint16(bounds[i])
		if i+2 < len(bounds) {
			om |= 1
		}
		f = append(f, next, 0, byte(om>>8), byte(om))
		f = binary.BigEndian.AppendUint32(f, id)
		f = append(f, payload[bounds[i]:bounds[i+1]]...)
		out = append(out, f)
	}
	return out
}

func TestDecoderReassemblesIPv6Fragments(t *testing.T) {
	whole, err := encap6().AppendFrame(nil, samplePacket(bth.RCWriteOnly, 300))
	require.NoError(t, err)
	t0 := time.Unix(1700000000, 0)
	for name, order := range map[string][]int{"in order": {0, 1, 2}, "reversed": {2, 0, 1}} {
		d := NewDecoder()
		fr := fragments6(whole, 0xabcdef01, 104, 208)
		for i, idx := range order {
			k, r := decodeAt(t, d, fr[idx], t0)
			if i < len(order)-1 {
				assert.Equal(t, KindFragment, k, "%s: fragment %d", name, idx)
				continue
			}
			require.Equal(t, KindRoCE, k, "%s: %v", name, r.Err)
			assert.Equal(t, 3, r.Fragments, name)
			assert.Equal(t, 300, r.PayloadLen, name)
			assert.True(t, r.ICRCChecked && r.ICRCOK, "%s: the ICRC of the datagram without the Fragment header", name)
			assert.Equal(t, bth.RCWriteOnly, r.Packet.BTH.Opcode)
		}
	}
	// A fragment of another protocol is not held.
	other := fragments6(whole, 1, 104)[0]
	other[14+40] = 6 // TCP
	k, _ := decodeAt(t, NewDecoder(), other, t0)
	assert.Equal(t, KindOther, k)
}
