package qp

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// Limits of this implementation. IBTA allows more in places; these are
// rxe's values where rxe has one.
const (
	// MaxUnackedPSNs is the default bound on the PSNs an RC requester
	// has in flight, the oldest unacknowledged one included: rxe's
	// RXE_MAX_UNACKED_PSNS (rxe's check lets one more out, 129);
	// InitAttr.MaxUnackedPSNs sets another.
	MaxUnackedPSNs = 128
	// MaxUnackedPSNsLimit is the largest InitAttr.MaxUnackedPSNs: a
	// quarter of the PSN space, as MaxMessagePSNs.
	MaxUnackedPSNsLimit = 1 << 22
	// AckReqInterval: besides the last packet of each message, a requester
	// asks for an ACK once every this many packets (rxe's RXE_MAX_PKT_PER_ACK).
	AckReqInterval = 64
	// MaxMessage is the largest message, 2^31 bytes (IBTA C9-16 / ibv_port_attr.max_msg_sz).
	MaxMessage = 1 << 31
	// MaxRdAtomicLimit caps max_rd_atomic and max_dest_rd_atomic.
	MaxRdAtomicLimit = 128
	// maxOutQueue bounds the responder's queue of ACKs and READ responses.
	maxOutQueue = 1024
	// MaxMessagePSNs is the most PSNs one message may take: a quarter of
	// the PSN space, so that PSN comparisons stay unambiguous (a 2 GiB
	// message at path MTU 256 would take 2^23).
	MaxMessagePSNs = 1 << 22
	// MaxInlineData is the most data IBV_SEND_INLINE copies at post time
	// (rxe's RXE_MAX_INLINE_DATA).
	MaxInlineData = 416
)

// InitAttr describes a QP at creation, as ibv_qp_init_attr.
type InitAttr struct {
	PD     *PD
	SendCQ *CQ
	RecvCQ *CQ
	// QPType is the transport service: IBV_QPT_RC (also the zero value),
	// IBV_QPT_UC or IBV_QPT_UD.
	QPType QPType
	// SRQ, when set, is where the QP takes its receive WQEs from
	// (ibv_qp_init_attr.srq); QP.PostRecv then fails and MaxRecvWR is
	// ignored. It must belong to the same device as PD.
	SRQ *SRQ
	// QPN is the QP number: 0 lets the PD's device allocate the next free
	// one (from 0x11 up, as rxe); otherwise 2..0xFFFFFF and not in use on
	// the device. QPN 1 makes the device's GSI QP (QP1, IBTA 3.5.1 and
	// 13.5.1): a UD QP whose Q_Key is always bth.GSIQKey, for the
	// communication manager's MADs.
	QPN       uint32
	MaxSendWR int  // send queue depth; 0 means 256
	MaxRecvWR int  // receive queue depth; 0 means 256
	SQSigAll  bool // every send WQE completes with a CQE, as sq_sig_all
	// MaxUnackedPSNs bounds the PSNs an RC requester has in flight:
	// it starts no packet whose PSN is this many or more past the oldest
	// one not yet acknowledged, so at most this many are outstanding,
	// that oldest one included. 0 means MaxUnackedPSNs (128, rxe's
	// RXE_MAX_UNACKED_PSNS; rxe_req.c waits only once its next PSN is
	// beyond the oldest plus 128, which lets 129 out: roce-emu keeps to
	// the number). An RDMA READ is started when there is room for its
	// request and then takes all its response PSNs, as in rxe, so a long
	// READ can take the window past this bound. At most
	// MaxUnackedPSNsLimit (ErrBadAttr beyond, or negative); UC and UD
	// have no window. IBTA sets no such window below half the PSN
	// space; ConnectX's is not documented. The window
	// costs no memory (a retransmission is built again from the WQEs),
	// but a go-back-N retransmission resends up to this many packets, and
	// a peer's socket buffer must hold what arrives before it reads:
	// docs/datapath.md, "The requester's window".
	MaxUnackedPSNs int
	// StrictRetryCount makes retry_cnt 7 mean seven retries, as IBTA
	// says. By default 7 never runs out, as in rxe, which never decrements
	// it (docs/wire-format.md section 4: 367 retransmissions in 25 s).
	StrictRetryCount bool
	// CC, when set, gives the QP DCQCN (package cc): a reaction point and
	// pacer for what it sends, and a notification point that answers
	// CE-marked packets with CNPs. CC.LineRate is the port speed.
	CC *cc.Params
	// CCAlgorithm, with CC set, replaces DCQCN's reaction point by another
	// algorithm (CC still gives the line rate and the CNP interval).
	CCAlgorithm cc.Algorithm
	// NP, with CC nil, gives the QP DCQCN's notification point alone, as
	// a ConnectX with RoCE congestion control's notification point
	// enabled and its reaction point not (mlx5's roce_np and roce_rp
	// settings): CE-marked packets it receives as the data's target are
	// answered with CNPs, paced by NP.MinTimeBetweenCNPs, NP.CNPPerPort
	// and NP.CNPAtWindowEnd (its other fields are not used); nothing it
	// sends is paced, and CNPs it receives count as rp_cnp_ignored. With
	// CC set, NP must be nil: CC gives both. Errors: ErrBadAttr for a
	// negative interval, or CNPAtWindowEnd with CNPPerPort.
	NP *cc.Params
	// RPOnly, with CC set, leaves the notification point out: the
	// reaction point and pacer alone (roce_rp enabled, roce_np not).
	// CE-marked packets are still counted (np_ecn_marked_roce_packets)
	// but answered with no CNP.
	RPOnly bool
}

