package qp

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/bth"
)

// readReq is a READ request for n bytes of d's memory region at psn.
func (d *dropQP) readReq(psn bth.PSN, n uint32) bth.Packet {
	p := pkt(bth.RCReadRequest, psn)
	p.RETH = bth.RETH{VA: d.mr.VA, RKey: d.mr.RKey, DMALength: n}
	return p
}

// next hands out the QP's next packet.
func (d *dropQP) next(t *testing.T) bth.Packet {
	t.Helper()
	var p bth.Packet
	require.True(t, d.q.NextPacket(d.now, &p), "a packet to send")
	return p
}

// A READ request that finds max_dest_rd_atomic responses still being sent
// is NAKed Invalid Request and the QP goes to ERR; the responses queued
// before it, to READs executed within the limit, go out first, in PSN
// order, and then the NAK (as rxe, which sends each READ's response
// before it takes the next request): nothing after the NAK.
func TestReadBeyondMaxDestRdAtomic(t *testing.T) {
	d := newDropQP(t) // max_dest_rd_atomic 4, path MTU 1024
	psn := bth.PSN(0x200)
	for range 4 {
		d.feed(d.readReq(psn, 4096)) // 4 packets each
		psn = psn.Add(4)
	}
	require.Equal(t, IBV_QPS_RTS, d.q.State())
	require.Len(t, d.q.resp.out, 4)
	d.feed(d.readReq(psn, 4096))
	assert.Equal(t, IBV_QPS_ERR, d.q.State())
	assert.Equal(t, uint64(1), d.q.Counters.RespRdAtomicExceeded)
	assert.Equal(t, uint64(1), d.q.Counters.RespInvalidRequest)
	for i := range 16 {
		r := d.next(t)
		want := map[int]bth.Opcode{0: bth.RCReadResponseFirst, 3: bth.RCReadResponseLast}[i%4]
		if want == 0 {
			want = bth.RCReadResponseMiddle
		}
		assert.Equal(t, want, r.BTH.Opcode, "packet %d", i)
		assert.Equal(t, bth.PSN(0x200).Add(i), r.BTH.PSN, "packet %d", i)
		assert.Len(t, r.Payload, 1024, "packet %d", i)
	}
	nak := d.next(t)
	assert.Equal(t, bth.RCAcknowledge, nak.BTH.Opcode)
	assert.Equal(t, bth.SyndromeInvalidReq, nak.AETH.Syndrome)
	assert.Equal(t, psn, nak.BTH.PSN)
	var p bth.Packet
	assert.False(t, d.q.NextPacket(d.now, &p), "no READ response after the NAK")
	var qe *QPError
	require.True(t, errors.As(d.q.Err(), &qe))
	assert.True(t, qe.Responder)
	assert.Equal(t, IBV_WC_REM_INV_REQ_ERR, qe.Status)
	assert.Equal(t, psn, qe.PSN)
	assert.Contains(t, qe.Error(), "max_dest_rd_atomic 4")
	// Every later request is dropped in ERR, counted.
	d.feed(d.readReq(psn.Add(4), 4096))
	assert.Equal(t, uint64(1), d.q.Counters.QPStateErr)
}

// Once a response has been handed out in full its resource is free: a
// requester that keeps to max_dest_rd_atomic outstanding READs is served
// without end.
func TestReadWithinMaxDestRdAtomic(t *testing.T) {
	d := newDropQP(t)
	psn := bth.PSN(0x200)
	for i := range 100 {
		d.feed(d.readReq(psn, 2048))
		first := d.next(t)
		assert.Equal(t, bth.RCReadResponseFirst, first.BTH.Opcode, "READ %d", i)
		d.feed(d.readReq(psn.Add(2), 1024)) // the next arrives while the last packet is still queued
		last := d.next(t)
		assert.Equal(t, bth.RCReadResponseLast, last.BTH.Opcode)
		only := d.next(t)
		assert.Equal(t, bth.RCReadResponseOnly, only.BTH.Opcode)
		psn = psn.Add(3)
	}
	assert.Equal(t, IBV_QPS_RTS, d.q.State())
	assert.Zero(t, d.q.Counters.RespRdAtomicExceeded)
	assert.Nil(t, d.q.Err())
}

// Atomics take responder resources as READs do.
func TestAtomicBeyondMaxDestRdAtomic(t *testing.T) {
	d := newDropQP(t)
	for i := range 5 {
		p := pkt(bth.RCFetchAdd, bth.PSN(0x200).Add(i))
		p.AtomicETH = bth.AtomicETH{VA: d.mr.VA, RKey: d.mr.RKey, SwapAdd: 1}
		d.feed(p)
	}
	assert.Equal(t, IBV_QPS_ERR, d.q.State())
	assert.Equal(t, uint64(1), d.q.Counters.RespRdAtomicExceeded)
}

