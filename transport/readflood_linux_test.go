//go:build linux

package transport

import (
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// heapPeak samples runtime.MemStats.HeapInuse every few milliseconds
// until stop is called, which returns the highest value seen.
func heapPeak() (stop func() uint64) {
	var (
		wg   sync.WaitGroup
		peak uint64
		done = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-tick.C:
			case <-done:
				return
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return peak }
}

// A peer that asks a server for its whole memory region (8 MiB + 64 KiB,
// perftest's default buffer for ib_write_bw -s 65536 -t 128) many times
// over does not grow the server's memory past that of the region plus
// 64 MiB, and another client of the server keeps being served meanwhile
// (issue 14; ../shared/testdata/cases/reliability/read_flood_memory.py
// is the same attack against the command). With max_dest_rd_atomic 1, as
// a `bw --perftest -o write` server has, the second READ is NAKed
// Invalid Request and the QP goes to ERR; with 16, the sixteen READs
// allowed are answered a batch of packets at a time, straight from the
// region.
func TestReadFloodMemory(t *testing.T) {
	const mrLen = 128*65536 + 65536
	for _, tc := range []struct {
		name    string
		rdAtom  uint8
		mtu     qp.MTU
		reads   int
		refused bool
	}{
		{"max_dest_rd_atomic 1, 100 READs", 1, qp.IBV_MTU_1024, 100, true},
		{"max_dest_rd_atomic 16, 16 READs", 16, qp.IBV_MTU_4096, 16, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)

			ip := func(s string) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(s), 0) }
			sconn, err := ListenUDP(ip("127.0.0.2"), UDPOptions{EphemeralPort: true})
			require.NoError(t, err)
			server := NewEndpoint(sconn, Options{})
			t.Cleanup(func() { server.Close() })
			cconn, err := ListenUDP(ip("127.0.0.1"), UDPOptions{EphemeralPort: true})
			require.NoError(t, err)
			client := NewEndpoint(cconn, Options{})
			t.Cleanup(func() { client.Close() })
			attacker, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ip("127.0.0.1")))
			require.NoError(t, err)
			t.Cleanup(func() { attacker.Close() })
			aaddr := attacker.LocalAddr().(*net.UDPAddr).AddrPort()

			access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ
			spd := server.NewPD()
			region := pattern(mrLen, 7)
			smr, err := spd.RegMR(region, access)
			require.NoError(t, err)
			scq := server.NewCQ(256)

			// The QP the attacker floods: its peer is the attacker's
			// address, QPN 0x99, first PSN 0x1000.
			flood, err := server.NewQP(spd, scq, scq, qp.InitAttr{})
			require.NoError(t, err)
			require.NoError(t, flood.Connect(Remote{Addr: aaddr, QPN: 0x99, PSN: 0x1000}, 0x5000,
				ConnectAttr{PathMTU: tc.mtu, Access: access, MaxRdAtomic: tc.rdAtom}))

			// The legitimate client, on another QP.
			legit, err := server.NewQP(spd, scq, scq, qp.InitAttr{})
			require.NoError(t, err)
			cpd := client.NewPD()
			ccq := client.NewCQ(64)
			cq, err := client.NewQP(cpd, ccq, ccq, qp.InitAttr{SQSigAll: true})
			require.NoError(t, err)
			require.NoError(t, legit.Connect(Remote{Addr: client.LocalAddr(), QPN: cq.QPN(), PSN: 0x100}, 0x200, ConnectAttr{Access: access}))
			require.NoError(t, cq.Connect(Remote{Addr: server.LocalAddr(), QPN: legit.QPN(), PSN: 0x200}, 0x100, ConnectAttr{Access: access}))
			cbuf := make([]byte, 1<<20)
			cmr, err := cpd.RegMR(cbuf, access)
			require.NoError(t, err)

			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			stop := heapPeak()

			npsn := (mrLen + tc.mtu.Bytes() - 1) / tc.mtu.Bytes()
			enc := bth.Encap{Src: aaddr.Addr(), Dst: server.LocalAddr().Addr(), SrcPort: aaddr.Port(), DstPort: server.LocalAddr().Port()}
			psn := bth.PSN(0x1000)
			var b []byte
			for range tc.reads {
				p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCReadRequest, PKey: bth.DefaultPKey, DestQP: flood.QPN(), PSN: psn, AckReq: true},
					RETH: bth.RETH{VA: smr.VA, RKey: smr.RKey, DMALength: mrLen}}
				b, err = p.Append(b[:0], &enc)
				require.NoError(t, err)
				_, err = attacker.WriteToUDPAddrPort(b, server.LocalAddr())
				require.NoError(t, err)
				psn = psn.Add(npsn)
			}
			require.Eventually(t, func() bool { return flood.Counters().SentPackets > 0 }, 30*time.Second, time.Millisecond)

			// The client READs 1 MiB of the region and WRITEs it back
			// elsewhere while the flood is answered.
			require.NoError(t, cq.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{cmr.SGE(0, len(cbuf))},
				RemoteAddr: smr.VA + 4096, RKey: smr.RKey}))
			wc := wait(t, ccq, 1)
			require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
			assert.Equal(t, region[4096:4096+len(cbuf)], cbuf)
			require.NoError(t, cq.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{cmr.SGE(0, 65536)},
				RemoteAddr: smr.VA + mrLen - 65536, RKey: smr.RKey}))
			wc = wait(t, ccq, 1)
			require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
			floodSentMeanwhile := flood.Counters().SentPackets

			total := uint64(tc.reads * npsn)
			if tc.refused {
				require.Eventually(t, func() bool { return flood.Counters().ReceivedPackets == uint64(tc.reads) }, 30*time.Second, time.Millisecond)
			} else {
				require.Eventually(t, func() bool { return flood.Counters().SentPackets == total }, 60*time.Second, time.Millisecond)
			}
			peak := stop()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)

			c := flood.Counters()
			if tc.refused {
				assert.Equal(t, qp.IBV_QPS_ERR, flood.State())
				assert.Equal(t, uint64(1), c.RespRdAtomicExceeded)
				assert.Equal(t, uint64(2), c.RxReadRequests, "the first READ and the one refused")
				assert.Equal(t, uint64(tc.reads-2), c.QPStateErr, "the rest dropped in ERR")
				assert.ErrorContains(t, flood.Err(), "max_dest_rd_atomic 1")
			} else {
				assert.Equal(t, qp.IBV_QPS_RTS, flood.State())
				assert.Zero(t, c.RespRdAtomicExceeded)
				assert.Less(t, floodSentMeanwhile, total, "the client was served while the flood was answered")
			}
			assert.Equal(t, qp.IBV_QPS_RTS, legit.State())
			t.Logf("flood: %d READs of %d bytes, %d response packets sent (%d when the client was done); heap in use %d MiB before the region, peak %d MiB; %d MiB allocated during the flood",
				tc.reads, mrLen, c.SentPackets, floodSentMeanwhile, base.HeapInuse>>20, peak>>20, (after.TotalAlloc-before.TotalAlloc)>>20)
			assert.LessOrEqual(t, peak, base.HeapInuse+mrLen+64<<20, "heap within the region + 64 MiB")
			assert.LessOrEqual(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "allocated during the flood")
		})
	}
}