// AddressVector is where a QP's packets go (ibv_ah_attr with its GRH),
// for the driver: qp itself only carries it.
type AddressVector struct {
	Remote       netip.AddrPort // remote address and UDP port; port 0 means 4791
	Local        netip.Addr     // local address the QP sends from and accepts packets at
	TrafficClass uint8          // IPv4 TOS / IPv6 traffic class: DSCP<<2 | ECN
	HopLimit     uint8          // TTL; 0 means 64
	FlowLabel    uint32         // 20 bits; also picks the UDP source port (bth.SourcePort)
}

// Attr is a set of QP attributes, as ibv_qp_attr. Modify reads the fields
// that its mask names.
type Attr struct {
	State           State
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           bth.PSN // first PSN expected from the remote requester
	SQPSN           bth.PSN // first PSN this requester sends
	Timeout         uint8   // local ACK timeout: 4.096 us * 2^Timeout; 0 waits forever (0-31)
	RetryCnt        uint8   // transport retries (0-7)
	RNRRetry        uint8   // RNR retries (0-7; 7 is infinite)
	MinRNRTimer     uint8   // RNR NAK timer code this responder sends (0-31, IBTA Table 45)
	MaxRdAtomic     uint8   // READ/atomic requests in flight as requester
	MaxDestRdAtomic uint8   // READ/atomic requests remembered as responder
	AccessFlags     Access  // remote operations the responder allows (REMOTE_*)
	PKey            uint16  // partition key; 0 means 0xFFFF
	// QKey is a UD QP's Q_Key (IBTA 10.2.5): what arriving packets' DETH
	// must carry, and what a work request whose RemoteQKey has the high
	// bit set sends. QP1's is always bth.GSIQKey.
	QKey uint32
	AV   AddressVector
}

// AttrMask says which Attr fields Modify applies, as ibv_qp_attr_mask.
type AttrMask uint32

// Attribute mask bits (the ibv_qp_attr_mask values).
const (
	IBV_QP_STATE              AttrMask = 1 << 0
	IBV_QP_ACCESS_FLAGS       AttrMask = 1 << 3
	IBV_QP_PKEY_INDEX         AttrMask = 1 << 4
	IBV_QP_PORT               AttrMask = 1 << 5
	IBV_QP_QKEY               AttrMask = 1 << 6
	IBV_QP_AV                 AttrMask = 1 << 7
	IBV_QP_PATH_MTU           AttrMask = 1 << 8
	IBV_QP_TIMEOUT            AttrMask = 1 << 9
	IBV_QP_RETRY_CNT          AttrMask = 1 << 10
	IBV_QP_RNR_RETRY          AttrMask = 1 << 11
	IBV_QP_RQ_PSN             AttrMask = 1 << 12
	IBV_QP_MAX_QP_RD_ATOMIC   AttrMask = 1 << 13
	IBV_QP_MIN_RNR_TIMER      AttrMask = 1 << 15
	IBV_QP_SQ_PSN             AttrMask = 1 << 16
	IBV_QP_MAX_DEST_RD_ATOMIC AttrMask = 1 << 17
	IBV_QP_DEST_QPN           AttrMask = 1 << 20
)

// transition lists, for one state change, the attributes it requires and
// those it allows (IBTA 11.2.4.2 Table 91 for RC, as Linux's
// ib_modify_qp_is_ok; the port and P_Key index are optional here since an
// emulated device has one port and one P_Key). Each service has its table
// (service.transitions); this one is RC's.
type transition struct{ req, opt AttrMask }

