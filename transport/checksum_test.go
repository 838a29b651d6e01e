package transport

import (
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// RoCEv2 over IPv6 with UDP checksum 0, as rxe sends it, on the in-memory
// network: a receiver that accepts zero checksums (roce-emu's sockets, and
// the default here) gets everything; one that behaves as a stock Linux
// UDP/IPv6 socket drops every packet and the QP runs out of retries.
func TestMemZeroChecksum6(t *testing.T) {
	cases := []struct {
		name       string
		send, recv ListenOptions // of side 0 (the requester) and side 1
		addrs      [2]string
		wantOK     bool
		wantDrops  bool
	}{
		{"zero checksum accepted", ListenOptions{}, ListenOptions{}, [2]string{"fd00::1", "fd00::2"}, true, false},
		{"stock IPv6 receiver drops zero checksum", ListenOptions{}, ListenOptions{RejectZeroChecksum6: true}, [2]string{"fd00::1", "fd00::2"}, false, true},
		{"computed checksum passes a stock receiver", ListenOptions{ComputeUDPChecksum: true}, ListenOptions{RejectZeroChecksum6: true}, [2]string{"fd00::1", "fd00::2"}, true, false},
		{"IPv4 zero checksum is always legal", ListenOptions{}, ListenOptions{RejectZeroChecksum6: true}, [2]string{"192.0.2.1", "192.0.2.2"}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := NewNetwork(Impairments{Delay: 5 * time.Microsecond}, 1)
				var conns [2]Conn
				for i, o := range []ListenOptions{c.send, c.recv} {
					// The receiver's ACKs go back with a computed checksum, so
					// that only the requester's packets meet the rule.
					if i == 1 {
						o.ComputeUDPChecksum = true
					}
					conn, err := n.ListenWith(netip.AddrPortFrom(netip.MustParseAddr(c.addrs[i]), 4791), o)
					require.NoError(t, err)
					conns[i] = conn
				}
				cfg := defaultPair()
				cfg.retry, cfg.timeout = 1, 8
				s := connect(t, conns, cfg)
				rbuf := make([]byte, 3000)
				smr, _ := s[0].pd.RegMR(pattern(3000, 9), qp.IBV_ACCESS_LOCAL_WRITE)
				rmr, _ := s[1].pd.RegMR(rbuf, qp.IBV_ACCESS_LOCAL_WRITE)
				require.NoError(t, s[1].qp.PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{rmr.SGE(0, 3000)}}))
				require.NoError(t, s[0].qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, 3000)}}))
				wc := wait(t, s[0].cq, 1)
				if c.wantOK {
					require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
					rc := wait(t, s[1].cq, 1)
					assert.Equal(t, qp.IBV_WC_SUCCESS, rc[0].Status)
					assert.Equal(t, pattern(3000, 9), rbuf)
				} else {
					assert.Equal(t, qp.IBV_WC_RETRY_EXC_ERR, wc[0].Status)
					assert.Zero(t, s[1].qp.Counters().ReceivedPackets, "nothing reached the responder")
				}
				n.mu.Lock()
				drops := n.ZeroChecksumDropped
				n.mu.Unlock()
				if c.wantDrops {
					// 3 packets, sent once and retried once.
					assert.Equal(t, uint64(6), drops)
				} else {
					assert.Zero(t, drops)
				}
			})
		})
	}
}
