// Command gencap writes the synthetic capture of internal/gencap, for
// scripts/bench-analyze.sh, and prints its truth: frames and go-back-N
// episodes.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"

	"github.com/roce-emu/roce-emu/internal/gencap"
)

func main() {
	out := flag.String("o", "bench.pcap", "capture `file` to write")
	msgs := flag.Int("messages", 1000, "WRITEs per connection")
	conns := flag.Int("conns", 4, "RC connections")
	flag.Parse()
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gencap:", err)
		os.Exit(1)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	tr, err := gencap.Generate(bw, gencap.Config{Conns: *conns, Messages: *msgs})
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gencap:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %d frames, %d go-back-N episodes\n", *out, tr.Frames, len(tr.Episodes))
}
