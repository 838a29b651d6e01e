package qp

import (
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regressions from a review: each test failed before its fix.

// Two PDs never share keys, so a QP cannot reach another PD's memory,
// locally or for a peer.
func TestPDIsolation(t *testing.T) {
	dev := NewDevice()
	a, b := dev.NewPD(), dev.NewPD()
	ma, err := a.RegMR(make([]byte, 64), IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, err)
	mb, err := b.RegMR(make([]byte, 64), IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, err)
	assert.NotEqual(t, ma.LKey, mb.LKey)
	assert.NotEqual(t, ma.VA, mb.VA)
	_, ok := a.local([]SGE{mb.SGE(0, 8)}, false, nil)
	assert.False(t, ok, "PD a does not know PD b's L_Key")
	assert.Nil(t, a.remote(mb.RKey, mb.VA, 8, IBV_ACCESS_REMOTE_WRITE), "nor its R_Key")

	// End to end: a peer that holds the R_Key of another PD's region is refused.
	w := newWire(t, defaultOpts())
	other := w.pd[1].Device().NewPD() // another PD on the responder's device
	secret := []byte("SECRET!!")
	omr, _ := other.RegMR(secret, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_READ)
	lmr, _ := w.pd[0].RegMR(make([]byte, 8), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_RDMA_READ, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{lmr.SGE(0, 8)},
		RemoteAddr: omr.VA, RKey: omr.RKey}))
	wc := w.poll(0, 1)
	assert.Equal(t, IBV_WC_REM_ACCESS_ERR, wc[0].Status)
}

// Moving to SQD in the middle of a message finishes that message and
// starts no other; back in RTS the rest goes.
func TestSQDDrains(t *testing.T) {
	w := newWire(t, defaultOpts())
	src := pattern(64<<10, 1)
	dst := make([]byte, 64<<10)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
	for i := range 2 {
		require.NoError(t, w.qp[0].PostSend(SendWR{WRID: uint64(i), Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED,
			SGEs: []SGE{smr.SGE(i*32<<10, 32<<10)}, RemoteAddr: dmr.VA + uint64(i*32<<10), RKey: dmr.RKey}))
	}
	var p bth.Packet
	require.True(t, w.qp[0].NextPacket(w.now, &p)) // the first packet of WR 0 is out
	require.NoError(t, w.qp[0].Modify(&Attr{State: IBV_QPS_SQD}, IBV_QP_STATE))
	w.runUntil(func() bool { return w.cq[0].Len() == 1 })
	var wc [2]WC
	require.Equal(t, 1, w.cq[0].Poll(wc[:]))
	assert.Equal(t, uint64(0), wc[0].WRID, "the begun WRITE completes in SQD")
	w.runUntil(nil)
	assert.Zero(t, w.cq[0].Len(), "the second WRITE does not start in SQD")
	require.NoError(t, w.qp[0].Modify(&Attr{State: IBV_QPS_RTS}, IBV_QP_STATE))
	done := w.poll(0, 1)
	assert.Equal(t, uint64(1), done[0].WRID)
	assert.Equal(t, src, dst)
}

// A region deregistered after a work request was posted fails it, as rxe
// (which looks the key up when it copies) does.
func TestDeregAfterPost(t *testing.T) {
	w := newWire(t, defaultOpts())
	src := pattern(3000, 1)
	dst := make([]byte, 3000)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: 9, SGEs: []SGE{dmr.SGE(0, 3000)}}))
	require.NoError(t, w.pd[1].DeregMR(dmr))
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_SEND, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, 3000)}}))
	rc := w.poll(1, 1)
	assert.Equal(t, IBV_WC_LOC_PROT_ERR, rc[0].Status)
	assert.Equal(t, make([]byte, 3000), dst, "nothing written into the deregistered buffer")

	w = newWire(t, defaultOpts())
	smr, _ = w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 2, Opcode: IBV_WR_SEND, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, 3000)}}))
	require.NoError(t, w.pd[0].DeregMR(smr))
	sc := w.poll(0, 1)
	assert.Equal(t, IBV_WC_LOC_PROT_ERR, sc[0].Status)
	assert.Zero(t, w.sent[0], "nothing sent from the deregistered buffer")
}

