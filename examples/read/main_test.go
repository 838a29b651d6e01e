package main

import (
	"strings"
	"testing"
)

// The program reads the peer's memory, then makes a READ outside the
// region, which fails with a remote access error and moves the QP to ERR.
func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	want := `reader: RDMA_READ SUCCESS, 44 bytes: "the responder's memory, read without its CPU"
reader, out of bounds: REM_ACCESS_ERR; the QP is now ERR
`
	if out.String() != want {
		t.Errorf("the program printed\n%s\nwant\n%s", out.String(), want)
	}
}
