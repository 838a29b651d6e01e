package transport

import (
	"bytes"
	"io"
	"net/netip"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type vectorPacket struct {
	src  netip.Addr
	data []byte // UDP payload: BTH to ICRC
	p    bth.Packet
}

func readVector(t *testing.T, name string) []vectorPacket {
	r, err := pcap.Open(filepath.Join("..", "testdata", name))
	require.NoError(t, err)
	defer r.Close()
	d := pcap.NewDecoder()
	var rec pcap.Record
	var out []vectorPacket
	for {
		data, ci, lt, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		k, err := d.Decode(data, ci, lt, &rec)
		require.NoError(t, err)
		require.Equal(t, pcap.KindRoCE, k)
		v := vectorPacket{src: rec.Src, data: append([]byte(nil), rec.UDPPayload...)}
		require.NoError(t, v.p.Decode(v.data))
		out = append(out, v)
	}
	return out
}

// rxe (Linux 6.1, in qemu, interop scenario pingpong-rxe-client-mtu1024-s65536)
// sent the First packet of a 64-packet SEND twice, 0.5 ms apart, before any
// ACK: a spurious retransmission (its completer_retry_err counter grew). The
// capture is testdata/rxe-duplicate-send-first-mtu1024.pcap: rxe's packets
// from 192.0.2.2, roce-emu's answers from 192.0.2.1. roce-emu must treat the
// copy as a duplicate: ACK it again with the last PSN it accepted (as rxe's
// own responder does), deliver the message once, and ACK the Last.
func TestRxeDuplicateSendFirst(t *testing.T) {
	vec := readVector(t, "rxe-duplicate-send-first-mtu1024.pcap")
	rxe := netip.MustParseAddr("192.0.2.2")
	var reqs, answers []vectorPacket
	for _, v := range vec {
		if v.src == rxe {
			reqs = append(reqs, v)
		} else if v.p.BTH.Opcode == bth.RCAcknowledge {
			answers = append(answers, v)
		}
	}
	require.Equal(t, bth.RCSendFirst, reqs[0].p.BTH.Opcode)
	require.Equal(t, reqs[0].p.BTH.PSN, reqs[1].p.BTH.PSN, "the vector starts with the First twice")
	require.Len(t, answers, 2)
	first := reqs[0].p.BTH.PSN

	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(Impairments{Delay: time.Microsecond}, 1)
		ours, _ := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
		peer, _ := n.Listen(netip.AddrPortFrom(rxe, 4791))
		// rxe's ICRCs cover its changing IP IDs, which the network does not carry.
		ep := NewEndpoint(ours, Options{ICRC: ICRCOff})
		defer ep.Close()
		pd := ep.NewPD()
		cq := ep.NewCQ(16)
		q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{})
		require.NoError(t, err)
		require.Equal(t, reqs[0].p.BTH.DestQP, q.QPN())
		buf := make([]byte, 65536)
		mr, _ := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
		require.NoError(t, q.PostRecv(qp.RecvWR{WRID: 1, SGEs: []qp.SGE{mr.SGE(0, len(buf))}}))
		require.NoError(t, q.Connect(Remote{Addr: netip.AddrPortFrom(rxe, 4791), QPN: answers[0].p.BTH.DestQP, PSN: first}, 0x100, ConnectAttr{}))

		ds := make([]Datagram, len(reqs))
		for i, v := range reqs {
			ds[i] = Datagram{Data: v.data, Src: netip.AddrPortFrom(rxe, 49543), Dst: ours.LocalAddr()}
		}
		// As in the capture: the First, its copy 0.5 ms later, then the
		// rest. Written at once, where the Endpoint's reads cut the batch
		// decides whether the copy's re-ACK leaves before the Last's ACK
		// replaces it in the queue (one ACK, not the capture's two).
		for _, part := range [][]Datagram{ds[:1], ds[1:2], ds[2:]} {
			_, err = peer.WriteBatch(part)
			require.NoError(t, err)
			time.Sleep(500 * time.Microsecond)
			synctest.Wait()
		}
		wc := wait(t, cq, 1)
		require.Equal(t, qp.IBV_WC_SUCCESS, wc[0].Status)
		assert.Equal(t, uint32(65536), wc[0].ByteLen)
		var want []byte
		for _, v := range reqs[1:] { // the copy of the First, then the rest
			if v.p.BTH.Opcode != bth.RCSendFirst || v.p.BTH.PSN == first {
				want = append(want, v.p.Payload...)
			}
		}
		assert.True(t, bytes.Equal(want[:65536], buf), "the message arrives once, in place")

		time.Sleep(time.Millisecond)
		synctest.Wait()
		got := make([]Datagram, 8)
		k, err := peer.ReadBatch(got)
		require.NoError(t, err)
		require.Equal(t, 2, k, "two ACKs, as in the capture")
		for i := range k {
			var p bth.Packet
			require.NoError(t, p.Decode(got[i].Data))
			assert.Equal(t, answers[i].p.BTH.PSN, p.BTH.PSN, "ACK %d PSN", i)
			assert.Equal(t, answers[i].p.AETH.Syndrome, p.AETH.Syndrome)
			assert.Equal(t, answers[i].p.AETH.MSN-answers[0].p.AETH.MSN, p.AETH.MSN, "MSN counts from the start of the connection")
		}
	})
}
