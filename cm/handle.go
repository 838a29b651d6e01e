package cm

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/qp"
)

// HandleMAD takes one MAD that QP1 received from the peer at address from
// (the source of its IP header; an IPv4-mapped address counts as IPv4).
// mad is the receive buffer after the 40-byte GRH slot: 256 bytes (more
// are ignored). It queues the MADs the message calls for and reports
// events; a MAD it cannot use is dropped, counted in one Counters.Drop*
// field, and described by the returned error (nil when the MAD was used).
func (m *Manager) HandleMAD(now time.Time, from netip.Addr, mad []byte) error {
	m.counters.MADsReceived++
	from = from.Unmap()
	if !from.IsValid() {
		m.counters.DropMalformed++
		return fmt.Errorf("%w: a MAD from no address", ErrFieldRange)
	}
	h, msg, err := DecodeMAD(mad)
	switch {
	case errors.Is(err, ErrUnknownAttr):
		m.counters.DropUnknownAttr++
		return err
	case err != nil:
		m.counters.DropMalformed++
		return err
	}
	switch msg := msg.(type) {
	case *REQ:
		return m.handleREQ(now, from, &h, msg)
	case *MRA:
		return m.handleMRA(now, from, msg)
	case *REJ:
		return m.handleREJ(now, from, msg)
	case *REP:
		return m.handleREP(now, from, msg)
	case *RTU:
		return m.handleRTU(from, msg)
	case *DREQ:
		return m.handleDREQ(now, from, &h, msg)
	case *DREP:
		return m.handleDREP(now, from, msg)
	}
	return nil // unreachable: DecodeMAD returns the seven types above
}

func (m *Manager) dropState(c *conn, a AttrID) error {
	m.counters.DropBadState++
	return fmt.Errorf("%w: %v for connection %#08x in %v", ErrState, a, c.localID, c.state)
}

func (m *Manager) dropUnknown(a AttrID, id uint32) error {
	m.counters.DropUnknownConn++
	return fmt.Errorf("%w: %v for local communication ID %#08x", ErrNoConnection, a, id)
}

// byLocal finds the connection a message names by our local ID (its
// RemoteCommID field), from the peer it belongs to.
func (m *Manager) byLocal(from netip.Addr, id uint32) *conn {
	c := m.conns[id]
	if c == nil || c.peer != from {
		return nil
	}
	return c
}

// rejectREQ answers a REQ no connection takes.
func (m *Manager) rejectREQ(from netip.Addr, tid uint64, req *REQ, reason RejectReason) {
	m.rejectREQARI(from, tid, req, reason, nil)
}

// rejectREQARI answers a REQ no connection takes, with additional
// rejection information.
func (m *Manager) rejectREQARI(from netip.Addr, tid uint64, req *REQ, reason RejectReason, ari []byte) {
	m.counters.RejectsSent++
	rej := &REJ{RemoteCommID: req.LocalCommID, MessageRejected: MsgREQ, Reason: reason, ARILength: uint8(len(ari))}
	copy(rej.ARI[:], ari)
	m.send(from, tid, rej)
}

// isLocal reports whether a is one of Config.LocalGIDs (any address when
// none is configured).
func (m *Manager) isLocal(a netip.Addr) bool {
	if len(m.cfg.LocalGIDs) == 0 {
		return true
	}
	a = a.Unmap().WithZone("")
	for _, g := range m.cfg.LocalGIDs {
		if g.Unmap().WithZone("") == a {
			return true
		}
	}
	return false
}

// portSpaceTakes reports whether a REQ of transport service type st may
// connect to the RDMA IP CM port space ps. rdma_cm fixes the QP type of
// an rdma_cm_id by its port space (librdmacm rdma_create_id,
// ucma_get_qp_type: RDMA_PS_TCP and RDMA_PS_IPOIB give RC, RDMA_PS_UDP
// gives UD, which connects by SIDR and takes no REQ, RDMA_PS_IB takes
// what the user gives); Linux cma_ib_check_req_qp_type refuses a REQ whose
// QP type is not the listener's.
func portSpaceTakes(ps uint16, st uint8) bool {
	switch ps {
	case PortSpaceTCP, PortSpaceIPoIB:
		return st == ServiceRC
	case PortSpaceUDP:
		return false
	}
	return st == ServiceRC || st == ServiceUC
}

