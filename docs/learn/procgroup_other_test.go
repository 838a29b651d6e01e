//go:build !unix

package learn_test

import "os/exec"

// ownGroup does nothing here: the chapters run on Linux only.
func ownGroup(*exec.Cmd) {}
