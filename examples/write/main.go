// Command write places data in a peer's memory with one RDMA WRITE with
// immediate: the peer's CPU learns of it from a receive completion that
// carries the immediate value, and finds the bytes already in its buffer.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run does the work and prints what happened to out.
func run(out io.Writer) error {
	ctx := context.Background()
	var eps [2]*transport.Endpoint
	var qps [2]*transport.QP
	var cqs [2]*transport.CQ
	var pds [2]*transport.PD
	for i, addr := range []string{"127.0.0.1:0", "127.0.0.2:0"} {
		conn, err := transport.ListenUDP(netip.MustParseAddrPort(addr), transport.UDPOptions{EphemeralPort: true})
		if err != nil {
			return err
		}
		eps[i] = transport.NewEndpoint(conn, transport.Options{})
		defer eps[i].Close()
		pds[i] = eps[i].NewPD()
		cqs[i] = eps[i].NewCQ(16)
		if qps[i], err = eps[i].NewQP(pds[i], cqs[i], cqs[i], qp.InitAttr{SQSigAll: true}); err != nil {
			return err
		}
	}
	// The target allows remote writes; the MTU splits the 10000 bytes
	// into ten packets.
	attr := transport.ConnectAttr{PathMTU: qp.IBV_MTU_1024, Access: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE}
	for i := range 2 {
		peer := transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN(), PSN: 0xFFFFFA} // the PSNs wrap
		if err := qps[i].Connect(peer, 0xFFFFFA, attr); err != nil {
			return err
		}
	}
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i)
	}
	src, err := pds[0].RegMR(data, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return err
	}
	target := make([]byte, len(data))
	dst, err := pds[1].RegMR(target, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	if err != nil {
		return err
	}
	// The target's address and R_Key would travel out of band; a WRITE
	// with immediate consumes a receive work request at the target.
	if err := qps[1].PostRecv(qp.RecvWR{WRID: 1}); err != nil {
		return err
	}
	if err := qps[0].PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_RDMA_WRITE_WITH_IMM, SGEs: []qp.SGE{src.SGE(0, len(data))},
		RemoteAddr: dst.VA, RKey: dst.RKey, ImmData: 0xCAFE}); err != nil {
		return err
	}
	wc := make([]qp.WC, 1)
	if _, err := cqs[1].Wait(ctx, wc); err != nil {
		return err
	}
	fmt.Fprintf(out, "target: %s %s, %d bytes, immediate %#x\n", wc[0].Opcode, wc[0].Status, wc[0].ByteLen, wc[0].ImmData)
	same := true
	for i := range target {
		same = same && target[i] == data[i]
	}
	fmt.Fprintf(out, "target buffer matches: %v; writer sent %d packets\n", same, qps[0].Counters().SentPackets)
	return nil
}
