package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// qpErrRun is a `bw -o write` server run against a hand-played perftest
// client whose RDMA WRITE with a wrong R_Key has ended the server's QP in
// IBV_QPS_ERR (the NAK seen), the exchange up to the traffic done.
type qpErrRun struct {
	c    net.Conn
	x    func(b []byte) []byte // one message each way
	key  []byte                // the client's key string
	wait func() (int, string)  // the exit code and output
}

// startQPErrRun starts the server (with extra flags) and plays the client
// up to the NAK.
func startQPErrRun(t *testing.T, extra ...string) *qpErrRun {
	t.Helper()
	return startPlayedClient(t, true, extra...)
}

// startPlayedClient is startQPErrRun, without the WRITE and its NAK when
// withNAK is false.
func startPlayedClient(t *testing.T, withNAK bool, extra ...string) *qpErrRun {
	t.Helper()
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	var out, errb bytes.Buffer
	var code int
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = run(append([]string{"bw", "-o", "write", "-s", "4096", "-n", "5", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "--timeout", "20s"}, extra...), &out, &errb)
	}()
	uport, err := net.LookupPort("udp", udp)
	require.NoError(t, err)
	// The client's RoCE side: a socket at the address its key announces.
	rc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: uport})
	require.NoError(t, err)
	defer rc.Close()
	var c net.Conn
	for range 200 {
		if c, err = net.Dial("tcp", "127.0.0.1:"+tcp); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, err)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	x := func(b []byte) []byte {
		t.Helper()
		_, err := c.Write(b)
		require.NoError(t, err)
		r := make([]byte, len(b))
		_, err = io.ReadFull(c, r)
		require.NoError(t, err)
		return r
	}
	x(append([]byte("6.06"), make([]byte, 12)...))
	x([]byte{0, 0, 0x10, 0})
	x([]byte{0, 0, 0, 64})
	x([]byte("3\x00"))
	mine := oob.PerftestKey{LID: 0, OutReads: 1, QPN: 0x99, PSN: 0x1234, RKey: 0x77, VA: 0x10000, GID: netip.MustParseAddr("::ffff:127.0.0.1")}
	key, err := mine.Append(nil)
	require.NoError(t, err)
	srv, err := oob.ParsePerftestKey(x(key))
	require.NoError(t, err)
	x(key)
	x(key)
	x(key)

	if !withNAK {
		return &qpErrRun{c: c, x: x, key: key, wait: func() (int, string) {
			<-done
			return code, out.String() + errb.String()
		}}
	}
	// An RDMA WRITE at the PSN the server expects, with an R_Key it never
	// gave: the server's responder NAKs it and its QP goes to ERR.
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: srv.QPN, PSN: mine.PSN, AckReq: true},
		RETH: bth.RETH{VA: srv.VA, RKey: srv.RKey ^ 0x5500, DMALength: 8}, Payload: make([]byte, 8)}
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(uport))
	enc := bth.Encap{Src: netip.MustParseAddr("127.0.0.1"), Dst: dst.Addr(), SrcPort: uint16(uport), DstPort: dst.Port()}
	b, err := p.Append(nil, &enc)
	require.NoError(t, err)
	_, err = rc.WriteToUDPAddrPort(b, dst)
	require.NoError(t, err)
	rc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2048)
	n, err := rc.Read(buf)
	require.NoError(t, err, "the NAK")
	var nak bth.Packet
	require.NoError(t, nak.Decode(buf[:n]))
	assert.Equal(t, bth.SyndromeRemoteAccess, nak.AETH.Syndrome)
	return &qpErrRun{c: c, x: x, key: key, wait: func() (int, string) {
		<-done
		return code, out.String() + errb.String()
	}}
}