func (m *Manager) handleREQ(now time.Time, from netip.Addr, h *Header, req *REQ) error {
	if c := m.remote[remoteKey{from, req.LocalCommID}]; c != nil && !c.active {
		m.counters.DuplicateREQs++
		switch c.state {
		case StateREQRcvd, StateMRAREQSent:
			// The consumer has not answered yet: ask the active side to
			// wait (IBTA 12.6.6).
			c.state = StateMRAREQSent
			m.send(from, c.tid, &MRA{LocalCommID: c.localID, RemoteCommID: c.remoteID,
				MessageMRAed: MsgREQ, ServiceTimeout: m.cfg.MRAServiceTimeout})
		case StateREPSent, StateMRAREPRcvd:
			// Our REP was lost: send it again.
			m.queue(Outgoing{To: from, MAD: c.resend})
		case StateTimeWait:
			m.rejectREQ(from, h.TransactionID, req, RejStaleConn)
		}
		return nil
	}
	if _, ok := m.listeners[req.ServiceID]; !ok {
		m.counters.NoListener++
		m.rejectREQ(from, h.TransactionID, req, RejInvalidServiceID)
		return fmt.Errorf("cm: REQ for service ID %#016x, which has no listener: rejected", req.ServiceID)
	}
	if req.TransportServiceType != ServiceRC && req.TransportServiceType != ServiceUC {
		m.counters.DropBadTransport++
		m.rejectREQ(from, h.TransactionID, req, RejInvalidTransportType)
		return fmt.Errorf("cm: REQ for transport service type %d: rejected", req.TransportServiceType)
	}
	if qp.MTU(req.PathMTU).Bytes() == 0 {
		m.counters.DropMalformed++
		m.rejectREQ(from, h.TransactionID, req, RejInvalidMTU)
		return fmt.Errorf("cm: REQ with path MTU code %d: rejected", req.PathMTU)
	}
	// The checks Linux makes before a REQ reaches the consumer, in its
	// order; each fails with a REJ and no connection is made, so that no
	// REP can go out for a REQ that cannot be served.
	if !m.isLocal(req.Primary.RemoteGID) {
		// cm.c cm_req_handler: the primary path's GID (the REQ's Primary
		// Remote Port GID: this side) is not one of this port's, so no
		// address vector can be made; the REJ says invalid GID and its ARI
		// carries the port's GID at index 0.
		m.counters.DropBadGID++
		g := m.cfg.LocalGIDs[0].Unmap().As16()
		m.rejectREQARI(from, h.TransactionID, req, RejInvalidGID, g[:])
		return fmt.Errorf("cm: REQ for GID %v, which is not this device's: rejected", req.Primary.RemoteGID)
	}
	var ip IPHeader
	hasIP := false
	if ps, _, ok := ParseServiceID(req.ServiceID); ok {
		// rdma_cm's listener (cma.c cma_ib_req_handler) refuses what it
		// cannot take by failing the REQ event, and cm.c's cm_destroy_id
		// then sends a REJ with reason consumer defined (28): a QP type
		// the port space does not have (cma_ib_check_req_qp_type), and
		// private data whose IP CM header is not version 0 with IP
		// version 4 or 6, or names a destination address that is not this
		// side's (cma_match_private_data, cma_save_ip_info).
		if !portSpaceTakes(ps, req.TransportServiceType) {
			m.counters.DropBadTransport++
			m.rejectREQ(from, h.TransactionID, req, RejConsumer)
			return fmt.Errorf("cm: REQ for transport service type %d on an rdma_cm port space %#04x: rejected", req.TransportServiceType, ps)
		}
		if err := ip.Decode(req.PrivateData[:]); err != nil {
			m.counters.DropBadPrivateData++
			m.rejectREQ(from, h.TransactionID, req, RejConsumer)
			return fmt.Errorf("cm: REQ for an rdma_cm service ID: %w: rejected", err)
		}
		if !m.isLocal(ip.Dst) {
			m.counters.DropBadPrivateData++
			m.rejectREQ(from, h.TransactionID, req, RejConsumer)
			return fmt.Errorf("cm: REQ whose IP CM header names destination %v, not this side: rejected", ip.Dst)
		}
		hasIP = true
	}
	if len(m.conns) >= m.cfg.MaxConnections {
		m.counters.DropNoResources++
		m.rejectREQ(from, h.TransactionID, req, RejNoResources)
		return ErrTooManyConnections
	}
	c := &conn{state: StateREQRcvd, localID: m.newLocalID(), remoteID: req.LocalCommID, peer: from,
		serviceID: req.ServiceID, tid: h.TransactionID, req: *req}
	local := req.Primary.RemoteGID
	c.params = QPParams{Local: local, Remote: from, RemoteQPN: req.LocalQPN, SQPSN: req.StartingPSN,
		PathMTU: qp.MTU(req.PathMTU), Timeout: req.Primary.LocalACKTimeout, RetryCnt: req.RetryCount,
		RNRRetry: req.RNRRetryCount, MinRNRTimer: m.cfg.MinRNRTimer, TrafficClass: req.Primary.TrafficClass,
		HopLimit: req.Primary.HopLimit, FlowLabel: req.Primary.FlowLabel, TransportService: req.TransportServiceType,
		UsesSRQ: req.SRQ, PeerResponseTime: req.LocalCMResponseTimeout, LocalResponseTime: m.cfg.CMResponseTimeout,
		MaxRdAtomic: req.ResponderResources, MaxDestRdAtomic: req.InitiatorDepth}
	m.conns[c.localID] = c
	m.remote[remoteKey{from, c.remoteID}] = c
	r := *req // the caller's copy
	e := Event{Type: EventConnectRequest, ID: c.localID, Peer: from, ServiceID: req.ServiceID, Params: c.params,
		Request: &r, PrivateData: r.PrivateData[:]}
	if hasIP {
		e.IP, e.HasIP = ip, true
		e.PrivateData = r.PrivateData[IPHeaderLen:]
	}
	m.event(e)
	return nil
}

