package main

import (
	"fmt"
	"strings"
	"testing"
)

// The program writes 10000 bytes with immediate across the PSN wrap and
// prints the target's completion, whether its buffer matches and how many
// packets the writer sent: ten at path MTU 1024, or more if loopback lost
// or delayed one and the writer sent it again.
func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("the program printed %d lines, want 2:\n%s", len(lines), out.String())
	}
	if want := "target: RECV_RDMA_WITH_IMM SUCCESS, 10000 bytes, immediate 0xcafe"; lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	var packets int
	if _, err := fmt.Sscanf(lines[1], "target buffer matches: true; writer sent %d packets", &packets); err != nil || packets < 10 {
		t.Errorf("second line %q, want \"target buffer matches: true; writer sent N packets\" with N at least 10", lines[1])
	}
}