// A `bw -o write` server whose QP a peer's request ends in IBV_QPS_ERR (an
// RDMA WRITE with a wrong R_Key: NAK Remote Access Error) finishes
// perftest's exchange with the client and then exits 1, saying which QP
// ended in ERR and why, and its final counters list the refusal by cause
// (issue 14, item 3).
func TestPerftestServerQPErrExitsNonZero(t *testing.T) {
	r := startQPErrRun(t)
	defer r.c.Close()
	x, key := r.x, r.key
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	x(u64(4096))
	x(u64(5))
	for _, v := range []float64{0.5, 0.4, 0.01} {
		x(u64(math.Float64bits(v)))
	}
	x(key)
	x([]byte("done\x00"))
	code, o := r.wait()
	assert.Equal(t, 1, code, o)
	assert.Contains(t, o, "drops and refusals: resp_remote_access_errors 1")
	assert.Contains(t, o, "QP 0x11 ended in IBV_QPS_ERR: qp: the responder refused the request at PSN 0x001234 with NAK_REMOTE_ACCESS")
	t.Log(o)
}

// qpErrors names a QP a NAK ended and passes over one the command moved
// to ERR itself; describeDrops lists each cause or says none.
func TestQPErrorsAndDrops(t *testing.T) {
	n := transport.NewNetwork(transport.Impairments{}, 1)
	conn, err := n.Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
	require.NoError(t, err)
	ep := transport.NewEndpoint(conn, transport.Options{})
	defer ep.Close()
	pd := ep.NewPD()
	cq := ep.NewCQ(16)
	a, err := ep.NewQP(pd, cq, cq, qp.InitAttr{})
	require.NoError(t, err)
	b, err := ep.NewQP(pd, cq, cq, qp.InitAttr{})
	require.NoError(t, err)
	assert.NoError(t, qpErrors(a, b))
	require.NoError(t, b.Modify(&qp.Attr{State: qp.IBV_QPS_ERR}, qp.IBV_QP_STATE))
	assert.NoError(t, qpErrors(a, b), "moved to ERR by the command")
	// a: its RDMA WRITE to a peer that allows none is NAKed (remote
	// access error) and the QP ends in ERR.
	conn2, err := n.Listen(netip.MustParseAddrPort("192.0.2.2:4791"))
	require.NoError(t, err)
	ep2 := transport.NewEndpoint(conn2, transport.Options{})
	defer ep2.Close()
	cq2 := ep2.NewCQ(16)
	c, err := ep2.NewQP(ep2.NewPD(), cq2, cq2, qp.InitAttr{})
	require.NoError(t, err)
	require.NoError(t, a.Connect(transport.Remote{Addr: ep2.LocalAddr(), QPN: c.QPN(), PSN: 0x100}, 0x200, transport.ConnectAttr{}))
	require.NoError(t, c.Connect(transport.Remote{Addr: ep.LocalAddr(), QPN: a.QPN(), PSN: 0x200}, 0x100, transport.ConnectAttr{}))
	buf := make([]byte, 8)
	mr, err := pd.RegMR(buf, qp.IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	require.NoError(t, a.PostSend(qp.SendWR{Opcode: qp.IBV_WR_RDMA_WRITE, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{mr.SGE(0, 8)},
		RemoteAddr: 0x10000, RKey: 0x1234}))
	require.Eventually(t, func() bool { return a.State() == qp.IBV_QPS_ERR }, 10*time.Second, time.Millisecond)
	err = qpErrors(a, b)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("QP %#x ended in IBV_QPS_ERR: qp: a send work request completed with IBV_WC_REM_ACCESS_ERR", a.QPN()))
	assert.NotContains(t, err.Error(), fmt.Sprintf("QP %#x", b.QPN()))

	// Completions lost to a full CQ are drops too: sends posted in ERR
	// complete at once, more than the CQ holds.
	for range 20 {
		require.NoError(t, a.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, Flags: qp.IBV_SEND_SIGNALED, SGEs: []qp.SGE{mr.SGE(0, 8)}}))
	}
	require.NotZero(t, cq.Overruns())
	assert.Equal(t, fmt.Sprintf("cq_overruns %d", cq.Overruns()), describeDrops(qp.Counters{}, transport.Stats{}, cq, cq2))

	assert.Equal(t, "none", describeDrops(qp.Counters{SentPackets: 3}, transport.Stats{Received: 4}))
	assert.Equal(t, "retry_exceeded_err 1, rx_qp_state_err 2, rx_unknown_qp 5",
		describeDrops(qp.Counters{RetryExceededErr: 1, QPStateErr: 2}, transport.Stats{UnknownQP: 5}))
}
