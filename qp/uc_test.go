package qp

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ucOpts() pairOpts {
	o := defaultOpts()
	o.typ = IBV_QPT_UC
	return o
}

// UC moves SEND and RDMA WRITE of every size without a single packet
// coming back, and completes the sends as their last packet leaves.
func TestUCSizes(t *testing.T) {
	for _, n := range sizes {
		for _, op := range []WROpcode{IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM} {
			t.Run(fmt.Sprint(op, "/", n), func(t *testing.T) {
				w := newWire(t, ucOpts())
				src := pattern(max(n, 1), 9)
				dst := make([]byte, n+16)
				smr, err := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
				require.NoError(t, err)
				rmr, err := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
				require.NoError(t, err)
				require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: 9, SGEs: []SGE{rmr.SGE(0, len(dst))}}))
				require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: op, Flags: IBV_SEND_SIGNALED,
					SGEs: []SGE{smr.SGE(0, n)}, ImmData: 0xCAFE, RemoteAddr: rmr.VA, RKey: rmr.RKey}))
				rc := w.poll(1, 1)
				sc := w.poll(0, 1)
				require.Equal(t, IBV_WC_SUCCESS, rc[0].Status)
				want := IBV_WC_RECV
				if op == IBV_WR_RDMA_WRITE_WITH_IMM {
					want = IBV_WC_RECV_RDMA_WITH_IMM
				}
				assert.Equal(t, WC{WRID: 9, Opcode: want, ByteLen: uint32(n), ImmData: 0xCAFE, Flags: IBV_WC_WITH_IMM,
					QPNum: 0x22, SrcQP: 0x11}, rc[0])
				assert.Equal(t, WC{WRID: 1, Opcode: map[WROpcode]WCOpcode{IBV_WR_SEND_WITH_IMM: IBV_WC_SEND,
					IBV_WR_RDMA_WRITE_WITH_IMM: IBV_WC_RDMA_WRITE}[op], ByteLen: uint32(n), QPNum: 0x11}, sc[0])
				assert.True(t, bytes.Equal(src[:n], dst[:n]))
				assert.Equal(t, make([]byte, 16), dst[n:])
				w.runUntil(nil)
				assert.Zero(t, w.sent[1], "a UC responder sends nothing")
				assert.Equal(t, packets(n, IBV_MTU_1024), w.sent[0])
				assert.True(t, w.qp[0].Deadline().IsZero(), "no ACK timer")
			})
		}
	}
}

