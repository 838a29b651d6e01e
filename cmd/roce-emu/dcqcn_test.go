package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDCQCNCommand(t *testing.T) {
	dir := t.TempDir()
	csvFile, png, svg := filepath.Join(dir, "d.csv"), filepath.Join(dir, "d.png"), filepath.Join(dir, "d.svg")
	var out, errb bytes.Buffer
	code := run([]string{"dcqcn", "--flows", "2", "--duration", "20ms", "--kmin", "5000", "--kmax", "200000", "--pmax", "0.01",
		"--csv", csvFile, "--plot", png, "--json"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var sum map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &sum))
	for _, k := range []string{"per_flow_gbps", "jain_index", "utilization", "queue_p50_bytes", "queue_p99_bytes", "cnps", "drops", "pauses"} {
		assert.Contains(t, sum, k)
	}
	assert.Len(t, sum["per_flow_gbps"], 2)
	require.IsType(t, "", sum["cnps"], "a 64-bit count, as a string")
	cnps, err := strconv.ParseUint(sum["cnps"].(string), 10, 64)
	require.NoError(t, err)
	assert.Greater(t, cnps, uint64(0))
	b, err := os.ReadFile(png)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(b, []byte("\x89PNG")), "a PNG")
	c, err := os.ReadFile(csvFile)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(c)), "\n")
	assert.Equal(t, "time_us,queue_bytes,rate_gbps_0,alpha_0,rate_gbps_1,alpha_1", lines[0])
	assert.Greater(t, len(lines), 500)

	out.Reset()
	require.Equal(t, 0, run([]string{"dcqcn", "--flows", "3", "--duration", "5ms", "--cc", "none", "--csv", "", "--plot", svg,
		"--profile", "mlx5", "--param", "rpg_ai_rate=10"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "3:1 incast")
	assert.Contains(t, out.String(), "Jain's fairness index")
	b, _ = os.ReadFile(svg)
	assert.Contains(t, string(b), "<svg")
}

func TestDCQCNBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"dcqcn", "--flows", "0"},
		{"dcqcn", "--profile", "reno"},
		{"dcqcn", "--cc", "cubic"},
		{"dcqcn", "--param", "rpg_ai_rate"},
		{"dcqcn", "--param", "bogus=1"},
		{"dcqcn", "--kmin", "10", "--kmax", "5"},
		{"dcqcn", "--link-rate", "fast"},
		{"dcqcn", "--plot", "x.gif"},
		{"dcqcn", "--duration", "-1s"},
	} {
		var o, e bytes.Buffer
		assert.Equal(t, 2, run(args, &o, &e), "%v", args)
		assert.NotEmpty(t, e.String(), "%v", args)
	}
}

// --per-packet runs the reference simulation: on an incast without packets
// that tie at the port (2:1, seed 1), the same summary as the default.
func TestDCQCNPerPacket(t *testing.T) {
	var sums [2]string
	for i, extra := range [][]string{nil, {"--per-packet"}} {
		var out, errb bytes.Buffer
		args := append([]string{"dcqcn", "--flows", "2", "--duration", "10ms", "--kmin", "5000", "--kmax", "200000", "--pmax", "0.01",
			"--csv", "", "--plot", "", "--json"}, extra...)
		require.Equal(t, 0, run(args, &out, &errb), errb.String())
		sums[i] = out.String()
	}
	assert.Contains(t, sums[0], "jain_index")
	assert.Equal(t, sums[0], sums[1])
}