var rcTransitions = map[[2]State]transition{
	{IBV_QPS_RESET, IBV_QPS_INIT}: {IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX | IBV_QP_PORT},
	{IBV_QPS_INIT, IBV_QPS_INIT}:  {0, IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT},
	{IBV_QPS_INIT, IBV_QPS_RTR}: {IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
	{IBV_QPS_RTR, IBV_QPS_RTS}: {IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
	{IBV_QPS_RTS, IBV_QPS_RTS}: {0, IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
	{IBV_QPS_RTS, IBV_QPS_SQD}: {0, 0},
	{IBV_QPS_SQD, IBV_QPS_RTS}: {0, IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
	{IBV_QPS_SQD, IBV_QPS_SQD}: {0, IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT |
		IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MAX_QP_RD_ATOMIC |
		IBV_QP_MAX_DEST_RD_ATOMIC},
	{IBV_QPS_SQE, IBV_QPS_RTS}: {0, IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER},
}

// Errors of QP creation, modification and posting.
var (
	ErrBadTransition = errors.New("qp: invalid state transition")
	ErrBadAttr       = errors.New("qp: invalid attribute")
	ErrQueueFull     = errors.New("qp: work queue full")
	ErrBadState      = errors.New("qp: QP state does not allow this")
	ErrBadWR         = errors.New("qp: invalid work request")
)

// QP is a queue pair of one transport service (RC, UC or UD): a requester
// (the send queue) and its completer, and a responder (the receive queue);
// RC and UC share a PSN space with one remote QP, UD addresses each
// message. The QP holds the state machine, the attributes and
// the verbs entry points, and dispatches packets and timers to its
// halves; what depends on the transport service goes through its service
// (service.go). See the package comment for how a driver runs it.
type QP struct {
	// QPN is the QP number (24 bits); read it, do not change it.
	QPN       uint32
	pd        *PD
	scq, rcq  *CQ
	sigAll    bool
	strict    bool
	maxSend   int
	window    int // InitAttr.MaxUnackedPSNs
	maxRecv   int
	state     State
	attr      Attr
	destroyed bool
	Counters  Counters

	typ    QPType
	srq    *SRQ
	unrel  bool       // UC or UD: nothing acknowledged
	ud     bool       // UD: DETH, per-WR addresses, GRH on receive
	opBase bth.Opcode // the opcode class: RC 0x00, UC 0x20, UD 0x60
	udMTU  MTU        // UD: the MTU, the device's active MTU at New

	errCause *QPError // why the QP is in ERR; nil otherwise

	svc  service
	ops  *[256]*bth.OpInfo // svc.opcodes()
	req  requester
	comp completer
	resp responder
	cc   *congestion
}

// New creates a QP in the RESET state.
func New(init InitAttr) (*QP, error) {
	if init.PD == nil || init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("%w: a QP needs a PD, a send CQ and a receive CQ", ErrBadAttr)
	}
	if init.PD.dev == nil {
		return nil, fmt.Errorf("%w: %w", ErrBadAttr, ErrNoDevice)
	}
	if init.QPType == 0 {
		init.QPType = IBV_QPT_RC
	}
	var svc service
	var base bth.Opcode
	switch init.QPType {
	case IBV_QPT_RC:
		svc = rcService{}
	case IBV_QPT_UC:
		svc, base = ucService{}, bth.Opcode(bth.TransportUC)
	case IBV_QPT_UD:
		svc, base = udService{}, bth.Opcode(bth.TransportUD)
	default:
		return nil, fmt.Errorf("%w: QP type %d (RC 2, UC 3, UD 4)", ErrBadAttr, init.QPType)
	}
	if (init.QPN == 1 && init.QPType != IBV_QPT_UD) || init.QPN > 0xFFFFFF {
		return nil, fmt.Errorf("%w: QPN %#x (must be 2..0xFFFFFF, or 0 to allocate; 1 is the GSI QP, UD)", ErrBadAttr, init.QPN)
	}
	if init.SRQ != nil && (init.SRQ.pd.dev != init.PD.dev || init.SRQ.destroyed) {
		return nil, fmt.Errorf("%w: the SRQ is destroyed or of another device", ErrBadAttr)
	}
	if init.MaxSendWR == 0 {
		init.MaxSendWR = 256
	}
	if init.MaxRecvWR == 0 {
		init.MaxRecvWR = 256
	}
	if init.MaxSendWR < 0 || init.MaxRecvWR < 0 {
		return nil, fmt.Errorf("%w: negative queue depth", ErrBadAttr)
	}
	if init.MaxUnackedPSNs == 0 {
		init.MaxUnackedPSNs = MaxUnackedPSNs
	}
	if init.MaxUnackedPSNs < 0 || init.MaxUnackedPSNs > MaxUnackedPSNsLimit {
		return nil, fmt.Errorf("%w: MaxUnackedPSNs %d (1..%d, or 0 for %d)", ErrBadAttr, init.MaxUnackedPSNs, MaxUnackedPSNsLimit, MaxUnackedPSNs)
	}
	q := &QP{pd: init.PD, scq: init.SendCQ, rcq: init.RecvCQ, sigAll: init.SQSigAll,
		strict: init.StrictRetryCount, maxSend: init.MaxSendWR, maxRecv: init.MaxRecvWR, window: init.MaxUnackedPSNs, svc: svc,
		typ: init.QPType, srq: init.SRQ, unrel: init.QPType != IBV_QPT_RC, ud: init.QPType == IBV_QPT_UD,
		opBase: base, udMTU: init.PD.dev.activeMTU}
	q.ops = q.svc.opcodes()
	switch {
	case init.CC != nil && init.NP != nil:
		return nil, fmt.Errorf("%w: CC gives the reaction and the notification point; NP is for the notification point alone", ErrBadAttr)
	case init.RPOnly && init.CC == nil:
		return nil, fmt.Errorf("%w: RPOnly needs CC, the reaction point's parameters", ErrBadAttr)
	case init.CC != nil:
		var np *cc.NotificationPoint
		if init.CC.CNPPerPort && !init.RPOnly {
			np = init.PD.dev.portNotificationPoint(init.CC.MinTimeBetweenCNPs)
		}
		c, err := newCongestion(init.CC, init.CCAlgorithm, np, init.RPOnly)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadAttr, err)
		}
		q.cc = c
	case init.NP != nil:
		var np *cc.NotificationPoint
		if init.NP.CNPPerPort {
			np = init.PD.dev.portNotificationPoint(init.NP.MinTimeBetweenCNPs)
		}
		c, err := newNotificationOnly(init.NP, np)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadAttr, err)
		}
		q.cc = c
	}
	if err := init.PD.dev.bindQPN(q, init.QPN); err != nil {
		return nil, err
	}
	if q.srq != nil {
		q.srq.qps++
	}
	q.reset()
	return q, nil
}

