package sim

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// matrixEnv turns on the whole matrix of TestIncastMatrix (72 runs, a few
// minutes of CPU); without it the test runs a representative subset.
const matrixEnv = "ROCE_EMU_DCQCN_MATRIX"

type matrixCase struct {
	profile string
	flows   int
	gbps    int
	seed    uint64
	dur     time.Duration // 0: 40 ms
}

// The profiles reach the bar: for paper and mlx5, 2:1, 8:1 and
// 16:1 incasts at 40 and 100 Gb/s, seeds 1-6, through the paper's marking
// (Kmin 5 KB, Kmax 200 KB, Pmax 1%, marks at dequeue) with a 12 MB buffer
// and no PFC, use at least 0.95 of the link with Jain's index at least
// 0.95 over the second half of 40 ms. Queue p99, CNPs and drops are
// logged: the mlx5 16:1 runs hold the buffer full and drop (per-port CNP
// pacing gives each of 16 flows a CNP every 64 us at best), which the bar
// does not see. The 2:1 at 100 Gb/s may take longer (as the issue
// allows): a run whose index is under 0.95 at 40 ms is run again for
// 400 ms and held to the bar over its second half (mlx5, seed 4: 0.932 at
// 40 ms, 0.969 at 400 ms: with R_AI 5 Mb/s every 300 us the two rates close
// slowly).
//
// By default (what CI runs) the subset is paper and mlx5 8:1 at 40 Gb/s
// and mlx5 2:1 at 100 Gb/s, seed 1; with ROCE_EMU_DCQCN_MATRIX=1 and
// without -short, all 72 runs.
func TestIncastMatrix(t *testing.T) {
	var cases []matrixCase
	if os.Getenv(matrixEnv) != "" && !testing.Short() {
		for _, prof := range []string{cc.ProfilePaper, cc.ProfileMLX5} {
			for _, gbps := range []int{40, 100} {
				for _, n := range []int{2, 8, 16} {
					for seed := uint64(1); seed <= 6; seed++ {
						cases = append(cases, matrixCase{profile: prof, flows: n, gbps: gbps, seed: seed})
					}
				}
			}
		}
	} else {
		cases = []matrixCase{{profile: cc.ProfilePaper, flows: 8, gbps: 40, seed: 1}, {profile: cc.ProfileMLX5, flows: 8, gbps: 40, seed: 1},
			{profile: cc.ProfileMLX5, flows: 2, gbps: 100, seed: 1}}
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%dG/%d:1/seed%d", c.profile, c.gbps, c.flows, c.seed), func(t *testing.T) {
			r := runMatrixCase(t, c)
			if c.flows == 2 && c.gbps == 100 && r.JainIndex < 0.95 {
				t.Logf("at 40 ms: utilisation %.3f, Jain %.4f; running 400 ms", r.Utilization, r.JainIndex)
				c.dur = 400 * time.Millisecond
				r = runMatrixCase(t, c)
			}
			t.Logf("utilisation %.3f, Jain %.4f, queue p50 %d p99 %d max %d, %d CNPs, %d marked, %d drops",
				r.Utilization, r.JainIndex, r.QueueP50, r.QueueP99, r.QueueMax, r.CNPs, r.Marked, r.Drops)
			assert.GreaterOrEqual(t, r.Utilization, 0.95)
			assert.GreaterOrEqual(t, r.JainIndex, 0.95)
			assert.NotZero(t, r.CNPs)
		})
	}
}

func runMatrixCase(t testing.TB, c matrixCase) *Result {
	line := cc.Rate(c.gbps) * cc.Gbps
	p, err := cc.Profile(c.profile, line)
	require.NoError(t, err)
	q := paperQueue(false)
	q.LineRate = line
	if c.dur == 0 {
		c.dur = 40 * time.Millisecond
	}
	r, err := Run(Config{Flows: c.flows, LinkRate: line, Duration: c.dur, MTU: 1024,
		Delay: time.Microsecond, Queue: q, DCQCN: true, Params: p, Seed: c.seed})
	require.NoError(t, err)
	return r
}

// BenchmarkIncast256 is the speed figure of the issue: 256 flows into one
// 100 Gb/s port for 20 ms of simulated time. One iteration is one whole
// run; SetBytes counts the payload delivered, so MB/s is simulated goodput
// per second of CPU. It runs the paper profile, the mlx5 profile (CNPs
// paced per port, the reading it takes) and the mlx5 profile with the
// other reading of min_time_between_cnps, per QP (docs/dcqcn.md, "CNP
// pacing: per port or per QP"). The paper profile brings the 256 flows
// down; neither mlx5 reading does within 20 ms, so those runs send, and
// mostly drop, tens of millions of packets (counted in bulk on the fast
// path, the default): drops, CNPs and the queue's p99 are reported with
// the time so that a faster run cannot hide a different outcome
// (docs/dcqcn.md, "Speed").
func BenchmarkIncast256(b *testing.B) {
	for _, bc := range []struct {
		name    string
		profile string
		perQP   bool
	}{{"paper", cc.ProfilePaper, false}, {"mlx5", cc.ProfileMLX5, false}, {"mlx5-cnp-per-qp", cc.ProfileMLX5, true}} {
		b.Run(bc.name, func(b *testing.B) {
			line := 100 * cc.Gbps
			p, err := cc.Profile(bc.profile, line)
			require.NoError(b, err)
			if bc.perQP {
				require.NoError(b, p.Set("cnp_per_port=false"))
			}
			q := paperQueue(false)
			q.LineRate = line
			c := Config{Flows: 256, LinkRate: line, Duration: 20 * time.Millisecond, MTU: 1024, Delay: time.Microsecond,
				Queue: q, DCQCN: true, Params: p, Seed: 1}
			b.ReportAllocs()
			var r *Result
			for b.Loop() {
				r, err = Run(c)
				require.NoError(b, err)
			}
			var gbps float64
			for _, g := range r.PerFlowGbps {
				gbps += g
			}
			// Goodput of the second half, scaled to the whole run.
			b.SetBytes(int64(gbps * 1e9 / 8 * c.Duration.Seconds()))
			b.ReportMetric(r.Utilization, "utilisation")
			b.ReportMetric(r.JainIndex, "jain")
			b.ReportMetric(float64(r.Drops), "drops")
			b.ReportMetric(float64(r.CNPs), "cnps")
			b.ReportMetric(float64(r.QueueP99), "queue-p99-bytes")
		})
	}
}
