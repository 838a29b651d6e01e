// Package testenv finds what tests need outside the module: the shared
// testdata that CI places beside the clone, and tools such as tshark.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// prerequisite is a failure, not a reason to skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// ModuleRoot returns the directory holding go.mod, searching upwards from
// the working directory.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// SharedPcaps returns ../shared/testdata/pcaps beside the module root. When
// it is missing the test is skipped with a message, or fails under CI.
func SharedPcaps(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(ModuleRoot(t), "..", "shared", "testdata", "pcaps")
	if _, err := os.Stat(dir); err != nil {
		missing(t, "the shared captures are not beside the clone ("+dir+"); clone the project next to ../shared to run this test")
	}
	return dir
}

// Tool returns the path of an executable on PATH. When it is missing the
// test is skipped, or fails under CI, with the install hint.
func Tool(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" is not installed: "+hint)
	}
	return p
}

func missing(t testing.TB, msg string) {
	t.Helper()
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