// Type returns the QP's transport service.
func (q *QP) Type() QPType { return q.typ }

// SRQ returns the shared receive queue the QP receives from, or nil.
func (q *QP) SRQ() *SRQ { return q.srq }

// qkey is the Q_Key a UD packet must carry to this QP: QP1's is fixed
// (rxe's check_keys).
func (q *QP) qkey() uint32 {
	if q.QPN == 1 {
		return bth.GSIQKey
	}
	return q.attr.QKey
}

// Destroy releases the QP, as ibv_destroy_qp: its outstanding work
// requests are discarded without completions and its QPN is free for a
// new QP on the device. A destroyed QP stays in RESET; Modify and the
// posts then fail with ErrBadState.
func (q *QP) Destroy() {
	if q.destroyed {
		return
	}
	q.flush(false)
	q.reset()
	q.destroyed = true
	q.pd.dev.releaseQPN(q)
	if q.srq != nil {
		q.srq.qps--
	}
}

// State returns the current state.
func (q *QP) State() State { return q.state }

// Attr returns the current attributes (State included).
func (q *QP) Attr() Attr {
	a := q.attr
	a.State = q.state
	return a
}

// PD returns the QP's protection domain.
func (q *QP) PD() *PD { return q.pd }

func (q *QP) reset() {
	q.state = IBV_QPS_RESET
	q.attr = Attr{PathMTU: IBV_MTU_1024, PKey: bth.DefaultPKey}
	if q.ud {
		q.attr.PathMTU = q.udMTU
	}
	if q.QPN == 1 {
		q.attr.QKey = bth.GSIQKey
	}
	q.errCause = nil
	q.req = requester{q: q}
	q.comp = completer{q: q}
	q.resp = responder{q: q}
}

