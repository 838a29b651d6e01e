package pcap

import (
	"io/fs"
	"os"
	"time"
)

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o644) }

func errNotExist() error { return fs.ErrNotExist }

var testTime = time.Unix(1700000000, 0)
