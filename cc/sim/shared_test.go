package sim

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The simulation and the in-memory network's congestion point run the one
// port model: the arrivals the simulation's bottleneck saw, replayed as
// datagrams of the same wire size at the same times into a congestion
// point with the same configuration and seed, are marked, dropped and
// delivered exactly as the simulation's port decided.
func TestSimAndNetworkShareThePortModel(t *testing.T) {
	p, err := cc.Profile(cc.ProfilePaper, 10*cc.Gbps)
	require.NoError(t, err)
	c := Config{Flows: 4, LinkRate: 10 * cc.Gbps, Duration: 2 * time.Millisecond, MTU: 1024, Delay: time.Microsecond,
		Queue: cc.QueueConfig{LineRate: 10 * cc.Gbps, Buffer: 100000, KMin: 5000, KMax: 50000, PMax: 0.2},
		DCQCN: true, Params: p, Seed: 7}
	var arrivals []arrival
	res, err := run(c, func(a arrival) {
		if a.Left { // the dequeue mark
			arrivals[a.ID].CE = true
			return
		}
		arrivals = append(arrivals, a)
	})
	require.NoError(t, err)
	var marks, drops uint64
	for _, a := range arrivals {
		if a.CE {
			marks++
		}
		if !a.Queued {
			drops++
		}
	}
	require.NotZero(t, marks, "the run marks")
	require.NotZero(t, drops, "the run drops")
	t.Logf("%d arrivals, %d marked, %d dropped", len(arrivals), marks, drops)
	assert.Equal(t, res.Marked, marks)
	assert.Equal(t, res.Drops, drops)

	type got struct {
		ce   bool
		took time.Duration // from sending to delivery
	}
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{QueueLen: len(arrivals) + 1}, 1)
		dst := netip.MustParseAddrPort("192.0.2.10:4791")
		cp, err := n.AddCongestionPoint(dst, c.Queue, c.Seed)
		require.NoError(t, err)
		rc, err := n.Listen(dst)
		require.NoError(t, err)
		sc, err := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		require.NoError(t, err)
		start := time.Now()
		delivered := map[int]got{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			ds := make([]transport.Datagram, 64)
			for {
				k, err := rc.ReadBatch(ds)
				if err != nil {
					return
				}
				now := time.Now()
				for _, d := range ds[:k] {
					i := int(binary.BigEndian.Uint32(d.Data))
					delivered[i] = got{ce: d.TOS&3 == 3, took: now.Sub(start.Add(arrivals[i].T))}
				}
			}
		}()
		for i, a := range arrivals {
			time.Sleep(start.Add(a.T).Sub(time.Now()))
			data := make([]byte, a.Size-bth.FrameOverhead)
			binary.BigEndian.PutUint32(data, uint32(i))
			_, err := sc.WriteBatch([]transport.Datagram{{Data: data, Dst: dst, TOS: 2}})
			require.NoError(t, err)
		}
		time.Sleep(time.Second)
		rc.Close()
		<-done
		q := cp.Queue()
		assert.Equal(t, marks, q.Marked)
		assert.Equal(t, drops, q.Dropped)
		for i, a := range arrivals {
			g, ok := delivered[i]
			require.Equal(t, a.Queued, ok, "arrival %d at %v: queued", i, a.T)
			if ok {
				require.Equal(t, a.CE, g.ce, "arrival %d at %v: CE", i, a.T)
				require.Equal(t, a.Depart-a.T, g.took, "arrival %d at %v: time in the port", i, a.T)
			}
		}
	})
}
