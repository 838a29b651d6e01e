package oob_test

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// host is one side of the library test: an Endpoint on the in-memory
// network, a PD, a CQ and one RC QP in INIT with a registered buffer.
type host struct {
	ep  *transport.Endpoint
	cq  *transport.CQ
	q   *transport.QP
	mr  *qp.MR
	buf []byte
}

func newHost(t *testing.T, n *transport.Network, addr string) *host {
	t.Helper()
	conn, err := n.Listen(netip.MustParseAddrPort(addr))
	require.NoError(t, err)
	h := &host{ep: transport.NewEndpoint(conn, transport.Options{}), buf: make([]byte, 4096)}
	t.Cleanup(func() { h.ep.Close() })
	pd := h.ep.NewPD()
	access := qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE
	h.mr, err = pd.RegMR(h.buf, access)
	require.NoError(t, err)
	h.cq = h.ep.NewCQ(16)
	h.q, err = h.ep.NewQP(pd, h.cq, h.cq, qp.InitAttr{})
	require.NoError(t, err)
	require.NoError(t, h.q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
	return h
}

func (h *host) connect(remote netip.Addr, qpn uint32, rpsn, psn uint32) error {
	return h.q.Connect(transport.Remote{Addr: netip.AddrPortFrom(remote, h.ep.LocalAddr().Port()), QPN: qpn, PSN: qpPSN(rpsn)}, qpPSN(psn),
		transport.ConnectAttr{PathMTU: qp.IBV_MTU_1024, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1,
			Access: qp.IBV_ACCESS_LOCAL_WRITE | qp.IBV_ACCESS_REMOTE_WRITE})
}

func (h *host) wait(t *testing.T, ctx context.Context) qp.WC {
	t.Helper()
	wc := make([]qp.WC, 1)
	n, err := h.cq.Wait(ctx, wc)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
	return wc[0]
}

// The out-of-band sessions as a library, without the command: two hosts
// on the in-memory network, RoCEv2 over IPv6, set up their QPs with
// rc_pingpong's exchange and then with perftest's, each over a net.Pipe,
// and move data over the QPs they connected.
func TestSessionsConnectQPs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := transport.NewNetwork(transport.Impairments{Delay: 10 * time.Microsecond}, 1)
	cl, sv := newHost(t, n, "[fd00::1]:4791"), newHost(t, n, "[fd00::2]:4791")

	// rc_pingpong: the server posts a receive, both connect in the
	// exchange's callbacks, the client SENDs.
	rmr := sv.mr.SGE(0, 64)
	require.NoError(t, sv.q.PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{rmr}}))
	c1, s1 := net.Pipe()
	defer c1.Close()
	defer s1.Close()
	cDest := oob.Dest{QPN: cl.q.QPN(), PSN: 0x111111, GID: cl.ep.LocalAddr().Addr()}
	sDest := oob.Dest{QPN: sv.q.QPN(), PSN: 0x222222, GID: sv.ep.LocalAddr().Addr()}
	errc := make(chan error, 1)
	go func() {
		_, err := oob.PingpongServer(ctx, s1, sDest, func(r oob.Dest) error {
			return sv.connect(r.GID, r.QPN, uint32(r.PSN), uint32(sDest.PSN))
		})
		errc <- err
	}()
	got, err := oob.PingpongClient(ctx, c1, cDest, func(r oob.Dest) error {
		return cl.connect(r.GID, r.QPN, uint32(r.PSN), uint32(cDest.PSN))
	})
	require.NoError(t, err)
	require.NoError(t, <-errc)
	assert.Equal(t, sDest, got)
	assert.False(t, got.GID.Is4In6() || got.GID.Is4(), "an IPv6 GID")

	copy(cl.buf, "ping over RoCEv2/IPv6")
	require.NoError(t, cl.q.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{cl.mr.SGE(0, 21)}}))
	cl.wait(t, ctx)
	wc := sv.wait(t, ctx)
	assert.Equal(t, "ping over RoCEv2/IPv6", string(sv.buf[:wc.ByteLen]))

	// perftest: two new QPs, keys with R_Key and VA, the client WRITEs
	// into the server's region, then the results and done.
	cl2, sv2 := newHost(t, n, "[fd00::1]:4792"), newHost(t, n, "[fd00::2]:4792")
	c2, s2 := net.Pipe()
	defer c2.Close()
	defer s2.Close()
	type side struct {
		h    *host
		s    *oob.Perftest
		key  oob.PerftestKey
		peer oob.PerftestKey
		rep  oob.BWReport
	}
	mk := func(h *host, s *oob.Perftest, psn uint32) *side {
		return &side{h: h, s: s, key: oob.PerftestKey{OutReads: 1, QPN: h.q.QPN(), PSN: qpPSN(psn), RKey: h.mr.RKey, VA: h.mr.VA + 2048,
			GID: h.ep.LocalAddr().Addr()}}
	}
	client, server := mk(cl2, oob.NewPerftestClient(c2), 0x333333), mk(sv2, oob.NewPerftestServer(s2), 0x444444)
	setup := func(sd *side) error {
		if _, err := sd.s.Versions(ctx); err != nil {
			return err
		}
		if _, err := sd.s.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine}); err != nil {
			return err
		}
		if _, err := sd.s.MTU(ctx, qp.IBV_MTU_1024); err != nil {
			return err
		}
		peers, err := sd.s.Keys(ctx, []oob.PerftestKey{sd.key})
		if err != nil {
			return err
		}
		sd.peer = peers[0]
		if err := sd.h.connect(sd.peer.GID, sd.peer.QPN, uint32(sd.peer.PSN), uint32(sd.key.PSN)); err != nil {
			return err
		}
		return sd.s.Barrier(ctx, "connected")
	}
	finish := func(sd *side, mine oob.BWReport) error {
		if err := sd.s.Barrier(ctx, "traffic done"); err != nil {
			return err
		}
		var err error
		if sd.rep, err = sd.s.BWReports(ctx, mine); err != nil {
			return err
		}
		return sd.s.Done(ctx)
	}
	go func() {
		if err := setup(server); err != nil {
			errc <- err
			return
		}
		errc <- finish(server, oob.BWReport{})
	}()
	require.NoError(t, setup(client))
	assert.Equal(t, server.key, client.peer)
	payload := bytes.Repeat([]byte("perftest"), 64)
	copy(cl2.buf, payload)
	require.NoError(t, cl2.q.PostSend(qp.SendWR{WRID: 3, Opcode: qp.IBV_WR_RDMA_WRITE, Flags: qp.IBV_SEND_SIGNALED,
		SGEs: []qp.SGE{cl2.mr.SGE(0, len(payload))}, RemoteAddr: client.peer.VA, RKey: client.peer.RKey}))
	cl2.wait(t, ctx)
	require.NoError(t, finish(client, oob.BWReport{Size: uint64(len(payload)), Iters: 1, PeakBW: 1, AvgBW: 1, MsgRate: 1}))
	require.NoError(t, <-errc)
	assert.Equal(t, client.key, server.peer)
	assert.Equal(t, oob.BWReport{Size: 512, Iters: 1, PeakBW: 1, AvgBW: 1, MsgRate: 1}, server.rep)
	sv2.ep.Sync()
	assert.Equal(t, payload, sv2.buf[2048:2048+len(payload)], "the WRITE landed where the server's key said")
}

func qpPSN(v uint32) bth.PSN { return bth.PSN(v & bth.PSNMask) }
