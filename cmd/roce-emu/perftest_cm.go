package main

// perftest's -R: the exchange and the data QPs over rdma_cm. perftest
// 6.06 (perftest_communication.c: create_comm_struct, rdma_client_connect,
// rdma_server_connect, create_rdma_cm_connection) opens no TCP connection
// then: its client connects one RC QP with rdma_cm to the test port (-p,
// rdma_cm's TCP port space), one receive of a struct pingpong_dest posted
// before the REQ or REP, and each message of the exchange is one SEND on
// it. After the versions, system data and MTU, a hand-shake; then the
// server listens again on the same port and the client connects each data
// QP with its own REQ; then another hand-shake, and the test goes on as
// with TCP, its key strings sent as binary dests, without ctx_connect.
// At the end each side disconnects its data QPs. perftest's -z alone runs
// only the exchange this way and connects the data QPs from the keys, as
// with TCP.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/rdmacm"
	"github.com/roce-emu/roce-emu/transport"
)

// perftestCMDialWait bounds how long a client retries a data QP's REQ that
// the server rejected for want of a listener: perftest's server listens
// again only after the hand-shake that lets the client go on.
const perftestCMDialWait = 5 * time.Second

// perftestCM is perftest's comm channel under -R and its data QPs'
// connections. It implements oob.PerftestMessenger.
type perftestCM struct {
	svc      *rdmacm.Service
	conn     *rdmacm.Conn // the comm QP's
	cq       *transport.CQ
	send     []byte
	recv     []byte
	sendMR   *qp.MR
	recvMR   *qp.MR
	wcs      []qp.WC
	sent     int   // SEND completions not yet claimed
	got      []int // lengths of messages received and not yet claimed
	gone     bool  // the peer disconnected the comm QP
	port     uint16
	peer     netip.Addr
	listener *rdmacm.Listener // the server's, for the data QPs
	data     []*rdmacm.Conn
	// ackTimeout is -u, every QP's local ACK timeout, as perftest sets it
	// on its rdma_cm ids (rdma_set_option RDMA_OPTION_ID_ACK_TIMEOUT,
	// perftest 24.10 on; older ones left rdma_cm's, about 2 s, and a lost
	// packet at the end of a window cost that long).
	ackTimeout uint8
}

// perftestCMResolve is host's address for rdma_cm.
func perftestCMResolve(ctx context.Context, host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), nil
	}
	as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(as) == 0 {
		return netip.Addr{}, fmt.Errorf("cannot resolve %q: %v", host, err)
	}
	return as[0].Unmap(), nil
}

// perftestCMConnect connects the comm QP: the client dials host's port,
// the server waits for one REQ on it and stops listening, as
// rdma_server_connect does.
func perftestCMConnect(ctx context.Context, ep *transport.Endpoint, f *perfFlags, host string, out io.Writer) (*perftestCM, error) {
	svc, err := rdmacm.New(ep, rdmacm.Config{UDPPort: uint16(f.udpPort)})
	if err != nil {
		return nil, err
	}
	c := &perftestCM{svc: svc, cq: ep.NewCQ(8), send: make([]byte, oob.PerftestDestLen), recv: make([]byte, oob.PerftestDestLen),
		wcs: make([]qp.WC, 8), port: uint16(f.port), ackTimeout: uint8(f.qpTimeout)}
	pd := ep.NewPD()
	if c.sendMR, err = pd.RegMR(c.send, 0); err == nil {
		c.recvMR, err = pd.RegMR(c.recv, qp.IBV_ACCESS_LOCAL_WRITE)
	}
	if err != nil {
		svc.Close()
		return nil, err
	}
	params := rdmacm.ConnParams{PD: pd, SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: 2, MaxRecvWR: 2, SQSigAll: true,
		RetryCount: 7, RNRRetryCount: 7, ACKTimeout: c.ackTimeout, RecvWRs: []qp.RecvWR{c.recvWR()}}
	if host == "" {
		l, err := svc.Listen(c.port)
		if err != nil {
			svc.Close()
			return nil, fmt.Errorf("cannot listen on rdma_cm port %d: %v", c.port, err)
		}
		fmt.Fprintln(out, "\n************************************")
		fmt.Fprintln(out, "* Waiting for client to connect... *")
		fmt.Fprintln(out, "************************************")
		c.conn, err = l.Accept(ctx, params)
		l.Close()
		if err != nil {
			err = fmt.Errorf("no client came over rdma_cm: %w", err)
			if d := drainCM(svc); d != "" {
				err = fmt.Errorf("%w (%s)", err, d)
			}
			svc.Close()
			return nil, err
		}
		c.peer = c.conn.RemoteAddr()
		return c, nil
	}
	if c.peer, err = perftestCMResolve(ctx, host); err != nil {
		svc.Close()
		return nil, err
	}
	if c.conn, err = svc.Dial(ctx, c.peer, c.port, params); err != nil {
		err = fmt.Errorf("cannot reach the server at %s rdma_cm port %d: %w", c.peer, c.port, err)
		if d := drainCM(svc); d != "" {
			err = fmt.Errorf("%w (%s)", err, d)
		}
		svc.Close()
		return nil, err
	}
	return c, nil
}

func (c *perftestCM) recvWR() qp.RecvWR {
	return qp.RecvWR{WRID: 1, SGEs: []qp.SGE{c.recvMR.SGE(0, len(c.recv))}}
}

// errPerftestCMGone: the peer disconnected the comm QP.
var errPerftestCMGone = errors.New("the peer disconnected the rdma_cm connection of the exchange")

// peerLeft reports that the peer disconnected the comm QP.
func (c *perftestCM) peerLeft() bool {
	select {
	case <-c.conn.Disconnected():
		return true
	default:
		return false
	}
}

