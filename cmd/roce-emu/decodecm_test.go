package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decode shows the CM MADs of rdma_cm's exchange between two rxe hosts:
// message kind, communication IDs, QPNs and starting PSNs, path MTU, the
// service's port and the addresses in rdma_cm's private-data header
// (values from ../shared/testdata/README.md and tshark).
func TestDecodeCMMADs(t *testing.T) {
	t.Parallel()
	path := filepath.Join(sharedPcaps(t), "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap")
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"decode", path}, &out, &errb), errb.String())
	var cmLines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if i := strings.Index(l, " cm{"); i >= 0 {
			cmLines = append(cmLines, l[i+1:strings.Index(l, " payload=")])
		}
	}
	assert.Equal(t, []string{
		"cm{REQ tid=0x252b5cf34 lcid=0x34cfb552 qpn=0x000011 starting_psn=0xe1a47d mtu=1024 rdma_cm{192.168.65.5:37847 > 192.168.65.4:7471}}",
		"cm{REP tid=0x252b5cf34 lcid=0xa980e2d3 rcid=0x34cfb552 qpn=0x000011 starting_psn=0x8c84dd}",
		"cm{RTU tid=0x252b5cf34 lcid=0x34cfb552 rcid=0xa980e2d3}",
		"cm{DREQ tid=0x252b5cf34 lcid=0x34cfb552 rcid=0xa980e2d3}",
		"cm{DREP tid=0x252b5cf34 lcid=0xa980e2d3 rcid=0x34cfb552}",
	}, cmLines)

	out.Reset()
	require.Equal(t, 0, run([]string{"decode", "--json", path}, &out, &errb), errb.String())
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	require.True(t, sc.Scan())
	var first struct {
		CM map[string]any `json:"cm"`
	}
	require.NoError(t, json.Unmarshal(sc.Bytes(), &first))
	assert.Equal(t, "REQ", first.CM["message"])
	assert.Equal(t, float64(0xe1a47d), first.CM["starting_psn"])
	assert.Equal(t, "0x0000000001061d2f", first.CM["service_id"])
	assert.Equal(t, float64(7471), first.CM["port"])
	assert.Equal(t, "192.168.65.5:37847", first.CM["src"])
	require.True(t, sc.Scan())
	var rc struct {
		CM *json.RawMessage `json:"cm"`
	}
	for sc.Scan() {
		rc.CM = nil
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rc))
		if bytes.Contains(sc.Bytes(), []byte(`"opcode_short":"RC_`)) {
			assert.Nil(t, rc.CM, "an RC packet has no cm key")
		}
	}
}
