//go:build linux

package transport

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// RC WRITEs and SENDs over the Linux UDP Conn leave with their payload
// sent from the memory region in place (writeBatchVec: headers, payload
// and tail as three iovecs), with GSO on and off, over IPv4 and IPv6:
// every byte arrives, the receiver verifies every ICRC (ICRCAssumeID0 on
// IPv4; IPv6 always) and finds none bad, lengths with every pad, one SGE
// (in place) and two (gathered into the QP's scratch buffer, copied).
func TestInPlacePayloadUDP(t *testing.T) {
	for _, fam := range []struct{ name, a, b string }{{"ipv4", "127.0.0.1", "127.0.0.2"}, {"ipv6", "::1", "::1"}} {
		for _, gso := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gso=%v", fam.name, gso), func(t *testing.T) {
				var conns [2]Conn
				for i, a := range []string{fam.a, fam.b} {
					c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0),
						UDPOptions{EphemeralPort: true, ComputeUDPChecksum: true, NoGSO: !gso})
					require.NoError(t, err)
					conns[i] = c
				}
				if o, _ := Offloads(conns[0]); gso && !o.GSO {
					t.Skipf("no GSO here: %s", o.GSOOff)
				}
				s := connectOpts(t, conns, defaultPair(), Options{ICRC: ICRCAssumeID0})
				const size = 20000
				src := pattern(size+8, 0x5A)
				dst := make([]byte, size)
				smr, err := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
				require.NoError(t, err)
				dmr, err := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
				require.NoError(t, err)
				// Lengths with each pad; one SGE, then two with a gap.
				// dst is read and cleared under the receiver's lock: its next
				// write comes over the socket, which the race detector does
				// not see as ordering.
				for _, n := range []int{size, 4097, 3074, 1027, 300} {
					s[1].ep.Locked(func() { clear(dst) })
					require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(1, n)},
						RemoteAddr: dmr.VA, RKey: dmr.RKey}))
					wc := wait(t, s[0].cq, 1)
					require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
					var got []byte
					s[1].ep.Locked(func() { got = append(got, dst[:n]...) })
					require.Equal(t, src[1:1+n], got, "WRITE of %d", n)
				}
				s[1].ep.Locked(func() { clear(dst) })
				require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 3000), smr.SGE(5000, 3000)},
					RemoteAddr: dmr.VA, RKey: dmr.RKey}))
				require.Equal(t, qp.IBV_WC_SUCCESS, wait(t, s[0].cq, 1)[0].Status)
				var got []byte
				s[1].ep.Locked(func() { got = append(got, dst[:6000]...) })
				require.Equal(t, src[:3000], got[:3000])
				require.Equal(t, src[5000:8000], got[3000:6000])
				// A SEND in place.
				rbuf := make([]byte, 5000)
				rmr, err := s[1].pd.RegMR(rbuf, qp.IBV_ACCESS_LOCAL_WRITE)
				require.NoError(t, err)
				require.NoError(t, s[1].qp.PostRecv(qp.RecvWR{SGEs: []qp.SGE{rmr.SGE(0, 5000)}}))
				require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(7, 4999)}}))
				require.Equal(t, qp.IBV_WC_SUCCESS, wait(t, s[0].cq, 1)[0].Status)
				rc := wait(t, s[1].cq, 1)
				require.Equal(t, uint32(4999), rc[0].ByteLen)
				require.Equal(t, src[7:7+4999], rbuf[:4999])

				st := s[1].ep.Stats()
				assert.Zero(t, st.BadICRC, "every ICRC computed over the payload in place verifies")
				assert.Zero(t, st.Malformed)
				s[0].ep.mu.Lock()
				sent := s[0].ep.inPlaceSent
				s[0].ep.mu.Unlock()
				// 20000/1024 = 20 packets + 5 + 4 + 2 + 1 (WRITEs) + 5 (SEND);
				// the 300-byte WRITE is in place too (inPlaceMin 256); the
				// two-SGE WRITE's first packet lies in one SGE (in place), the
				// rest are gathered.
				assert.GreaterOrEqual(t, sent, uint64(20+5+4+2+1+5), "payloads sent in place")
				if o, ok := Offloads(conns[0]); ok && gso {
					assert.NotZero(t, o.GSOSends, "the in-place datagrams went out segmented")
				}
			})
		}
	}
}

// A Conn wrapped by a decorator sees whole datagrams: the Endpoint sends
// nothing in place through it.
func TestInPlaceNotThroughDecorators(t *testing.T) {
	conns := udpPair(t)
	conns[0] = WithFaults(conns[0], NewFaults(1), nil)
	s := connect(t, conns, defaultPair())
	src := pattern(8192, 1)
	smr, err := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	dst := make([]byte, 8192)
	dmr, err := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	require.NoError(t, err)
	require.NoError(t, s[0].qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, 8192)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	require.Equal(t, qp.IBV_WC_SUCCESS, wait(t, s[0].cq, 1)[0].Status)
	s[1].ep.Sync()
	require.Equal(t, src, dst)
	s[0].ep.mu.Lock()
	defer s[0].ep.mu.Unlock()
	assert.Nil(t, s[0].ep.vec)
	assert.Zero(t, s[0].ep.inPlaceSent)
}
