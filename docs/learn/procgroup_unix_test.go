//go:build unix

package learn_test

import (
	"os/exec"
	"syscall"
)

// ownGroup runs cmd in a process group of its own and makes its
// cancellation kill the whole group: a command the test gives up on
// (timeout, a failed chapter) leaves no roce-emu behind holding the
// chapter's ports for the next one, which sh's children would otherwise
// outlive.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
