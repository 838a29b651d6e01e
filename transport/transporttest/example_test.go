package transporttest_test

import (
	"fmt"
	"testing"

	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
)

// exampleTB lets the examples below call the helpers, which take the
// test's testing.TB, outside a test: failures panic and cleanups run when
// the example calls cleanup. In a test, pass its *testing.T instead.
type exampleTB struct {
	testing.TB // nil: the helpers call only the methods below
	cleanups   []func()
}

func (*exampleTB) Helper()                           {}
func (*exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (tb *exampleTB) Cleanup(f func())               { tb.cleanups = append(tb.cleanups, f) }
func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

// A connected pair, a SEND and an RDMA WRITE. In a test:
//
//	p := transporttest.NewPair(t, transporttest.Config{})
func ExampleNewPair() {
	t := &exampleTB{}
	defer t.cleanup()

	p := transporttest.NewPair(t, transporttest.Config{})
	fmt.Println("A", p.A.Addr, "QPN", p.A.QP.QPN(), p.A.QP.State())
	fmt.Println("B", p.B.Addr, "QPN", p.B.QP.QPN(), p.B.QP.State())

	inbox := p.B.Reg(make([]byte, 5))
	p.B.PostRecv(1, inbox)
	p.A.PostSend(2, p.A.Reg([]byte("hello")))
	for _, wc := range append(p.A.WaitOK(1), p.B.WaitOK(1)...) {
		fmt.Println(wc.WRID, wc.Opcode, wc.Status, wc.ByteLen)
	}
	fmt.Printf("%q\n", inbox.Buf)

	target := p.B.Reg(make([]byte, 8))
	p.A.PostWrite(3, p.A.Reg([]byte("by WRITE")), target)
	p.A.WaitOK(1)
	p.B.Endpoint.Sync()
	fmt.Printf("%q\n", target.Buf)
	// Output:
	// A 192.0.2.1:4791 QPN 17 RTS
	// B 192.0.2.2:4791 QPN 17 RTS
	// 2 SEND SUCCESS 5
	// 1 RECV SUCCESS 5
	// "hello"
	// "by WRITE"
}

// A pair over IPv6 on a network that loses one packet in five: every
// work request still completes.
func ExampleConfig_lossy() {
	t := &exampleTB{}
	defer t.cleanup()

	p := transporttest.NewPair(t, transporttest.Config{IPv6: true, Seed: 1,
		Impairments: transport.Impairments{Loss: 0.2}})
	src := p.A.Reg(make([]byte, 32<<10))
	for i := range src.Buf {
		src.Buf[i] = byte(i)
	}
	dst := p.B.Reg(make([]byte, 32<<10))
	p.A.PostWrite(1, src, dst)
	wc := p.A.WaitOK(1)[0]
	p.B.Endpoint.Sync()
	fmt.Println(p.A.Addr, "wrote", wc.ByteLen, "bytes to", p.B.Addr)
	fmt.Println("same bytes:", string(dst.Buf) == string(src.Buf))
	fmt.Println("retransmitted:", p.A.QP.Counters().RetransmittedPkts > 0)
	// Output:
	// [2001:db8::1]:4791 wrote 32768 bytes to [2001:db8::2]:4791
	// same bytes: true
	// retransmitted: true
}
