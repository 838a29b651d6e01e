//go:build linux

package transport

import (
	"bytes"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
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
	rc, err := ListenUDP(netip.AddrPortFrom(recvAddr, 0), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	capFile := filepath.Join(t.TempDir(), "receiver.pcap")
	w, err := pcap.Create(capFile)
	require.NoError(t, err)
	recv := NewEndpoint(rc, Options{Capture: w, ICRC: ICRCAssumeID0})
	defer recv.Close()

	var senderConns []Conn
	for _, a := range []string{"127.0.0.1", "127.0.0.3"} {
		c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		senderConns = append(senderConns, c)
	}
	sw, err := NewSwitch(SwitchConfig{Addr: netip.MustParseAddr("127.0.0.100"), Ports: []uint16{0, 0},
		Senders: []netip.AddrPort{senderConns[0].LocalAddr(), senderConns[1].LocalAddr()}, Egress: rc.LocalAddr(),
		Queue: cc.QueueConfig{LineRate: 200 * cc.Mbps, Buffer: 4 << 20, KMin: 5000, KMax: 50000, PMax: 0.1}})
	require.NoError(t, err)
	defer sw.Close()
	ports := sw.Ports()

	// Senders start at 200 Mb/s each into a 200 Mb/s egress: slow enough
	// for a loaded machine (and the race detector) to keep up.
	params, _ := cc.Profile(cc.ProfilePaper, 200*cc.Mbps)
	params.MinTimeBetweenCNPs = 20 * time.Microsecond
	rpd := recv.NewPD()
	rcq := recv.NewCQ(64)
	const size = 512 << 10
	type sender struct {
		ep  *Endpoint
		q   *QP
		cq  *CQ
		src []byte
		smr *qp.MR
		dst []byte
		dmr *qp.MR
	}
	var ss []*sender
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE
	for i, c := range senderConns {
		ep := NewEndpoint(c, Options{ICRC: ICRCAssumeID0})
		defer ep.Close()
		pd := ep.NewPD()
		cq := ep.NewCQ(64)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true, CC: &params})
		require.NoError(t, err)
		rq, err := recv.NewQP(rpd, rcq, rcq, qp.InitAttr{CC: &params})
		require.NoError(t, err)
		// Both ends of pair i talk to switch port i.
		require.NoError(t, q.Connect(Remote{Addr: ports[i], QPN: rq.QPN(), PSN: 0x100}, 0x100, ConnectAttr{Access: access, Timeout: 12}))
		require.NoError(t, rq.Connect(Remote{Addr: ports[i], QPN: q.QPN(), PSN: 0x100}, 0x100, ConnectAttr{Access: access, Timeout: 12}))
		s := &sender{ep: ep, q: q, cq: cq, src: pattern(size, byte(i+7)), dst: make([]byte, size)}
		s.smr, _ = pd.RegMR(s.src, qp.IBV_ACCESS_LOCAL_WRITE)
		s.dmr, _ = rpd.RegMR(s.dst, access)
		ss = append(ss, s)
	}
	for _, s := range ss {
		for k := range 8 {
			off := k * size / 8
			require.NoError(t, s.q.PostSend(qp.SendWR{WRID: uint64(k), Opcode: qp.IBV_WR_RDMA_WRITE,
				SGEs: []qp.SGE{s.smr.SGE(off, size/8)}, RemoteAddr: s.dmr.VA + uint64(off), RKey: s.dmr.RKey}))
		}
	}
	for _, s := range ss {
		for _, c := range wait(t, s.cq, 8) {
			require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		}
	}
	// Stop the receiver (late duplicates may still be arriving) so that
	// its counters and its capture cover the same packets.
	recv.Close()
	st := sw.Stats()
	var marked, cnps uint64
	for _, q := range recv.order {
		c := q.Counters()
		marked += c.NPECNMarked
		cnps += c.NPCNPSent
	}
	t.Logf("switch: %+v; receiver: %d CE-marked packets, %d CNPs; bad ICRC at the receiver %d", st, marked, cnps, recv.Stats().BadICRC)
	for i, s := range ss {
		assert.True(t, bytes.Equal(s.src, s.dst), "sender %d data", i)
		c := s.q.Counters()
		t.Logf("sender %d: rp_cnp_handled %d, lowest rate %v, retransmitted %d", i, c.RPCNPHandled, s.q.CCLowestRate(), c.RetransmittedPkts)
		assert.NotZero(t, c.RPCNPHandled, "sender %d handled CNPs", i)
		assert.Less(t, float64(s.q.CCLowestRate()), 0.75*float64(params.LineRate), "sender %d cut its rate", i)
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
	var ends [2]Conn
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		defer c.Close()
		ends[i] = c
	}
	sw, err := NewSwitch(SwitchConfig{Addr: netip.MustParseAddr("127.0.0.100"), Ports: []uint16{0},
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
	_, err = ends[0].WriteBatch([]Datagram{{Data: good, Src: ends[0].LocalAddr(), Dst: port}, {Data: bad, Src: ends[0].LocalAddr(), Dst: port}})
	require.NoError(t, err)
	got := make([]Datagram, 4)
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
// could not rewrite it; NewSwitch refuses one.
func TestSwitchRefusesWildcardAddr(t *testing.T) {
	for _, a := range []string{"0.0.0.0", "::"} {
		_, err := NewSwitch(SwitchConfig{Addr: netip.MustParseAddr(a), Ports: []uint16{0},
			Senders: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791")}, Egress: netip.MustParseAddrPort("127.0.0.2:4791"),
			Queue: cc.DefaultQueue(cc.Gbps)})
		assert.ErrorContains(t, err, "wildcard", a)
	}
	_, err := NewSwitch(SwitchConfig{Ports: []uint16{0},
		Senders: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791")}, Egress: netip.MustParseAddrPort("127.0.0.2:4791"),
		Queue: cc.DefaultQueue(cc.Gbps)})
	assert.Error(t, err, "no address")
}