// A dropped packet loses its message, and only it: the rest of the
// message is dropped, the next message completes into the receive WQE the
// lost one had begun, and no ACK, NAK or retransmission ever happens.
func TestUCAcrossDroppedPacket(t *testing.T) {
	for _, op := range []WROpcode{IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM} {
		t.Run(op.String(), func(t *testing.T) {
			w := newWire(t, ucOpts())
			// Message A takes PSNs 0x100-0x103; 0x101 is lost.
			w.drop = func(from int, p *bth.Packet) bool { return from == 0 && p.BTH.PSN == 0x101 }
			a, b := pattern(4000, 1), pattern(3000, 2)
			amr, _ := w.pd[0].RegMR(a, IBV_ACCESS_LOCAL_WRITE)
			bmr, _ := w.pd[0].RegMR(b, IBV_ACCESS_LOCAL_WRITE)
			remote := make([]byte, 8192)
			rmr, _ := w.pd[1].RegMR(remote, IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE)
			recv := [2][]byte{make([]byte, 4096), make([]byte, 4096)}
			for i := range recv {
				mr, _ := w.pd[1].RegMR(recv[i], IBV_ACCESS_LOCAL_WRITE)
				require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: uint64(10 + i), SGEs: []SGE{mr.SGE(0, 4096)}}))
			}
			require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 1, Opcode: op, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{amr.SGE(0, 4000)},
				RemoteAddr: rmr.VA, RKey: rmr.RKey, ImmData: 1}))
			require.NoError(t, w.qp[0].PostSend(SendWR{WRID: 2, Opcode: op, Flags: IBV_SEND_SIGNALED, SGEs: []SGE{bmr.SGE(0, 3000)},
				RemoteAddr: rmr.VA + 4096, RKey: rmr.RKey, ImmData: 2}))
			sc := w.poll(0, 2)
			assert.Equal(t, IBV_WC_SUCCESS, sc[0].Status)
			assert.Equal(t, IBV_WC_SUCCESS, sc[1].Status, "UC completes what it sent, lost or not")
			w.runUntil(nil)

			rc := make([]WC, 4)
			k := w.cq[1].Poll(rc)
			switch op {
			case IBV_WR_RDMA_WRITE:
				assert.Zero(t, k)
				assert.Equal(t, 2, w.qp[1].RecvQueued())
			default:
				require.Equal(t, 1, k, "only the second message completes")
				assert.Equal(t, uint64(10), rc[0].WRID, "into the first receive WQE, which the lost message gave back")
				assert.Equal(t, uint32(3000), rc[0].ByteLen)
				assert.Equal(t, 1, w.qp[1].RecvQueued())
			}
			if op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM {
				assert.True(t, bytes.Equal(b, recv[0][:3000]))
			} else {
				assert.True(t, bytes.Equal(b, remote[4096:7096]))
			}
			assert.Zero(t, w.sent[1], "no ACK or NAK, ever")
			assert.Equal(t, 7, w.sent[0], "no retransmission")
			c := w.qp[1].Counters
			assert.Equal(t, uint64(6), c.ReceivedPackets)
			assert.Equal(t, uint64(1), c.OutOfSequence, "0x102 shows the gap")
			assert.Equal(t, uint64(1), c.DroppedMsgPkts, "0x103, the rest of the message")
			assert.Equal(t, uint64(2), c.Drops())
			assert.Zero(t, c.NAKsSent)
			s := w.qp[0].Counters
			assert.Equal(t, uint64(7), s.SentPackets)
			assert.Zero(t, s.RetransmittedPkts)
			assert.Zero(t, s.ReceivedPackets)
			assert.Equal(t, IBV_QPS_RTS, w.qp[0].State())
			assert.Equal(t, IBV_QPS_RTS, w.qp[1].State())
		})
	}
}

// Random loss over many messages: every message that completes at the
// receiver is whole and in order, and nothing is ever sent back or sent
// again.
func TestUCLossy(t *testing.T) {
	w := newWire(t, ucOpts())
	w.loss = 0.05
	const n, size = 200, 2500
	src := pattern(n*size, 5)
	smr, _ := w.pd[0].RegMR(src, IBV_ACCESS_LOCAL_WRITE)
	dst := make([]byte, n*4096)
	dmr, _ := w.pd[1].RegMR(dst, IBV_ACCESS_LOCAL_WRITE)
	for i := range n {
		require.NoError(t, w.qp[1].PostRecv(RecvWR{WRID: uint64(i), SGEs: []SGE{dmr.SGE(i*4096, 4096)}}))
	}
	for i := range n {
		require.NoError(t, w.qp[0].PostSend(SendWR{WRID: uint64(i), Opcode: IBV_WR_SEND_WITH_IMM, SGEs: []SGE{smr.SGE(i*size, size)}, ImmData: uint32(i)}))
	}
	w.runUntil(nil)
	wcs := make([]WC, n)
	k := w.cq[1].Poll(wcs)
	require.Greater(t, k, n/2)
	require.Less(t, k, n, "5% loss over 3-packet messages loses some")
	last := -1
	for j, wc := range wcs[:k] {
		require.Equal(t, IBV_WC_SUCCESS, wc.Status)
		msg := int(wc.ImmData)
		require.Greater(t, msg, last, "in order")
		last = msg
		assert.Equal(t, uint64(j), wc.WRID, "receive WQEs are used in order, none lost")
		require.True(t, bytes.Equal(src[msg*size:(msg+1)*size], dst[j*4096:j*4096+size]), "message %d whole", msg)
	}
	assert.Zero(t, w.sent[1])
	c := w.qp[1].Counters
	assert.Equal(t, 3*n, w.sent[0], "no retransmission")
	assert.Less(t, c.ReceivedPackets, uint64(3*n))
	// Received packets were placed in completed messages, placed in
	// messages abandoned later, or counted as drops.
	assert.GreaterOrEqual(t, c.ReceivedPackets, uint64(3*k)+c.Drops())
	assert.NotZero(t, c.OutOfSequence)
}