func (m *Manager) handleMRA(now time.Time, from netip.Addr, mra *MRA) error {
	c := m.byLocal(from, mra.RemoteCommID)
	if c == nil {
		return m.dropUnknown(AttrMRA, mra.RemoteCommID)
	}
	wait := IBTime(mra.ServiceTimeout) + 2*m.plt()
	switch {
	case mra.MessageMRAed == MsgREQ && (c.state == StateREQSent || c.state == StateMRAREQRcvd):
		c.state = StateMRAREQRcvd
	case mra.MessageMRAed == MsgREP && (c.state == StateREPSent || c.state == StateMRAREPRcvd):
		c.state = StateMRAREPRcvd
	default:
		return m.dropState(c, AttrMRA)
	}
	if c.remoteID == 0 && mra.LocalCommID != 0 {
		c.remoteID = mra.LocalCommID
	}
	c.arm(now, wait)
	return nil
}

func (m *Manager) handleREJ(now time.Time, from netip.Addr, rej *REJ) error {
	c := m.byLocal(from, rej.RemoteCommID)
	if c == nil && rej.LocalCommID != 0 {
		// A REJ that does not know our ID (a timeout REJ of a REQ we
		// answered): find the connection by the peer's.
		c = m.remote[remoteKey{from, rej.LocalCommID}]
	}
	if c == nil {
		return m.dropUnknown(AttrREJ, rej.RemoteCommID)
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREQRcvd, StateMRAREQSent:
		if rej.Reason == RejStaleConn {
			// IBTA 12.9.6: a stale connection REJ sends the IDs to TIMEWAIT.
			m.enterTimeWait(now, c)
		} else {
			m.remove(c)
		}
	case StateREPSent, StateMRAREPRcvd, StateEstablished:
		m.enterTimeWait(now, c)
	default:
		return m.dropState(c, AttrREJ)
	}
	m.counters.RejectsReceived++
	m.event(Event{Type: EventRejected, ID: c.localID, Peer: c.peer, ServiceID: c.serviceID, Reason: rej.Reason,
		ARI: append([]byte(nil), rej.ARIBytes()...), PrivateData: append([]byte(nil), rej.PrivateData[:]...)})
	return nil
}

