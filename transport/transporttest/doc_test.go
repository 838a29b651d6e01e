package transporttest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
)

// TestWriteUnderSynctest is the example in the package comment, verbatim
// (TestPackageDocShowsTest checks that).
func TestWriteUnderSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{
			Impairments: transport.Impairments{Delay: 5 * time.Microsecond, Loss: 0.05},
		})
		src := p.A.Reg([]byte("written by A"))
		dst := p.B.Reg(make([]byte, 12))
		p.A.PostWrite(1, src, dst)
		p.A.WaitOK(1)
		p.B.Endpoint.Sync() // B's writes to dst happen before what follows
		if string(dst.Buf) != "written by A" {
			t.Errorf("B's buffer holds %q", dst.Buf)
		}
	})
}

// The package comment shows TestWriteUnderSynctest as it is.
func TestPackageDocShowsTest(t *testing.T) {
	fset := token.NewFileSet()
	doc, err := parser.ParseFile(fset, "transporttest.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("doc_test.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(fset, "doc_test.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var code string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "TestWriteUnderSynctest" {
			code = string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
		}
	}
	var shown []string
	for _, line := range strings.Split(doc.Doc.Text(), "\n") {
		if strings.HasPrefix(line, "\t") {
			shown = append(shown, strings.TrimPrefix(line, "\t"))
		}
	}
	if code == "" || strings.Join(shown, "\n") != code {
		t.Errorf("the package comment shows\n%s\n\nbut TestWriteUnderSynctest is\n%s", strings.Join(shown, "\n"), code)
	}
}
