//go:build linux

package transport

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
)

// BenchmarkReadBW measures RDMA READ bandwidth between two Endpoints over
// UDP on loopback, 16 READs outstanding (max_rd_atomic 16): 64 KiB and
// 8 MiB messages. One op is one completed READ; Gb/s counts message
// bytes. The responder's side of it is what issue 14 changed: READ
// responses encoded a batch at a time with the Endpoint's lock released
// while they are written.
func BenchmarkReadBW(b *testing.B) {
	for _, size := range []int{64 << 10, 8 << 20} {
		b.Run(fmt.Sprintf("%dKiB/mtu1024", size>>10), func(b *testing.B) {
			s := connect(b, udpPair(b), defaultPair())
			const depth = 16
			src := pattern(size, 3)
			dst := make([]byte, size*depth)
			smr, _ := s[1].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_READ)
			dmr, _ := s[0].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE)
			wc := make([]qp.WC, 64)
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			start := time.Now()
			posted, done := 0, 0
			for done < b.N {
				for posted < b.N && posted-done < depth {
					off := (posted % depth) * size
					if err := s[0].qp.PostSend(qp.SendWR{WRID: uint64(posted), Opcode: qp.IBV_WR_RDMA_READ,
						SGEs: []qp.SGE{dmr.SGE(off, size)}, RemoteAddr: smr.VA, RKey: smr.RKey}); err != nil {
						b.Fatal(err)
					}
					posted++
				}
				n, err := s[0].cq.Wait(ctx, wc)
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range wc[:n] {
					if c.Status != qp.IBV_WC_SUCCESS {
						b.Fatal(c.Status)
					}
				}
				done += n
			}
			b.ReportMetric(float64(size)*float64(b.N)*8/time.Since(start).Seconds()/1e9, "Gb/s")
			c := s[0].qp.Counters()
			b.ReportMetric(float64(c.RetransmittedPkts)/float64(b.N), "retrans/op")
		})
	}
}
