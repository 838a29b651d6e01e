package transport_test

import (
	"bytes"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forger is another process on a peer's host: a socket at the peer's IP
// address on another UDP port, sending packets with valid ICRCs.
type forger struct {
	t    testing.TB
	conn transport.Conn
}

func newForger(t testing.TB, n *transport.Network, host netip.Addr) *forger {
	c, err := n.Listen(netip.AddrPortFrom(host, 5000))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &forger{t: t, conn: c}
}

// send sends p to dst from the forger's address and UDP source port sport.
func (f *forger) send(dst netip.AddrPort, sport uint16, p bth.Packet) {
	src := netip.AddrPortFrom(f.conn.LocalAddr().Addr(), sport)
	e := bth.Encap{Src: src.Addr(), Dst: dst.Addr(), SrcPort: sport, DstPort: dst.Port()}
	data, err := p.Append(nil, &e)
	require.NoError(f.t, err)
	_, err = f.conn.WriteBatch([]transport.Datagram{{Data: data, Src: src, Dst: dst}})
	require.NoError(f.t, err)
}

var sourceModes = []struct {
	name   string
	source transport.SourceCheck
}{{"strict", transport.SourceStrict}, {"addr-only", transport.SourceAddrOnly}}

func bothOptions(s transport.SourceCheck) [2]transport.Options {
	return [2]transport.Options{{Source: s}, {Source: s}}
}

// A forged SEND from another port of the requester's host, at the PSN the
// responder expects next: under SourceStrict it is counted and dropped and
// the real SEND lands intact; with the address check alone (rxe's) the
// forged bytes land and the real SEND is discarded as a duplicate.
func TestSourceForgedSEND(t *testing.T) {
	for _, m := range sourceModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := transporttest.NewPair(t, transporttest.Config{PSN: [2]bth.PSN{0x100, 0x200}, Options: bothOptions(m.source)})
				real1, real2 := p.A.Reg([]byte("first real message")), p.A.Reg([]byte("second real message"))
				dst1, dst2 := p.B.Reg(make([]byte, 64)), p.B.Reg(make([]byte, 64))
				p.B.PostRecv(1, dst1)
				p.B.PostRecv(2, dst2)
				p.A.PostSend(1, real1)
				p.A.WaitOK(1)
				p.B.WaitOK(1)
				port, pinned := p.B.QP.PeerSourcePort()
				if m.source == transport.SourceStrict {
					require.True(t, pinned)
					assert.Equal(t, p.A.QP.SourcePort(), port, "B pinned A's QP's source port")
				} else {
					assert.False(t, pinned)
				}

				f := newForger(t, p.Network, p.A.Addr.Addr())
				forged := []byte("forged bytes!!")
				f.send(p.B.Addr, 5000, bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: p.B.QP.QPN(), PSN: 0x101, AckReq: true},
					Payload: forged})
				synctest.Wait()
				p.A.PostSend(2, real2)
				p.A.WaitOK(1)
				wc := p.B.WaitOK(1)
				p.B.Endpoint.Sync()
				st, c := p.B.Endpoint.Stats(), p.B.QP.Counters()
				if m.source == transport.SourceStrict {
					assert.Equal(t, uint64(1), st.BadSourcePort)
					assert.Equal(t, uint32(len(real2.Buf)), wc[0].ByteLen)
					assert.Equal(t, real2.Buf, dst2.Buf[:len(real2.Buf)], "the real SEND landed intact")
					assert.Zero(t, c.DuplicateRequest)
				} else {
					assert.Zero(t, st.BadSourcePort)
					assert.Equal(t, forged, dst2.Buf[:len(forged)], "without the port check the forged SEND lands")
					assert.Equal(t, uint64(1), c.DuplicateRequest, "and the real one is taken for a duplicate")
				}
				assert.Equal(t, real1.Buf, dst1.Buf[:len(real1.Buf)])
			})
		})
	}
}

