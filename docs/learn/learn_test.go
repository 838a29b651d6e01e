// Package learn_test runs every command block of the tutorial in
// docs/learn and compares what each command prints with the text, so that a
// change to roce-emu that breaks a chapter fails CI.
//
// The format of a runnable block (see README.md in this folder):
//
//   - A fenced block whose info string starts with "console" runs. Other
//     words after it: "long" (skipped under -short), "tshark" (needs tshark:
//     skipped with a message when it is missing, a failure under CI=true).
//     Blocks of any other language (sh, text) are not run.
//   - A line starting with "$ " is a command, run by sh in the chapter's
//     working directory with the freshly built roce-emu first on PATH; a
//     line ending in a backslash continues on the next one. The lines up to
//     the next command are what it prints (stdout and stderr together).
//     Its exit status must be 0.
//   - A command ending in " &" starts in the background and prints nothing
//     in the block (redirect its output to a file); "$ wait" waits for every
//     background command of the chapter and fails if one did not exit with 0.
//   - In expected output, runs of blanks compare as one blank and leading
//     and trailing blanks are ignored; {{n}} stands for a number (123, -4.5, 1,234,
//     0x1f); {{*}} for any text within a line; a line "..." for any number of
//     lines, none included.
//   - Every image a chapter shows from fig/ must be written by one of its
//     commands (the same base name in the working directory); go test
//     ./docs/learn -update copies the images the commands wrote into fig/.
//
// Each chapter runs in its own temporary directory, in which testdata is the
// repository's testdata, as when a reader runs the commands from the root of
// a clone.
package learn_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "copy the figures the chapters' commands write into docs/learn/fig")

// commandTimeout bounds one command (and a background command, counted
// from its start to the "wait" that collects it).
const commandTimeout = 90 * time.Second

// block is one runnable fenced block of a chapter.
type block struct {
	line   int // line of the opening fence, 1-based
	long   bool
	tshark bool
	cmds   []command
}

// command is one "$ " line of a block and the output the text shows for it.
type command struct {
	line int // 1-based
	text string
	want []string
}

