package analyze_test

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/pcap/analyze"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type side struct {
	ep *transport.Endpoint
	pd *transport.PD
	cq *transport.CQ
	qp *transport.QP
}

// pair connects a QP on each of two endpoints on n, as ibv_rc_pingpong
// would after its exchange; the first endpoint captures into w.
func pair(t *testing.T, n *transport.Network, w *pcap.Writer, psn [2]bth.PSN) [2]*side {
	var s [2]*side
	for i, addr := range []string{"192.0.2.1", "192.0.2.2"} {
		c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 4791))
		require.NoError(t, err)
		if i == 0 {
			// The capture records each packet as it crosses A's socket.
			c = transport.WithObserver(c, nil, transport.CaptureObserver(w, [6]byte{}, [6]byte{}))
		}
		ep := transport.NewEndpoint(c, transport.Options{})
		t.Cleanup(func() { ep.Close() })
		pd := ep.NewPD()
		cq := ep.NewCQ(1 << 14)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{MaxSendWR: 1024, MaxRecvWR: 1024, SQSigAll: true})
		require.NoError(t, err)
		s[i] = &side{ep, pd, cq, q}
	}
	for i := range 2 {
		q, peer := s[i].qp, s[1-i]
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT,
			AccessFlags: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_REMOTE_READ},
			qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: qp.IBV_MTU_1024, DestQPN: peer.qp.QPN(), RQPSN: psn[1-i],
			MaxDestRdAtomic: 16, MinRNRTimer: 1, AV: qp.AddressVector{Remote: peer.ep.LocalAddr()}},
			qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER))
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: psn[i], Timeout: 12, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC))
	}
	return s
}

func waitWC(t *testing.T, c *transport.CQ, n int) []qp.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var out []qp.WC
	buf := make([]qp.WC, 64)
	for len(out) < n {
		k, err := c.Wait(ctx, buf)
		require.NoError(t, err, "waiting for %d completions, have %d", n, len(out))
		out = append(out, buf[:k]...)
	}
	return out
}

// analyzeBytes analyzes a capture held in memory.
func analyzeBytes(t *testing.T, b []byte, cfg analyze.Config) *analyze.Report {
	t.Helper()
	r, err := pcap.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	d := pcap.NewDecoder()
	a := analyze.New(cfg)
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
	return a.Report()
}

// Two roce-emu peers on a lossy in-memory network, the requester's
// endpoint capturing what it sends and receives: the analyzer's resent
// packets, NAKs and ACK timeouts are the requester's own counters.
func TestLossyRunMatchesCounters(t *testing.T) {
	for _, c := range []struct {
		name string
		loss float64
		psn  bth.PSN
		read bool
	}{
		{"writes 3% loss", 0.03, 0x1000, false},
		{"writes across the PSN wrap 5% loss", 0.05, 0xFFFF00, false},
		{"writes and reads 3% loss", 0.03, 0x2000, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			var counters qp.Counters
			var wcs int
			synctest.Test(t, func(t *testing.T) {
				w, err := pcap.NewWriter(&buf)
				require.NoError(t, err)
				n := transport.NewNetwork(transport.Impairments{Delay: 5 * time.Microsecond, Loss: c.loss}, 7)
				s := pair(t, n, w, [2]bth.PSN{c.psn, 0x500})
				a, b := s[0], s[1]
				src := make([]byte, 8192)
				dst := make([]byte, 8192)
				smr, err := a.pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
				require.NoError(t, err)
				dmr, err := b.pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE|qp.IBV_ACCESS_REMOTE_READ)
				require.NoError(t, err)
				const msgs = 200
				for i := range msgs {
					wr := qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 4096)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}
					if c.read && i%4 == 3 {
						wr.Opcode = qp.IBV_WR_RDMA_READ
					}
					require.NoError(t, a.qp.PostSend(wr))
					if i%16 == 15 {
						for _, wc := range waitWC(t, a.cq, 16) {
							require.Equal(t, qp.IBV_WC_SUCCESS, wc.Status)
						}
						wcs += 16
					}
				}
				for _, wc := range waitWC(t, a.cq, msgs-wcs) {
					require.Equal(t, qp.IBV_WC_SUCCESS, wc.Status)
				}
				a.ep.Sync()
				counters = a.qp.Counters()
				require.NoError(t, w.Flush())
			})
			rep := analyzeBytes(t, buf.Bytes(), analyze.Config{})
			if os.Getenv("LOSSY_DUMP") != "" {
				os.WriteFile(os.Getenv("LOSSY_DUMP"), buf.Bytes(), 0o644)
			}
			require.Len(t, rep.Connections, 1)
			conn := rep.Connections[0]
			t.Logf("requester counters: retransmitted %d, NAKs %d, timeouts %d, implied %d, go-back-N %d",
				counters.RetransmittedPkts, counters.PacketSeqErr, counters.LocalAckTimeoutErr, counters.ImpliedNakSeqErr, counters.CompleterRetry)
			t.Logf("analyzer: retransmitted %d, NAKs %d, timeouts %d, implied %d, episodes %d",
				conn.RetransmittedPackets, conn.NAKs, conn.Timeouts, conn.ImpliedNAKs, len(conn.GBNEpisodes))
			require.NotZero(t, counters.RetransmittedPkts, "the loss made no resends: the test shows nothing")
			assert.Equal(t, int(counters.RetransmittedPkts), conn.RetransmittedPackets)
			// NAKs on the wire: those the requester takes as PSN
			// sequence errors, and those past a READ whose response was
			// lost, which it takes as implied NAKs.
			assert.Equal(t, int(counters.PacketSeqErr), conn.NAKs-conn.NAKsPastRead)
			if !c.read {
				assert.Zero(t, conn.NAKsPastRead)
			}
			assert.Equal(t, int(counters.ImpliedNakSeqErr), conn.ImpliedNAKs)
			assert.Equal(t, int(counters.LocalAckTimeoutErr), conn.Timeouts)
			assert.Equal(t, int(counters.CompleterRetry), len(conn.GBNEpisodes))
			assert.Equal(t, 200, conn.Messages)
			assert.Equal(t, "RC", conn.Transport)
			assert.Equal(t, "192.0.2.1/"+hexQPN(conn, true), conn.Requester)
			var resent int
			for _, e := range conn.GBNEpisodes {
				resent += e.PacketsResent
			}
			assert.Equal(t, conn.RetransmittedPackets, resent)
		})
	}
}

func hexQPN(c *analyze.Connection, req bool) string {
	s := c.Requester
	if !req {
		s = c.Responder
	}
	for i := range s {
		if s[i] == '/' {
			return s[i+1:]
		}
	}
	return ""
}
