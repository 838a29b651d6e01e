package gencap_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/roce-emu/roce-emu/internal/gencap"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/pcap/analyze"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The episodes the analyzer finds in a generated capture are the ones the
// generator made, connection by connection.
func TestAnalyzerFindsGeneratedEpisodes(t *testing.T) {
	var buf bytes.Buffer
	truth, err := gencap.Generate(&buf, gencap.Config{Messages: 120})
	require.NoError(t, err)
	require.Len(t, truth.Episodes, 4*2)

	r, err := pcap.NewReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	d := pcap.NewDecoder()
	a := analyze.New(analyze.Config{})
	var rec pcap.Record
	for n := 1; ; n++ {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		k, err := d.Decode(data, ci, lt, &rec)
		require.NoError(t, err)
		a.Add(n, k, &rec)
	}
	rep := a.Report()
	assert.Equal(t, truth.Frames, rep.Summary.Frames)
	require.Len(t, rep.Connections, 4)
	for i, c := range rep.Connections {
		req, resp := gencap.Endpoints(i)
		assert.Equal(t, req, c.Requester)
		assert.Equal(t, resp, c.Responder)
		assert.Equal(t, truth.Messages, c.Messages)
		assert.Equal(t, truth.CE[i], c.CEMarked)
		assert.Equal(t, truth.CNPs[i], c.CNPs)
		assert.Equal(t, 1024, c.PathMTU)
		assert.Empty(t, c.Checks)
		var want []analyze.Episode
		for _, e := range truth.Episodes {
			if e.Conn == i {
				want = append(want, analyze.Episode{Cause: "NAK", StartFrame: e.NAKFrame, FirstResendFrame: e.FirstResendFrame,
					DelayUs: 0.1, FromPSN: e.FromPSN, PacketsResent: e.PacketsResent, BytesResent: e.BytesResent, ResendFrom: "MIDDLE"})
			}
		}
		assert.Equal(t, want, c.GBNEpisodes, "connection %d", i)
		assert.Equal(t, len(want), c.NAKs)
		assert.Zero(t, c.Timeouts)
		assert.Equal(t, int64(120*64), c.PSN.Count, "across the wrap")
	}
}
