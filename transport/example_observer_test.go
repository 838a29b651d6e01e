package transport_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// An Observer sees every packet that crosses a Conn, with its direction,
// its own time and the decoded packet, without writing a file. Here it
// watches A's side of a SEND on an in-memory network; CaptureObserver
// would write the same packets to a pcap.Writer instead.
func ExampleWithObserver() {
	n := transport.NewNetwork(transport.Impairments{}, 1)
	var mu sync.Mutex
	var lines []string
	var eps [2]*transport.Endpoint
	for i, a := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
		c, err := n.Listen(netip.MustParseAddrPort(a))
		if err != nil {
			panic(err)
		}
		if i == 0 {
			c = transport.WithObserver(c, nil, func(e *transport.Event) {
				mu.Lock()
				defer mu.Unlock()
				line := fmt.Sprintf("%-3s %s PSN %#06x", e.Dir, e.Packet.BTH.Opcode, uint32(e.Packet.BTH.PSN))
				if e.Packet.BTH.Opcode.Info().Op == bth.OpAcknowledge {
					line += " " + e.Packet.AETH.Syndrome.KindName()
				}
				lines = append(lines, line)
			})
		}
		eps[i] = transport.NewEndpoint(c, transport.Options{})
		defer eps[i].Close()
	}
	var qps [2]*transport.QP
	var cqs [2]*transport.CQ
	var mrs [2]*qp.MR
	for i, ep := range eps {
		pd := ep.NewPD()
		cqs[i] = ep.NewCQ(4)
		qps[i], _ = ep.NewQP(pd, cqs[i], cqs[i], qp.InitAttr{SQSigAll: true})
		mrs[i], _ = pd.RegMR(make([]byte, 64), qp.IBV_ACCESS_LOCAL_WRITE)
	}
	for i := range 2 {
		// A local ACK timeout of 4.096 us * 2^24 (69 s), so that a busy
		// machine's slow ACK does not make a retransmission here.
		qps[i].Connect(transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN(), PSN: 0x100}, 0x100, transport.ConnectAttr{Timeout: 24})
	}
	qps[1].PostRecv(qp.RecvWR{SGEs: []qp.SGE{mrs[1].SGE(0, 64)}})
	qps[0].PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mrs[0].SGE(0, 64)}})
	wc := make([]qp.WC, 1)
	cqs[0].Wait(context.Background(), wc)
	fmt.Println("A's completion:", wc[0].Status)
	mu.Lock()
	defer mu.Unlock()
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// A's completion: SUCCESS
	// out RC_SEND_ONLY PSN 0x000100
	// in  RC_ACKNOWLEDGE PSN 0x000100 ACK
}
