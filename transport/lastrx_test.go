package transport_test

import (
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
	"github.com/stretchr/testify/assert"
)

// LastReceived is zero until the peer's first packet reaches the QP, then
// the Endpoint's time of the last one: the responder's at the SEND's
// arrival (one network delay after it left), the requester's at the ACK's.
// A packet from another host, dropped before the QP, does not move it.
func TestLastReceived(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 5 * time.Microsecond
		p := transporttest.NewPair(t, transporttest.Config{PSN: [2]bth.PSN{0x100, 0x200}, Impairments: transport.Impairments{Delay: delay}})
		assert.True(t, p.A.QP.LastReceived().IsZero())
		assert.True(t, p.B.QP.LastReceived().IsZero())
		src, dst := p.A.Reg([]byte("a message")), p.B.Reg(make([]byte, 64))
		p.B.PostRecv(1, dst)
		time.Sleep(time.Second)
		sent := time.Now()
		p.A.PostSend(1, src)
		p.A.WaitOK(1)
		p.B.WaitOK(1)
		synctest.Wait()
		assert.Equal(t, sent.Add(delay), p.B.QP.LastReceived(), "the SEND's arrival")
		assert.Equal(t, sent.Add(2*delay), p.A.QP.LastReceived(), "the ACK's arrival")

		before := p.B.QP.LastReceived()
		time.Sleep(time.Second)
		f := newForger(t, p.Network, netip.MustParseAddr("192.0.2.99"))
		f.send(p.B.Addr, 5000, bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: p.B.QP.QPN(), PSN: 0x101, AckReq: true},
			Payload: []byte("stranger")})
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, uint64(1), p.B.Endpoint.Stats().BadSource, "dropped before the QP")
		assert.Equal(t, before, p.B.QP.LastReceived(), "a packet from another host")
	})
}
