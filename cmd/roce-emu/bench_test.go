package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/roce-emu/roce-emu/internal/gencap"
)

// benchCapture writes the generated capture (internal/gencap) of
// messages WRITEs per connection to a file.
func benchCapture(b *testing.B, messages int) (string, int64) {
	path := filepath.Join(b.TempDir(), "bench.pcap")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := gencap.Generate(f, gencap.Config{Messages: messages}); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(path)
	return path, fi.Size()
}

// BenchmarkDecodeJSON and BenchmarkAnalyze run the commands on a generated
// capture (4 RC connections, 64 KiB WRITEs at MTU 1024, 1% CE with CNPs,
// a go-back-N every 50 messages); scripts/bench-analyze.sh compares them
// with tshark.
func BenchmarkDecodeJSON(b *testing.B) {
	path, size := benchCapture(b, 50)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if code := run([]string{"decode", "--json", path}, io.Discard, io.Discard); code != 0 {
			b.Fatal("exit", code)
		}
	}
}

func BenchmarkAnalyze(b *testing.B) {
	path, size := benchCapture(b, 50)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if code := run([]string{"analyze", "--json", path}, io.Discard, io.Discard); code != 0 {
			b.Fatal("exit", code)
		}
	}
}
