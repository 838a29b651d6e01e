package transport

import (
	"context"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/require"
)

// allocGate fails when f allocates on average once or more per call,
// after a warm-up that lets buffers and queues reach their size.
func allocGate(t *testing.T, name string, f func()) {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector changes what allocates")
	}
	for range 100 {
		f()
	}
	if n := testing.AllocsPerRun(200, f); n != 0 {
		t.Errorf("%s: %v allocations per packet, want 0", name, n)
	}
}

// connRound writes one RoCEv2 datagram from cs[0] and reads it at cs[1].
func connRound(t *testing.T, cs [2]Conn) func() {
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCWriteMiddle, PKey: 0xFFFF, DestQP: 0x11}, Payload: make([]byte, 1024)}
	e := bth.Encap{Src: cs[0].LocalAddr().Addr(), Dst: cs[1].LocalAddr().Addr(), SrcPort: cs[0].LocalAddr().Port(), DstPort: cs[1].LocalAddr().Port()}
	data, err := p.Append(nil, &e)
	require.NoError(t, err)
	out := []Datagram{{Data: data, Src: cs[0].LocalAddr(), Dst: cs[1].LocalAddr()}}
	in := make([]Datagram, 8)
	for i := range in {
		in[i].Data = make([]byte, 0, 16<<10)
	}
	return func() {
		if _, err := cs[0].WriteBatch(out); err != nil {
			t.Fatal(err)
		}
		if n, err := cs[1].ReadBatch(in); err != nil || n != 1 || len(in[0].Data) != len(data) {
			t.Fatal(n, err)
		}
	}
}

// Sending and receiving a datagram on the in-memory network allocates
// nothing.
func TestAllocsConnMem(t *testing.T) {
	cs := memConns(t)
	defer cs[0].Close()
	defer cs[1].Close()
	allocGate(t, "Network Conn", connRound(t, cs))
}

// An RDMA WRITE of one packet and its ACK between two Endpoints on the
// in-memory network: posting, sending, receiving, completing and waiting
// allocate nothing.
func TestAllocsEndpointMem(t *testing.T) {
	allocGate(t, "Endpoint WRITE", endpointWriteRound(t, memConns(t)))
}

// endpointWriteRound posts an RDMA WRITE of one 1 KiB packet from A to B
// and waits for its completion.
func endpointWriteRound(t *testing.T, cs [2]Conn) func() {
	s := connect(t, cs, defaultPair())
	smr, _ := s[0].pd.RegMR(make([]byte, 1024), qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := s[1].pd.RegMR(make([]byte, 1024), qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	return postWaitRound(t, s[0], qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 1024)}, RemoteAddr: dmr.VA, RKey: dmr.RKey})
}

// postWaitRound posts wr on s's QP and waits for its one successful
// completion.
func postWaitRound(t *testing.T, s *side, wr qp.SendWR) func() {
	wc := make([]qp.WC, 4)
	return func() {
		if err := s.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if n, err := s.cq.Wait(context.Background(), wc); err != nil || n != 1 || wc[0].Status != qp.IBV_WC_SUCCESS {
			t.Fatal(n, err)
		}
	}
}

// A READ of 256 packets, more than one send batch holds (the responder's
// Endpoint sends the first batch itself and the rest from its sender
// goroutine), allocates nothing either.
func TestAllocsEndpointReadMem(t *testing.T) {
	s := connect(t, memConns(t), defaultPair())
	const size = 256 << 10
	smr, _ := s[1].pd.RegMR(make([]byte, size), qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_READ)
	dmr, _ := s[0].pd.RegMR(make([]byte, size), qp.IBV_ACCESS_LOCAL_WRITE)
	allocGate(t, "Endpoint READ of 256 packets",
		postWaitRound(t, s[0], qp.SendWR{Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{dmr.SGE(0, size)}, RemoteAddr: smr.VA, RKey: smr.RKey}))
}
