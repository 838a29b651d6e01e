package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeAllNewFlows writes, streaming, a capture of at least size bytes
// in which every packet starts a new flow: RC SEND Only packets of no
// payload, each to a QPN not seen before (the source address changes
// every 2^24 QPNs). It returns the packets written.
func writeAllNewFlows(t *testing.T, path string, size int64) int {
	t.Helper()
	w, err := pcap.Create(path)
	require.NoError(t, err)
	e := bth.Encap{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.1.0.1"), SrcPort: 49152}
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, PSN: 1}}
	frame, err := e.AppendFrame(nil, &p)
	require.NoError(t, err)
	per := int64(16 + len(frame)) // pcap record header and frame
	n := int((size - 24 + per - 1) / per)
	ts := time.Unix(1700000000, 0)
	for i := range n {
		p.BTH.DestQP = uint32(i) & bth.PSNMask
		if p.BTH.DestQP == 0 && i > 0 {
			e.Src = e.Src.Next()
		}
		require.NoError(t, w.WritePacket(ts.Add(time.Duration(i)*time.Microsecond), &e, &p))
	}
	require.NoError(t, w.Close())
	return n
}

// heapPeak samples the heap in use until stop is called and returns the
// highest it saw.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var ms runtime.MemStats
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		return peak.Load()
	}
}

// decode and analyze of a capture in which every packet starts a new
// flow keep their state bounded by --max-flows and --max-connections:
// a 200 MB capture (about 2.8 million flows; before the cap decode held
// about 870 bytes a flow for ever, 2.3 GiB) stays under 256 MiB of heap,
// every flow printed (evicted ones as they go) and the evictions counted
// in the summary. It takes minutes on a loaded 2-core machine, so with -short it runs on a 20 MB
// capture with a tenth of the flow cap under a quarter of the bound (about
// 270,000 flows: uncapped, decode's heap peaked at 311 MiB), and under the
// race detector on a 5 MB one.
func TestDecodeAllNewFlowsBoundedMemory(t *testing.T) {
	size, maxFlows, bound := int64(200e6), 65536, uint64(256<<20)
	switch {
	case raceEnabled:
		size, maxFlows, bound = 5e6, 1638, 64<<20
	case testing.Short():
		size, maxFlows, bound = 20e6, 6554, 64<<20
	}
	path := filepath.Join(t.TempDir(), "all-new-flows.pcap")
	start := time.Now()
	n := writeAllNewFlows(t, path, size)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	t.Logf("wrote %d packets, %d bytes, in %v", n, fi.Size(), time.Since(start))

	// decode: count the flows printed, evicted and in the summary.
	var flows, evicted int
	var summary []string
	counter := &lineWriter{f: func(line []byte) {
		switch {
		case bytes.HasPrefix(line, []byte("evicted flow ")):
			evicted++
		case bytes.HasPrefix(line, []byte("  flow ")):
			flows++
		case bytes.HasPrefix(line, []byte("summary:")), bytes.Contains(line, []byte("evicted, least recently seen")):
			summary = append(summary, string(line))
		}
	}}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	stop := heapPeak()
	start = time.Now()
	var stderr bytes.Buffer
	code := runDecode([]string{"--max-flows", fmt.Sprint(maxFlows), path}, counter, &stderr)
	peak := stop()
	t.Logf("decode: %v; heap in use %d MiB before, %d MiB at the peak; %s", time.Since(start), base>>20, peak>>20, strings.Join(summary, " / "))
	require.Equal(t, 0, code, stderr.String())
	assert.Less(t, peak-min(base, peak), bound, "decode's heap")
	assert.Equal(t, n, flows+evicted, "every flow printed once")
	assert.LessOrEqual(t, flows, maxFlows)
	assert.Greater(t, evicted, 0)
	require.Len(t, summary, 2)
	assert.Contains(t, summary[1], fmt.Sprintf("  %d flows (%d packets) evicted", evicted, evicted))

	// analyze: connections beyond --max-connections (its default, 4096)
	// evicted and counted.
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base = ms.HeapInuse
	stop = heapPeak()
	start = time.Now()
	var out bytes.Buffer
	stderr.Reset()
	code = runAnalyze([]string{path}, &out, &stderr)
	peak = stop()
	first, _, _ := strings.Cut(out.String(), "\n")
	t.Logf("analyze: %v; heap in use %d MiB before, %d MiB at the peak; %s", time.Since(start), base>>20, peak>>20, first)
	require.Equal(t, 0, code, stderr.String())
	assert.Less(t, peak-min(base, peak), bound, "analyze's heap")
	assert.Contains(t, first, "more evicted, not reported")
}

// lineWriter is an io.Writer that hands each whole line written to f
// (without its newline; the slice is valid during the call only).
type lineWriter struct {
	f    func([]byte)
	rest []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.rest = append(w.rest, b...)
	for {
		i := bytes.IndexByte(w.rest, '\n')
		if i < 0 {
			break
		}
		w.f(w.rest[:i])
		w.rest = w.rest[i+1:]
	}
	if len(w.rest) == 0 {
		w.rest = w.rest[:0:0]
	}
	return len(b), nil
}

// With --json, each evicted flow is an object of its own and the summary
// counts them; --max-flows must be positive.
func TestDecodeMaxFlowsJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ten-flows.pcap")
	n := writeAllNewFlows(t, path, 24+10*74)
	require.Equal(t, 10, n)
	var out, stderr bytes.Buffer
	require.Equal(t, 0, runDecode([]string{"--json", "--max-flows", "4", path}, &out, &stderr), stderr.String())
	var evicted []uint32
	var sum struct {
		Summary struct {
			Flows          []json.RawMessage `json:"flows"`
			FlowsEvicted   int               `json:"flows_evicted"`
			EvictedPackets int               `json:"evicted_packets"`
		} `json:"summary"`
	}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var obj struct {
			File        string `json:"file"`
			EvictedFlow *struct {
				DestQP  uint32 `json:"dqpn"`
				Packets int    `json:"packets"`
			} `json:"evicted_flow"`
			Summary json.RawMessage `json:"summary"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &obj), line)
		switch {
		case obj.EvictedFlow != nil:
			assert.Equal(t, path, obj.File)
			assert.Equal(t, 1, obj.EvictedFlow.Packets)
			evicted = append(evicted, obj.EvictedFlow.DestQP)
		case obj.Summary != nil:
			require.NoError(t, json.Unmarshal([]byte(line), &sum))
		}
	}
	assert.Equal(t, []uint32{0, 1, 2, 3, 4, 5}, evicted, "the least recently seen first")
	assert.Len(t, sum.Summary.Flows, 4)
	assert.Equal(t, 6, sum.Summary.FlowsEvicted)
	assert.Equal(t, 6, sum.Summary.EvictedPackets)

	stderr.Reset()
	assert.Equal(t, 2, runDecode([]string{"--max-flows", "0", path}, &out, &stderr))
	assert.Contains(t, stderr.String(), "--max-flows")
}
