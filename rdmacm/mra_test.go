package rdmacm_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listener whose Accept comes late: the active side resends its REQ
// after its response timeout (about 6.4 s), the passive side answers the
// duplicate with an MRA asking for 2^24 * 4.096 us (about 69 s), as
// Linux's CM does for a REQ its rdma_cm consumer has not answered, and
// the active side then waits instead of resending; Accept 60 s later
// still connects, with one REQ resent and one MRA on the wire.
func TestSlowAcceptGetsMRA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNet()
		var mu sync.Mutex
		sent := map[string][]cm.AttrID{}
		watch := func(who string) transport.Observer {
			return func(e *transport.Event) {
				if e.Dir != transport.Out || e.Packet == nil || e.Packet.BTH.DestQP != 1 {
					return
				}
				var h cm.Header
				if h.Decode(e.Packet.Payload) == nil {
					mu.Lock()
					sent[who] = append(sent[who], h.AttrID)
					mu.Unlock()
				}
			}
		}
		a := newObservedSide(t, n, "192.0.2.1", transport.Options{}, watch("a"))
		b := newObservedSide(t, n, "192.0.2.2", transport.Options{}, watch("b"))
		l := b.listen(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		dialed := dialAsync(ctx, a, b.svc.LocalAddr(), a.params(nil))
		time.Sleep(60 * time.Second) // the consumer is busy
		mu.Lock()
		assert.Equal(t, []cm.AttrID{cm.AttrREQ, cm.AttrREQ}, sent["a"], "one REQ resent, then none: the MRA holds it")
		assert.Equal(t, []cm.AttrID{cm.AttrMRA}, sent["b"])
		mu.Unlock()
		server, err := l.Accept(ctx, b.params(nil))
		require.NoError(t, err)
		r := <-dialed
		require.NoError(t, r.err)
		transfer(t, a, b, r.c, server, 3)
		assert.Equal(t, uint64(1), b.svc.Stats().CM.DuplicateREQs)
		assert.Equal(t, uint64(1), a.svc.Stats().CM.Retransmits)
		require.NoError(t, r.c.Disconnect(ctx))
		require.NoError(t, r.c.Close())
		require.NoError(t, server.Close())
	})
}
