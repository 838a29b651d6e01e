// Package transcript reads recorded TCP exchanges between two peers, the
// test vectors of the out-of-band protocols (oob/testdata and
// ../shared/testdata).
package transcript

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Msg is one recorded message and who sent it.
type Msg struct {
	FromClient bool
	Data       []byte
}

// ReadHex reads a transcript of "C->S LEN HEX" lines, one per message
// ("S->C" from the server), with "C->S EOF" where a side closed (skipped)
// and '#' comments.
func ReadHex(name string) ([]Msg, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var msgs []Msg
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) == 2 && fs[1] == "EOF" {
			continue
		}
		if len(fs) != 3 || (fs[0] != "C->S" && fs[0] != "S->C") {
			return nil, fmt.Errorf("%s: bad line %q", name, line)
		}
		data, err := hex.DecodeString(fs[2])
		if err != nil {
			return nil, fmt.Errorf("%s: line %q: %v", name, line, err)
		}
		if n, err := strconv.Atoi(fs[1]); err != nil || n != len(data) {
			return nil, fmt.Errorf("%s: line %q: length %s, %d bytes", name, line, fs[1], len(data))
		}
		msgs = append(msgs, Msg{FromClient: fs[0] == "C->S", Data: data})
	}
	return msgs, sc.Err()
}

// ReadPy reads a transcript of "C->S LEN b'...'" lines, Python bytes
// literals (../shared/testdata/perftest-6.06-ib_write_bw-client-exchange.txt).
func ReadPy(name string) ([]Msg, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var msgs []Msg
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, " ", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("%s: bad line %q", name, line)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("%s: line %q: %v", name, line, err)
		}
		data, err := ParsePyBytes(f[2])
		if err != nil {
			return nil, fmt.Errorf("%s: line %q: %v", name, line, err)
		}
		if len(data) != n {
			return nil, fmt.Errorf("%s: line %q: length %d, %d bytes", name, line, n, len(data))
		}
		msgs = append(msgs, Msg{FromClient: f[0] == "C->S", Data: data})
	}
	return msgs, nil
}

// ParsePyBytes decodes a Python bytes literal such as b'3\x00'.
func ParsePyBytes(s string) ([]byte, error) {
	if len(s) < 3 || s[0] != 'b' || (s[1] != '\'' && s[1] != '"') || s[len(s)-1] != s[1] {
		return nil, fmt.Errorf("not a bytes literal: %q", s)
	}
	s = s[2 : len(s)-1]
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		i++
		if i == len(s) {
			return nil, fmt.Errorf("dangling backslash")
		}
		switch c := s[i]; c {
		case 'x':
			if i+3 > len(s) {
				return nil, fmt.Errorf("short \\x escape")
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return nil, err
			}
			out = append(out, byte(v))
			i += 2
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case '0':
			out = append(out, 0)
		case '\\', '\'', '"':
			out = append(out, c)
		default:
			return nil, fmt.Errorf("unknown escape \\%c", c)
		}
	}
	return out, nil
}

// Sizes are the lengths of the messages one side sent, in order.
func Sizes(msgs []Msg, fromClient bool) []int {
	var n []int
	for _, m := range msgs {
		if m.FromClient == fromClient {
			n = append(n, len(m.Data))
		}
	}
	return n
}

// From are the messages one side sent, in order.
func From(msgs []Msg, fromClient bool) [][]byte {
	var out [][]byte
	for _, m := range msgs {
		if m.FromClient == fromClient {
			out = append(out, m.Data)
		}
	}
	return out
}