// A port announced out of band (Remote.SourcePort) is pinned before any
// packet: a forged SEND that arrives before the real peer's first packet
// is dropped too.
func TestSourceAnnouncedPort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{}, 1)
		var eps [2]*transport.Endpoint
		var qps [2]*transport.QP
		var cqs [2]*transport.CQ
		var pds [2]*transport.PD
		for i, a := range transporttest.DefaultAddrs4 {
			c, err := n.Listen(a)
			require.NoError(t, err)
			eps[i] = transport.NewEndpoint(c, transport.Options{})
			t.Cleanup(func() { eps[i].Close() })
			pds[i], cqs[i] = eps[i].NewPD(), eps[i].NewCQ(16)
			qps[i], err = eps[i].NewQP(pds[i], cqs[i], cqs[i], qp.InitAttr{SQSigAll: true})
			require.NoError(t, err)
		}
		// A's source port towards B is the Linux rule's, which B (knowing
		// both QPNs) can announce to itself as an exchange would.
		aPort := bth.SourcePort(0, qps[0].QPN(), qps[1].QPN())
		require.NoError(t, qps[0].Connect(transport.Remote{Addr: eps[1].LocalAddr(), QPN: qps[1].QPN(), PSN: 0x200}, 0x100, transport.ConnectAttr{}))
		require.NoError(t, qps[1].Connect(transport.Remote{Addr: eps[0].LocalAddr(), QPN: qps[0].QPN(), PSN: 0x100, SourcePort: aPort}, 0x200, transport.ConnectAttr{}))
		require.Equal(t, aPort, qps[0].SourcePort())
		port, pinned := qps[1].PeerSourcePort()
		require.True(t, pinned)
		require.Equal(t, aPort, port)

		f := newForger(t, n, eps[0].LocalAddr().Addr())
		f.send(eps[1].LocalAddr(), 5000, bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: qps[1].QPN(), PSN: 0x100},
			Payload: []byte("forged")})
		synctest.Wait()
		assert.Equal(t, uint64(1), eps[1].Stats().BadSourcePort)

		src := []byte("the real first message")
		dst := make([]byte, 64)
		smr, err := pds[0].RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		dmr, err := pds[1].RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		require.NoError(t, qps[1].PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{dmr.SGE(0, len(dst))}}))
		require.NoError(t, qps[0].PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(src))}}))
		wc := transporttest.WaitN(t, t.Context(), cqs[1], 1)
		require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
		eps[1].Sync()
		assert.Equal(t, src, dst[:len(src)])
		assert.Equal(t, uint32(len(src)), wc[0].ByteLen)
	})
}

// A forged ACK for a SEND that never left: under SourceStrict it is
// dropped, and the SEND completes only once its retransmission reached
// the responder; with the address check alone it completes a SEND the
// responder never saw.
func TestSourceForgedACK(t *testing.T) {
	for _, m := range sourceModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rule, err := transport.ParseFault("drop:dir=out,opcode=RC_SEND_ONLY,nth=2")
				require.NoError(t, err)
				p := transporttest.NewPair(t, transporttest.Config{PSN: [2]bth.PSN{0x100, 0x200}, Options: bothOptions(m.source),
					WrapConn: func(side int, c transport.Conn) transport.Conn {
						if side == 0 {
							return transport.WithFaults(c, transport.NewFaults(1, rule), nil)
						}
						return c
					}})
				real1, real2 := p.A.Reg([]byte("first")), p.A.Reg([]byte("second, lost once"))
				dst1, dst2 := p.B.Reg(make([]byte, 64)), p.B.Reg(make([]byte, 64))
				p.B.PostRecv(1, dst1)
				p.B.PostRecv(2, dst2)
				p.A.PostSend(1, real1)
				p.A.WaitOK(1)
				p.B.WaitOK(1)

				p.A.PostSend(2, real2) // dropped on its way out
				f := newForger(t, p.Network, p.B.Addr.Addr())
				f.send(p.A.Addr, 5000, bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: p.A.QP.QPN(), PSN: 0x101},
					AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: 2}})
				p.A.WaitOK(1)
				synctest.Wait()
				st, c := p.A.Endpoint.Stats(), p.A.QP.Counters()
				if m.source == transport.SourceStrict {
					assert.Equal(t, uint64(1), st.BadSourcePort)
					assert.Equal(t, uint64(1), c.RetransmittedPkts, "the SEND completed by its retransmission, not the forged ACK")
					wc := p.B.WaitOK(1)
					p.B.Endpoint.Sync()
					assert.Equal(t, uint32(len(real2.Buf)), wc[0].ByteLen)
					assert.Equal(t, real2.Buf, dst2.Buf[:len(real2.Buf)])
				} else {
					assert.Zero(t, st.BadSourcePort)
					assert.Zero(t, c.RetransmittedPkts, "the forged ACK completed the SEND")
					var wc [1]qp.WC
					assert.Zero(t, p.B.CQ.Poll(wc[:]), "B never received the SEND that completed")
				}
			})
		})
	}
}

