package transport

import (
	"context"
	"net/netip"
	"testing"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// The datapath benchmarks: one op is one packet through the datapath, and
// each reports its allocations, which must be 0 per op once warm.
//
//	go test ./transport -run '^$' -bench 'Conn|Endpoint' -benchmem

// memConns returns two Conns, 192.0.2.1:4791 and 192.0.2.2:4791, on a
// Network with no impairments.
func memConns(b testing.TB) [2]Conn {
	n := NewNetwork(Impairments{}, 1)
	var cs [2]Conn
	for i, a := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
		c, err := n.Listen(netip.MustParseAddrPort(a))
		if err != nil {
			b.Fatal(err)
		}
		cs[i] = c
	}
	return cs
}

// benchConn sends one 1 KiB RoCEv2 packet from cs[0] to cs[1] and reads it
// there, per op.
func benchConn(b *testing.B, cs [2]Conn) {
	defer cs[0].Close()
	defer cs[1].Close()
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCWriteMiddle, PKey: 0xFFFF, DestQP: 0x11}, Payload: make([]byte, 1024)}
	e := bth.Encap{Src: cs[0].LocalAddr().Addr(), Dst: cs[1].LocalAddr().Addr(), SrcPort: cs[0].LocalAddr().Port(), DstPort: cs[1].LocalAddr().Port()}
	data, err := p.Append(nil, &e)
	if err != nil {
		b.Fatal(err)
	}
	out := []Datagram{{Data: data, Src: cs[0].LocalAddr(), Dst: cs[1].LocalAddr()}}
	in := make([]Datagram, 8)
	for i := range in {
		in[i].Data = make([]byte, 0, 16<<10)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cs[0].WriteBatch(out); err != nil {
			b.Fatal(err)
		}
		if n, err := cs[1].ReadBatch(in); err != nil || n != 1 || len(in[0].Data) != len(data) {
			b.Fatal(n, err)
		}
	}
}

func BenchmarkConnMem(b *testing.B) { benchConn(b, memConns(b)) }

// benchEndpointWrite runs one RDMA WRITE of one 1 KiB packet per op
// between two Endpoints and waits for its completion: A's Endpoint sends
// the packet and receives the ACK, B's receives the packet and sends the
// ACK.
func benchEndpointWrite(b *testing.B, conns [2]Conn) {
	s := connect(b, conns, defaultPair())
	src := make([]byte, 1024)
	dst := make([]byte, 1024)
	smr, _ := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	wr := qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, len(src))}, RemoteAddr: dmr.VA, RKey: dmr.RKey}
	wc := make([]qp.WC, 4)
	ctx := context.Background()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s[0].qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if n, err := s[0].cq.Wait(ctx, wc); err != nil || n != 1 || wc[0].Status != qp.IBV_WC_SUCCESS {
			b.Fatal(n, err, wc[0].Status)
		}
	}
}

// benchEndpointSend runs one SEND of one 1 KiB packet per op into a
// receive B posted, and waits for both completions.
func benchEndpointSend(b *testing.B, conns [2]Conn) {
	s := connect(b, conns, defaultPair())
	src := make([]byte, 1024)
	dst := make([]byte, 1024)
	smr, _ := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE)
	wr := qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(src))}}
	rwr := qp.RecvWR{SGEs: []qp.SGE{dmr.SGE(0, len(dst))}}
	wc := make([]qp.WC, 4)
	ctx := context.Background()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s[1].qp.PostRecv(rwr); err != nil {
			b.Fatal(err)
		}
		if err := s[0].qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for _, c := range []*CQ{s[0].cq, s[1].cq} {
			if n, err := c.Wait(ctx, wc); err != nil || n != 1 || wc[0].Status != qp.IBV_WC_SUCCESS {
				b.Fatal(n, err, wc[0].Status)
			}
		}
	}
}

func BenchmarkEndpointMem(b *testing.B) {
	b.Run("write", func(b *testing.B) { benchEndpointWrite(b, memConns(b)) })
	b.Run("send", func(b *testing.B) { benchEndpointSend(b, memConns(b)) })
}