// Modify changes attributes and state, as ibv_modify_qp. The mask must hold
// IBV_QP_STATE to change state, every attribute the transition requires,
// and only attributes it allows (IBTA 11.2.4.2). Values are checked: path
// MTU 256-4096, retry counts 0-7, timer codes 0-31, 24-bit QPNs and PSNs,
// read/atomic depths up to 128. On error nothing changes.
//
// Moving to ERR flushes every outstanding work request with
// IBV_WC_WR_FLUSH_ERR; moving to RESET discards them without completions.
func (q *QP) Modify(attr *Attr, mask AttrMask) error {
	if q.destroyed {
		return fmt.Errorf("%w: the QP is destroyed", ErrBadState)
	}
	from, to := q.state, q.state
	if mask&IBV_QP_STATE != 0 {
		to = attr.State
	}
	if to > IBV_QPS_ERR {
		return fmt.Errorf("%w: state %d", ErrBadAttr, to)
	}
	rest := mask &^ IBV_QP_STATE
	switch {
	case to == IBV_QPS_RESET || to == IBV_QPS_ERR:
		if rest != 0 {
			return fmt.Errorf("%w: %s -> %s takes no attributes (mask %#x)", ErrBadTransition, from, to, uint32(rest))
		}
	default:
		t, ok := q.svc.transitions()[[2]State{from, to}]
		if !ok {
			return fmt.Errorf("%w: %s -> %s", ErrBadTransition, from, to)
		}
		if missing := t.req &^ rest; missing != 0 {
			return fmt.Errorf("%w: %s -> %s needs attributes %s", ErrBadTransition, from, to, missing)
		}
		if extra := rest &^ (t.req | t.opt); extra != 0 {
			return fmt.Errorf("%w: %s -> %s does not take attributes %s", ErrBadTransition, from, to, extra)
		}
	}
	if err := checkAttr(attr, rest); err != nil {
		return err
	}
	if rest&IBV_QP_QKEY != 0 && q.QPN == 1 && attr.QKey != bth.GSIQKey {
		return fmt.Errorf("%w: QP1's Q_Key is %#x, not %#x", ErrBadAttr, uint32(bth.GSIQKey), attr.QKey)
	}

	a := &q.attr
	if rest&IBV_QP_ACCESS_FLAGS != 0 {
		a.AccessFlags = attr.AccessFlags
	}
	if rest&IBV_QP_AV != 0 {
		a.AV = attr.AV
	}
	if rest&IBV_QP_PATH_MTU != 0 {
		a.PathMTU = attr.PathMTU
	}
	if rest&IBV_QP_DEST_QPN != 0 {
		a.DestQPN = attr.DestQPN
	}
	if rest&IBV_QP_RQ_PSN != 0 {
		a.RQPSN = attr.RQPSN
		q.resp.ePSN = attr.RQPSN
	}
	if rest&IBV_QP_SQ_PSN != 0 {
		a.SQPSN = attr.SQPSN
		q.req.sendPSN = attr.SQPSN
		q.comp.psn = attr.SQPSN
	}
	if rest&IBV_QP_TIMEOUT != 0 {
		a.Timeout = attr.Timeout
	}
	if rest&IBV_QP_RETRY_CNT != 0 {
		a.RetryCnt = attr.RetryCnt
		q.comp.retryLeft = attr.RetryCnt
	}
	if rest&IBV_QP_RNR_RETRY != 0 {
		a.RNRRetry = attr.RNRRetry
		q.comp.rnrLeft = attr.RNRRetry
	}
	if rest&IBV_QP_MIN_RNR_TIMER != 0 {
		a.MinRNRTimer = attr.MinRNRTimer
	}
	if rest&IBV_QP_MAX_QP_RD_ATOMIC != 0 {
		a.MaxRdAtomic = attr.MaxRdAtomic
	}
	if rest&IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
		a.MaxDestRdAtomic = attr.MaxDestRdAtomic
	}
	if rest&IBV_QP_PKEY_INDEX != 0 && attr.PKey != 0 {
		a.PKey = attr.PKey
	}
	if rest&IBV_QP_QKEY != 0 {
		a.QKey = attr.QKey
	}
	switch to {
	case IBV_QPS_RESET:
		q.flush(false)
		q.reset()
		return nil
	case IBV_QPS_ERR:
		if q.state != IBV_QPS_ERR {
			q.toError(&QPError{Modified: true})
		}
		return nil
	}
	q.state = to
	return nil
}

