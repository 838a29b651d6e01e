package qp

import (
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixedRate is a congestion control algorithm that only paces: the
// smallest cc.Algorithm, to show the QP takes others than DCQCN.
type fixedRate struct {
	rate cc.Rate
	cnps int
	sent int
}

func (f *fixedRate) OnCNP(time.Time) bool      { f.cnps++; return true }
func (f *fixedRate) OnSent(_ time.Time, n int) { f.sent += n }
func (f *fixedRate) Rate() cc.Rate             { return f.rate }
func (f *fixedRate) Deadline() time.Time       { return time.Time{} }
func (f *fixedRate) OnTimeout(time.Time)       {}

func TestQPPacedByAlgorithm(t *testing.T) {
	w := newWire(t, defaultOpts())
	p, err := cc.Profile(cc.ProfilePaper, 10*cc.Gbps)
	require.NoError(t, err)
	alg := &fixedRate{rate: cc.Gbps}
	// Put the paced QP in place of side 0's, with its QPN.
	old := w.qp[0]
	a := old.Attr()
	old.Destroy()
	q, err := New(InitAttr{PD: w.pd[0], SendCQ: w.cq[0], RecvCQ: w.cq[0], QPN: 0x11, CC: &p, CCAlgorithm: alg})
	require.NoError(t, err)
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: a.AccessFlags}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: a.PathMTU, DestQPN: a.DestQPN, RQPSN: a.RQPSN, MaxDestRdAtomic: 1,
		MinRNRTimer: 1, AV: a.AV}, IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_RTS, SQPSN: a.SQPSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		IBV_QP_STATE|IBV_QP_SQ_PSN|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|IBV_QP_MAX_QP_RD_ATOMIC))
	w.qp[0] = q
	src := pattern(256<<10, 3)
	dst := make([]byte, 256<<10)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
	start := w.now
	require.NoError(t, q.PostSend(SendWR{Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, len(src))},
		RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	wc := w.poll(0, 1)
	require.Equal(t, IBV_WC_SUCCESS, wc[0].Status)
	assert.Equal(t, src, dst)
	took := w.now.Sub(start)
	// 256 packets of 1024+58 bytes at 1 Gb/s take 2.2 ms; the pacer's
	// bucket lets two packets go at once.
	assert.Greater(t, took, 2*time.Millisecond, "paced at the algorithm's rate")
	assert.Less(t, took, 3*time.Millisecond)
	assert.Equal(t, 256*(1024+58), alg.sent)
}