func (m *Manager) handleREP(now time.Time, from netip.Addr, rep *REP) error {
	c := m.byLocal(from, rep.RemoteCommID)
	if c == nil || !c.active {
		return m.dropUnknown(AttrREP, rep.RemoteCommID)
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
	case StateEstablished, StateDREQSent:
		if rep.LocalCommID == c.remoteID {
			// Our RTU was lost and the passive side resent its REP.
			m.counters.DuplicateREPs++
			if c.state == StateEstablished {
				m.send(from, c.tid, &RTU{LocalCommID: c.localID, RemoteCommID: c.remoteID})
			}
			return nil
		}
		return m.dropState(c, AttrREP)
	default:
		return m.dropState(c, AttrREP)
	}
	if rep.LocalQPN == 0 {
		m.counters.DropMalformed++
		return fmt.Errorf("cm: REP for %#08x with QPN 0", c.localID)
	}
	p := &c.params // c is forgotten if Apply refuses: no copy to restore
	p.RemoteQPN, p.SQPSN = rep.LocalQPN, rep.StartingPSN
	p.MaxRdAtomic, p.MaxDestRdAtomic = rep.ResponderResources, rep.InitiatorDepth
	p.RNRRetry = rep.RNRRetryCount
	p.Timeout = ackTimeout(rep.TargetACKDelay, m.cfg.PacketLifeTime)
	p.UsesSRQ = rep.SRQ
	if c.apply != nil {
		if err := c.apply(p); err != nil {
			// cma.c cma_rep_recv: the QP cannot take the REP's values; a
			// REJ instead of the RTU, and the ID goes back to idle
			// (cm.c: a REJ in REP_RCVD resets the ID).
			m.counters.REPsRefused++
			m.counters.RejectsSent++
			m.send(from, c.tid, &REJ{LocalCommID: c.localID, RemoteCommID: rep.LocalCommID, MessageRejected: MsgREP, Reason: RejConsumer})
			m.remove(c)
			m.event(Event{Type: EventConnectError, ID: c.localID, Peer: from, ServiceID: c.serviceID, Params: c.params,
				Reason: RejConsumer})
			return fmt.Errorf("cm: REP for %#08x: %w (rejected)", c.localID, err)
		}
	}
	c.rep = *rep
	c.remoteID = rep.LocalCommID
	m.remote[remoteKey{from, c.remoteID}] = c
	c.state = StateEstablished
	c.deadline = time.Time{}
	m.send(from, c.tid, &RTU{LocalCommID: c.localID, RemoteCommID: c.remoteID})
	m.event(Event{Type: EventEstablished, ID: c.localID, Peer: from, ServiceID: c.serviceID, Params: c.params,
		PrivateData: append([]byte(nil), rep.PrivateData[:]...)})
	return nil
}

func (m *Manager) handleRTU(from netip.Addr, rtu *RTU) error {
	c := m.byLocal(from, rtu.RemoteCommID)
	if c == nil || c.active || c.remoteID != rtu.LocalCommID {
		return m.dropUnknown(AttrRTU, rtu.RemoteCommID)
	}
	if c.state != StateREPSent && c.state != StateMRAREPRcvd {
		return m.dropState(c, AttrRTU)
	}
	m.establishPassive(c)
	return nil
}

func (m *Manager) handleDREQ(now time.Time, from netip.Addr, h *Header, dreq *DREQ) error {
	c := m.byLocal(from, dreq.RemoteCommID)
	if c == nil || c.remoteID != dreq.LocalCommID {
		// IBTA 12.9.6 / Linux cm_issue_drep: a DREQ for a connection we
		// do not know still gets its DREP, so the peer can finish.
		m.counters.UnknownDREQs++
		m.send(from, h.TransactionID, &DREP{LocalCommID: dreq.RemoteCommID, RemoteCommID: dreq.LocalCommID})
		return nil
	}
	if dreq.RemoteQPN != c.params.LocalQPN {
		m.counters.DropBadQPN++
		return fmt.Errorf("cm: DREQ for %#08x names QPN %#x, the connection's is %#x", c.localID, dreq.RemoteQPN, c.params.LocalQPN)
	}
	// The DREP answers the DREQ's transaction (Linux cm_dreq_handler).
	drep := &DREP{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	switch c.state {
	case StateEstablished, StateREPSent, StateMRAREPRcvd, StateDREQSent:
		m.send(from, h.TransactionID, drep)
		m.enterTimeWait(now, c)
		m.event(Event{Type: EventDisconnected, ID: c.localID, Peer: from, ServiceID: c.serviceID,
			PrivateData: append([]byte(nil), dreq.PrivateData[:]...)})
	case StateTimeWait:
		m.send(from, h.TransactionID, drep) // our DREP was lost
	default:
		return m.dropState(c, AttrDREQ)
	}
	return nil
}

func (m *Manager) handleDREP(now time.Time, from netip.Addr, drep *DREP) error {
	c := m.byLocal(from, drep.RemoteCommID)
	if c == nil || c.remoteID != drep.LocalCommID {
		return m.dropUnknown(AttrDREP, drep.RemoteCommID)
	}
	if c.state != StateDREQSent {
		return m.dropState(c, AttrDREP)
	}
	m.enterTimeWait(now, c)
	m.event(Event{Type: EventDisconnected, ID: c.localID, Peer: from, ServiceID: c.serviceID,
		PrivateData: append([]byte(nil), drep.PrivateData[:]...)})
	return nil
}
