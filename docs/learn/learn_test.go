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
//     Its exit status must be 0. A command the test gives up on (past
//     commandTimeout, or left running when a chapter fails) is killed with
//     every process it started, so that none keeps a later chapter's ports.
//   - A command ending in " &" starts in the background and prints nothing
//     in the block (redirect its output to a file); "$ wait" waits for every
//     background command of the chapter and fails if one did not exit with 0.
//   - In expected output, runs of blanks compare as one blank and leading
//     and trailing blanks are ignored; {{n}} stands for a number (123, -4.5, 1,234,
//     0x1f); {{*}} for any text within a line; a line "..." for any number of
//     lines, none included. {{P}} (a name in capitals) is a number that
//     binds P where it first matches in the chapter and must be the same
//     number wherever P appears again, in decimal or 0x hexadecimal;
//     {{P+2}} and {{P-1}} are P plus or minus a constant, modulo 2^24 (the
//     PSN space), so that a text can say "the NAK carries P+1".
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
	"sort"
	"strconv"
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
		fence := strings.TrimLeft(l, " ")
		if !strings.HasPrefix(fence, "```") {
			continue
		}
		// A block inside a list item is indented: so is its content.
		indent := len(l) - len(fence)
		info := strings.Fields(strings.TrimPrefix(fence, "```"))
		// Find the closing fence.
		end := -1
		for j := i + 1; j < len(lines); j++ {
			if strings.TrimSpace(lines[j]) == "```" {
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
			l := dedent(strings.TrimRight(lines[j], " \t\r"), indent)
			if strings.HasPrefix(l, "$ ") {
				c := command{line: j + 1, text: strings.TrimPrefix(l, "$ ")}
				for strings.HasSuffix(c.text, `\`) && j+1 < end {
					j++
					c.text = strings.TrimSuffix(c.text, `\`) + "\n" + dedent(strings.TrimRight(lines[j], " \t\r"), indent)
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

// dedent removes up to n leading spaces.
func dedent(l string, n int) string {
	for i := 0; i < n && strings.HasPrefix(l, " "); i++ {
		l = l[1:]
	}
	return l
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

// psnSpace is the modulus of {{NAME+k}} arithmetic: the 24-bit PSN space,
// so that a PSN near 2^24 wraps as the protocol's do.
const psnSpace = 1 << 24

// placeholder matches {{n}}, {{*}}, {{NAME}}, {{NAME+k}} and {{NAME-k}}.
var placeholder = regexp.MustCompile(`\{\{(n|\*|[A-Z][A-Z0-9]*(?:[+-][0-9]+)?)\}\}`)

var varRef = regexp.MustCompile(`^([A-Z][A-Z0-9]*)(?:([+-])([0-9]+))?$`)

// varUse is one {{NAME+k}} in a line: the capture group it is, the name
// and the offset.
type varUse struct {
	name   string
	offset int64
}

// pattern is one expected line: an anchored regular expression, and the
// variables its capture groups stand for, in order.
type pattern struct {
	re   *regexp.Regexp
	vars []varUse
}

// linePattern turns one expected line into a pattern.
func linePattern(l string) pattern {
	var sb strings.Builder
	var vars []varUse
	sb.WriteString("^")
	last := 0
	for _, m := range placeholder.FindAllStringSubmatchIndex(l, -1) {
		sb.WriteString(regexp.QuoteMeta(l[last:m[0]]))
		switch tok := l[m[2]:m[3]]; tok {
		case "n":
			sb.WriteString(numberRE)
		case "*":
			sb.WriteString(".*?")
		default:
			v := varRef.FindStringSubmatch(tok)
			off, _ := strconv.ParseInt(v[3], 10, 64)
			if v[2] == "-" {
				off = -off
			}
			vars = append(vars, varUse{name: v[1], offset: off})
			sb.WriteString("(" + numberRE + ")")
		}
		last = m[1]
	}
	sb.WriteString(regexp.QuoteMeta(l[last:]) + "$")
	return pattern{re: regexp.MustCompile(sb.String()), vars: vars}
}

// parseNumber reads a number as the placeholders match it: decimal (commas
// allowed) or 0x hexadecimal.
func parseNumber(s string) (int64, bool) {
	if h, ok := strings.CutPrefix(s, "0x"); ok {
		v, err := strconv.ParseInt(h, 16, 64)
		return v, err == nil
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	return v, err == nil
}

func mod(v int64) int64 { return ((v % psnSpace) + psnSpace) % psnSpace }

// matchLine matches one output line against p, given the variables bound
// so far; it returns the bindings with the ones this line made.
func (p pattern) matchLine(line string, vars map[string]int64) (map[string]int64, bool) {
	m := p.re.FindStringSubmatch(line)
	if m == nil {
		return nil, false
	}
	if len(p.vars) == 0 {
		return vars, true
	}
	out := make(map[string]int64, len(vars)+len(p.vars))
	for k, v := range vars {
		out[k] = v
	}
	for i, u := range p.vars {
		v, ok := parseNumber(m[i+1])
		if !ok {
			return nil, false
		}
		if b, bound := out[u.name]; bound {
			if mod(b+u.offset) != mod(v) {
				return nil, false
			}
			continue
		}
		out[u.name] = mod(v - u.offset)
	}
	return out, true
}

func fingerprint(vars map[string]int64) string {
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%d;", k, vars[k])
	}
	return sb.String()
}

// match reports whether got matches the expected lines (placeholders as in
// the package comment), with vars the variables bound by earlier commands
// of the chapter; it returns the bindings after this output. When it does
// not match, it returns the index of the furthest expected line reached.
func match(want, got []string, vars map[string]int64) (map[string]int64, bool, int) {
	want, got = normalize(want), normalize(got)
	pats := make([]*pattern, len(want))
	for i, w := range want {
		if w != "..." {
			p := linePattern(w)
			pats[i] = &p
		}
	}
	tried := make(map[string]bool)
	furthest := 0
	var rec func(i, j int, vars map[string]int64) (map[string]int64, bool)
	rec = func(i, j int, vars map[string]int64) (map[string]int64, bool) {
		if i > furthest {
			furthest = i
		}
		if i == len(want) {
			return vars, j == len(got)
		}
		k := fmt.Sprintf("%d/%d/%s", i, j, fingerprint(vars))
		if tried[k] {
			return nil, false
		}
		tried[k] = true
		if pats[i] == nil { // "...": any run of lines
			for jj := j; jj <= len(got); jj++ {
				if v, ok := rec(i+1, jj, vars); ok {
					return v, true
				}
			}
			return nil, false
		}
		if j >= len(got) {
			return nil, false
		}
		v, ok := pats[i].matchLine(got[j], vars)
		if !ok {
			return nil, false
		}
		return rec(i+1, j+1, v)
	}
	if v, ok := rec(0, 0, vars); ok {
		return v, true, -1
	}
	return vars, false, furthest
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
	vars map[string]int64 // {{NAME}} bindings, for the whole chapter
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
	ownGroup(cmd)
	return cmd
}

func (r *runner) run(c command) {
	t := r.t
	t.Helper()
	if strings.TrimSpace(c.text) == "wait" {
		r.wait(true)
		if _, ok, _ := match(c.want, nil, r.vars); !ok {
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
	vars, ok, at := match(c.want, got, r.vars)
	r.vars = vars
	if !ok {
		t.Errorf("%s:%d: $ %s\nthe output does not match the text from its line %d (%q; variables bound before: %s).\nthe text:\n%s\nthe output:\n%s",
			r.file, c.line, c.text, c.line+1+at, lineAt(c.want, at), fingerprint(vars), strings.Join(c.want, "\n"), out.String())
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

func TestMatchVariables(t *testing.T) {
	for _, tc := range []struct {
		want, got string
		ok        bool
	}{
		{"psn={{P}}\npsn={{P+1}}", "psn=100\npsn=101", true},
		{"psn={{P}}\npsn={{P+1}}", "psn=100\npsn=102", false},
		{"psn={{P}} hex {{P}}", "psn=255 hex 0xff", true},
		{"psn={{P}} hex {{P}}", "psn=255 hex 0xfe", false},
		{"psn={{P+1}}", "psn=0", true},                           // binds P = 2^24-1
		{"a={{P}}\nb={{P+1}}", "a=16777215\nb=0", true},          // across the wrap
		{"a={{P}}\nb={{Q}}\nc={{P-2}}", "a=10\nb=10\nc=8", true}, // Q may equal P
		{"...\nx={{P}}\ny={{P+1}}", "x=1\nx=5\ny=6", true},       // "..." backtracks over a binding
	} {
		_, ok, _ := match(strings.Split(tc.want, "\n"), strings.Split(tc.got, "\n"), nil)
		assert.Equal(t, tc.ok, ok, "want %q got %q", tc.want, tc.got)
	}
	// Bindings carry from one command to the next.
	vars, ok, _ := match([]string{"first {{P}}"}, []string{"first 7"}, nil)
	require.True(t, ok)
	_, ok, _ = match([]string{"later {{P+3}}"}, []string{"later 10"}, vars)
	assert.True(t, ok)
	_, ok, _ = match([]string{"later {{P+3}}"}, []string{"later 11"}, vars)
	assert.False(t, ok)
}

func TestParseBlocks(t *testing.T) {
	md := "text\n```console\n$ echo a \\\n  b\na b\n$ true\n```\n```sh\n$ not run\n```\n```console long tshark\n\n$ x &\n```\n" +
		"- item\n\n  ```console\n  $ echo in a list\n  in a list\n  ```\n"
	blocks, err := parseBlocks(md)
	require.NoError(t, err)
	require.Len(t, blocks, 3)
	require.Len(t, blocks[2].cmds, 1)
	assert.Equal(t, "echo in a list", blocks[2].cmds[0].text)
	assert.Equal(t, []string{"in a list"}, blocks[2].cmds[0].want)
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
		_, ok, _ := match(strings.Split(tc.want, "\n"), strings.Split(tc.got, "\n"), nil)
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
