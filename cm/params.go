package cm

import (
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// QPParams are the values a connection negotiated, from this side's point
// of view, in the form a caller applies to its RC (or UC) qp.QP: RTRAttr
// and RTSAttr build the qp.Attr of the INIT->RTR and RTR->RTS transitions
// (as Linux's ib_cm_init_qp_attr), Apply makes both.
//
// Where each comes from (Linux cm.c, whose choices the rxe captures show):
// the PSN this side sends from (SQPSN) is the peer's StartingPSN and the
// one it expects (RQPSN) is its own; the path MTU is the REQ's; the
// active side's max_rd_atomic is the REP's responder resources and its
// max_dest_rd_atomic the REP's initiator depth, the passive side's are
// the values of its own REP; the retry count is the REQ's for both
// sides; the RNR retry count is the REP's for the active side and the
// REQ's for the passive side; the local ACK timeout is the REQ's primary
// path's on the passive side and PacketLifeTime+1 adjusted by the REP's
// target ACK delay on the active side (cm_ack_timeout).
type QPParams struct {
	Local, Remote     netip.Addr // this side's and the peer's address (their GIDs)
	LocalQPN          uint32
	RemoteQPN         uint32
	SQPSN             bth.PSN // first PSN this side's requester sends
	RQPSN             bth.PSN // first PSN this side's responder expects
	PathMTU           qp.MTU
	MaxRdAtomic       uint8 // READ/atomics in flight as requester (ibv_qp_attr.max_rd_atomic)
	MaxDestRdAtomic   uint8 // READ/atomics accepted as responder (max_dest_rd_atomic)
	Timeout           uint8 // local ACK timeout, 4.096 us * 2^Timeout
	RetryCnt          uint8
	RNRRetry          uint8
	MinRNRTimer       uint8 // Linux's CM sets 0 (655.36 ms); Config.MinRNRTimer
	TrafficClass      uint8
	HopLimit          uint8
	FlowLabel         uint32
	TransportService  uint8 // ServiceRC or ServiceUC, from the REQ
	UsesSRQ           bool  // the peer said its QP takes receives from an SRQ
	PeerResponseTime  uint8 // the peer CM's response timeout exponent
	LocalResponseTime uint8 // ours
}

// RTRAttr returns the attributes and mask of the INIT->RTR transition:
// the address vector, path MTU, destination QPN, RQ PSN, and for RC the
// responder's READ/atomic depth and minimum RNR timer.
func (p *QPParams) RTRAttr() (qp.Attr, qp.AttrMask) {
	a := qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: p.PathMTU, DestQPN: p.RemoteQPN, RQPSN: p.RQPSN,
		AV: qp.AddressVector{Remote: netip.AddrPortFrom(p.Remote, 0), Local: p.Local,
			TrafficClass: p.TrafficClass, HopLimit: p.HopLimit, FlowLabel: p.FlowLabel}}
	mask := qp.IBV_QP_STATE | qp.IBV_QP_AV | qp.IBV_QP_PATH_MTU | qp.IBV_QP_DEST_QPN | qp.IBV_QP_RQ_PSN
	if p.TransportService == ServiceRC {
		a.MaxDestRdAtomic, a.MinRNRTimer = p.MaxDestRdAtomic, p.MinRNRTimer
		mask |= qp.IBV_QP_MAX_DEST_RD_ATOMIC | qp.IBV_QP_MIN_RNR_TIMER
	}
	return a, mask
}

// RTSAttr returns the attributes and mask of the RTR->RTS transition: the
// SQ PSN, and for RC the local ACK timeout, retry and RNR retry counts and
// the requester's READ/atomic depth.
func (p *QPParams) RTSAttr() (qp.Attr, qp.AttrMask) {
	a := qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: p.SQPSN}
	mask := qp.IBV_QP_STATE | qp.IBV_QP_SQ_PSN
	if p.TransportService == ServiceRC {
		a.Timeout, a.RetryCnt, a.RNRRetry, a.MaxRdAtomic = p.Timeout, p.RetryCnt, p.RNRRetry, p.MaxRdAtomic
		mask |= qp.IBV_QP_TIMEOUT | qp.IBV_QP_RETRY_CNT | qp.IBV_QP_RNR_RETRY | qp.IBV_QP_MAX_QP_RD_ATOMIC
	}
	return a, mask
}

// Apply moves q, which must be in INIT, to RTR and then RTS with the
// negotiated values. Errors are qp.QP.Modify's.
func (p *QPParams) Apply(q *qp.QP) error {
	a, m := p.RTRAttr()
	if err := q.Modify(&a, m); err != nil {
		return err
	}
	a, m = p.RTSAttr()
	return q.Modify(&a, m)
}

// ackTimeout is the local ACK timeout for a path of the given packet
// lifetime to a CA that acknowledges within caACKDelay (both IBTA time
// exponents), as Linux's cm_ack_timeout: PacketLifeTime+1, raised to the
// CA's delay when that is longer.
func ackTimeout(caACKDelay, packetLifeTime uint8) uint8 {
	t := int(packetLifeTime) + 1
	d := int(caACKDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		t = d
		if int(packetLifeTime)+1 >= d-1 {
			t++
		}
	}
	return uint8(min(31, t))
}