// Forged RNR NAKs every 0.5 s: under SourceStrict they never reach the
// requester, whose SENDs complete in one round trip; with the address
// check alone the requester takes them.
func TestSourceForgedRNRNAK(t *testing.T) {
	for _, m := range sourceModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := transporttest.NewPair(t, transporttest.Config{PSN: [2]bth.PSN{0x100, 0x200}, Options: bothOptions(m.source),
					Impairments: transport.Impairments{Delay: time.Millisecond}})
				msgs := make([]*qp.MR, 5)
				dsts := make([]*qp.MR, 5)
				for i := range msgs {
					msgs[i] = p.A.Reg(bytes.Repeat([]byte{byte('a' + i)}, 100+i))
					dsts[i] = p.B.Reg(make([]byte, 128))
					p.B.PostRecv(uint64(i), dsts[i])
				}
				p.A.PostSend(0, msgs[0]) // pins the ports
				p.A.WaitOK(1)
				p.B.WaitOK(1)

				f := newForger(t, p.Network, p.B.Addr.Addr())
				var slowest time.Duration
				for i := 1; i < len(msgs); i++ {
					start := time.Now()
					p.A.PostSend(uint64(i), msgs[i])
					// Timer code 0 asks for the longest wait, 655.36 ms;
					// it reaches A a millisecond before B's real ACK.
					f.send(p.A.Addr, 5000, bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: p.A.QP.QPN(), PSN: 0x100 + bth.PSN(i)},
						AETH: bth.AETH{Syndrome: bth.RNRNAKSyndrome(0), MSN: uint32(i)}})
					p.A.WaitOK(1)
					slowest = max(slowest, time.Since(start))
					p.B.WaitOK(1)
					time.Sleep(500 * time.Millisecond)
				}
				p.B.Endpoint.Sync()
				st, c := p.A.Endpoint.Stats(), p.A.QP.Counters()
				if m.source == transport.SourceStrict {
					assert.Equal(t, uint64(4), st.BadSourcePort)
					assert.Zero(t, c.RNRNakRetryErr, "no forged RNR NAK reached the QP")
					assert.LessOrEqual(t, slowest, 3*time.Millisecond, "each SEND completed in one round trip (simulated time)")
					for i := range msgs {
						assert.Equal(t, msgs[i].Buf, dsts[i].Buf[:len(msgs[i].Buf)], "message %d", i)
					}
				} else {
					t.Logf("addr-only: %d RNR NAKs taken, slowest SEND %v", c.RNRNakRetryErr, slowest)
					assert.Zero(t, st.BadSourcePort)
					assert.NotZero(t, c.RNRNakRetryErr, "forged RNR NAKs reached the QP")
					assert.Greater(t, slowest, 30*time.Millisecond, "a forged RNR NAK held a SEND back")
				}
			})
		})
	}
}

// Forged CNPs from another port of the peer's host: under SourceStrict
// they are counted apart and the sender's DCQCN rate stays at line rate;
// a CNP from UDP port 0 (ConnectX's, which no unprivileged socket can
// send from) still acts. With the address check alone the forged CNPs
// cut the rate.
func TestSourceForgedCNP(t *testing.T) {
	params, err := cc.Profile(cc.ProfilePaper, 10*cc.Gbps)
	require.NoError(t, err)
	for _, m := range sourceModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := transporttest.NewPair(t, transporttest.Config{Options: bothOptions(m.source),
					InitAttr: &qp.InitAttr{SQSigAll: true, CC: &params}})
				src, dst := p.A.Reg([]byte("pins the ports")), p.B.Reg(make([]byte, 64))
				p.B.PostRecv(1, dst)
				p.A.PostSend(1, src)
				p.A.WaitOK(1)
				p.B.WaitOK(1)

				cnp := bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: 0xFFFF, BECN: true, DestQP: p.A.QP.QPN()}}
				f := newForger(t, p.Network, p.B.Addr.Addr())
				for range 10 {
					f.send(p.A.Addr, 5000, cnp)
					time.Sleep(time.Millisecond)
				}
				synctest.Wait()
				st, c := p.A.Endpoint.Stats(), p.A.QP.Counters()
				assert.Equal(t, uint64(10), st.CNPs)
				if m.source == transport.SourceStrict {
					assert.Equal(t, uint64(10), st.BadSourcePortCNP)
					assert.Zero(t, st.BadSourcePort)
					assert.Zero(t, c.RPCNPHandled)
					assert.Equal(t, params.LineRate, p.A.QP.CCLowestRate(), "no forged CNP cut the rate")

					f.send(p.A.Addr, 0, cnp) // as ConnectX sends CNPs
					synctest.Wait()
					assert.Equal(t, uint64(1), p.A.QP.Counters().RPCNPHandled)
					assert.Less(t, p.A.QP.CCLowestRate(), params.LineRate)
				} else {
					assert.Zero(t, st.BadSourcePortCNP)
					assert.NotZero(t, c.RPCNPHandled)
					assert.Less(t, p.A.QP.CCLowestRate(), params.LineRate, "the forged CNPs cut the rate")
				}
			})
		})
	}
}

