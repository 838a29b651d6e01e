// Command read fetches a peer's memory with RDMA READ: only the reader's
// CPU takes part; the peer's QP answers from its registered memory.
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
	attr := transport.ConnectAttr{PathMTU: qp.IBV_MTU_4096, Access: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_READ}
	for i := range 2 {
		peer := transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN(), PSN: 7}
		if err := qps[i].Connect(peer, 7, attr); err != nil {
			return err
		}
	}
	exposed := []byte("the responder's memory, read without its CPU")
	remote, err := pds[1].RegMR(exposed, qp.IBV_ACCESS_REMOTE_READ)
	if err != nil {
		return err
	}
	local := make([]byte, len(exposed))
	lmr, err := pds[0].RegMR(local, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return err
	}
	if err := qps[0].PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{lmr.SGE(0, len(local))},
		RemoteAddr: remote.VA, RKey: remote.RKey}); err != nil {
		return err
	}
	wc := make([]qp.WC, 1)
	if _, err := cqs[0].Wait(ctx, wc); err != nil {
		return err
	}
	fmt.Fprintf(out, "reader: %s %s, %d bytes: %q\n", wc[0].Opcode, wc[0].Status, wc[0].ByteLen, local)
	// A READ outside the region is refused with a remote access error.
	if err := qps[0].PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_RDMA_READ, SGEs: []qp.SGE{lmr.SGE(0, 8)},
		RemoteAddr: remote.VA + 4096, RKey: remote.RKey}); err != nil {
		return err
	}
	if _, err := cqs[0].Wait(ctx, wc); err != nil {
		return err
	}
	fmt.Fprintf(out, "reader, out of bounds: %s; the QP is now %s\n", wc[0].Status, qps[0].State())
	return nil
}
