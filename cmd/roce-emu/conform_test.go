package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/conform"
)

// conform --self: every case passes against roce-emu, in simulated time;
// --json has the shape and every case its capture.
func TestConformSelfJSON(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		var o, e bytes.Buffer
		code := run([]string{"conform", "--self", "--json", "--pcap-dir", dir}, &o, &e)
		require.Equal(t, 0, code, "stderr: %s\nstdout: %s", e.String(), o.String())
		var out struct {
			Target string `json:"target"`
			Cases  []struct {
				Name    string `json:"name"`
				Verdict string `json:"verdict"`
				IBTA    string `json:"ibta"`
				Frames  []int  `json:"frames"`
				Capture string `json:"capture"`
			} `json:"cases"`
			Passed, Failed int
		}
		require.NoError(t, json.Unmarshal(o.Bytes(), &out))
		assert.Equal(t, "self", out.Target)
		require.Len(t, out.Cases, len(conform.Cases()))
		assert.Equal(t, len(conform.Cases()), out.Passed)
		for _, c := range out.Cases {
			assert.Equal(t, "pass", c.Verdict, c.Name)
			assert.Contains(t, c.IBTA, "IBTA Vol. 1", c.Name)
			assert.NotEmpty(t, c.Frames, c.Name)
			st, err := os.Stat(c.Capture)
			if assert.NoError(t, err, c.Name) {
				assert.Greater(t, st.Size(), int64(24), c.Name)
			}
		}
	})
}

func TestConformSelfTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o, e bytes.Buffer
		code := run([]string{"conform", "--self", "--only", "rnr-timer-code-0,psn-wrap"}, &o, &e)
		require.Equal(t, 0, code, e.String())
		lines := strings.Split(o.String(), "\n")
		assert.Regexp(t, `^CASE +VERDICT +FRAMES +IBTA$`, lines[0])
		assert.Regexp(t, `^rnr-timer-code-0 +pass +\d+,\d+ +IBTA Vol. 1 Table 45`, lines[1])
		assert.Equal(t, "  resent after 655.36ms", lines[2])
		assert.Regexp(t, `^psn-wrap +pass +1,2,3,4,5,6,7,8 +IBTA`, lines[3])
		assert.Equal(t, "self: 2 passed, 0 failed, 0 n/a", lines[4])
	})
}

// Against roce-emu's own rc_pingpong and ib_write_bw servers over UDP on
// loopback (two addresses: both servers use one UDP port), as against a
// live peer; the ib_read_bw case is n/a (no
// --read-bw) and the run exits 0.
func TestConformLive(t *testing.T) {
	pp, bw, udp := freeTCPPort(t), freeTCPPort(t), freeUDPPort(t)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var o, e bytes.Buffer
		run([]string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", pp, "--timeout", "3s"}, &o, &e)
	}()
	go func() {
		defer wg.Done()
		var o, e bytes.Buffer
		run([]string{"bw", "-o", "write", "--bind", "127.0.0.3", "--udp-port", udp, "-p", bw, "--timeout", "10s"}, &o, &e)
	}()
	var o, e bytes.Buffer
	code := run([]string{"conform", "--bind", "127.0.0.1", "--udp-port", udp, "--pingpong", pp, "--write-bw", bw, "--json",
		"--only", "go-back-n,psn-sequence-error-nak-once,zero-length-read", "127.0.0.2"}, &o, &e)
	wg.Wait()
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", e.String(), o.String())
	var rep conform.Report
	require.NoError(t, json.Unmarshal(o.Bytes(), &rep))
	require.Len(t, rep.Cases, 3)
	assert.Equal(t, conform.Pass, rep.Cases[0].Verdict, "%+v", rep.Cases[0])
	assert.Equal(t, conform.Pass, rep.Cases[1].Verdict, "%+v", rep.Cases[1])
	assert.Equal(t, conform.NA, rep.Cases[2].Verdict)
	assert.Equal(t, "not run: the target runs no ib_read_bw", rep.Cases[2].Detail)
	assert.Equal(t, 0, rep.NotRun)
}

func TestConformBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"conform"},
		{"conform", "--self", "host"},
		{"conform", "--self", "--only", "no-such-case"},
		{"conform", "--self", "--mtu", "1000"},
		{"conform", "--self", "--wait", "0s"},
		{"conform", "--pingpong", "70000", "host"},
		{"conform", "--atomic-bw", "70000", "host"},
		{"conform", "--read-bw-bidir", "-1", "host"},
		{"conform", "--bind", "0.0.0.0", "127.0.0.1"},
	} {
		var o, e bytes.Buffer
		code := run(args, &o, &e)
		assert.NotEqual(t, 0, code, "%v", args)
		assert.NotEmpty(t, e.String(), "%v", args)
	}
	var o, e bytes.Buffer
	require.Equal(t, 0, run([]string{"conform", "--list"}, &o, &e))
	assert.Contains(t, o.String(), "go-back-n")
	assert.Regexp(t, `(?m)^misaligned-atomic-cmp-swap +ib_atomic_bw +IBTA Vol. 1 9\.4\.5`, o.String())
	assert.Regexp(t, `(?m)^implied-nak-ack +ib_read_bw -b +IBTA Vol. 1 9\.7\.5\.1`, o.String())
}
