package transcript

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRead(t *testing.T) {
	b, err := ParsePyBytes(`b'3\x00\\\'a\n'`)
	require.NoError(t, err)
	assert.Equal(t, []byte("3\x00\\'a\n"), b)
	for _, bad := range []string{"", "b'", `b'\'`, `b'\x4'`, `b'\q'`, "'x'"} {
		_, err := ParsePyBytes(bad)
		assert.Error(t, err, "%q", bad)
	}

	dir := t.TempDir()
	hexName := filepath.Join(dir, "x.txt")
	require.NoError(t, os.WriteFile(hexName, []byte("# comment\nC->S 2 3300\nS->C 1 ff\nS->C EOF\n"), 0o644))
	msgs, err := ReadHex(hexName)
	require.NoError(t, err)
	assert.Equal(t, []Msg{{true, []byte("3\x00")}, {false, []byte{0xff}}}, msgs)
	assert.Equal(t, []int{2}, Sizes(msgs, true))
	assert.Equal(t, [][]byte{{0xff}}, From(msgs, false))
	require.NoError(t, os.WriteFile(hexName, []byte("C->S 3 3300\n"), 0o644))
	_, err = ReadHex(hexName)
	assert.Error(t, err, "length and bytes disagree")

	pyName := filepath.Join(dir, "y.txt")
	require.NoError(t, os.WriteFile(pyName, []byte("C->S 2 b'3\\x00'\nS->C 1 b'a'\n"), 0o644))
	msgs, err = ReadPy(pyName)
	require.NoError(t, err)
	assert.Equal(t, []Msg{{true, []byte("3\x00")}, {false, []byte("a")}}, msgs)
}
