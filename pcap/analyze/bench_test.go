package analyze_test

import (
	"bytes"
	"io"
	"runtime"
	"testing"

	"github.com/roce-emu/roce-emu/internal/gencap"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/pcap/analyze"
)

// BenchmarkAnalyzeCapture reads, decodes and analyzes a generated capture
// (4 RC connections, 64 KiB WRITEs at MTU 1024, 1% CE with CNPs, a
// go-back-N every 50 messages) held in memory.
func BenchmarkAnalyzeCapture(b *testing.B) {
	var buf bytes.Buffer
	if _, err := gencap.Generate(&buf, gencap.Config{Messages: 50}); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := pcap.NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		d := pcap.NewDecoder()
		a := analyze.New(analyze.Config{})
		var rec pcap.Record
		for n := 1; ; n++ {
			frame, ci, lt, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			k, err := d.Decode(frame, ci, lt, &rec)
			if err != nil {
				b.Fatal(err)
			}
			a.Add(n, k, &rec)
		}
		a.Report()
	}
}

// decodedCapture returns the records of the generated capture of
// BenchmarkAnalyzeCapture, each decoded from its own copy of the frame.
func decodedCapture(b *testing.B) ([]pcap.Record, []pcap.Kind, int64) {
	var buf bytes.Buffer
	if _, err := gencap.Generate(&buf, gencap.Config{Messages: 50}); err != nil {
		b.Fatal(err)
	}
	size := int64(buf.Len())
	r, err := pcap.NewReader(&buf)
	if err != nil {
		b.Fatal(err)
	}
	d := pcap.NewDecoder()
	var recs []pcap.Record
	var kinds []pcap.Kind
	for {
		frame, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		var rec pcap.Record
		k, err := d.Decode(bytes.Clone(frame), ci, lt, &rec)
		if err != nil {
			b.Fatal(err)
		}
		recs, kinds = append(recs, rec), append(kinds, k)
	}
	return recs, kinds, size
}

// BenchmarkAnalyzerAdd is the analyzer alone: Analyzer.Add over the
// decoded frames of the generated capture, then Report; ns/packet and
// allocs/packet are per frame.
func BenchmarkAnalyzerAdd(b *testing.B) {
	recs, kinds, size := decodedCapture(b)
	b.SetBytes(size)
	b.ReportAllocs()
	var allocs uint64
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	start := ms.Mallocs
	for b.Loop() {
		a := analyze.New(analyze.Config{})
		for i := range recs {
			a.Add(i+1, kinds[i], &recs[i])
		}
		a.Report()
	}
	runtime.ReadMemStats(&ms)
	allocs = ms.Mallocs - start
	n := float64(b.N) * float64(len(recs))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/packet")
	b.ReportMetric(float64(allocs)/n, "allocs/packet")
}
