//go:build unix

package main

import "syscall"

// mapBuffer maps n zeroed bytes outside Go's heap (anonymous, private).
func mapBuffer(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
}

// unmapBuffer undoes mapBuffer.
func unmapBuffer(b []byte) error { return syscall.Munmap(b) }
