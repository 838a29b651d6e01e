//go:build linux

package transport

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A busy-polling UDP Conn reads what arrives while it spins and what
// arrives after its budget (parked on the poller), and a read in either
// phase ends with net.ErrClosed at Close.
func TestUDPBusyPollReads(t *testing.T) {
	var conns [2]Conn
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), UDPOptions{EphemeralPort: true, BusyPoll: 20 * time.Millisecond})
		require.NoError(t, err)
		conns[i] = c
	}
	defer conns[0].Close()
	got := make(chan int, 4)
	errc := make(chan error, 1)
	go func() {
		ds := []Datagram{{Data: make([]byte, 0, 2048)}}
		for {
			n, err := conns[1].ReadBatch(ds)
			if err != nil {
				errc <- err
				return
			}
			got <- len(ds[0].Data) * n
		}
	}()
	send := func(size int) {
		_, err := conns[0].WriteBatch([]Datagram{{Data: make([]byte, size), Src: conns[0].LocalAddr(), Dst: conns[1].LocalAddr()}})
		require.NoError(t, err)
	}
	send(100) // read while spinning, or before
	assert.Equal(t, 100, <-got)
	time.Sleep(50 * time.Millisecond) // past the budget: parked
	send(200)
	assert.Equal(t, 200, <-got)
	require.NoError(t, conns[1].Close())
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("a busy-polling read did not end at Close")
	}
}

// Endpoints with Options.BusyPoll run a SEND ping-pong over UDP: the
// CQ waits and the read loop spin, completions arrive, and a Wait with no
// completion coming still ends with its context.
func TestEndpointBusyPoll(t *testing.T) {
	s := connectOpts(t, udpPair(t), defaultPair(), Options{BusyPoll: 200 * time.Microsecond})
	a, z := s[0], s[1]
	var mr [2]*qp.MR
	for i, sd := range s {
		var err error
		mr[i], err = sd.pd.RegMR(make([]byte, 8), qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
	}
	for range 50 {
		require.NoError(t, z.qp.PostRecv(qp.RecvWR{SGEs: []qp.SGE{mr[1].SGE(0, 8)}}))
		require.NoError(t, a.qp.PostRecv(qp.RecvWR{SGEs: []qp.SGE{mr[0].SGE(0, 8)}}))
		require.NoError(t, a.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr[0].SGE(0, 8)}}))
		for _, c := range wait(t, z.cq, 1) {
			require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		}
		require.NoError(t, z.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{mr[1].SGE(0, 8)}}))
		for _, c := range wait(t, a.cq, 2) { // A's SEND and the answer's RECV
			require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, err := a.cq.Wait(ctx, make([]qp.WC, 1))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}