// poll waits for completions of the comm QP and counts them.
func (c *perftestCM) poll(ctx context.Context) error {
	n, err := c.cq.Wait(ctx, c.wcs)
	if err != nil {
		return err
	}
	for _, wc := range c.wcs[:n] {
		if wc.Status == qp.IBV_WC_WR_FLUSH_ERR && c.peerLeft() {
			// The peer disconnects once it has the exchange's last
			// message: a SEND of ours its DREQ flushed before the ACK
			// came was received; the receive posted again is moot.
			c.gone = true
			if wc.Opcode == qp.IBV_WC_SEND {
				c.sent++
			}
			continue
		}
		if wc.Status != qp.IBV_WC_SUCCESS {
			return fmt.Errorf("the rdma_cm comm QP's %v completion failed: %v", wc.Opcode, wc.Status)
		}
		switch wc.Opcode {
		case qp.IBV_WC_SEND:
			c.sent++
		case qp.IBV_WC_RECV:
			c.got = append(c.got, int(wc.ByteLen))
		}
	}
	return nil
}

// SendMessage sends b (at most oob.PerftestDestLen bytes) as one SEND and
// waits for its completion, as rdma_write_data does.
func (c *perftestCM) SendMessage(ctx context.Context, b []byte) error {
	if len(b) > len(c.send) {
		return fmt.Errorf("a message of %d bytes: perftest receives at most %d", len(b), len(c.send))
	}
	if c.gone {
		return errPerftestCMGone
	}
	copy(c.send, b)
	if err := c.conn.QP().PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{c.sendMR.SGE(0, len(b))}}); err != nil {
		return err
	}
	for c.sent == 0 {
		if err := c.poll(ctx); err != nil {
			return err
		}
	}
	c.sent--
	return nil
}

// RecvMessage waits for the peer's next message, copies it into b and
// posts the receive again, as rdma_read_data does.
func (c *perftestCM) RecvMessage(ctx context.Context, b []byte) (int, error) {
	for len(c.got) == 0 {
		if c.gone {
			return 0, errPerftestCMGone
		}
		if err := c.poll(ctx); err != nil {
			return 0, err
		}
	}
	n := c.got[0]
	c.got = c.got[1:]
	copy(b, c.recv[:n])
	if err := c.conn.QP().PostRecv(c.recvWR()); err != nil {
		return n, err
	}
	return n, nil
}

// listen is the server's rdma_listen for the data QPs, before the
// hand-shake that lets the client dial them.
func (c *perftestCM) listen() error {
	l, err := c.svc.Listen(c.port)
	if err != nil {
		return fmt.Errorf("cannot listen on rdma_cm port %d for the data QPs: %v", c.port, err)
	}
	c.listener = l
	return nil
}

// connectQP connects data QP i with rdma_cm, as perftest's
// rdma_cm_route_handler (client) and rdma_cm_connection_request_handler
// (server) do: READ and atomic tests offer outReads READs each way,
// retries 7. The QP comes back in RTS with recvs posted.
//
// A client's REQ the server rejects for want of a listener (it listens
// again only after the hand-shake) is sent again for up to
// perftestCMDialWait.
func (c *perftestCM) connectQP(ctx context.Context, pd *transport.PD, cq *transport.CQ, init qp.InitAttr, access qp.Access, outReads uint8, mtu qp.MTU, recvs []qp.RecvWR) (*transport.QP, error) {
	p := rdmacm.ConnParams{PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: init.MaxSendWR, MaxRecvWR: init.MaxRecvWR, Access: access,
		ResponderResources: outReads, InitiatorDepth: outReads, RetryCount: 7, RNRRetryCount: 7, ACKTimeout: c.ackTimeout, PathMTU: mtu,
		CC: init.CC, NP: init.NP, RPOnly: init.RPOnly}
	var conn *rdmacm.Conn
	var err error
	if c.listener != nil {
		conn, err = c.listener.Accept(ctx, p)
	} else {
		dl := time.Now().Add(perftestCMDialWait)
		for {
			conn, err = c.svc.Dial(ctx, c.peer, c.port, p)
			var rej *rdmacm.RejectError
			if !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID || !time.Now().Before(dl) {
				break
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("data QP %d over rdma_cm: %w", len(c.data), err)
	}
	c.data = append(c.data, conn)
	// The receives go on once connected: a REQ rejected before the
	// server listened would flush them into the test's CQ. The peer's
	// first SEND comes after the hand-shakes that follow.
	for _, wr := range recvs {
		if err := conn.QP().PostRecv(wr); err != nil {
			return nil, err
		}
	}
	return conn.QP(), nil
}

// close disconnects the data QPs as perftest's rdma_cm_disconnect_nodes
// does, then the comm QP, and stops the Service. The DREPs are awaited at
// most cmDisconnectWait for the data QPs and as long for the comm QP,
// whatever state the run's context is in (a signal or --timeout ended
// it): the peer learns the connections are gone. It says what happened
// (see disconnectCM), the data QPs' then the exchange's connection; err
// names the data QPs whose DREQ went unanswered.
func (c *perftestCM) close() (detail string, err error) {
	if c.listener != nil {
		c.listener.Close()
	}
	detail, missing := disconnectCM(c.data...)
	// perftest destroys its comm cm_id last; either side may go first.
	comm, _ := disconnectCM(c.conn)
	switch {
	case len(c.data) == 0:
		detail = comm
	case comm != "no rdma_cm connection was up":
		// The exchange's DREQ is one more than the data QPs': say so.
		detail += "; the exchange's connection: " + comm
	}
	if d := drainCM(c.svc); d != "" {
		detail += "; " + d
	}
	c.svc.Close()
	if missing > 0 {
		err = fmt.Errorf("disconnecting the data QPs: %s", detail)
	}
	return detail, err
}
