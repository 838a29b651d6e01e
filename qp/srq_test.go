package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two UD QPs share one SRQ: each message takes the oldest WQE whichever
// QP it reaches, and the armed limit raises IBV_EVENT_SRQ_LIMIT_REACHED
// once, when a take leaves fewer WQEs than the limit.
func TestSRQSharedByTwoQPs(t *testing.T) {
	now := time.Unix(1700000000, 0)
	devB := NewDevice()
	pd := devB.NewPD()
	srq, err := pd.NewSRQ(SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	b1 := newUDHost(t, devB, "192.0.2.2", 0x22, 7, srq)
	b2 := newUDHost(t, devB, "192.0.2.2", 0x23, 7, srq)
	a := newUDHost(t, NewDevice(), "192.0.2.1", 0x11, 7, nil)
	assert.Equal(t, srq, b1.q.SRQ())

	err = b1.q.PostRecv(RecvWR{WRID: 1, SGEs: []SGE{b1.mr.SGE(0, 64)}})
	assert.ErrorIs(t, err, ErrBadWR, "a QP with an SRQ takes no receive WQEs of its own")
	mr, err := pd.RegMR(make([]byte, 4*256), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	assert.ErrorIs(t, srq.PostRecv(RecvWR{WRID: 9, SGEs: []SGE{mr.SGE(0, 8), mr.SGE(8, 8)}}), ErrBadWR, "over max_sge")
	for i := range 4 {
		require.NoError(t, srq.PostRecv(RecvWR{WRID: uint64(100 + i), SGEs: []SGE{mr.SGE(i*256, 256)}}))
	}
	assert.ErrorIs(t, srq.PostRecv(RecvWR{WRID: 9, SGEs: []SGE{mr.SGE(0, 8)}}), ErrQueueFull)
	assert.Equal(t, 4, srq.Queued())
	assert.ErrorIs(t, srq.Modify(SRQInitAttr{SRQLimit: 5}, IBV_SRQ_LIMIT), ErrBadAttr, "over max_wr")
	require.NoError(t, srq.Modify(SRQInitAttr{SRQLimit: 3}, IBV_SRQ_LIMIT))
	assert.Equal(t, SRQInitAttr{MaxWR: 4, MaxSGE: 1, SRQLimit: 3}, srq.Query())

	var ev [4]AsyncEvent
	send := func(to uint32, msg string) {
		require.NoError(t, a.send(t, 1, []byte(msg), b1.addr, to, 7, false))
		handOver(t, now, a, 0, 64, b1.q, b2.q)
	}
	send(0x22, "one")
	assert.Zero(t, devB.PollEvents(ev[:]), "3 left: not below the limit")
	send(0x23, "two")
	require.Equal(t, 1, devB.PollEvents(ev[:]), "2 left: below the limit of 3")
	assert.Equal(t, AsyncEvent{Type: IBV_EVENT_SRQ_LIMIT_REACHED, SRQ: srq}, ev[0])
	assert.Equal(t, "SRQ_LIMIT_REACHED", ev[0].Type.String())
	assert.Zero(t, srq.Query().SRQLimit, "the limit disarms itself")
	send(0x22, "three")
	assert.Zero(t, devB.PollEvents(ev[:]), "once only")
	assert.Equal(t, 1, srq.Queued())

	wc := make([]WC, 4)
	require.Equal(t, 2, b1.cq.Poll(wc))
	assert.Equal(t, []uint64{100, 102}, []uint64{wc[0].WRID, wc[1].WRID})
	assert.Equal(t, []byte("three"), mr.Buf[2*256+GRHLen:2*256+GRHLen+5])
	require.Equal(t, 1, b2.cq.Poll(wc))
	assert.Equal(t, uint64(101), wc[0].WRID)
	assert.Equal(t, uint32(0x23), wc[0].QPNum)
	assert.Equal(t, []byte("two"), mr.Buf[256+GRHLen:256+GRHLen+3])

	// Armed again, it fires again.
	require.NoError(t, srq.Modify(SRQInitAttr{SRQLimit: 1}, IBV_SRQ_LIMIT))
	send(0x23, "four")
	require.Equal(t, 1, devB.PollEvents(ev[:]))
	// Empty: the next datagram finds no WQE and is dropped.
	send(0x22, "five")
	assert.Equal(t, uint64(1), b1.q.Counters.OutOfBuffer)
	assert.Zero(t, devB.PollEvents(ev[:]))

	// A QP going to ERR leaves the SRQ's WQEs alone.
	require.NoError(t, srq.PostRecv(RecvWR{WRID: 200, SGEs: []SGE{mr.SGE(0, 256)}}))
	require.NoError(t, b2.q.Modify(&Attr{State: IBV_QPS_ERR}, IBV_QP_STATE))
	assert.Equal(t, 1, srq.Queued())

	assert.ErrorIs(t, srq.Modify(SRQInitAttr{MaxWR: 0}, IBV_SRQ_MAX_WR), ErrBadAttr)
	require.NoError(t, srq.Modify(SRQInitAttr{MaxWR: 8}, IBV_SRQ_MAX_WR))
	assert.Equal(t, 8, srq.Query().MaxWR)

	assert.ErrorIs(t, srq.Destroy(), ErrSRQInUse)
	b1.q.Destroy()
	b2.q.Destroy()
	require.NoError(t, srq.Destroy())
	assert.ErrorIs(t, srq.PostRecv(RecvWR{}), ErrBadState)
	_, err = New(InitAttr{PD: pd, SendCQ: b1.cq, RecvCQ: b1.cq, SRQ: srq})
	assert.ErrorIs(t, err, ErrBadAttr, "a destroyed SRQ")
}

// SRQ creation checks its attributes, and an SRQ serves QPs of its own
// device only.
func TestSRQAttrs(t *testing.T) {
	pd := NewDevice().NewPD()
	for _, a := range []SRQInitAttr{{MaxWR: 0}, {MaxWR: MaxSRQWR + 1}, {MaxWR: 4, MaxSGE: MaxSRQSGE + 1}, {MaxWR: 4, SRQLimit: 5}, {MaxWR: 4, SRQLimit: -1}} {
		_, err := pd.NewSRQ(a)
		assert.ErrorIs(t, err, ErrBadAttr, "%+v", a)
	}
	_, err := (&PD{}).NewSRQ(SRQInitAttr{MaxWR: 1})
	assert.ErrorIs(t, err, ErrNoDevice)
	srq, err := pd.NewSRQ(SRQInitAttr{MaxWR: 4, SRQLimit: 2})
	require.NoError(t, err)
	assert.Equal(t, SRQInitAttr{MaxWR: 4, MaxSGE: 1, SRQLimit: 2}, srq.Query(), "armed at creation, as rxe")
	cq := NewCQ(1)
	_, err = New(InitAttr{PD: NewDevice().NewPD(), SendCQ: cq, RecvCQ: cq, SRQ: srq})
	assert.ErrorIs(t, err, ErrBadAttr, "an SRQ of another device")
	assert.ErrorIs(t, srq.Modify(SRQInitAttr{}, 4), ErrBadAttr)
}

// An RC QP on an SRQ: RNR NAKs while the SRQ is empty, then the messages
// land in the order the SRQ's WQEs were posted; a UC QP on an SRQ too.
func TestSRQWithConnectedQPs(t *testing.T) {
	for _, typ := range []QPType{IBV_QPT_RC, IBV_QPT_UC} {
		t.Run(typ.String(), func(t *testing.T) {
			o := defaultOpts()
			o.typ, o.srqWR, o.minRNR = typ, 8, 1
			w := newWire(t, o)
			src := pattern(3000, 3)
			smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
			dst := make([]byte, 8192)
			dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE)
			// Two SGEs per WQE, as max_sge 2 allows.
			for i := range 2 {
				require.NoError(t, w.srq.PostRecv(RecvWR{WRID: uint64(i), SGEs: []SGE{dmr.SGE(i*4096, 1000), dmr.SGE(i*4096+1000, 3096)}}))
			}
			for i := range 2 {
				require.NoError(t, w.qp[0].PostSend(SendWR{WRID: uint64(i), Opcode: IBV_WR_SEND, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(i*1000, 2000)}}))
			}
			rc := w.poll(1, 2)
			assert.Equal(t, uint64(0), rc[0].WRID)
			assert.Equal(t, uint64(1), rc[1].WRID)
			assert.True(t, bytes.Equal(src[:2000], dst[:2000]))
			assert.True(t, bytes.Equal(src[1000:3000], dst[4096:6096]))
			assert.Zero(t, w.srq.Queued())
			if typ == IBV_QPT_RC {
				// Empty SRQ: RNR NAKs until a WQE is posted.
				require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 5, Opcode: IBV_WR_SEND, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{smr.SGE(0, 10)}}))
				w.runUntil(func() bool { return w.qp[1].Counters.SendRNRErr >= 2 })
				require.NoError(t, w.srq.PostRecv(RecvWR{WRID: 6, SGEs: []SGE{dmr.SGE(0, 100)}}))
				rc = w.poll(1, 1)
				assert.Equal(t, uint64(6), rc[0].WRID)
				assert.Equal(t, IBV_WC_SUCCESS, rc[0].Status)
			}
		})
	}
}
