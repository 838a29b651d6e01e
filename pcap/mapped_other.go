//go:build !linux

package pcap

import (
	"bufio"
	"io"
	"os"
)

// openSource returns f as the reader Open gives NewReader: f behind a MiB
// buffer (fewer system calls). Linux maps the file instead (mapped_linux.go).
func openSource(f *os.File) (src io.Reader, close func() error) {
	return bufio.NewReaderSize(f, 1<<20), func() error { return nil }
}
