package main

import (
	"encoding/json"
	"io"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/pcap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hand-written JSON of decode --json is byte for byte what
// encoding/json writes for the same packet, on every packet of the
// project's captures, the handed cases and malformed frames.
func TestDecodeJSONEncoderMatches(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "testdata", "*.pcap*"))
	require.NoError(t, err)
	cases, err := filepath.Glob(filepath.Join("..", "..", "testdata", "cases", "*"))
	require.NoError(t, err)
	files = append(files, cases...)
	bad := goodFrame(t, 41, 16)
	bad[len(bad)-1] ^= 0xFF
	files = append(files, writeTemp(t, "odd <&> name\u2028é.pcap", captureBytes(t, goodFrame(t, 7, 3), bad, goodFrame(t, 8, 0)[:60])))
	n := 0
	for _, name := range files {
		r, err := pcap.Open(name)
		require.NoError(t, err)
		d := pcap.NewDecoder()
		var rec pcap.Record
		var js jsonScratch
		for i := 1; ; i++ {
			data, ci, lt, err := r.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			k, err := d.Decode(data, ci, lt, &rec)
			if err != nil || k == pcap.KindOther || k == pcap.KindFragment {
				continue
			}
			j := js.record(name, i, float64(i)*1.2345e-7, k, &rec)
			want, err := json.Marshal(j)
			require.NoError(t, err)
			assert.Equal(t, string(want)+"\n", string(appendJSON(nil, j)), "%s frame %d", name, i)
			n++
		}
		r.Close()
	}
	assert.Greater(t, n, 500)
	for _, f := range []float64{0, 1, -2.5, 1e-7, 123456.789, 1e21, 5e-324, math.MaxFloat64} {
		want, _ := json.Marshal(f)
		assert.Equal(t, string(want), string(appendJSONFloat(nil, f)), "%g", f)
	}
	for _, ts := range []time.Time{time.Unix(0, 0).UTC(), time.Date(2024, 5, 1, 12, 0, 0, 123000, time.UTC), time.Date(2024, 5, 1, 12, 0, 0, 1, time.FixedZone("x", 3600))} {
		want, _ := json.Marshal(ts)
		assert.Equal(t, string(want), string(appendJSONTime(nil, ts)))
	}
}

// The 64-bit fields of decode --json (virtual addresses, atomic operands
// and the original value) are decimal strings, exact past 2^53 where jq
// reads numbers as doubles; the DMA length is tshark's dmalen.
func TestDecodeJSON64BitStrings(t *testing.T) {
	big := uint64(1)<<60 + 1
	j := &jsonPacket{File: "f", Frame: 1, RETH: &jsonRETH{VA: big, RKey: 7, DMALength: 4096},
		AtomicETH: &jsonAtomic{VA: big + 1, RKey: 8, SwapAdd: math.MaxUint64, Compare: big + 2}, AtomicAck: &jsonAtomicAk{Orig: big + 3}}
	out := string(appendJSON(nil, j))
	for _, s := range []string{`"reth":{"va":"1152921504606846977","rkey":7,"dmalen":4096}`,
		`"atomiceth":{"va":"1152921504606846978","rkey":8,"swap_add":"18446744073709551615","compare":"1152921504606846979"}`,
		`"atomicacketh":{"orig":"1152921504606846980"}`} {
		assert.Contains(t, out, s)
	}
	want, err := json.Marshal(j)
	require.NoError(t, err)
	assert.Equal(t, string(want)+"\n", out)
}
