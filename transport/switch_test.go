//go:build linux

package transport_test

import (
	"bytes"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/internal/incast"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two roce-emu senders with DCQCN write into one receiver over UDP on
// loopback through a Switch with a 200 Mb/s egress: the switch marks CE, the
// receiver's QPs send CNPs, the senders' reaction points cut their rates,
// and the receiver's counters agree with a capture of what it received
// and sent.
func TestUDPSwitchDCQCN(t *testing.T) {
	recvAddr := netip.MustParseAddr("127.0.0.2")
	rc, err := transport.ListenUDP(netip.AddrPortFrom(recvAddr, 0), transport.UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	capFile := filepath.Join(t.TempDir(), "receiver.pcap")
	w, err := pcap.Create(capFile)
	require.NoError(t, err)
	recv := transport.NewEndpoint(transport.WithObserver(rc, nil, transport.CaptureObserver(w, [6]byte{}, [6]byte{})),
		transport.Options{ICRC: transport.ICRCAssumeID0})
	defer recv.Close()

	var senderConns []transport.Conn
	for _, a := range []string{"127.0.0.1", "127.0.0.3"} {
		c, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), transport.UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		senderConns = append(senderConns, c)
	}
	sw, err := transport.NewSwitch(transport.SwitchConfig{Addr: netip.MustParseAddr("127.0.0.100"), Ports: []uint16{0, 0},
		Senders: []netip.AddrPort{senderConns[0].LocalAddr(), senderConns[1].LocalAddr()}, Egress: rc.LocalAddr(),
		Queue: cc.QueueConfig{LineRate: 200 * cc.Mbps, Buffer: 4 << 20, KMin: 5000, KMax: 50000, PMax: 0.1}})
	require.NoError(t, err)
	defer sw.Close()
	ports := sw.Ports()

	// Senders start at 200 Mb/s each into a 200 Mb/s egress: slow enough
	// for a loaded machine (and the race detector) to keep up.
	params, _ := cc.Profile(cc.ProfilePaper, 200*cc.Mbps)
	params.MinTimeBetweenCNPs = 20 * time.Microsecond
	var senders []*transport.Endpoint
	for _, c := range senderConns {
		ep := transport.NewEndpoint(c, transport.Options{ICRC: transport.ICRCAssumeID0})
		defer ep.Close()
		senders = append(senders, ep)
	}
	// Both ends of pair i talk to switch port i.
	ss := incast.Start(t, incast.Setup{Recv: recv, Senders: senders, Params: &params, PSN: 0x100,
		Attr: transport.ConnectAttr{Timeout: 12}, Size: 512 << 10, WRs: 8,
		SenderPeer: func(i int) netip.AddrPort { return ports[i] },
		RecvPeer:   func(i int) netip.AddrPort { return ports[i] }})
	incast.Wait(t, ss, 8)
	// Stop the receiver (late duplicates may still be arriving) so that
	// its counters and its capture cover the same packets.
	recv.Close()
	st := sw.Stats()
	var marked, cnps uint64
	for _, s := range ss {
		c := s.RQ.Counters()
		marked += c.NPECNMarked
		cnps += c.NPCNPSent
	}
	t.Logf("switch: %+v; receiver: %d CE-marked packets, %d CNPs; bad ICRC at the receiver %d", st, marked, cnps, recv.Stats().BadICRC)
	for i, s := range ss {
		assert.True(t, bytes.Equal(s.Src, s.Dst), "sender %d data", i)
		c := s.Q.Counters()
		t.Logf("sender %d: rp_cnp_handled %d, lowest rate %v, retransmitted %d", i, c.RPCNPHandled, s.Q.CCLowestRate(), c.RetransmittedPkts)
		assert.NotZero(t, c.RPCNPHandled, "sender %d handled CNPs", i)
		assert.Less(t, float64(s.Q.CCLowestRate()), 0.75*float64(params.LineRate), "sender %d cut its rate", i)
	}
	assert.NotZero(t, st.Marked)
	assert.NotZero(t, marked)
	assert.NotZero(t, cnps)
	assert.Zero(t, recv.Stats().BadICRC, "the switch rewrote every ICRC for its headers")

	// The receiver's capture shows the same CE marks and CNPs.
	require.NoError(t, w.Close())
	r, err := pcap.Open(capFile)
	require.NoError(t, err)
	defer r.Close()
	d := pcap.NewDecoder()
	d.Port = rc.LocalAddr().Port()
	var rec pcap.Record
	var capCE, capCNP uint64
	for {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if k, _ := d.Decode(data, ci, lt, &rec); k != pcap.KindRoCE {
			// The receiver's own packets go to the switch's ports.
			d2 := pcap.NewDecoder()
			for _, p := range ports {
				d2.Port = p.Port()
				if k2, _ := d2.Decode(data, ci, lt, &rec); k2 == pcap.KindRoCE && rec.Packet.BTH.Opcode == bth.CNP {
					capCNP++
				}
			}
			continue
		}
		// Packets with a bad ICRC never reached a QP.
		if rec.ECN == bth.CE && rec.ICRCOK && rec.Packet.BTH.Opcode.Info().Op != bth.OpAcknowledge {
			capCE++
		}
	}
	assert.Equal(t, marked, capCE, "CE-marked packets in the capture")
	assert.Equal(t, cnps, capCNP, "CNPs in the capture")
}

// The switch rewrites ICRCs for its own headers, but a packet that arrived
// damaged leaves damaged.
func TestSwitchKeepsBadICRCBad(t *testing.T) {
	var ends [2]transport.Conn
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), transport.UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		defer c.Close()
		ends[i] = c
	}
	sw, err := transport.NewSwitch(transport.SwitchConfig{Addr: netip.MustParseAddr("127.0.0.100"), Ports: []uint16{0},
		Senders: []netip.AddrPort{ends[0].LocalAddr()}, Egress: ends[1].LocalAddr(), Queue: cc.DefaultQueue(cc.Gbps)})
	require.NoError(t, err)
	defer sw.Close()
	port := sw.Ports()[0]
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x11, PSN: 5}, Payload: []byte("hello")}
	enc := bth.Encap{Src: ends[0].LocalAddr().Addr(), Dst: port.Addr(), SrcPort: ends[0].LocalAddr().Port(), DstPort: port.Port()}
	good, err := p.Append(nil, &enc)
	require.NoError(t, err)
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 0xFF
	_, err = ends[0].WriteBatch([]transport.Datagram{{Data: good, Src: ends[0].LocalAddr(), Dst: port}, {Data: bad, Src: ends[0].LocalAddr(), Dst: port}})
	require.NoError(t, err)
	got := make([]transport.Datagram, 4)
	n := 0
	for n < 2 {
		k, err := ends[1].ReadBatch(got[n:])
		require.NoError(t, err)
		n += k
	}
	out := bth.Encap{Src: port.Addr(), Dst: ends[1].LocalAddr().Addr(), SrcPort: port.Port(), DstPort: ends[1].LocalAddr().Port()}
	_, _, err = out.VerifyICRC(got[0].Data)
	assert.NoError(t, err, "a good packet leaves with an ICRC for the switch's headers")
	_, _, err = out.VerifyICRC(got[1].Data)
	assert.ErrorIs(t, err, bth.ErrBadICRC, "a damaged packet stays damaged")
	assert.Equal(t, uint64(1), sw.Stats().BadICRC)
}

// The ICRC covers the IP addresses, so a switch on a wildcard address
// could not rewrite it; transport.NewSwitch refuses one.
func TestSwitchRefusesWildcardAddr(t *testing.T) {
	for _, a := range []string{"0.0.0.0", "::"} {
		_, err := transport.NewSwitch(transport.SwitchConfig{Addr: netip.MustParseAddr(a), Ports: []uint16{0},
			Senders: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791")}, Egress: netip.MustParseAddrPort("127.0.0.2:4791"),
			Queue: cc.DefaultQueue(cc.Gbps)})
		assert.ErrorContains(t, err, "wildcard", a)
	}
	_, err := transport.NewSwitch(transport.SwitchConfig{Ports: []uint16{0},
		Senders: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791")}, Egress: netip.MustParseAddrPort("127.0.0.2:4791"),
		Queue: cc.DefaultQueue(cc.Gbps)})
	assert.Error(t, err, "no address")
}
