package transport_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"net/netip"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// Two RC queue pairs on an in-memory network, one SEND between them. A
// program on real hosts does the same with transport.ListenUDP instead of
// Network.Listen, and learns the peer's address, QPN and PSN out of band.
//
// Under testing/synctest the same code runs in simulated time, so that
// delays, losses and the QPs' retransmission timers cost nothing and every
// run is the same. An example cannot call synctest.Test (it needs the
// test's *testing.T); the test TestExampleSynctest in this package's
// example_test.go is:
//
//	func TestExampleSynctest(t *testing.T) {
//		synctest.Test(t, func(t *testing.T) {
//			network := transport.NewNetwork(transport.Impairments{Delay: 20 * time.Microsecond, Loss: 0.1}, 1)
//			var eps [2]*transport.Endpoint
//			var qps [2]*transport.QP
//			var cqs [2]*transport.CQ
//			for i, addr := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
//				conn, err := network.Listen(netip.MustParseAddrPort(addr))
//				if err != nil {
//					t.Fatal(err)
//				}
//				eps[i] = transport.NewEndpoint(conn, transport.Options{})
//				t.Cleanup(func() { eps[i].Close() })
//				cqs[i] = eps[i].NewCQ(64)
//				if qps[i], err = eps[i].NewQP(eps[i].NewPD(), cqs[i], cqs[i], qp.InitAttr{SQSigAll: true}); err != nil {
//					t.Fatal(err)
//				}
//			}
//			for i := range 2 {
//				peer := transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN()}
//				if err := qps[i].Connect(peer, 0, transport.ConnectAttr{}); err != nil {
//					t.Fatal(err)
//				}
//			}
//			start := time.Now() // simulated: the bubble's clock
//			for i := range 100 {
//				if err := qps[0].PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_SEND}); err != nil {
//					t.Fatal(err)
//				}
//				if err := qps[1].PostRecv(qp.RecvWR{WRID: uint64(i)}); err != nil {
//					t.Fatal(err)
//				}
//			}
//			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
//			defer cancel()
//			wc := make([]qp.WC, 100)
//			for got := 0; got < 100; {
//				n, err := cqs[0].Wait(ctx, wc)
//				if err != nil {
//					t.Fatalf("%d of 100 SENDs completed: %v", got, err)
//				}
//				for _, c := range wc[:n] {
//					if c.Status != qp.IBV_WC_SUCCESS {
//						t.Fatalf("SEND %d: %s", c.WRID, c.Status)
//					}
//				}
//				got += n
//			}
//			// With 10% loss some SENDs waited for a NAK or an ACK timeout, in
//			// simulated time: the same elapsed time on every run.
//			t.Logf("100 SENDs in %v, %d packets retransmitted", time.Since(start), qps[0].Counters().RetransmittedPkts)
//		})
//	}
func Example() {
	ctx := context.Background()
	network := transport.NewNetwork(transport.Impairments{Delay: 10 * time.Microsecond}, 1)
	var eps [2]*transport.Endpoint
	var qps [2]*transport.QP
	var cqs [2]*transport.CQ
	var pds [2]*transport.PD
	for i, addr := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
		conn, err := network.Listen(netip.MustParseAddrPort(addr))
		if err != nil {
			log.Fatal(err)
		}
		eps[i] = transport.NewEndpoint(conn, transport.Options{})
		defer eps[i].Close()
		pds[i] = eps[i].NewPD()
		cqs[i] = eps[i].NewCQ(16)
		if qps[i], err = eps[i].NewQP(pds[i], cqs[i], cqs[i], qp.InitAttr{SQSigAll: true}); err != nil {
			log.Fatal(err)
		}
	}
	// What an out-of-band exchange tells each side: address, QPN, first PSN.
	for i := range 2 {
		peer := transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN(), PSN: 100}
		if err := qps[i].Connect(peer, 100, transport.ConnectAttr{}); err != nil {
			log.Fatal(err)
		}
	}
	msg := []byte("hello over RoCEv2")
	smr, err := pds[0].RegMR(msg, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		log.Fatal(err)
	}
	inbox := make([]byte, 64)
	rmr, err := pds[1].RegMR(inbox, qp.IBV_ACCESS_LOCAL_WRITE)
	if err != nil {
		log.Fatal(err)
	}
	if err := qps[1].PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{rmr.SGE(0, len(inbox))}}); err != nil {
		log.Fatal(err)
	}
	if err := qps[0].PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(msg))}}); err != nil {
		log.Fatal(err)
	}
	wc := make([]qp.WC, 1)
	for i, who := range []string{"sender", "receiver"} {
		if _, err := cqs[i].Wait(ctx, wc); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: QPN %#x %s %s, %d bytes\n", who, wc[0].QPNum, wc[0].Opcode, wc[0].Status, wc[0].ByteLen)
	}
	fmt.Printf("received %q\n", inbox[:wc[0].ByteLen])
	// Output:
	// sender: QPN 0x11 SEND SUCCESS, 17 bytes
	// receiver: QPN 0x11 RECV SUCCESS, 17 bytes
	// received "hello over RoCEv2"
}

func TestExampleSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		network := transport.NewNetwork(transport.Impairments{Delay: 20 * time.Microsecond, Loss: 0.1}, 1)
		var eps [2]*transport.Endpoint
		var qps [2]*transport.QP
		var cqs [2]*transport.CQ
		for i, addr := range []string{"192.0.2.1:4791", "192.0.2.2:4791"} {
			conn, err := network.Listen(netip.MustParseAddrPort(addr))
			if err != nil {
				t.Fatal(err)
			}
			eps[i] = transport.NewEndpoint(conn, transport.Options{})
			t.Cleanup(func() { eps[i].Close() })
			cqs[i] = eps[i].NewCQ(64)
			if qps[i], err = eps[i].NewQP(eps[i].NewPD(), cqs[i], cqs[i], qp.InitAttr{SQSigAll: true}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 2 {
			peer := transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN()}
			if err := qps[i].Connect(peer, 0, transport.ConnectAttr{}); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now() // simulated: the bubble's clock
		for i := range 100 {
			if err := qps[0].PostSend(qp.SendWR{WRID: uint64(i), Opcode: qp.IBV_WR_SEND}); err != nil {
				t.Fatal(err)
			}
			if err := qps[1].PostRecv(qp.RecvWR{WRID: uint64(i)}); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		wc := make([]qp.WC, 100)
		for got := 0; got < 100; {
			n, err := cqs[0].Wait(ctx, wc)
			if err != nil {
				t.Fatalf("%d of 100 SENDs completed: %v", got, err)
			}
			for _, c := range wc[:n] {
				if c.Status != qp.IBV_WC_SUCCESS {
					t.Fatalf("SEND %d: %s", c.WRID, c.Status)
				}
			}
			got += n
		}
		// With 10% loss some SENDs waited for a NAK or an ACK timeout, in
		// simulated time: the same elapsed time on every run.
		t.Logf("100 SENDs in %v, %d packets retransmitted", time.Since(start), qps[0].Counters().RetransmittedPkts)
	})
}

// The doc comment of Example shows TestExampleSynctest as it is.
func TestExampleDocShowsSynctestTest(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var code, shown string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		switch fn.Name.Name {
		case "TestExampleSynctest":
			code = string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
		case "Example":
			var lines []string
			for _, line := range strings.Split(fn.Doc.Text(), "\n") {
				if strings.HasPrefix(line, "\t") {
					lines = append(lines, strings.TrimPrefix(line, "\t"))
				}
			}
			shown = strings.Join(lines, "\n")
		}
	}
	if code == "" || shown != code {
		t.Errorf("Example's comment shows\n%s\n\nbut TestExampleSynctest is\n%s", shown, code)
	}
}