// max_dest_rd_atomic 0 leaves no responder resource: every READ is NAKed
// Invalid Request, as rxe does (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
func TestReadWithMaxDestRdAtomicZero(t *testing.T) {
	d := newDropQP(t)
	require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_RESET}, IBV_QP_STATE))
	all := IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
	require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_INIT, AccessFlags: all}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_RTR, PathMTU: IBV_MTU_1024, DestQPN: 0x22, RQPSN: 0x200,
		MaxDestRdAtomic: 0, MinRNRTimer: 1, AV: AddressVector{Remote: netip.MustParseAddrPort("192.0.2.2:4791")}},
		IBV_QP_STATE|IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_DEST_QPN|IBV_QP_RQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_MIN_RNR_TIMER))
	d.feed(d.readReq(0x200, 8))
	assert.Equal(t, IBV_QPS_ERR, d.q.State())
	assert.Equal(t, uint64(1), d.q.Counters.RespRdAtomicExceeded)
	assert.Equal(t, bth.SyndromeInvalidReq, d.next(t).AETH.Syndrome)
}

// Duplicates of a READ or atomic replace the answer still queued for it:
// a peer repeating them cannot grow the queue.
func TestDuplicateReadAtomicDoNotGrowQueue(t *testing.T) {
	d := newDropQP(t)
	d.feed(d.readReq(0x200, 4096)) // 4 packets
	p := pkt(bth.RCFetchAdd, 0x204)
	p.AtomicETH = bth.AtomicETH{VA: d.mr.VA + 8, RKey: d.mr.RKey, SwapAdd: 1}
	d.feed(p)
	require.Len(t, d.q.resp.out, 2)
	for range 1000 {
		d.feed(d.readReq(0x200, 4096))
		d.feed(p)
	}
	assert.Len(t, d.q.resp.out, 2)
	assert.Equal(t, uint64(2000), d.q.Counters.DuplicateRequest)
	assert.Equal(t, IBV_QPS_RTS, d.q.State())
}

// Err says nothing outside ERR, and why after Modify to ERR or a fatal
// NAK received.
func TestQPErr(t *testing.T) {
	d := newDropQP(t)
	assert.Nil(t, d.q.Err())
	d.post(t, IBV_WR_SEND, 8)
	d.feed(ack(0x100, bth.SyndromeRemoteAccess))
	var qe *QPError
	require.True(t, errors.As(d.q.Err(), &qe))
	assert.False(t, qe.Responder)
	assert.Equal(t, IBV_WC_REM_ACCESS_ERR, qe.Status)
	assert.Contains(t, qe.Error(), "IBV_WC_REM_ACCESS_ERR")

	d = newDropQP(t)
	require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_ERR}, IBV_QP_STATE))
	require.True(t, errors.As(d.q.Err(), &qe))
	assert.True(t, qe.Modified)
	require.NoError(t, d.q.Modify(&Attr{State: IBV_QPS_RESET}, IBV_QP_STATE))
	assert.Nil(t, d.q.Err())
}

// A requester that timed out retries READs whose answers already left:
// those replays take no responder resource, so the READ it posts once the
// first answer arrives is served (seen under -race in TestBWBidirectional:
// a replay counted as a resource refused the next READ).
func TestReadReplaysTakeNoResource(t *testing.T) {
	d := newDropQP(t) // max_dest_rd_atomic 4
	psn := bth.PSN(0x200)
	for range 4 {
		d.feed(d.readReq(psn, 1024))
		psn = psn.Next()
	}
	d.next(t) // the first answer leaves
	// The requester retries all four; the first is answered again.
	for i := range 4 {
		d.feed(d.readReq(bth.PSN(0x200).Add(i), 1024))
	}
	assert.Len(t, d.q.resp.out, 4, "three answers replaced, one appended")
	// The first answer arrived: the requester completes the first READ
	// and sends a fifth.
	d.feed(d.readReq(psn, 1024))
	assert.Equal(t, IBV_QPS_RTS, d.q.State())
	assert.Zero(t, d.q.Counters.RespRdAtomicExceeded)
	assert.Len(t, d.q.resp.out, 5)
	// A sixth, with four first answers still queued, is one too many.
	d.feed(d.readReq(psn.Next(), 1024))
	assert.Equal(t, IBV_QPS_ERR, d.q.State())
	assert.Equal(t, uint64(1), d.q.Counters.RespRdAtomicExceeded)
}
