//go:build linux

package transport

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
)

// cpuTime returns the CPU time (user and system) the process has used.
func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkManyQPs measures aggregate RDMA WRITE throughput of 4 KiB
// messages at MTU 4096 from 1 and from 1,000 connected QPs on one
// Endpoint pair over an in-memory Network (no impairments, a receive queue
// of 64 Ki datagrams): 64 WRITEs in flight on the one QP, 2 on each of
// the 1,000 QPs (2,000 in all). One op is one completed WRITE; compare the
// two runs' Gb/s, or on a loaded machine their Gb/s-cpu: message bits
// per second of the process's CPU time (user and system, getrusage), which
// other processes' load does not change.
//
//	go test ./transport -run '^$' -bench ManyQPs -benchtime 20000x
func BenchmarkManyQPs(b *testing.B) {
	for _, c := range []struct{ qps, depth int }{{1, 64}, {1000, 2}} {
		b.Run(fmt.Sprintf("qps=%d", c.qps), func(b *testing.B) {
			m := connectMany(b, memNetConns(b, 1<<16), c.qps, c.depth, qp.IBV_MTU_4096)
			b.SetBytes(4096)
			b.ReportAllocs()
			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime(b)
			runWrites(b, m, c.qps, c.depth, 4096, b.N)
			el, cpu := time.Since(start), cpuTime(b)-cpu0
			b.ReportMetric(float64(b.N)*4096*8/el.Seconds()/1e9, "Gb/s")
			b.ReportMetric(float64(b.N)*4096*8/cpu.Seconds()/1e9, "Gb/s-cpu")
			var retrans uint64
			for _, q := range m.qps[0] {
				retrans += q.Counters().RetransmittedPkts
			}
			b.ReportMetric(float64(retrans)/float64(b.N), "retrans/op")
		})
	}
}
