package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/roce-emu/roce-emu/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The set-ups the rdmacm tests share: Endpoints with an rdma_cm Service
// on an in-memory network, a Listener, Accept and Dial run beside the
// test, and a CM peer played by hand over a bare QP1.

// testPort is the rdma_cm port the tests listen on.
const testPort = 7174

type side struct {
	ep  *transport.Endpoint
	svc *rdmacm.Service
	pd  *transport.PD
	cq  *transport.CQ
}

// newNet is the in-memory network of the tests: 10 us one-way delay,
// no loss.
func newNet() *transport.Network {
	return transport.NewNetwork(transport.Impairments{Delay: 10 * time.Microsecond}, 1)
}

// newPair is newNet with a side at 192.0.2.1 (a, the active side in most
// tests) and one at 192.0.2.2 (b), each sending through its fault rule
// when one is given.
func newPair(t *testing.T, aFault, bFault string) (n *transport.Network, a, b side) {
	t.Helper()
	n = newNet()
	return n, newSide(t, n, "192.0.2.1", aFault), newSide(t, n, "192.0.2.2", bFault)
}

// newSide opens an Endpoint at addr on n (its outgoing packets through
// the fault rule when one is given) with an rdma_cm Service.
func newSide(t *testing.T, n *transport.Network, addr string, fault string) side {
	t.Helper()
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 4791))
	require.NoError(t, err)
	if fault != "" {
		r, err := transport.ParseFault(fault)
		require.NoError(t, err)
		c = transport.WithFaults(c, transport.NewFaults(1, r), nil)
	}
	return openSide(t, c, transport.Options{})
}

// newObservedSide is newSide with obs watching the Endpoint's datagrams
// and the Endpoint's options given.
func newObservedSide(t *testing.T, n *transport.Network, addr string, opts transport.Options, obs transport.Observer) side {
	t.Helper()
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 4791))
	require.NoError(t, err)
	return openSide(t, transport.WithObserver(c, nil, obs), opts)
}

// openSide puts an Endpoint with opts and an rdma_cm Service on c, both
// closed when the test ends.
func openSide(t *testing.T, c transport.Conn, opts transport.Options) side {
	t.Helper()
	ep := transport.NewEndpoint(c, opts)
	svc, err := rdmacm.New(ep, rdmacm.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, svc.Close())
		ep.Close()
	})
	return side{ep: ep, svc: svc, pd: ep.NewPD(), cq: ep.NewCQ(64)}
}

func (s side) params(priv []byte) rdmacm.ConnParams {
	return rdmacm.ConnParams{PD: s.pd, SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: 16, MaxRecvWR: 16, SQSigAll: true,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PrivateData: priv}
}

// listen has s listen on testPort.
func (s side) listen(t *testing.T) *rdmacm.Listener {
	t.Helper()
	l, err := s.svc.Listen(testPort)
	require.NoError(t, err)
	return l
}

func waitWC(t *testing.T, cq *transport.CQ) qp.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := make([]qp.WC, 1)
	n, err := cq.Wait(ctx, wc)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	return wc[0]
}

// connResult is what an Accept or a Dial run beside the test returned.
type connResult struct {
	c   *rdmacm.Conn
	err error
}

// acceptAsync runs l.Accept(ctx, p) in a goroutine; its result comes on
// the channel (buffered: the goroutine never blocks on it).
func acceptAsync(ctx context.Context, l *rdmacm.Listener, p rdmacm.ConnParams) <-chan connResult {
	ch := make(chan connResult, 1)
	go func() {
		c, err := l.Accept(ctx, p)
		ch <- connResult{c, err}
	}()
	return ch
}

// dialAsync runs s.svc.Dial(ctx, to, testPort, p) in a goroutine; its
// result comes on the channel (buffered).
func dialAsync(ctx context.Context, s side, to netip.Addr, p rdmacm.ConnParams) <-chan connResult {
	ch := make(chan connResult, 1)
	go func() {
		c, err := s.svc.Dial(ctx, to, testPort, p)
		ch <- connResult{c, err}
	}()
	return ch
}

// connect runs Accept on b and Dial from a to b's port 7174 and returns
// both connections.
func connect(t *testing.T, a, b side, l *rdmacm.Listener) (client, server *rdmacm.Conn) {
	t.Helper()
	return connectWith(t, a, b, l, a.params([]byte("req-data")), b.params([]byte("rep-data")))
}

// connectWith is connect with the parameters of each side given.
func connectWith(t *testing.T, a, b side, l *rdmacm.Listener, ap, bp rdmacm.ConnParams) (client, server *rdmacm.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch := acceptAsync(ctx, l, bp)
	client, err := a.svc.Dial(ctx, b.svc.LocalAddr(), l.Port(), ap)
	require.NoError(t, err)
	r := <-ch
	require.NoError(t, r.err)
	return client, r.c
}

// rawPeer is a CM peer at 192.0.2.3 played by hand over a bare QP1.
func rawPeer(t *testing.T, n *transport.Network) *transporttest.GSI {
	t.Helper()
	c, err := n.Listen(netip.MustParseAddrPort("192.0.2.3:4791"))
	require.NoError(t, err)
	raw := transport.NewEndpoint(c, transport.Options{})
	t.Cleanup(func() { raw.Close() })
	return transporttest.NewGSI(t, raw)
}

// recvMsg waits for the next MAD g receives and decodes it.
func recvMsg(t *testing.T, g *transporttest.GSI) (cm.Header, cm.Message) {
	t.Helper()
	m, ok := g.Recv(10 * time.Minute)
	require.True(t, ok, "no MAD came")
	h, msg, err := cm.DecodeMAD(m.MAD)
	require.NoError(t, err)
	return h, msg
}

// badREQ is a REQ from 192.0.2.3 to rdma_cm port 7174 at to, as rdma_cm
// would send it, changed by mut.
func badREQ(t *testing.T, id uint32, to netip.Addr, mut func(*cm.REQ)) []byte {
	t.Helper()
	from := netip.MustParseAddr("192.0.2.3")
	r := &cm.REQ{LocalCommID: id, ServiceID: cm.ServiceID(cm.PortSpaceTCP, testPort), LocalQPN: 0x20, StartingPSN: 0x123,
		ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20,
		RetryCount: 7, RNRRetryCount: 7, PathMTU: 3, MaxCMRetries: 15, PKey: 0xFFFF,
		Primary: cm.Path{LocalLID: 0xFFFF, RemoteLID: 0xFFFF, LocalGID: from, RemoteGID: to, HopLimit: 64, LocalACKTimeout: 19}}
	h := cm.IPHeader{Src: netip.AddrPortFrom(from, 40000), Dst: to}
	_, err := h.Append(r.PrivateData[:0])
	require.NoError(t, err)
	mut(r)
	b, err := cm.AppendMAD(nil, uint64(id), r)
	require.NoError(t, err)
	return b
}