func checkAttr(a *Attr, m AttrMask) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadAttr}, args...)...)
	}
	switch {
	case m&IBV_QP_PATH_MTU != 0 && a.PathMTU.Bytes() == 0:
		return bad("path MTU code %d (1=256 ... 5=4096)", a.PathMTU)
	case m&IBV_QP_DEST_QPN != 0 && (a.DestQPN > 0xFFFFFF || a.DestQPN < 2):
		return bad("destination QPN %#x", a.DestQPN)
	case m&IBV_QP_RQ_PSN != 0 && !a.RQPSN.Valid():
		return bad("RQ PSN %#x is over 24 bits", uint32(a.RQPSN))
	case m&IBV_QP_SQ_PSN != 0 && !a.SQPSN.Valid():
		return bad("SQ PSN %#x is over 24 bits", uint32(a.SQPSN))
	case m&IBV_QP_TIMEOUT != 0 && a.Timeout > 31:
		return bad("timeout %d (0-31)", a.Timeout)
	case m&IBV_QP_RETRY_CNT != 0 && a.RetryCnt > 7:
		return bad("retry_cnt %d (0-7)", a.RetryCnt)
	case m&IBV_QP_RNR_RETRY != 0 && a.RNRRetry > 7:
		return bad("rnr_retry %d (0-7)", a.RNRRetry)
	case m&IBV_QP_MIN_RNR_TIMER != 0 && a.MinRNRTimer > 31:
		return bad("min_rnr_timer %d (0-31)", a.MinRNRTimer)
	case m&IBV_QP_MAX_QP_RD_ATOMIC != 0 && a.MaxRdAtomic > MaxRdAtomicLimit:
		return bad("max_rd_atomic %d (0-%d)", a.MaxRdAtomic, MaxRdAtomicLimit)
	case m&IBV_QP_MAX_DEST_RD_ATOMIC != 0 && a.MaxDestRdAtomic > MaxRdAtomicLimit:
		return bad("max_dest_rd_atomic %d (0-%d)", a.MaxDestRdAtomic, MaxRdAtomicLimit)
	case m&IBV_QP_ACCESS_FLAGS != 0 && a.AccessFlags&^(IBV_ACCESS_LOCAL_WRITE|IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_READ|IBV_ACCESS_REMOTE_ATOMIC) != 0:
		return bad("access flags %#x", uint32(a.AccessFlags))
	case m&IBV_QP_AV != 0 && !a.AV.Remote.Addr().IsValid():
		return bad("address vector without a remote address")
	}
	return nil
}

