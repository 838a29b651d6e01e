package transport

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/qp"
)

// gateConn holds the next WriteBatch once armed, until released.
type gateConn struct {
	Conn
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *gateConn) WriteBatch(ds []Datagram) (int, error) {
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Conn.WriteBatch(ds)
}

func (g *gateConn) Unwrap() Conn { return g.Conn }

// What the QPs queued while a batch was being written still goes out when
// the Endpoint is closed right after: Close sends it first. (Packets queued
// then were dropped once, and the peer of a pingpong that had its last
// completion and closed never got its last ACK.)
func TestCloseSendsWhatWasQueued(t *testing.T) {
	s, g, posted := queuedWhileWriting(t)
	closed := make(chan error)
	go func() { closed <- s[0].ep.Close() }()
	time.Sleep(10 * time.Millisecond) // Close waits for the batch being written
	close(g.release)
	require.NoError(t, <-posted)
	require.NoError(t, <-closed)
	wantBothSENDs(t, s)
}

// The same holds for a QP destroyed right after it posted: what it queued
// while another batch was being written goes out before it is removed.
// (rping -s posted its DREP on QP1 and closed its rdma_cm service, which
// destroys QP1, while the read loop's batch was being written: the DREP
// was lost about one run in fifteen and the client waited for it.)
func TestDestroySendsWhatWasQueued(t *testing.T) {
	s, g, posted := queuedWhileWriting(t)
	destroyed := make(chan struct{})
	go func() { s[0].qp.Destroy(); close(destroyed) }()
	time.Sleep(10 * time.Millisecond) // Destroy waits for the batch being written
	close(g.release)
	require.NoError(t, <-posted)
	<-destroyed
	wantBothSENDs(t, s)
	require.NoError(t, s[0].ep.Close())
}

// queuedWhileWriting connects a pair whose first side writes through a
// gate, posts a SEND whose batch the gate holds in WriteBatch, and posts
// a second SEND while it is held; posted gets the first PostSend's error
// once the gate is released.
func queuedWhileWriting(t *testing.T) (s [2]*side, g *gateConn, posted chan error) {
	t.Helper()
	cs := memConns(t)
	g = &gateConn{Conn: cs[0], entered: make(chan struct{}), release: make(chan struct{})}
	s = connect(t, [2]Conn{g, cs[1]}, defaultPair())
	src, _ := s[0].pd.RegMR(make([]byte, 64), qp.IBV_ACCESS_LOCAL_WRITE)
	dst, _ := s[1].pd.RegMR(make([]byte, 128), qp.IBV_ACCESS_LOCAL_WRITE)
	for i := range 2 {
		require.NoError(t, s[1].qp.PostRecv(qp.RecvWR{WRID: uint64(i), SGEs: []qp.SGE{dst.SGE(i*64, 64)}}))
	}
	send := qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{src.SGE(0, 64)}}
	g.armed.Store(true)
	posted = make(chan error)
	go func() { posted <- s[0].qp.PostSend(send) }() // its batch is held in WriteBatch
	<-g.entered
	require.NoError(t, s[0].qp.PostSend(send), "queued while the first batch is written")
	return s, g, posted
}

// wantBothSENDs waits for the two SENDs of queuedWhileWriting to complete
// at the second side, successfully.
func wantBothSENDs(t *testing.T, s [2]*side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []qp.WC
	wc := make([]qp.WC, 4)
	for len(got) < 2 {
		k, err := s[1].cq.Wait(ctx, wc)
		require.NoError(t, err, "both SENDs arrive")
		got = append(got, wc[:k]...)
	}
	for _, c := range got {
		assert.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
		assert.Equal(t, qp.IBV_WC_RECV, c.Opcode)
	}
}