// parseBlocks returns the runnable blocks of a Markdown text.
func parseBlocks(md string) ([]block, error) {
	lines := strings.Split(md, "\n")
	var blocks []block
	for i := 0; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], " \t\r")
		if !strings.HasPrefix(l, "```") {
			continue
		}
		info := strings.Fields(strings.TrimPrefix(l, "```"))
		// Find the closing fence.
		end := -1
		for j := i + 1; j < len(lines); j++ {
			if strings.TrimRight(lines[j], " \t\r") == "```" {
				end = j
				break
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("line %d: fenced block not closed", i+1)
		}
		if len(info) == 0 || info[0] != "console" {
			i = end
			continue
		}
		b := block{line: i + 1}
		for _, w := range info[1:] {
			switch w {
			case "long":
				b.long = true
			case "tshark":
				b.tshark = true
			default:
				return nil, fmt.Errorf("line %d: unknown word %q after console (long, tshark)", i+1, w)
			}
		}
		for j := i + 1; j < end; j++ {
			l := strings.TrimRight(lines[j], " \t\r")
			if strings.HasPrefix(l, "$ ") {
				c := command{line: j + 1, text: strings.TrimPrefix(l, "$ ")}
				for strings.HasSuffix(c.text, `\`) && j+1 < end {
					j++
					c.text = strings.TrimSuffix(c.text, `\`) + "\n" + strings.TrimRight(lines[j], " \t\r")
				}
				b.cmds = append(b.cmds, c)
				continue
			}
			if len(b.cmds) == 0 {
				if l != "" {
					return nil, fmt.Errorf("line %d: output before the block's first command", j+1)
				}
				continue
			}
			last := &b.cmds[len(b.cmds)-1]
			last.want = append(last.want, l)
		}
		if len(b.cmds) == 0 {
			return nil, fmt.Errorf("line %d: console block without a command", i+1)
		}
		blocks = append(blocks, b)
		i = end
	}
	return blocks, nil
}

var blanks = regexp.MustCompile(`[ \t]+`)

// normalize collapses runs of blanks and drops leading and trailing blanks
// and trailing empty lines.
func normalize(lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, strings.TrimSpace(blanks.ReplaceAllString(l, " ")))
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

const numberRE = `(?:0x[0-9a-fA-F]+|-?[0-9][0-9,]*(?:\.[0-9]+)?)`

// linePattern turns one expected line into an anchored regular expression.
func linePattern(l string) *regexp.Regexp {
	var sb strings.Builder
	sb.WriteString("^")
	for l != "" {
		n := strings.Index(l, "{{n}}")
		a := strings.Index(l, "{{*}}")
		switch {
		case n < 0 && a < 0:
			sb.WriteString(regexp.QuoteMeta(l))
			l = ""
		case a < 0 || (n >= 0 && n < a):
			sb.WriteString(regexp.QuoteMeta(l[:n]) + numberRE)
			l = l[n+len("{{n}}"):]
		default:
			sb.WriteString(regexp.QuoteMeta(l[:a]) + ".*?")
			l = l[a+len("{{*}}"):]
		}
	}
	sb.WriteString("$")
	return regexp.MustCompile(sb.String())
}

// match reports whether got matches the expected lines (placeholders as in
// the package comment); when it does not, it returns the index of the
// first expected line that could not be matched at the furthest point
// reached.
func match(want, got []string) (bool, int) {
	want, got = normalize(want), normalize(got)
	pats := make([]*regexp.Regexp, len(want))
	for i, w := range want {
		if w != "..." {
			pats[i] = linePattern(w)
		}
	}
	// memo[i][j]: whether want[i:] matches got[j:] has been tried.
	tried := make(map[[2]int]bool)
	furthest := 0
	var rec func(i, j int) bool
	rec = func(i, j int) bool {
		if i > furthest {
			furthest = i
		}
		if i == len(want) {
			return j == len(got)
		}
		k := [2]int{i, j}
		if tried[k] {
			return false
		}
		tried[k] = true
		if pats[i] == nil { // "...": any run of lines
			for jj := j; jj <= len(got); jj++ {
				if rec(i+1, jj) {
					return true
				}
			}
			return false
		}
		return j < len(got) && pats[i].MatchString(got[j]) && rec(i+1, j+1)
	}
	if rec(0, 0) {
		return true, -1
	}
	return false, furthest
}

var figRef = regexp.MustCompile(`!\[[^\]]*\]\(fig/([^)\s]+)\)`)

func TestChapters(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the tutorial's commands use loopback addresses other than 127.0.0.1 and sh: Linux only")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	chapters, err := filepath.Glob("*.md")
	require.NoError(t, err)
	require.NotEmpty(t, chapters)

	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "roce-emu"), "./cmd/roce-emu")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	_, tsharkErr := exec.LookPath("tshark")

	for _, ch := range chapters {
		t.Run(strings.TrimSuffix(ch, ".md"), func(t *testing.T) {
			md, err := os.ReadFile(ch)
			require.NoError(t, err)
			blocks, err := parseBlocks(string(md))
			require.NoError(t, err, ch)
			work := t.TempDir()
			require.NoError(t, os.Symlink(filepath.Join(root, "testdata"), filepath.Join(work, "testdata")))
			env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC")
			r := &runner{t: t, dir: work, env: env, file: ch}
			defer r.killAll()
			ran := false
			for _, b := range blocks {
				if b.long && testing.Short() {
					t.Logf("%s:%d: long block skipped under -short", ch, b.line)
					continue
				}
				if b.tshark && tsharkErr != nil {
					if os.Getenv("CI") == "true" {
						t.Fatalf("%s:%d: tshark is not installed (apt-get install tshark)", ch, b.line)
					}
					t.Logf("%s:%d: skipped: tshark is not installed (apt-get install tshark)", ch, b.line)
					continue
				}
				ran = true
				for _, c := range b.cmds {
					r.run(c)
				}
			}
			r.wait(len(blocks) > 0)
			if t.Failed() || testing.Short() || !ran {
				return
			}
			for _, m := range figRef.FindAllStringSubmatch(string(md), -1) {
				name := m[1]
				gen := filepath.Join(work, filepath.Base(name))
				f, err := os.Open(gen)
				if !assert.NoError(t, err, "%s shows fig/%s, which none of its commands wrote", ch, name) {
					continue
				}
				if strings.HasSuffix(name, ".png") {
					_, err = png.Decode(f)
					assert.NoError(t, err, "%s: the command wrote a broken fig/%s", ch, name)
				}
				f.Close()
				if *update {
					b, err := os.ReadFile(gen)
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(filepath.Join("fig", name), b, 0o644))
				} else {
					_, err := os.Stat(filepath.Join("fig", name))
					assert.NoError(t, err, "%s shows fig/%s, which is not in the repository (go test ./docs/learn -update)", ch, name)
				}
			}
		})
	}
}

// runner runs one chapter's commands.
type runner struct {
	t    *testing.T
	dir  string
	env  []string
	file string
	bg   []*background
}

type background struct {
	c      command
	cmd    *exec.Cmd
	out    bytes.Buffer
	done   chan error
	cancel context.CancelFunc
}

func (r *runner) shell(ctx context.Context, text string, out *bytes.Buffer) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "sh", "-c", text)
	cmd.Dir = r.dir
	cmd.Env = r.env
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func (r *runner) run(c command) {
	t := r.t
	t.Helper()
	if strings.TrimSpace(c.text) == "wait" {
		r.wait(true)
		if ok, _ := match(c.want, nil); !ok {
			t.Errorf("%s:%d: wait prints nothing here, the text shows %q", r.file, c.line, c.want)
		}
		return
	}
	if text, ok := strings.CutSuffix(strings.TrimSpace(c.text), " &"); ok {
		if len(normalize(c.want)) != 0 {
			t.Errorf("%s:%d: a background command shows no output (redirect it to a file)", r.file, c.line)
		}
		ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
		b := &background{c: c, done: make(chan error, 1), cancel: cancel}
		b.cmd = r.shell(ctx, text, &b.out)
		if err := b.cmd.Start(); err != nil {
			cancel()
			t.Fatalf("%s:%d: %v", r.file, c.line, err)
		}
		go func() { b.done <- b.cmd.Wait() }()
		r.bg = append(r.bg, b)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	var out bytes.Buffer
	err := r.shell(ctx, c.text, &out).Run()
	got := strings.Split(out.String(), "\n")
	if err != nil {
		t.Errorf("%s:%d: $ %s\n%v; it printed:\n%s", r.file, c.line, c.text, err, out.String())
		return
	}
	if ok, at := match(c.want, got); !ok {
		t.Errorf("%s:%d: $ %s\nthe output does not match the text from its line %d (%q).\nthe text:\n%s\nthe output:\n%s",
			r.file, c.line, c.text, c.line+1+at, lineAt(c.want, at), strings.Join(c.want, "\n"), out.String())
	}
}

func lineAt(l []string, i int) string {
	if i >= 0 && i < len(l) {
		return l[i]
	}
	return "(end)"
}

// wait collects every background command; check says whether their exit
// status counts.
func (r *runner) wait(check bool) {
	for _, b := range r.bg {
		err := <-b.done
		b.cancel()
		if check && err != nil {
			r.t.Errorf("%s:%d: background $ %s: %v; it printed:\n%s", r.file, b.c.line, b.c.text, err, b.out.String())
		}
	}
	r.bg = nil
}

func (r *runner) killAll() {
	for _, b := range r.bg {
		b.cancel()
		<-b.done
	}
	r.bg = nil
}

func TestParseBlocks(t *testing.T) {
	md := "text\n```console\n$ echo a \\\n  b\na b\n$ true\n```\n```sh\n$ not run\n```\n```console long tshark\n\n$ x &\n```\n"
	blocks, err := parseBlocks(md)
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	assert.Equal(t, 2, blocks[0].line)
	require.Len(t, blocks[0].cmds, 2)
	assert.Equal(t, "echo a \n  b", blocks[0].cmds[0].text)
	assert.Equal(t, []string{"a b"}, blocks[0].cmds[0].want)
	assert.Equal(t, 6, blocks[0].cmds[1].line)
	assert.True(t, blocks[1].long)
	assert.True(t, blocks[1].tshark)
	assert.Equal(t, "x &", blocks[1].cmds[0].text)

	for _, bad := range []string{"```console\nno command\n```\n", "```console\n$ x\n", "```console fast\n$ x\n```\n", "```console\n```\n"} {
		_, err := parseBlocks(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		want, got string
		ok        bool
	}{
		{"a  b", "  a b  ", true},
		{"a b", "a c", false},
		{"x={{n}} y", "x=1,234.5 y", true},
		{"x={{n}} y", "x=0x1f y", true},
		{"x={{n}} y", "x=-3 y", true},
		{"x={{n}} y", "x=abc y", false},
		{"x={{n}}", "x=1 2", false},
		{"a {{*}} z", "a anything at all z", true},
		{"a {{*}} z", "a anything", false},
		{"first\n...\nlast", "first\nlast", true},
		{"first\n...\nlast", "first\n1\n2\nlast", true},
		{"first\n...\nlast", "first\n1\n2\nlast\nmore", false},
		{"first\n...\nlast\n...", "first\n1\nlast\nmore", true},
		{"one", "one\ntwo", false},
		{"one\ntwo", "one", false},
		{"one\n\n", "one\n", true},
		{"a.b", "axb", false},
		{"(x)", "(x)", true},
	} {
		ok, _ := match(strings.Split(tc.want, "\n"), strings.Split(tc.got, "\n"))
		assert.Equal(t, tc.ok, ok, "want %q got %q", tc.want, tc.got)
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Every relative link of the tutorial (to another chapter, a figure, or a
// document elsewhere in the repository) names a file that exists.
func TestLinks(t *testing.T) {
	chapters, err := filepath.Glob("*.md")
	require.NoError(t, err)
	for _, ch := range chapters {
		md, err := os.ReadFile(ch)
		require.NoError(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(string(md), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			_, err := os.Stat(filepath.FromSlash(target))
			assert.NoError(t, err, "%s links to %s", ch, m[1])
		}
	}
}
