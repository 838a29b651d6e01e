package analyze

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cm"
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
func (a *Analyzer) cmMAD(frame int, t time.Time, src, dst netip.Addr, p *bth.Packet) {
	m := p.Payload
	if p.BTH.DestQP != 1 || len(m) < madLen+48 || m[1] != mgmtClassCM {
		return
	}
	a.cmExchange(frame, t, src, dst, m)
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

// CMExchange is one connection's communication-manager exchange (IBTA
// 12.6, 12.9): the frames of its REQ, REP, RTU, REJ, DREQ and DREP, the
// retries, and where it ended. The active side sent the REQ.
type CMExchange struct {
	Active        string `json:"active"`  // IP address
	Passive       string `json:"passive"` // IP address
	ActiveCommID  string `json:"active_comm_id"`
	PassiveCommID string `json:"passive_comm_id,omitempty"`
	ServiceID     string `json:"service_id"` // 0x..., as a string (64 bits)
	ActiveQPN     string `json:"active_qpn"`
	PassiveQPN    string `json:"passive_qpn,omitempty"`
	REQFrame      int    `json:"req_frame"`
	REQs          int    `json:"reqs"` // REQs sent (more than 1: the CM's retries)
	REPFrame      int    `json:"rep_frame,omitempty"`
	REPs          int    `json:"reps,omitempty"`
	RTUFrame      int    `json:"rtu_frame,omitempty"`
	MRAs          int    `json:"mras,omitempty"`
	REJFrame      int    `json:"rej_frame,omitempty"`
	REJFrom       string `json:"rej_from,omitempty"`   // "active" or "passive"
	REJReason     string `json:"rej_reason,omitempty"` // IBTA Table 109's name and code
	DREQFrame     int    `json:"dreq_frame,omitempty"`
	DREQFrom      string `json:"dreq_from,omitempty"`
	DREPFrame     int    `json:"drep_frame,omitempty"`
	// SetupUs is from the first REQ to the RTU.
	SetupUs float64 `json:"setup_us,omitempty"`
	// State is where the capture leaves it: "REQ sent" (no answer),
	// "REP sent" (no RTU), "connected", "rejected", "disconnecting" (a
	// DREQ, no DREP) or "disconnected".
	State string `json:"state"`

	reqTime time.Time
}

type cmXKey struct {
	active netip.Addr
	commID uint32 // the active side's
}

// cmExchange follows one CM MAD of frame into its exchange; MADs that do
// not decode, or whose exchange's REQ is not in the capture, are skipped.
func (a *Analyzer) cmExchange(frame int, t time.Time, src, dst netip.Addr, mad []byte) {
	_, m, err := cm.DecodeMAD(mad)
	if err != nil {
		return
	}
	// find returns the exchange a message from src belongs to, whichever
	// side src is, and whether src is its active side.
	find := func(local, remote uint32) (*CMExchange, bool) {
		if x := a.cmX[cmXKey{src, local}]; x != nil {
			return x, true
		}
		if x := a.cmX[cmXKey{dst, remote}]; x != nil {
			return x, false
		}
		return nil, false
	}
	side := func(active bool) string {
		if active {
			return "active"
		}
		return "passive"
	}
	switch v := m.(type) {
	case *cm.REQ:
		k := cmXKey{src, v.LocalCommID}
		if x := a.cmX[k]; x != nil {
			x.REQs++
			return
		}
		if len(a.cmX) >= a.cfg.MaxConnections {
			a.sum.CMNotTracked++
			return
		}
		x := &CMExchange{Active: src.String(), Passive: dst.String(), ActiveCommID: fmt.Sprintf("%#08x", v.LocalCommID),
			ServiceID: fmt.Sprintf("%#016x", v.ServiceID), ActiveQPN: fmt.Sprintf("%#06x", v.LocalQPN),
			REQFrame: frame, REQs: 1, reqTime: t}
		a.cmX[k] = x
		a.cmOrder = append(a.cmOrder, x)
	case *cm.REP:
		if x := a.cmX[cmXKey{dst, v.RemoteCommID}]; x != nil {
			x.REPs++
			if x.REPFrame == 0 {
				x.REPFrame = frame
				x.PassiveCommID = fmt.Sprintf("%#08x", v.LocalCommID)
				x.PassiveQPN = fmt.Sprintf("%#06x", v.LocalQPN)
			}
		}
	case *cm.RTU:
		if x, active := find(v.LocalCommID, v.RemoteCommID); x != nil && active && x.RTUFrame == 0 {
			x.RTUFrame = frame
			x.SetupUs = us(t.Sub(x.reqTime))
		}
	case *cm.MRA:
		if x, _ := find(v.LocalCommID, v.RemoteCommID); x != nil {
			x.MRAs++
		}
	case *cm.REJ:
		x, active := find(v.LocalCommID, v.RemoteCommID)
		if x == nil && v.MessageRejected == cm.MsgREQ {
			// The passive side rejects a REQ before it has a comm ID of
			// its own to send (LocalCommID 0).
			x, active = a.cmX[cmXKey{dst, v.RemoteCommID}], false
		}
		if x != nil && x.REJFrame == 0 {
			x.REJFrame, x.REJFrom, x.REJReason = frame, side(active), v.Reason.String()
		}
	case *cm.DREQ:
		if x, active := find(v.LocalCommID, v.RemoteCommID); x != nil && x.DREQFrame == 0 {
			x.DREQFrame, x.DREQFrom = frame, side(active)
		}
	case *cm.DREP:
		if x, _ := find(v.LocalCommID, v.RemoteCommID); x != nil && x.DREPFrame == 0 {
			x.DREPFrame = frame
		}
	}
}

// state names where an exchange stands.
func (x *CMExchange) state() string {
	switch {
	case x.REJFrame != 0:
		return "rejected"
	case x.DREPFrame != 0:
		return "disconnected"
	case x.DREQFrame != 0:
		return "disconnecting"
	case x.RTUFrame != 0:
		return "connected"
	case x.REPFrame != 0:
		return "REP sent"
	}
	return "REQ sent"
}