// A responder moved to ERR stops a READ response in mid-stream.
func TestERRStopsResponses(t *testing.T) {
	w := newWire(t, defaultOpts())
	mem := make([]byte, 64<<10)
	rmr, _ := w.pd[1].RegMR(mem, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_READ)
	lmr, _ := w.pd[0].RegMR(make([]byte, 64<<10), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_RDMA_READ, SGEs: []SGE{lmr.SGE(0, 64<<10)}, RemoteAddr: rmr.VA, RKey: rmr.RKey}))
	var p bth.Packet
	require.True(t, w.qp[0].NextPacket(w.now, &p))
	data, _ := p.Append(nil, &w.enc[0])
	var in bth.Packet
	require.NoError(t, in.Decode(data))
	w.qp[1].HandlePacket(w.now, &in, bth.NotECT)
	require.True(t, w.qp[1].NextPacket(w.now, &p), "the first response packet")
	require.NoError(t, w.qp[1].Modify(&Attr{State: IBV_QPS_ERR}, IBV_QP_STATE))
	assert.False(t, w.qp[1].NextPacket(w.now, &p), "nothing more after ERR")
}

// Posting before RTS is refused (rxe: -EINVAL); inline data is copied at
// post time.
func TestPostStatesAndInline(t *testing.T) {
	pd := NewDevice().NewPD()
	cq := NewCQ(8)
	q, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPN: 0x42})
	require.NoError(t, err)
	mr, _ := pd.RegMR(make([]byte, 8), IBV_ACCESS_LOCAL_WRITE)
	wr := SendWR{Opcode: IBV_WR_SEND, SGEs: []SGE{mr.SGE(0, 8)}}
	assert.ErrorIs(t, q.PostSend(wr), ErrBadState, "RESET")
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	assert.ErrorIs(t, q.PostSend(wr), ErrBadState, "INIT")
	assert.NoError(t, q.PostRecv(RecvWR{SGEs: []SGE{mr.SGE(0, 8)}}), "receives may be posted in INIT")

	w := newWire(t, defaultOpts())
	buf := []byte("inline!!")
	dst := make([]byte, 8)
	smr, _ := w.pd[0].RegMR(buf, IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, w.qp[1].PostRecv(RecvWR{SGEs: []SGE{dmr.SGE(0, 8)}}))
	require.NoError(t, w.qp[0].PostSend(SendWR{Opcode: IBV_WR_SEND, Flags: IBV_SEND_INLINE | IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, 8)}}))
	copy(buf, "changed!") // allowed at once with inline
	w.poll(1, 1)
	assert.Equal(t, "inline!!", string(dst))
	big := make([]byte, MaxInlineData+1)
	bmr, _ := w.pd[0].RegMR(big, IBV_ACCESS_LOCAL_WRITE)
	assert.ErrorIs(t, w.qp[0].PostSend(SendWR{Opcode: IBV_WR_SEND, Flags: IBV_SEND_INLINE, SGEs: []SGE{bmr.SGE(0, len(big))}}), ErrBadWR)
}

// A message needing more than MaxMessagePSNs PSNs is refused at post time.
func TestMessagePSNSpan(t *testing.T) {
	o := defaultOpts()
	o.mtu = IBV_MTU_256
	w := newWire(t, o)
	// A region is not needed: the size check comes first.
	err := w.qp[0].PostSend(SendWR{Opcode: IBV_WR_RDMA_READ, SGEs: []SGE{{Addr: 0, Length: 1 << 30, LKey: 1}, {Addr: 0, Length: 1 << 30, LKey: 1}}})
	assert.ErrorIs(t, err, ErrBadWR)
}
