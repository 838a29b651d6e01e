// Command sendrecv sends one message from one RC queue pair to another over
// UDP on loopback: the receiver posts a buffer, the sender posts a SEND, and
// both wait for their completions.
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
	// Two endpoints, as two hosts would have. Port 0 with EphemeralPort lets
	// the kernel pick free ports; peers on real hosts use 4791.
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
	// What an out-of-band exchange would tell each side about the other.
	for i := range 2 {
		peer := transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN(), PSN: 100}
		if err := qps[i].Connect(peer, 100, transport.ConnectAttr{}); err != nil {
			return err
		}
	}

	msg := []byte("hello over RoCEv2")
	smr, err := pds[0].RegMR(msg, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return err
	}
	inbox := make([]byte, 64)
	rmr, err := pds[1].RegMR(inbox, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		return err
	}
	if err := qps[1].PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{rmr.SGE(0, len(inbox))}}); err != nil {
		return err
	}
	if err := qps[0].PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(msg))}}); err != nil {
		return err
	}
	wc := make([]qp.WC, 1)
	for i, who := range []string{"sender", "receiver"} {
		if _, err := cqs[i].Wait(ctx, wc); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: %s %s, %d bytes\n", who, wc[0].Opcode, wc[0].Status, wc[0].ByteLen)
	}
	fmt.Fprintf(out, "received %q\n", inbox[:wc[0].ByteLen])
	return nil
}
