package main

import (
	"strings"
	"testing"
)

// The program sends one message and prints both completions and what
// arrived.
func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	want := `sender: SEND SUCCESS, 17 bytes
receiver: RECV SUCCESS, 17 bytes
received "hello over RoCEv2"
`
	if out.String() != want {
		t.Errorf("the program printed\n%s\nwant\n%s", out.String(), want)
	}
}
