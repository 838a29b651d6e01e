package pcap

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
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
			if lt == LinkTypeEthernet {
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
		f.Add(sll2(s, 0x0800)) // Ethernet frames of IPv4 as SLL2, and garbled SLL2
	}
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, frame []byte) {
		var r Record
		for _, lt := range []LinkType{LinkTypeEthernet, LinkTypeRaw, LinkTypeLinuxSLL2, LinkTypeLinuxSLL, LinkTypeNull} {
			// As captured whole, and as cut by a snapshot length.
			for _, wire := range []int{len(frame), len(frame) + 1000} {
				k, err := d.Decode(frame, gopacket.CaptureInfo{CaptureLength: len(frame), Length: wire}, lt, &r)
				require.NoError(t, err)
				cut := wire > len(frame)
				switch k {
				case KindRoCE:
					require.Equal(t, uint16(bth.UDPPort), r.DstPort)
					require.GreaterOrEqual(t, r.PayloadLen, len(r.Packet.Payload))
					if r.ICRCChecked {
						require.NoError(t, r.Packet.Decode(r.UDPPayload))
						require.Equal(t, len(r.Packet.Payload), r.PayloadLen)
					} else if !cut {
						// Unchecked only for what the capture cut short,
						// and IPv6 with extension headers.
						require.True(t, r.Src.Is6(), "complete IPv4 frame with an unchecked ICRC")
					}
				case KindMalformed:
					require.Error(t, r.Err)
					require.Equal(t, uint16(bth.UDPPort), r.DstPort)
					require.Equal(t, len(r.UDPPayload), r.PayloadLen)
				}
				s := NewSummary()
				s.Add(k, &r)
			}
		}
		pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
		_ = pk.Layers()
	})
}

// readerSeeds returns captures made with the byte builders: every pcapng
// block type, options, sections of both byte orders, and a classic pcap.
func readerSeeds(tb testing.TB) [][]byte {
	f := frameOf(tb, 1, 8)
	g := frameOf(tb, 2, 70)
	ng := newNg(le).shb(newNg(le).opt(4, []byte("roce-emu")))
	ng.idb(1, 65535, ng.tsresol(9), ng.opt(2, []byte("eth0"))).idb(276, 0)
	ng.epb(0, 1, f).epb(1, 2, sll2(g, 0x0800)).spb(uint32(len(f)), f).pb(0, uint32(len(g)), uint32(len(g)), g)
	ng.isb(0, ng.opt(2, make([]byte, 8))).block(0x0BAD, []byte("unknown block"))
	b := newNg(be).shb().idb(113, 262144).epb(0, 7, f)
	ng.raw(b.b...)
	return [][]byte{ng.b, newPcap(be, 1, 65535).frame(1, f).record(2, 30, 10, g[:30]).b}
}

func FuzzReader(f *testing.F) {
	// The start of the shipped captures only: the fuzzer minimizes every
	// input that finds new coverage before it reports it, and minimizing
	// tens of KiB takes most of a short run.
	for _, name := range []string{"roce-emu-every-opcode.pcap", "rxe-rc-pingpong-send-unacked-retransmit.pcapng"} {
		if b, err := os.ReadFile(filepath.Join("..", "testdata", name)); err == nil {
			f.Add(b[:min(len(b), 2048)])
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
	for _, s := range readerSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			checkReaderError(t, err)
			return
		}
		d := NewDecoder()
		var rec Record
		for i := 0; i < 10000; i++ {
			data, ci, lt, err := r.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				checkReaderError(t, err)
				return
			}
			require.LessOrEqual(t, len(data), maxSnaplen)
			require.LessOrEqual(t, len(data), ci.Length, "captured length over the original length")
			_, err = d.Decode(data, ci, lt, &rec)
			if errors.Is(err, ErrLinkType) {
				// A pcapng interface of another link type: Next returns
				// its frames and Decode refuses them, as documented;
				// callers skip and count them.
				require.False(t, SupportedLinkType(lt), "ErrLinkType for supported link type %v", lt)
				continue
			}
			require.NoError(t, err)
		}
	})
}

// checkReaderError fails on errors the validators should have kept from
// happening: gopacket's own errors and panics.
func checkReaderError(t *testing.T, err error) {
	t.Helper()
	ok := errors.Is(err, ErrNotCapture) || errors.Is(err, ErrTruncatedCapture) || errors.Is(err, ErrLinkType)
	var fe *formatError
	ok = ok || errors.As(err, &fe)
	if !ok || strings.Contains(err.Error(), "gopacket") || strings.Contains(err.Error(), "bufio") {
		t.Fatalf("reader error the validators did not catch: %v", err)
	}
}

func TestDecoderAllocs(t *testing.T) {
	d := NewDecoder()
	var r Record
	for _, op := range bth.Opcodes() {
		frame, err := encap4().AppendFrame(nil, samplePacket(op, 100))
		require.NoError(t, err)
		ci := gopacket.CaptureInfo{CaptureLength: len(frame), Length: len(frame)}
		k, err := d.Decode(frame, ci, LinkTypeEthernet, &r)
		require.NoError(t, err)
		require.Equal(t, KindRoCE, k)
		require.True(t, r.ICRCOK)
		assert.Zero(t, testing.AllocsPerRun(50, func() { d.Decode(frame, ci, LinkTypeEthernet, &r) }), "%s", op)
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
				d.Decode(frame, ci, LinkTypeEthernet, &r)
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
