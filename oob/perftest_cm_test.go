package oob

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chanMessenger is one side of an in-memory message channel.
type chanMessenger struct {
	in, out chan []byte
	sent    [][]byte
}

func newChanMessengers() (*chanMessenger, *chanMessenger) {
	a, b := make(chan []byte, 1), make(chan []byte, 1)
	return &chanMessenger{in: a, out: b}, &chanMessenger{in: b, out: a}
}

func (m *chanMessenger) SendMessage(ctx context.Context, b []byte) error {
	m.sent = append(m.sent, append([]byte(nil), b...))
	select {
	case m.out <- append([]byte(nil), b...):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *chanMessenger) RecvMessage(ctx context.Context, b []byte) (int, error) {
	select {
	case msg := <-m.in:
		return copy(b, msg), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func TestPerftestDestLayout(t *testing.T) {
	k := PerftestKey{LID: 0, OutReads: 16, QPN: 0x11, PSN: 0x5df3ee, RKey: 0x2d1, VA: 0x562bb641e000,
		GID: netip.MustParseAddr("192.0.2.2"), SRQN: 7}
	b, err := k.AppendDest(nil)
	require.NoError(t, err)
	require.Len(t, b, PerftestDestLen)
	assert.Equal(t, uint32(16), binary.BigEndian.Uint32(b[4:]))
	assert.Equal(t, uint32(0x11), binary.BigEndian.Uint32(b[8:]))
	assert.Equal(t, uint32(0x5df3ee), binary.BigEndian.Uint32(b[12:]))
	assert.Equal(t, uint32(0x2d1), binary.BigEndian.Uint32(b[16:]))
	assert.Equal(t, uint64(0x562bb641e000), binary.BigEndian.Uint64(b[24:]))
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2}, b[32:48])
	assert.Equal(t, uint32(7), binary.BigEndian.Uint32(b[48:]))
	got, err := ParsePerftestDest(b)
	require.NoError(t, err)
	assert.Equal(t, k, got)

	_, err = ParsePerftestDest(b[:55])
	assert.ErrorIs(t, err, ErrMalformed)
	bad := append([]byte(nil), b...)
	binary.BigEndian.PutUint32(bad[8:], 0x1000000)
	_, err = ParsePerftestDest(bad)
	assert.ErrorIs(t, err, ErrMalformed)
	_, err = PerftestKey{QPN: 1 << 24}.AppendDest(nil)
	assert.Error(t, err)
}

// TestPerftestCMSession runs both sides of the rdma_cm exchange as
// ib_write_bw -R does: versions, system data, MTU, the hand-shakes around
// the data QPs' connection, keys, barriers, results and the closing
// barrier; every message is one SEND of perftest's size.
func TestPerftestCMSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cm, sm := newChanMessengers()
	c, s := NewPerftestCMClient(cm), NewPerftestCMServer(sm)
	ck := PerftestKey{OutReads: 1, QPN: 0x12, PSN: 0x1234, RKey: 0x99, VA: 0x1000, GID: netip.MustParseAddr("192.0.2.1")}
	sk := PerftestKey{OutReads: 1, QPN: 0x13, PSN: 0x4321, RKey: 0x77, VA: 0x2000, GID: netip.MustParseAddr("192.0.2.2")}
	type res struct {
		sys  SysData
		mtu  qp.MTU
		key  PerftestKey
		rep  BWReport
		errs []error
	}
	run := func(p *Perftest, mine PerftestKey, cb int, mtu qp.MTU, rep BWReport) res {
		var r res
		_, err := p.Versions(ctx)
		r.errs = append(r.errs, err)
		r.sys, err = p.SysData(ctx, SysData{CycleBuffer: cb, CacheLine: 64})
		r.errs = append(r.errs, err)
		r.mtu, err = p.MTU(ctx, mtu)
		r.errs = append(r.errs, err)
		r.errs = append(r.errs, p.Barrier(ctx, "before rdma_cm"), p.Barrier(ctx, "after rdma_cm"))
		keys, err := p.Keys(ctx, []PerftestKey{mine})
		r.errs = append(r.errs, err)
		if len(keys) == 1 {
			r.key = keys[0]
		}
		r.errs = append(r.errs, p.BarrierEach(ctx, "connected"), p.Barrier(ctx, "printed"))
		r.rep, err = p.BWReports(ctx, rep)
		r.errs = append(r.errs, err, p.Done(ctx))
		return r
	}
	done := make(chan res)
	go func() { done <- run(s, sk, 8192, qp.IBV_MTU_1024, BWReport{}) }()
	cr := run(c, ck, 4096, qp.IBV_MTU_4096, BWReport{Size: 65536, Iters: 5000, PeakBW: 1.5, AvgBW: 1.25, MsgRate: 0.002})
	sr := <-done
	for i, err := range append(cr.errs, sr.errs...) {
		require.NoError(t, err, "step %d", i)
	}
	assert.Equal(t, SysData{CycleBuffer: 8192, CacheLine: 64}, cr.sys)
	assert.Equal(t, cr.sys, sr.sys)
	assert.Equal(t, qp.IBV_MTU_1024, cr.mtu)
	assert.Equal(t, qp.IBV_MTU_1024, sr.mtu)
	assert.Equal(t, sk, cr.key)
	assert.Equal(t, ck, sr.key)
	assert.Equal(t, BWReport{Size: 65536, Iters: 5000, PeakBW: 1.5, AvgBW: 1.25, MsgRate: 0.002}, sr.rep)
	// perftest's sizes: version 16, system data 4 and 4, MTU 2, then
	// 56-byte dests, results 8 each; no "done".
	var sizes []int
	for _, b := range cm.sent {
		sizes = append(sizes, len(b))
	}
	assert.Equal(t, []int{16, 4, 4, 2, 56, 56, 56, 56, 56, 8, 8, 8, 8, 8, 56}, sizes)
}

func TestPerftestCMShortMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cm, sm := newChanMessengers()
	s := NewPerftestCMServer(sm)
	go cm.SendMessage(ctx, []byte("6.06\x00"))
	_, err := s.Versions(ctx)
	assert.ErrorIs(t, err, ErrMalformed)
}
