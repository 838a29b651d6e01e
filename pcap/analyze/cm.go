package analyze

import (
	"encoding/binary"
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
)

// CM: connections set up by the InfiniBand Communication Manager (rdma_cm)
// announce their QPNs and starting PSNs in MADs (IBTA 12.6): UD SEND_ONLY
// packets to QP1 whose MAD has management class 0x07. A REQ carries the
// active side's QPN and a starting PSN, the REP that answers it (its
// RemoteCommID is the REQ's LocalCommID) the passive side's. The active
// side's first request carries the REP's starting PSN and the passive
// side's the REQ's (as rxe and the shared rdma_cm capture show).

const (
	madLen      = 24 // MAD common header
	mgmtClassCM = 0x07
	attrREQ     = 0x0010
	attrREP     = 0x0013
)

// cmSide is what the CM told about one direction of a connection.
type cmSide struct {
	reqQPN   uint32 // the requester's QPN
	firstPSN bth.PSN
}

type cmKey struct {
	req, resp netip.Addr
	respQPN   uint32
}

type cmREQ struct {
	src, dst netip.Addr
	commID   uint32
}

type cmREQInfo struct {
	qpn uint32
	psn bth.PSN
}

// cmMAD reads a CM REQ or REP from a UD packet to QP1.
func (a *Analyzer) cmMAD(src, dst netip.Addr, p *bth.Packet) {
	m := p.Payload
	if p.BTH.DestQP != 1 || len(m) < madLen+48 || m[1] != mgmtClassCM {
		return
	}
	d := m[madLen:]
	u24 := func(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
	switch binary.BigEndian.Uint16(m[16:]) {
	case attrREQ:
		// Local Comm ID 0-3, Local QPN 32-34, Starting PSN 44-46 (IBTA 12.6.5).
		if len(a.cmReqs) >= a.cfg.MaxConnections {
			return
		}
		a.cmReqs[cmREQ{src, dst, binary.BigEndian.Uint32(d)}] = cmREQInfo{u24(d[32:]), bth.PSN(u24(d[44:]))}
	case attrREP:
		// Local Comm ID 0-3, Remote Comm ID 4-7, Local QPN 12-14, Starting
		// PSN 20-22 (IBTA 12.6.8).
		k := cmREQ{dst, src, binary.BigEndian.Uint32(d[4:])}
		req, ok := a.cmReqs[k]
		if !ok {
			return
		}
		delete(a.cmReqs, k)
		if len(a.cm) >= 2*a.cfg.MaxConnections {
			return
		}
		repQPN, repPSN := u24(d[12:]), bth.PSN(u24(d[20:]))
		a.cm[cmKey{dst, src, repQPN}] = cmSide{reqQPN: req.qpn, firstPSN: repPSN}
		a.cm[cmKey{src, dst, req.qpn}] = cmSide{reqQPN: repQPN, firstPSN: req.psn}
	}
}
