package analyze_test

import (
	"bytes"
	"io"
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