// ICRCAuto verifies received ICRCs over UDP sockets for IPv6, where every
// field the ICRC covers is known, and not for IPv4 (the IP ID is not);
// ICRCAssumeID0 verifies IPv4 too.
func TestICRCDefaultOverUDP(t *testing.T) {
	cases := []struct {
		name    string
		addr    string
		opt     transport.ICRCCheck
		checked bool
	}{
		{"ipv6-auto", "[::1]:0", transport.ICRCAuto, true},
		{"ipv4-auto", "127.0.0.1:0", transport.ICRCAuto, false},
		{"ipv4-assume-id0", "127.0.0.1:0", transport.ICRCAssumeID0, true},
		{"ipv6-off", "[::1]:0", transport.ICRCOff, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ec, err := transport.ListenUDP(netip.MustParseAddrPort(tc.addr), transport.UDPOptions{EphemeralPort: true})
			if err != nil {
				t.Skipf("cannot listen on %s here: %v", tc.addr, err)
			}
			ep := transport.NewEndpoint(ec, transport.Options{ICRC: tc.opt})
			defer ep.Close()
			sc, err := transport.ListenUDP(netip.MustParseAddrPort(tc.addr), transport.UDPOptions{EphemeralPort: true})
			require.NoError(t, err)
			defer sc.Close()
			src, dst := sc.LocalAddr(), ep.LocalAddr()
			p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x99, PSN: 1}, Payload: []byte("x")}
			e := bth.Encap{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port()}
			good, err := p.Append(nil, &e)
			require.NoError(t, err)
			bad := bytes.Clone(good)
			bad[len(bad)-1] ^= 0xFF
			_, err = sc.WriteBatch([]transport.Datagram{{Data: good, Src: src, Dst: dst}, {Data: bad, Src: src, Dst: dst}})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return ep.Stats().Received == 2 }, 5*time.Second, time.Millisecond)
			st := ep.Stats()
			if tc.checked {
				assert.Equal(t, uint64(1), st.BadICRC, "the corrupted ICRC is caught")
				assert.Equal(t, uint64(1), st.UnknownQP, "the valid one passed the check")
			} else {
				assert.Zero(t, st.BadICRC)
				assert.Equal(t, uint64(2), st.UnknownQP)
			}
		})
	}
}

// A QP moved to RESET forgets its peer's port, and a QP that has not
// reached RTR pins nothing.
func TestSourcePinLifetime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := transporttest.NewPair(t, transporttest.Config{})
		src, dst := p.A.Reg([]byte("pin")), p.B.Reg(make([]byte, 8))
		p.B.PostRecv(1, dst)
		p.A.PostSend(1, src)
		p.A.WaitOK(1)
		p.B.WaitOK(1)
		_, pinned := p.B.QP.PeerSourcePort()
		require.True(t, pinned)
		require.NoError(t, p.B.QP.Modify(&qp.Attr{State: qp.IBV_QPS_RESET}, qp.IBV_QP_STATE))
		_, pinned = p.B.QP.PeerSourcePort()
		assert.False(t, pinned, "RESET forgets the peer")

		// A's retransmissions reach a QP in RESET: nothing is pinned.
		p.A.PostSend(2, src)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		_, pinned = p.B.QP.PeerSourcePort()
		assert.False(t, pinned, "a QP before RTR learns nothing")
		assert.Zero(t, p.B.Endpoint.Stats().BadSourcePort)
	})
}