// UC carries SEND and RDMA WRITE only: READ, atomics and SEND with
// Invalidate are refused at post time (rxe: EINVAL), and its state
// machine takes none of RC's acknowledgement attributes.
func TestUCVerbs(t *testing.T) {
	w := newWire(t, ucOpts())
	mr, _ := w.pd[0].RegMR(make([]byte, 64), IBV_ACCESS_LOCAL_WRITE)
	for _, op := range []WROpcode{IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND_WITH_INV} {
		err := w.qp[0].PostSend(SendWR{Opcode: op, SGEs: []SGE{mr.SGE(0, 8)}})
		assert.ErrorIs(t, err, ErrBadWR, "%s", op)
		assert.ErrorContains(t, err, "UC QP")
	}
	assert.Zero(t, w.qp[0].SendQueued())
	assert.Equal(t, IBV_QPT_UC, w.qp[0].Type())

	q, err := New(InitAttr{PD: w.pd[0], SendCQ: w.cq[0], RecvCQ: w.cq[0], QPType: IBV_QPT_UC})
	require.NoError(t, err)
	require.NoError(t, q.Modify(&Attr{State: IBV_QPS_INIT}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	rtr := &Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_4096, DestQPN: 0x22, AV: w.qp[0].Attr().AV}
	base := IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
	for _, extra := range []AttrMask{IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_QKEY} {
		assert.ErrorIs(t, q.Modify(rtr, base|extra), ErrBadTransition, "%s", extra)
	}
	assert.ErrorIs(t, q.Modify(rtr, base&^IBV_QP_RQ_PSN), ErrBadTransition)
	require.NoError(t, q.Modify(rtr, base))
	rts := &Attr{State: IBV_QPS_RTS, SQPSN: 5, Timeout: 14, RetryCnt: 7}
	for _, extra := range []AttrMask{IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_MAX_QP_RD_ATOMIC} {
		assert.ErrorIs(t, q.Modify(rts, IBV_QP_STATE|IBV_QP_SQ_PSN|extra), ErrBadTransition, "%s", extra)
	}
	require.NoError(t, q.Modify(rts, IBV_QP_STATE|IBV_QP_SQ_PSN))
	assert.Equal(t, IBV_QPS_RTS, q.State())
}

// A receive WQE whose buffer is gone is a local error on UC and UD as on
// RC: the WQE completes with IBV_WC_LOC_PROT_ERR and the QP moves to ERR,
// but nothing is sent back.
func TestUnreliableLocalProtectionError(t *testing.T) {
	for _, typ := range []QPType{IBV_QPT_UC, IBV_QPT_UD} {
		t.Run(typ.String(), func(t *testing.T) {
			d := newDropQPType(t, typ)
			buf, err := d.q.PD().RegMR(make([]byte, 128), IBV_ACCESS_LOCAL_WRITE)
			require.NoError(t, err)
			require.NoError(t, d.q.PostRecv(RecvWR{WRID: 4, SGEs: []SGE{buf.SGE(0, 128)}}))
			require.NoError(t, d.q.PD().DeregMR(buf))
			p := pkt(bth.UCSendOnly, 0x200)
			if typ == IBV_QPT_UD {
				p = pkt(bth.UDSendOnly, 0)
				p.DETH = bth.DETH{QKey: dropQKey, SrcQP: 0x33}
			}
			p.Payload = []byte("data")
			d.feed(p)
			wc := make([]WC, 2)
			require.Equal(t, 1, d.q.rcq.Poll(wc))
			assert.Equal(t, IBV_WC_LOC_PROT_ERR, wc[0].Status)
			assert.Equal(t, uint64(4), wc[0].WRID)
			assert.Equal(t, IBV_QPS_ERR, d.q.State())
			var out bth.Packet
			assert.False(t, d.q.NextPacket(d.now, &out), "no NAK from an unreliable QP")
		})
	}
}
