//go:build !unix

package main

// mapBuffer returns n zeroed bytes. Without mmap they are on Go's heap,
// where the race detector sees the race ib_write_lat's polling has by
// design (see perftestRun).
func mapBuffer(n int) ([]byte, error) { return make([]byte, n), nil }

// unmapBuffer undoes mapBuffer.
func unmapBuffer([]byte) error { return nil }
