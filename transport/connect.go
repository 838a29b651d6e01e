package transport

import (
	"fmt"
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// ConnectAttr are the attributes Connect gives a QP. The zero value of a
// field takes the default shown, which are ibv_rc_pingpong's and
// perftest's values (docs/wire-format.md section 6).
type ConnectAttr struct {
	PathMTU     qp.MTU    // default IBV_MTU_1024
	Access      qp.Access // remote access the responder allows; default LOCAL_WRITE only
	Timeout     uint8     // local ACK timeout code; default 14 (67 ms)
	RetryCnt    uint8     // default 7
	RNRRetry    uint8     // default 7 (infinite)
	MinRNRTimer uint8     // default 12 (640 us)
	MaxRdAtomic uint8     // READs/atomics in flight, both ways; default 16
	HopLimit    uint8     // TTL; default 64
	// TrafficClass is DSCP<<2 | ECN; 0 takes the Endpoint's default.
	TrafficClass uint8
}

// Remote is what the other side of a connection tells this side out of
// band: where it is, its QPN, and the PSN it starts sending with.
type Remote struct {
	Addr netip.AddrPort // its address and UDP port (port 0 means 4791)
	QPN  uint32
	PSN  bth.PSN
	// SourcePort is the UDP source port the peer's QP sends from, when the
	// exchange told it; under SourceStrict the QP then takes packets from
	// that port only from the start. 0: learnt from the peer's first
	// packet. None of rc_pingpong's, perftest's or rdma_cm's exchanges
	// carries it.
	SourcePort uint16
}

// Connect moves w from RESET or INIT through INIT, RTR and RTS towards a
// remote QP, sending from PSN localPSN. It is the usual sequence of three
// ibv_modify_qp calls; use Modify for anything it does not cover.
func (w *QP) Connect(r Remote, localPSN bth.PSN, a ConnectAttr) error {
	if a.PathMTU == 0 {
		a.PathMTU = qp.IBV_MTU_1024
	}
	if a.Access == 0 {
		a.Access = qp.IBV_ACCESS_LOCAL_WRITE
	}
	def := func(v *uint8, d uint8) {
		if *v == 0 {
			*v = d
		}
	}
	def(&a.Timeout, 14)
	def(&a.RetryCnt, 7)
	def(&a.RNRRetry, 7)
	def(&a.MinRNRTimer, 12)
	def(&a.MaxRdAtomic, 16)
	def(&a.HopLimit, 64)
	if w.State() == qp.IBV_QPS_RESET {
		if err := w.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: a.Access}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS); err != nil {
			return err
		}
	}
	av := qp.AddressVector{Remote: r.Addr, HopLimit: a.HopLimit, TrafficClass: a.TrafficClass}
	if err := w.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: a.PathMTU, DestQPN: r.QPN, RQPSN: r.PSN,
		MaxDestRdAtomic: a.MaxRdAtomic, MinRNRTimer: a.MinRNRTimer, AV: av, AccessFlags: a.Access},
		qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|
			qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER|qp.IBV_QP_ACCESS_FLAGS); err != nil {
		return fmt.Errorf("cannot move the QP to RTR towards %s QPN %#x: %w", r.Addr, r.QPN, err)
	}
	if r.SourcePort != 0 {
		w.ep.mu.Lock()
		w.peerPort, w.peerPinned = r.SourcePort, w.ep.opts.Source == SourceStrict && w.q.Type() != qp.IBV_QPT_UD
		w.ep.mu.Unlock()
	}
	if err := w.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: localPSN, Timeout: a.Timeout, RetryCnt: a.RetryCnt,
		RNRRetry: a.RNRRetry, MaxRdAtomic: a.MaxRdAtomic},
		qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC); err != nil {
		return fmt.Errorf("cannot move the QP to RTS: %w", err)
	}
	return nil
}
