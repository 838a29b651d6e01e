package pcap

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seedFrames returns frames of every opcode from our encoder, plus every
// frame of the shared captures when they are beside the clone (seeds only:
// their absence does not fail the fuzzers).
func seedFrames(tb testing.TB) [][]byte {
	var out [][]byte
	for _, op := range bth.Opcodes() {
		for _, n := range []int{0, 3, 64} {
			f, err := encap4().AppendFrame(nil, samplePacket(op, n))
			require.NoError(tb, err)
			out = append(out, f)
		}
		f, err := encap6().AppendFrame(nil, samplePacket(op, 5))
		require.NoError(tb, err)
		out = append(out, f)
	}
	dir := filepath.Join("..", "..", "shared", "testdata", "pcaps")
	names, _ := filepath.Glob(filepath.Join(dir, "*.pcap*"))
	for _, name := range names {
		r, err := Open(name)
		if err != nil {
			continue
		}
		for {
			data, _, lt, err := r.Next()
			if err != nil {
				break
			}
			if lt == layers.LinkTypeEthernet {
				out = append(out, append([]byte(nil), data...))
			}
		}
		r.Close()
	}
	return out
}

func FuzzDecoder(f *testing.F) {
	for _, s := range seedFrames(f) {
		f.Add(s)
	}
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, frame []byte) {
		var r Record
		for _, lt := range []layers.LinkType{layers.LinkTypeEthernet, layers.LinkTypeRaw} {
			k, err := d.Decode(frame, gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}, lt, &r)
			require.NoError(t, err)
			switch k {
			case KindRoCE:
				require.NoError(t, r.Packet.Decode(r.UDPPayload))
				require.Equal(t, uint16(bth.UDPPort), r.DstPort)
			case KindMalformed:
				require.Error(t, r.Err)
			}
			var s Summary = *NewSummary()
			s.Add(k, &r)
		}
		pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
		_ = pk.Layers()
	})
}

func FuzzReader(f *testing.F) {
	for _, name := range []string{"roce-emu-every-opcode.pcap", "rxe-rc-pingpong-send-unacked-retransmit.pcapng"} {
		if b, err := os.ReadFile(filepath.Join("..", "testdata", name)); err == nil {
			f.Add(b)
			f.Add(b[:len(b)/2])
		}
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	require.NoError(f, err)
	for _, s := range seedFrames(f)[:8] {
		require.NoError(f, w.WriteFrame(testTime, s))
	}
	require.NoError(f, w.Flush())
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		d := NewDecoder()
		var rec Record
		for i := 0; i < 10000; i++ {
			data, ci, lt, err := r.Next()
			if err != nil {
				return
			}
			_, err = d.Decode(data, ci, lt, &rec)
			require.NoError(t, err)
		}
	})
}

func TestDecoderAllocs(t *testing.T) {
	d := NewDecoder()
	var r Record
	for _, op := range bth.Opcodes() {
		frame, err := encap4().AppendFrame(nil, samplePacket(op, 100))
		require.NoError(t, err)
		ci := gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}
		k, err := d.Decode(frame, ci, layers.LinkTypeEthernet, &r)
		require.NoError(t, err)
		require.Equal(t, KindRoCE, k)
		require.True(t, r.ICRCOK)
		assert.Zero(t, testing.AllocsPerRun(50, func() { d.Decode(frame, ci, layers.LinkTypeEthernet, &r) }), "%s", op)
	}
}

func BenchmarkDecoder(b *testing.B) {
	for _, c := range []struct {
		name string
		op   bth.Opcode
		n    int
	}{{"RC_SEND_ONLY_64", bth.RCSendOnly, 64}, {"RC_RDMA_WRITE_FIRST_1024", bth.RCWriteFirst, 1024},
		{"RC_ACKNOWLEDGE", bth.RCAcknowledge, 0}, {"RC_RDMA_READ_RESPONSE_MIDDLE_4096", bth.RCReadResponseMiddle, 4096}} {
		b.Run(c.name, func(b *testing.B) {
			frame, err := encap4().AppendFrame(nil, samplePacket(c.op, c.n))
			require.NoError(b, err)
			ci := gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}
			d := NewDecoder()
			var r Record
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			for b.Loop() {
				d.Decode(frame, ci, layers.LinkTypeEthernet, &r)
			}
		})
	}
}

// BenchmarkReadCapture reads and decodes a whole capture file from memory.
func BenchmarkReadCapture(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "rxe-rc-pingpong-send-unacked-retransmit.pcapng"))
	if err != nil {
		b.Skip("testdata capture missing")
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		r, err := NewReader(bytes.NewReader(raw))
		require.NoError(b, err)
		d := NewDecoder()
		var rec Record
		for {
			data, ci, lt, err := r.Next()
			if err == io.EOF {
				break
			}
			require.NoError(b, err)
			d.Decode(data, ci, lt, &rec)
		}
	}
}
