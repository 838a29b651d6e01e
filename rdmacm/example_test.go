package rdmacm_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/roce-emu/roce-emu/transport"
)

// Two Endpoints on the in-memory network: one listens on rdma_cm port
// 7174 and accepts, the other dials; the connected QPs carry a SEND.
func Example() {
	n := transport.NewNetwork(transport.Impairments{}, 1)
	open := func(addr string) (*transport.Endpoint, *rdmacm.Service) {
		c, _ := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 4791))
		ep := transport.NewEndpoint(c, transport.Options{})
		svc, err := rdmacm.New(ep, rdmacm.Config{})
		if err != nil {
			panic(err)
		}
		return ep, svc
	}
	epA, client := open("192.0.2.1")
	defer epA.Close()
	defer client.Close()
	epB, server := open("192.0.2.2")
	defer epB.Close()
	defer server.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	params := func(ep *transport.Endpoint) rdmacm.ConnParams {
		cq := ep.NewCQ(16)
		return rdmacm.ConnParams{PD: ep.NewPD(), SendCQ: cq, RecvCQ: cq, SQSigAll: true,
			ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}
	}
	l, _ := server.Listen(7174)
	pb := params(epB)
	buf := make([]byte, 16)
	mr, _ := pb.PD.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
	pb.RecvWRs = []qp.RecvWR{{WRID: 1, SGEs: []qp.SGE{mr.SGE(0, len(buf))}}}
	accepted := make(chan *rdmacm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx, pb)
		if err != nil {
			fmt.Println("accept:", err)
		}
		accepted <- c
	}()
	pa := params(epA)
	conn, err := client.Dial(ctx, server.LocalAddr(), 7174, pa)
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	peer := <-accepted
	fmt.Println("connected: client QP in", conn.QP().State(), "to QPN", conn.Params().RemoteQPN == peer.QP().QPN())

	msg, _ := pa.PD.RegMR([]byte("hello"), qp.IBV_ACCESS_LOCAL_WRITE)
	_ = conn.QP().PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{msg.SGE(0, 5)}})
	wc := make([]qp.WC, 1)
	_, _ = pb.RecvCQ.Wait(ctx, wc)
	epB.Sync()
	fmt.Printf("server received %q\n", buf[:wc[0].ByteLen])

	_ = conn.Disconnect(ctx)
	<-peer.Disconnected()
	fmt.Println("disconnected; server QP in", peer.QP().State())
	_ = conn.Close()
	_ = peer.Close()
	// Output:
	// connected: client QP in RTS to QPN true
	// server received "hello"
	// disconnected; server QP in ERR
}
