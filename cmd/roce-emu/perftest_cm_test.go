package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runPerfPairCM runs a server on 127.0.0.2 and a client on 127.0.0.1 that
// dials it with rdma_cm (the server's address, where its Endpoint is).
func runPerfPairCM(t *testing.T, kind string, extra ...string) (string, string) {
	port, udp := freeTCPPort(t), freeUDPPort(t)
	common := append([]string{kind, "--udp-port", udp, "-p", port, "--timeout", "30s"}, extra...)
	r := runPair(append(append([]string{}, common...), "--bind", "127.0.0.2"),
		append(append([]string{}, common...), "--bind", "127.0.0.1", "127.0.0.2"), "cannot reach",
		func(sout *lockedBuffer) {
			// The server prints its banner once it listens: a REQ before that
			// would be lost and sent again only after the CM's timeout.
			for i := 0; i < 500 && !strings.Contains(sout.String(), "Waiting for client"); i++ {
				time.Sleep(10 * time.Millisecond)
			}
		})
	require.Equal(t, 0, r.ccode, "client: %s", r.cerr)
	require.Equal(t, 0, r.scode, "server: %s", r.serr)
	return r.cout, r.sout
}

// roce-emu against roce-emu with -R: the exchange and the data QPs over
// rdma_cm, no TCP; every test, and -q 2 for the bandwidth tests.
func TestPerfRDMACM(t *testing.T) {
	for _, kind := range []string{"bw", "lat"} {
		for _, op := range []string{"send", "write", "read"} {
			t.Run(kind+"-"+op, func(t *testing.T) {
				args := []string{"-R", "-o", op, "-n", "100"}
				if kind == "bw" {
					args = append(args, "-s", "4096", "-q", "2")
				}
				c, s := runPerfPairCM(t, kind, args...)
				for _, out := range []string{c, s} {
					if kind == "bw" {
						assert.Equal(t, 2, strings.Count(out, " remote address:"), out)
						assert.Contains(t, out, " rdma_cm: 2 data QPs disconnected", out)
					} else {
						assert.Contains(t, out, " rdma_cm: 1 data QPs disconnected", out)
					}
				}
				if kind == "bw" {
					assert.Regexp(t, `\n 4096 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, c)
					assert.Regexp(t, `\n 4096 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s)
				} else {
					assert.Regexp(t, `\n 2 +100 +[0-9.]+ `, c)
				}
				served := map[string]string{"send": "SEND", "write": "RDMA WRITE", "read": "RDMA READ"}[op]
				assert.Regexp(t, fmt.Sprintf(`requests served: .*[1-9][0-9]* %s`, served), c+s)
			})
		}
	}
}

// -z: the exchange over rdma_cm, the data QPs connected by hand from the
// keys (perftest's use_rdma_cm without work_rdma_cm): no data QP goes
// through rdma_cm, so none is disconnected at the end.
func TestPerfRDMACMExchangeOnly(t *testing.T) {
	for _, tc := range [][]string{{"bw", "-o", "write", "-s", "4096", "-n", "100", "-q", "2"}, {"lat", "-o", "send", "-n", "100"}} {
		t.Run(tc[0], func(t *testing.T) {
			c, s := runPerfPairCM(t, tc[0], append([]string{"-z"}, tc[1:]...)...)
			for _, out := range []string{c, s} {
				assert.NotContains(t, out, "data QPs disconnected", out)
			}
			if tc[0] == "bw" {
				assert.Regexp(t, `\n 4096 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, c)
				assert.Regexp(t, `\n 4096 +200 +[0-9.]+ +[0-9.]+ +[0-9.]+\n`, s)
			} else {
				assert.Regexp(t, `\n 2 +100 +[0-9.]+ `, c)
			}
		})
	}
}
