//go:build linux

package transport_test

import (
	"context"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A lossy run over UDP on loopback, captured as --pcap captures it
// (faults outside the capture, on the requester's Conn): every packet in
// the file has its own time, the times never go back, and the requester's
// resend of the packet a sequence NAK names comes measurably after the NAK.
// (Captures once carried one time per batch: 25,657 packets, 234 distinct
// times, NAK-to-resend 0 us.)
func TestCaptureTimestampPerPacket(t *testing.T) {
	capFile := filepath.Join(t.TempDir(), "lossy.pcap")
	w, err := pcap.Create(capFile)
	require.NoError(t, err)
	midDrop, err := transport.ParseFault("drop:dir=out,opcode=RC_RDMA_WRITE_MIDDLE,nth=5")
	require.NoError(t, err)
	faults := transport.NewFaults(3, transport.LossRule(0.02), midDrop)

	var eps [2]*transport.Endpoint
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := transport.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), transport.UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		if i == 0 {
			c = transport.WithFaults(transport.WithObserver(c, nil, transport.CaptureObserver(w, [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2})), faults, nil)
		}
		eps[i] = transport.NewEndpoint(c, transport.Options{ICRC: transport.ICRCAssumeID0})
		defer eps[i].Close()
	}
	var qps [2]*transport.QP
	var cqs [2]*transport.CQ
	var pds [2]*transport.PD
	for i, ep := range eps {
		pds[i], cqs[i] = ep.NewPD(), ep.NewCQ(64)
		qps[i], err = ep.NewQP(pds[i], cqs[i], cqs[i], qp.InitAttr{MaxSendWR: 16, SQSigAll: true})
		require.NoError(t, err)
	}
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE
	for i := range 2 {
		require.NoError(t, qps[i].Connect(transport.Remote{Addr: eps[1-i].LocalAddr(), QPN: qps[1-i].QPN(), PSN: 0x100},
			0x100, transport.ConnectAttr{Access: access, Timeout: 8}))
	}
	const size, msgs = 256 << 10, 8
	src := make([]byte, size)
	dst := make([]byte, size)
	smr, _ := pds[0].RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := pds[1].RegMR(dst, access)
	for k := range msgs {
		require.NoError(t, qps[0].PostSend(qp.SendWR{WRID: uint64(k), Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, size)},
			RemoteAddr: dmr.VA, RKey: dmr.RKey}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := make([]qp.WC, msgs)
	for got := 0; got < msgs; {
		n, err := cqs[0].Wait(ctx, wc)
		require.NoError(t, err)
		for _, c := range wc[:n] {
			require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		}
		got += n
	}
	require.NotZero(t, qps[0].Counters().PacketSeqErr, "the run had sequence NAKs")
	require.NoError(t, eps[0].Close())
	require.NoError(t, w.Close())

	// Read the capture back: packets to B (port of B) and to A (port of A).
	r, err := pcap.Open(capFile)
	require.NoError(t, err)
	defer r.Close()
	type pkt struct {
		at  time.Time
		out bool
		p   bth.Packet
	}
	var pkts []pkt
	dec := pcap.NewDecoder()
	var rec pcap.Record
	for {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		found := false
		for _, to := range []*transport.Endpoint{eps[1], eps[0]} {
			dec.Port = to.LocalAddr().Port()
			if k, _ := dec.Decode(data, ci, lt, &rec); k == pcap.KindRoCE {
				pkts = append(pkts, pkt{at: ci.Timestamp, out: to == eps[1], p: rec.Packet})
				found = true
				break
			}
		}
		require.True(t, found, "frame %d is RoCEv2 to A or B", len(pkts)+1)
	}
	require.Greater(t, len(pkts), 8*256, "every WRITE packet and the ACKs are in the capture")
	distinct := map[int64]bool{}
	for i, p := range pkts {
		distinct[p.at.UnixNano()] = true
		if i > 0 {
			require.True(t, p.at.After(pkts[i-1].at), "packet %d at %v is not after packet %d at %v", i+1, p.at, i, pkts[i-1].at)
		}
	}
	assert.Len(t, distinct, len(pkts), "one time per packet")

	// Each sequence NAK A received, and A's first resend of the PSN it names.
	naks, minGap := 0, time.Duration(-1)
	for i, p := range pkts {
		if p.out || p.p.BTH.Opcode != bth.RCAcknowledge || p.p.AETH.Syndrome.Kind() != bth.KindNAK ||
			p.p.AETH.Syndrome.NAKCode() != bth.NAKPSNSequenceError {
			continue
		}
		for _, q := range pkts[i+1:] {
			if q.out && q.p.BTH.PSN == p.p.BTH.PSN {
				naks++
				gap := q.at.Sub(p.at)
				if minGap < 0 || gap < minGap {
					minGap = gap
				}
				assert.Greater(t, gap, time.Duration(0), "NAK-to-resend delay of PSN %#x", uint32(p.p.BTH.PSN))
				break
			}
		}
	}
	assert.NotZero(t, naks, "a sequence NAK and its resend are in the capture")
	t.Logf("%d packets, %d distinct times; %d sequence NAKs resent, the soonest %v after its NAK", len(pkts), len(distinct), naks, minGap)
}