// String names the set bits of m, e.g. "PATH_MTU|DEST_QPN".
func (m AttrMask) String() string {
	names := []struct {
		m AttrMask
		n string
	}{{IBV_QP_STATE, "STATE"}, {IBV_QP_ACCESS_FLAGS, "ACCESS_FLAGS"}, {IBV_QP_PKEY_INDEX, "PKEY_INDEX"},
		{IBV_QP_PORT, "PORT"}, {IBV_QP_QKEY, "QKEY"}, {IBV_QP_AV, "AV"}, {IBV_QP_PATH_MTU, "PATH_MTU"}, {IBV_QP_TIMEOUT, "TIMEOUT"},
		{IBV_QP_RETRY_CNT, "RETRY_CNT"}, {IBV_QP_RNR_RETRY, "RNR_RETRY"}, {IBV_QP_RQ_PSN, "RQ_PSN"},
		{IBV_QP_MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"}, {IBV_QP_MIN_RNR_TIMER, "MIN_RNR_TIMER"},
		{IBV_QP_SQ_PSN, "SQ_PSN"}, {IBV_QP_MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"}, {IBV_QP_DEST_QPN, "DEST_QPN"}}
	s := ""
	for _, x := range names {
		if m&x.m != 0 {
			if s != "" {
				s += "|"
			}
			s += x.n
		}
	}
	if s == "" {
		return fmt.Sprintf("%#x", uint32(m))
	}
	return s
}

// LocalAckTimeout returns the local ACK timeout the Timeout attribute
// stands for, 4.096 us * 2^Timeout (IBTA 9.7.6.1.3), or 0 for none.
func LocalAckTimeout(code uint8) time.Duration {
	if code == 0 || code > 31 {
		return 0
	}
	return time.Duration(4096<<code) * time.Nanosecond
}

// QPError says why a QP entered IBV_QPS_ERR (QP.Err).
type QPError struct {
	// Status is the completion status that ended the QP: that of the
	// send WQE the requester failed, or the one the responder's NAK
	// stands for (the peer's requester completes with it). Zero when
	// Modified.
	Status WCStatus
	// Responder: the responder refused a request (IBTA 9.7.5.2 class B-D
	// errors): it sent a NAK with Syndrome for PSN (RC; UC sends none).
	Responder bool
	Syndrome  bth.Syndrome
	PSN       bth.PSN
	// Reason, when set, is the check the request failed.
	Reason string
	// Modified: the application moved the QP to ERR with Modify.
	Modified bool
}

func (e *QPError) Error() string {
	var s string
	switch {
	case e.Modified:
		return "qp: moved to IBV_QPS_ERR by modify"
	case e.Responder && e.Syndrome != 0:
		s = fmt.Sprintf("qp: the responder refused the request at PSN %#06x with %s (the peer completes with IBV_WC_%s)", uint32(e.PSN), e.Syndrome.KindName(), e.Status)
	case e.Responder:
		s = fmt.Sprintf("qp: the responder failed a request at PSN %#06x with IBV_WC_%s", uint32(e.PSN), e.Status)
	default:
		s = fmt.Sprintf("qp: a send work request completed with IBV_WC_%s", e.Status)
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Err returns why the QP is in IBV_QPS_ERR, a *QPError, or nil when it
// is in another state.
func (q *QP) Err() error {
	if q.state != IBV_QPS_ERR || q.errCause == nil {
		return nil
	}
	return q.errCause
}

// toError moves the QP to ERR and flushes its work queues (IBTA 10.3.1.x);
// cause says why.
func (q *QP) toError(cause *QPError) {
	if q.state != IBV_QPS_ERR || q.errCause == nil {
		q.errCause = cause
	}
	q.state = IBV_QPS_ERR
	q.flush(true)
	if !cause.Responder {
		q.resp.keepAcksOnly()
	}
	q.comp.retransmitAt = time.Time{}
	q.req.rnrUntil = time.Time{}
}

// flush completes every outstanding send and receive WQE with
// IBV_WC_WR_FLUSH_ERR, or discards them when complete is false.
func (q *QP) flush(complete bool) {
	q.req.flush(complete)
	q.resp.flush(complete)
}

// Deadline returns when the QP next needs HandleTimeout: the local ACK
// timer or the end of an RNR wait, whichever is first. It returns the zero
// time when no timer runs.
func (q *QP) Deadline() time.Time {
	return earliest(earliest(q.comp.retransmitAt, q.req.rnrUntil), q.ccDeadline())
}

// HandleTimeout runs the timers that expired at or before now.
func (q *QP) HandleTimeout(now time.Time) {
	if q.cc != nil {
		if q.cc.snd != nil {
			q.cc.snd.OnTimeout(now)
		}
		if q.cc.np != nil && q.cc.np.OnTimeout(now) {
			q.cc.cnpDue = true
		}
		if !q.cc.paceUntil.IsZero() && !now.Before(q.cc.paceUntil) {
			q.cc.paceUntil = time.Time{}
		}
	}
	q.req.onTimeout(now)
	q.comp.onTimeout(now)
}

// HandlePacket processes one packet addressed to this QP, as decoded by
// bth.Packet.Decode (payload aliasing the caller's buffer, which may be
// reused once HandlePacket returns). ecn is the IP ECN codepoint it
// arrived with. Requests go to the responder, responses to the completer.
// A packet the service's opcode class, the P_Key or the QP state rules
// out is dropped and counted, each cause in its own counter (docs/wire-format.md
// section 5, checks 7, 8 and 10; see Counters).
//
// A UD QP needs the packet's IP and UDP headers for the GRH of its
// receive completions: give them with HandleReceived. Given through
// HandlePacket, a UD receive gets a zeroed GRH slot and no IBV_WC_GRH.
func (q *QP) HandlePacket(now time.Time, p *bth.Packet, ecn bth.ECN) {
	q.handle(now, p, ecn, nil)
}

// HandleReceived is HandlePacket with what the packet's IP and UDP
// headers said (ri must not be nil; its TOS gives the ECN codepoint). UD
// QPs fill the GRH slot of receive completions from it; RC and UC QPs
// treat it as HandlePacket does.
func (q *QP) HandleReceived(now time.Time, p *bth.Packet, ri *RecvInfo) {
	q.handle(now, p, bth.ECN(ri.TOS&3), ri)
}

func (q *QP) handle(now time.Time, p *bth.Packet, ecn bth.ECN, ri *RecvInfo) {
	q.Counters.ReceivedPackets++
	op := p.BTH.Opcode
	if op == bth.CNP {
		// A CNP for this QP's data (reaction point). ConnectX sends CNPs
		// with the default P_Key 0xFFFF whatever the QP's P_Key: that one
		// is taken too.
		switch {
		case p.BTH.PKey != bth.DefaultPKey && p.BTH.PKey&0x7FFF != q.attr.PKey&0x7FFF:
			q.Counters.PKeyViolations++
		case q.cc == nil || q.cc.snd == nil:
			q.Counters.RPCNPIgnored++ // no reaction point: mlx5 counts it so
		case q.cc.snd.OnCNP(now):
			q.Counters.RPCNPHandled++
		default:
			q.Counters.RPCNPIgnored++
		}
		return
	}
	info := q.ops[op]
	if info == nil {
		q.Counters.OpcodeErr++
		return
	}
	if p.BTH.PKey&0x7FFF != q.attr.PKey&0x7FFF {
		q.Counters.PKeyViolations++
		return
	}
	switch info.Op {
	case bth.OpAcknowledge, bth.OpAtomicAcknowledge, bth.OpReadResponse:
		if q.state != IBV_QPS_RTS && q.state != IBV_QPS_SQD && q.state != IBV_QPS_SQE {
			q.Counters.QPStateErr++
			return
		}
		if info.Op == bth.OpReadResponse {
			q.notify(now, ecn)
		}
		q.comp.handle(now, p, info)
	default:
		if q.state < IBV_QPS_RTR || q.state == IBV_QPS_ERR {
			q.Counters.QPStateErr++
			return
		}
		q.notify(now, ecn)
		q.resp.handle(p, info, ri)
	}
}

// NextPacket fills out with the next packet to transmit and reports
// whether there was one. Responder output (ACKs, NAKs, READ responses)
// goes first, then new or retransmitted requests while the window and the
// RNR timer allow. out.Payload may alias a memory region or the QP's
// scratch buffer: encode it before calling NextPacket again.
func (q *QP) NextPacket(now time.Time, out *bth.Packet) bool {
	if q.nextCNP(out) {
		q.Counters.SentPackets++
		return true
	}
	if q.resp.next(now, out) {
		q.Counters.SentPackets++
		return true
	}
	if q.req.next(now, out) {
		q.Counters.SentPackets++
		return true
	}
	return false
}

// PostSend queues a send work request, as ibv_post_send. The SGEs are
// checked now; a request whose SGEs name no valid local memory completes
// later with IBV_WC_LOC_PROT_ERR and moves the QP to ERR, as on a NIC. It
// returns an error, and queues nothing, when the QP is in RESET, the send
// queue is full, or the request is malformed (an opcode the service does
// not carry, atomic without an 8-byte aligned address and an 8-byte SGE,
// message over 2 GiB). In ERR the request completes at once with
// IBV_WC_WR_FLUSH_ERR.
func (q *QP) PostSend(wr SendWR) error {
	switch q.state {
	case IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_ERR:
	default:
		// rxe refuses a post before RTS (qp_state < IB_QPS_RTS: -EINVAL).
		return fmt.Errorf("%w: post send in %s", ErrBadState, q.state)
	}
	return q.req.post(wr)
}

// PostRecv queues a receive work request, as ibv_post_recv. It fails in
// RESET, when the receive queue is full, or when the QP receives from an
// SRQ (post to the SRQ: rxe's post_recv refuses with EINVAL); in ERR the
// request completes at once with IBV_WC_WR_FLUSH_ERR. SGEs must name
// memory with LOCAL_WRITE access; one that does not fails the message it
// would receive with IBV_WC_LOC_PROT_ERR. A UD receive buffer starts with
// the GRHLen-byte GRH slot.
func (q *QP) PostRecv(wr RecvWR) error {
	if q.srq != nil {
		return fmt.Errorf("%w: the QP receives from an SRQ: post to the SRQ", ErrBadWR)
	}
	if q.state == IBV_QPS_RESET {
		return fmt.Errorf("%w: post receive in %s", ErrBadState, q.state)
	}
	return q.resp.post(wr)
}

// RecvQueued returns the number of receive WQEs waiting in the QP's own
// receive queue (0 with an SRQ; see SRQ.Queued).
func (q *QP) RecvQueued() int { return len(q.resp.rq) }

// SendQueued returns the number of send WQEs not yet completed.
func (q *QP) SendQueued() int { return len(q.req.sq) }

// Remote returns the destination QPN and address vector packets go to
// (for a connected QP; a UD QP addresses each packet, see SentTo).
func (q *QP) Remote() (uint32, AddressVector) { return q.attr.DestQPN, q.attr.AV }

// SentTo returns where the packet NextPacket last handed out goes: for a
// UD QP the destination QPN and address vector of its work request
// (SendWR.RemoteQPN and AH), for RC and UC what Remote returns.
func (q *QP) SentTo() (uint32, AddressVector) {
	if q.ud && q.req.last != nil {
		return q.req.last.wr.RemoteQPN, *q.req.last.wr.AH
	}
	return q.attr.DestQPN, q.attr.AV
}

// header returns a BTH for a packet to the remote QP.
func (q *QP) header(op bth.Opcode, psn bth.PSN) bth.BTH {
	return bth.BTH{Opcode: op, PKey: q.attr.PKey, DestQP: q.attr.DestQPN, PSN: psn}
}
