package qp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/require"
)

// TestRequesterWindow checks InitAttr.MaxUnackedPSNs: with no ACK back,
// an RC requester sends that many PSNs of a long WRITE and stops (the
// default: MaxUnackedPSNs, rxe's 128); the whole WRITE still lands once
// ACKs flow.
func TestRequesterWindow(t *testing.T) {
	for _, c := range []struct {
		window, want int
	}{{0, MaxUnackedPSNs}, {5, 5}, {1, 1}, {300, 300}} {
		o := defaultOpts()
		o.window = c.window
		w := newWire(t, o)
		const n = 400 << 10 // 400 packets at MTU 1024
		local, remote := pattern(n, 7), make([]byte, n)
		lmr, _ := w.pd[0].RegMR(local, IBV_ACCESS_LOCAL_WRITE)
		rmr, _ := w.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
		require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED,
			SGEs: []SGE{lmr.SGE(0, n)}, RemoteAddr: rmr.VA, RKey: rmr.RKey}))
		var p bth.Packet
		sent, ackReqs := 0, 0
		for w.qp[0].NextPacket(w.now, &p) {
			sent++
			if p.BTH.AckReq {
				ackReqs++
			}
		}
		require.Equal(t, c.want, sent, "window %d: packets sent before any ACK", c.window)
		require.True(t, p.BTH.AckReq, "window %d: the packet that fills the window asks for its ACK", c.window)
		require.Equal(t, (c.want-1)/AckReqInterval+1, ackReqs, "window %d: AckReq every %d packets and at the window's end", c.window, AckReqInterval)

		w2 := newWire(t, o)
		lmr2, _ := w2.pd[0].RegMR(local, IBV_ACCESS_LOCAL_WRITE)
		rmr2, _ := w2.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
		require.NoError(t, w2.qp[0].PostSend(SendWR{WRID: 1, Opcode: IBV_WR_RDMA_WRITE, Flags: IBV_SEND_SIGNALED,
			SGEs: []SGE{lmr2.SGE(0, n)}, RemoteAddr: rmr2.VA, RKey: rmr2.RKey}))
		wc := w2.poll(0, 1)
		require.Equal(t, IBV_WC_SUCCESS, wc[0].Status, "window %d", c.window)
		require.True(t, bytes.Equal(local, remote), "window %d", c.window)
		require.Zero(t, w2.qp[0].Counters.LocalAckTimeoutErr, "window %d: no wait for the ACK timer", c.window)
		require.Zero(t, w2.qp[0].Counters.RetransmittedPkts, "window %d", c.window)
	}
}

func TestRequesterWindowBadAttr(t *testing.T) {
	pd := NewDevice().NewPD()
	cq := NewCQ(4)
	for _, bad := range []int{-1, MaxUnackedPSNsLimit + 1} {
		_, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, MaxUnackedPSNs: bad})
		require.True(t, errors.Is(err, ErrBadAttr), "MaxUnackedPSNs %d: %v", bad, err)
	}
	q, err := New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, MaxUnackedPSNs: MaxUnackedPSNsLimit})
	require.NoError(t, err)
	q.Destroy()
}
