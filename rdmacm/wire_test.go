package rdmacm_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// qp1Header is what the wire shows of a MAD's packet besides the MAD.
type qp1Header struct {
	TOS    uint8
	AckReq bool
	SrcQP  uint32
	QKey   uint32
	PKey   uint16
}

// rxeQP1Headers reads the headers of the MADs in the rxe rdma_cm capture.
func rxeQP1Headers(t *testing.T) []qp1Header {
	t.Helper()
	r, err := pcap.Open(filepath.Join(testenv.SharedPcaps(t), "rxe-qemu-rdmacm-write18-read4096-mtu1024.pcap"))
	require.NoError(t, err)
	defer r.Close()
	d := pcap.NewDecoder()
	var out []qp1Header
	for {
		data, ci, lt, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		var rec pcap.Record
		kind, err := d.Decode(data, ci, lt, &rec)
		require.NoError(t, err)
		if kind == pcap.KindRoCE && rec.Packet.BTH.DestQP == 1 {
			p := &rec.Packet
			out = append(out, qp1Header{rec.TrafficClass, p.BTH.AckReq, p.DETH.SrcQP, p.DETH.QKey, p.BTH.PKey})
		}
	}
}

// The MADs roce-emu sends from QP1 carry the headers rxe's carry: AckReq
// set, TOS 0 (DSCP 0, Not-ECT) even when the Endpoint marks its data
// ECT(0) with a DSCP, source QP 1, Q_Key 0x80010000, P_Key 0xFFFF.
func TestQP1HeadersAsRXE(t *testing.T) {
	want := rxeQP1Headers(t)
	require.Len(t, want, 5)
	for _, w := range want[1:] {
		require.Equal(t, want[0], w)
	}
	synctest.Test(t, func(t *testing.T) {
		n := transport.NewNetwork(transport.Impairments{Delay: 10 * time.Microsecond}, 1)
		var mu sync.Mutex
		var got []qp1Header
		dataTOS := map[uint8]int{}
		obs := func(e *transport.Event) {
			if e.Dir != transport.Out || e.Packet == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			p := e.Packet
			if p.BTH.DestQP != 1 {
				dataTOS[e.Datagram.TOS]++
				return
			}
			got = append(got, qp1Header{e.Datagram.TOS, p.BTH.AckReq, p.DETH.SrcQP, p.DETH.QKey, p.BTH.PKey})
		}
		open := func(addr string) side { return newObservedSide(t, n, addr, transport.Options{DSCP: 26}, obs) }
		a, b := open("192.0.2.1"), open("192.0.2.2")
		l, err := b.svc.Listen(7174)
		require.NoError(t, err)
		client, server := connect(t, a, b, l)
		transfer(t, a, b, client, server, 1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, client.Disconnect(ctx))
		<-server.Disconnected()
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, 5, "REQ, REP, RTU, DREQ, DREP")
		// The data QPs keep the Endpoint's DSCP and ECT(0).
		require.Len(t, dataTOS, 1)
		require.Positive(t, dataTOS[bth.TrafficClass(26, bth.ECT0)])
		for i, g := range got {
			assert.Equal(t, want[0], g, "MAD %d", i)
		}
	})
}
