package transport

import (
	"context"
	"errors"
	"fmt"
	"github.com/roce-emu/roce-emu/internal/fifo"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/qp"
)

// ICRCCheck says when an Endpoint verifies the ICRC of received packets.
type ICRCCheck uint8

// ICRC checking modes.
const (
	// ICRCAuto (the default) verifies wherever the sender's IP header can
	// be rebuilt: on an in-memory Network, where the whole header is
	// known, and over UDP sockets for IPv6, whose ICRC masks every field a
	// socket does not show (traffic class, flow label, hop limit) when the
	// Conn is bound to one address (not "::") and the sender put no
	// extension header in. It does not verify IPv4 over UDP sockets: the
	// ICRC covers the IPv4 identification, which a socket does not show
	// and peers such as rxe change on every packet.
	ICRCAuto ICRCCheck = iota
	// ICRCAssumeID0 verifies assuming the sender's IP header had ID 0 and
	// DF, as Linux sends from an unconnected socket: right for roce-emu
	// peers and NICs that send ID 0; wrong for rxe.
	ICRCAssumeID0
	// ICRCOff never verifies.
	ICRCOff
)

// SourceCheck says how an Endpoint checks where the packets of an RC or
// UC QP come from. UD QPs take datagrams from any address, their Q_Key
// deciding (IBTA 9.6.1.1 check 11), whatever the mode.
type SourceCheck uint8

// Source checking modes.
const (
	// SourceStrict (the default) takes an RC or UC QP's packets from its
	// remote IP address and one UDP source port only: the port
	// Remote.SourcePort announced, or else the port of the first packet
	// from the remote address after the QP reached RTR (re-learnt after
	// the address vector or destination QPN changes). A CNP may also come
	// from port 0, as ConnectX sends them (docs/wire-format.md section 2), a port no
	// unprivileged process can send from. Packets from another port are
	// dropped before the QP sees them and counted in
	// Stats.BadSourcePort (Stats.BadSourcePortCNP for CNPs). RoCEv2 peers
	// keep one source port per QP: rxe and irdma take it from the QPNs and
	// flow label (rdma_get_udp_sport, set once when the address vector is
	// set), ConnectX from a hash of the same, Huawei hns uses the QPN
	// itself; every RC and UC flow of the captures in ../shared/testdata
	// has one source port for its requests, ACKs and READ responses. The
	// check keeps another process on the peer's host (or any host that
	// can spoof the peer's address but not guess its port) from injecting
	// a SEND, ACK or NAK; it cannot stop a host that sees the traffic, or
	// one that wins the race to the first packet (then the real peer's
	// packets are the ones dropped, and its retries run out).
	SourceStrict SourceCheck = iota
	// SourceAddrOnly takes an RC or UC QP's packets from its remote IP
	// address on any UDP source port, as rxe checks (rxe_recv.c
	// check_addr / IBTA check 9): any process on the peer's host can
	// inject packets into the connection.
	SourceAddrOnly
)

// Options configure an Endpoint.
type Options struct {
	// ICRC chooses when received ICRCs are verified.
	ICRC ICRCCheck
	// Source chooses how RC and UC packets' source is checked; the zero
	// value, SourceStrict, pins each QP's peer to one UDP source port.
	Source SourceCheck
	// Logger receives events (QP errors, dropped packets); default: discard.
	Logger *slog.Logger
	// Clock is what the Endpoint reads as now and arms its timer with;
	// nil means SystemClock (which testing/synctest fakes).
	Clock Clock
	// DSCP is the DSCP of data packets from QPs whose address vector sets
	// no traffic class. Such packets go out ECN-capable, ECT(0), unless
	// NotECT is set. QP1's (the CM's MADs) go out with TOS 0, as rxe's. CNPs go out with their QP's cc.Params.CNPDSCP and
	// ECT(0), as ConnectX sends them (TOS 0xC2 for DSCP 48).
	DSCP   uint8
	NotECT bool
	// SendBatch is the most datagrams the Endpoint encodes before it
	// hands them to the Conn; 0 means 64. With the path MTU it bounds the
	// send path's memory (64 datagrams of a 4096-byte MTU: about 270 KB)
	// whatever the peers ask for: a READ response of any length goes out
	// a batch at a time, as the Conn takes it, from the memory region,
	// and the Endpoint's lock is not held while the Conn writes.
	SendBatch int
	// BusyPoll, when positive, makes the Endpoint spin instead of sleep
	// for up to this long at each of the two places its receive path
	// waits, for latency tests (perftest's busy polling; Linux's
	// SO_BUSY_POLL): CQ.Wait polls the CQ, yielding the processor
	// between tries, before it parks; and the read loop's UDP Conn (the
	// Linux one, under any decorators) spins on a non-blocking recvmmsg
	// before it waits on the network poller (UDPOptions.BusyPoll). Each
	// spin costs a busy CPU while it lasts, measured on the wall clock
	// (not Options.Clock): keep it zero under testing/synctest, whose
	// clock stands still while goroutines run. Zero (the default) sleeps.
	// docs/datapath.md has the goroutines and the figures.
	BusyPoll time.Duration
	// ReplyHold is how long the Endpoint may hold back the packets (the
	// ACKs) that a received batch produced when that batch also completed
	// work a goroutine in CQ.Wait was waiting for, so that they leave in
	// one write with what that goroutine posts in reply: a ping-pong's
	// ACK and answer go out, and arrive, together instead of costing a
	// system call and a wake-up of the peer each. They leave at the first
	// of: a successful PostSend, or a Modify (even one refused), of any
	// QP of the Endpoint; a CQ.Wait that finds its CQ empty, on a CQ
	// whose waiters the batch woke; Endpoint.Flush; the next batch read;
	// Close or QP.Destroy; and a timer, this long after the batch, or at
	// once after a CQ.Poll that found such a CQ empty. (A goroutine on
	// a CQ the batch put nothing on, as an rdma_cm Service's on QP1's,
	// ends no hold; one on a CQ it did complete does, even when the
	// reply is another goroutine's: a second waiter on the same CQ, or
	// one reaping a separate send CQ. A woken goroutine that moves on
	// to another CQ leaves what is held to the timer.) Go fires
	// such a timer about a millisecond late
	// in a process that is otherwise idle (1.2 ms typically, on Linux),
	// and an Options.Clock of one's own fires it when it is advanced.
	// All the packets of the batch are held (ACKs, READ responses).
	//
	// One batch is held at a time, and only when it had requests in it
	// and left no QP it reached with sends not yet completed (a batch
	// whose ACKs let this side send more, or will, holds nothing). None
	// is held for a QP whose own local ACK timeout is under 4.2 ms
	// (Timeout 1 to 9: a peer set up alike could time out; the peer's own
	// timeout is not known here: against a shorter one, turn the hold
	// off), nor for the next 64 batches after two holds in a row that no
	// PostSend ended (a stream of SENDs, not a ping-pong).
	//
	// A held ACK is written behind the reply's requests of its flow, so
	// that UDP GSO can send the two as one; it is late, never lost or
	// reordered within its PSN stream (an ACK acknowledges every packet
	// up to its PSN, as coalesced ACKs do). 0 means DefaultReplyHold;
	// negative never holds (each batch's ACKs leave as it is handled, as
	// rxe sends them). Keep it well under the peer's local ACK timeout
	// (4.096 us x 2^timeout).
	//
	// ReplyHold also bounds direct reads (direct.go; docs/datapath.md):
	// after a batch woke a goroutine in CQ.Wait, the read loop lends the
	// socket to CQ.Wait, and the next goroutine there that finds its CQ
	// empty reads the Conn itself (one wake-up per message instead of
	// two). If none has read it for ReplyHold (plus the timer's
	// lateness), the read loop takes it back. Not for QPs with a timeout
	// of 1 to 9, nor with ReplyHold negative; only on the Linux UDP Conn
	// with no decorator around it.
	ReplyHold time.Duration
}

// DefaultReplyHold is Options.ReplyHold's default.
const DefaultReplyHold = 100 * time.Microsecond

// minHoldTimeout is the shortest local ACK timeout (4.096 us x 2^10, 4.2
// ms) of a QP whose ACKs are held: a peer set up alike would time out on
// an ACK the Go runtime's timer wrote a millisecond late.
const minHoldTimeout = 10

// holdBackoff is how many batches the read loop holds nothing after two
// holds in a row that no PostSend ended: the application takes
// completions without answering them (a stream of SENDs, where held ACKs
// only slow the peer's window), so holding resumes only now and then to
// look again.
const holdBackoff = 64

// DefaultSendBatch is Options.SendBatch's default.
const DefaultSendBatch = 64

// sendQuota is how many packets one QP adds to a batch before the next
// QP's turn: a QP with a long READ response to send does not hold back
// the others.
const sendQuota = 16

// closeDrainBatches bounds what Close sends of what the QPs still have
// queued: 1024 batches (64 Ki packets by default), so that a peer that
// keeps asking cannot hold Close.
const closeDrainBatches = 1024

// Stats are an Endpoint's counts of packets no QP saw. Received and Sent
// count what the Endpoint read from and handed to its Conn: with
// WithFaults around the Conn, after the rules acted on incoming datagrams
// and before they act on outgoing ones.
type Stats struct {
	Received  uint64 `json:"rx_datagrams"`
	Sent      uint64 `json:"tx_datagrams"`
	Malformed uint64 `json:"rx_malformed"`  // did not decode as RoCEv2
	BadICRC   uint64 `json:"rx_bad_icrc"`   // ICRC did not verify (dropped silently, as rxe does)
	UnknownQP uint64 `json:"rx_unknown_qp"` // no QP with that number
	BadSource uint64 `json:"rx_bad_source"` // not from the QP's remote IP address (rxe check 9)
	// BadSourcePort and BadSourcePortCNP count packets (CNPs) from the
	// QP's remote IP address but another UDP source port than its peer's,
	// dropped under SourceStrict.
	BadSourcePort    uint64 `json:"rx_bad_source_port"`
	BadSourcePortCNP uint64 `json:"rx_bad_source_port_cnp"`
	CNPs             uint64 `json:"rx_cnps"`   // CNPs received (before the source checks)
	SendErrors       uint64 `json:"tx_errors"` // datagrams the Conn refused
	// With no QP1 on the Endpoint (no CM runs), the MADs to QP1:
	// REQs answered with a REJ (invalid service ID), DREQs answered with
	// a DREP, and the rest dropped.
	CMRejects uint64 `json:"rx_cm_req_rejected"`
	CMDREPs   uint64 `json:"rx_cm_dreq_answered"`
	CMDropped uint64 `json:"rx_cm_dropped"`
	// EncodeErrors counts packets a QP handed out that could not be
	// encoded (an address vector of mixed IP versions), dropped.
	EncodeErrors uint64 `json:"tx_encode_errors"`
	// DirectBatches counts the batches that a goroutine in CQ.Wait read
	// from the Conn itself, instead of the Endpoint's read loop (Options.
	// ReplyHold has how); they are in Received too.
	DirectBatches uint64 `json:"rx_direct_batches"`
}

// Drops returns the Endpoint's counters of datagrams it dropped or could
// not send, each cause its own counter (every Stats field but
// rx_datagrams, tx_datagrams, rx_cnps, rx_cm_dreq_answered and
// rx_direct_batches), by JSON
// name in field order,
// leaving out those at zero.
func (s Stats) Drops() []qp.Count {
	var out []qp.Count
	v := reflect.ValueOf(s)
	for i := range v.NumField() {
		name := v.Type().Field(i).Tag.Get("json")
		switch name {
		case "rx_datagrams", "tx_datagrams", "rx_cnps", "rx_cm_dreq_answered", "rx_direct_batches":
			continue
		}
		if n := v.Field(i).Uint(); n != 0 {
			out = append(out, qp.Count{Name: name, Value: n})
		}
	}
	return out
}

// Endpoint runs queue pairs on one Conn: it reads datagrams, hands them to
// the QP they name, sends what the QPs produce, and runs their timers.
// Fault injection and capture are Conns that wrap a Conn (WithFaults,
// WithObserver), not the Endpoint's business. All methods are safe for
// concurrent use; QPs, CQs and MRs of one Endpoint share its lock.
type Endpoint struct {
	conn  Conn
	opts  Options
	log   *slog.Logger
	clock Clock
	// onNetwork: conn is (or wraps) a Conn of an in-memory Network.
	onNetwork bool

	// One batch is written at a time, by whoever set sending: flushLocked
	// inline, or sendLoop for what one batch could not take. The writer
	// owns arena and batch and writes with mu released; pending says
	// that packets were queued meanwhile. sendLoop runs only while there
	// is more to send (senderOn), and Close waits for it (senders).
	sending  bool
	pending  bool
	senderOn bool
	senders  sync.WaitGroup
	sendIdle sync.Cond // broadcast when a batch has been written (L is &mu)
	closing  bool      // Close is sending what was queued
	sendFn   func()    // sendLoop as a func value: go sendFn() allocates nothing
	// held: the read loop left its batch's packets queued for a waiter's
	// reply (Options.ReplyHold), until heldDue at the latest.
	held    bool
	heldDue time.Time
	// rxRequest: the batch being handled held a request (read loop);
	// rxShortTimeout: one of them was for a QP whose own local ACK
	// timeout is under minHoldTimeout. replied: a PostSend ends the hold;
	// unreplied counts the holds in a row that none ended. holdSkip:
	// batches left before the next hold, after two holds that no reply
	// ended (holdBackoff).
	rxRequest      bool
	rxShortTimeout bool
	replied        bool
	unreplied      int
	holdSkip       int
	// holdGen numbers the holds; a CQ whose waiters the batch of a hold
	// woke carries its number (CQ.heldGen): only a goroutine back in
	// Wait on such a CQ, finding it empty, ends the hold early.
	holdGen uint64
	holds   int // holds begun (tests)

	mu  sync.Mutex
	qps map[uint32]*QP // every QP, by QPN: the receive path's demultiplexer
	// timers, active and dirty schedule the QPs with something to do
	// (schedule.go).
	timers deadlineHeap
	active fifo.Queue[*QP] // the QPs that may have a packet to send, in turn
	dirty  []*QP
	cqs    []*CQ
	// waiting holds the CQs that have goroutines in Wait (CQ.listed).
	waiting []*CQ
	dev     *qp.Device // QPNs, memory-region keys and addresses
	stats   Stats
	closed  bool
	timer   Timer
	timerAt time.Time
	arena   []byte
	batch   []Datagram
	pkt     bth.Packet
	rx      bth.Packet
	done    chan struct{}
	// CM answers of an Endpoint without QP1 (gsi.go)
	gsiOut []gsiAnswer
	gsiPSN bth.PSN

	// Direct reads (direct.go). read reads a batch into rxds, the read
	// loop's, which whoever reads owns. kicker: the Conn can be kicked
	// (nil: no direct reads). lent: the read loop lent the socket to
	// CQ.Wait, parked on loopWake until lentDue at the latest; inline: a
	// goroutine in Wait on inlineCQ is reading it; kicked: kickReader set the Conn's
	// read deadline. kickDone is the ctx.Done channel of the registered
	// kickStop. shortQPs counts the QPs with shortTimeout.
	read     func([]Datagram) (int, error)
	rxds     []Datagram
	kicker   kickConn
	lent     bool
	inline   bool
	inlineCQ *CQ
	// inlineW: the channel of the goroutine that reads in Wait, from
	// before its read until it has handled the batch; signal sends
	// nothing on it, since that goroutine polls its CQ next.
	inlineW chan struct{}
	// inlineDone: the ctx.Done channel of the goroutine reading.
	inlineDone <-chan struct{}
	kicked     bool
	lentDue    time.Time
	loopWake   chan struct{}
	kickDone   <-chan struct{}
	kickStop   func() bool
	shortQPs   int
	lends      int // times the read loop lent the socket (tests)
}

// NewEndpoint starts an Endpoint on conn. Close stops it and closes conn.
func NewEndpoint(conn Conn, opts Options) *Endpoint {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.SendBatch <= 0 {
		opts.SendBatch = DefaultSendBatch
	}
	if opts.ReplyHold == 0 {
		opts.ReplyHold = DefaultReplyHold
	}
	ep := &Endpoint{conn: conn, opts: opts, log: log, clock: clockOr(opts.Clock), qps: map[uint32]*QP{}, dev: qp.NewDevice(), done: make(chan struct{})}
	_, ep.onNetwork = innermost(conn).(*memConn)
	ep.sendFn = ep.sendLoop
	ep.sendIdle.L = &ep.mu
	ep.rxds = make([]Datagram, 64)
	for i := range ep.rxds {
		ep.rxds[i].Data = make([]byte, 0, 16<<10)
	}
	// A Linux UDP Conn with GRO on, with no decorator around it, hands
	// out the datagrams in its own buffers instead of copying them into
	// rxds: each batch is done with before the next read. The same Conn
	// can be kicked, so CQ.Wait may read it (direct.go).
	ep.read = conn.ReadBatch
	if a, ok := conn.(interface {
		readBatchAliased([]Datagram) (int, error)
	}); ok {
		ep.read = a.readBatchAliased
	}
	if k, ok := conn.(kickConn); ok {
		ep.kicker, ep.loopWake = k, make(chan struct{}, 1)
	}
	if opts.BusyPoll > 0 {
		if bp, ok := innermost(conn).(interface{ setBusyPoll(time.Duration) }); ok {
			bp.setBusyPoll(opts.BusyPoll)
		}
	}
	go ep.readLoop()
	return ep
}

// LocalAddr returns the address the Endpoint receives on.
func (ep *Endpoint) LocalAddr() netip.AddrPort { return ep.conn.LocalAddr() }

// Stats returns a copy of the Endpoint's counters (see QP.Counters for
// packets held for a reply).
func (ep *Endpoint) Stats() Stats {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.stats
}

// Flush writes now what the Endpoint holds for a reply (Options.ReplyHold),
// if anything, or leaves it to the batch being written. A program that
// reports its counters at the end of a run calls it first, so that the
// ACK held after its last completion is counted. It writes to the Conn
// from the calling goroutine: not from inside a Conn decorator's or an
// Observer's callback.
func (ep *Endpoint) Flush() {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.flushHeldLocked()
}

// Close stops the Endpoint: QPs stop, the Conn closes, and the goroutine
// reading it ends before Close returns.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	if ep.closed || ep.closing {
		ep.mu.Unlock()
		return nil
	}
	// What the QPs queued before Close goes out first (the last ACK of a
	// run whose completion the application saw, say).
	ep.closing = true
	ep.drainLocked()
	ep.closed = true
	if ep.timer != nil {
		ep.timer.Stop()
	}
	for _, c := range ep.cqs {
		c.signal()
	}
	// The read loop, if it lent the socket, reads again (and finds it
	// closed); a goroutine reading in Wait gives it back when its read
	// fails.
	ep.unlendLocked()
	if ep.kickStop != nil {
		ep.kickStop()
	}
	ep.mu.Unlock()
	err := ep.conn.Close()
	<-ep.done
	ep.senders.Wait()
	return err
}

// drainLocked waits for the batch being written, then writes what the
// QPs still have to send, up to closeDrainBatches batches (ep.mu held;
// released while the Conn writes).
func (ep *Endpoint) drainLocked() {
	for range closeDrainBatches {
		for ep.sending {
			ep.sendIdle.Wait()
		}
		if !ep.sendBatchLocked(ep.clock.Now()) {
			break
		}
	}
}

func (ep *Endpoint) readLoop() {
	defer close(ep.done)
	for {
		n, err := ep.read(ep.rxds)
		if err != nil {
			ep.mu.Lock()
			// Only kicks set read deadlines: one meant for a reader in
			// CQ.Wait that had returned, whether or not that reader
			// undid it since. No goroutine reads in Wait while the read
			// loop does, so the deadline goes.
			kicked := errors.Is(err, os.ErrDeadlineExceeded)
			if kicked && ep.kicker != nil {
				ep.kicked = false
				ep.kicker.unkick()
			}
			ep.mu.Unlock()
			if kicked {
				continue
			}
			if !errors.Is(err, net.ErrClosed) {
				ep.log.Error("read failed; endpoint stops", "err", err)
			}
			return
		}
		// A batch read is handled even when Close has begun (nothing is
		// sent then), so that every datagram a Conn decorator saw cross
		// the socket reached the QPs: their counters and a capture agree.
		ep.mu.Lock()
		now := ep.clock.Now()
		woke := ep.handleBatchLocked(now, ep.rxds[:n])
		closed := ep.closed
		if woke && ep.lendableLocked() {
			ep.lendLocked(now)
		}
		lent := ep.lent
		ep.mu.Unlock()
		if closed {
			return
		}
		if lent {
			<-ep.loopWake
		}
	}
}

// handleBatchLocked hands a batch read to the QPs, then sends, holds or
// signals what they produced (flushReceivedLocked). It reports whether
// the batch woke every goroutine parked in CQ.Wait (at least one), after
// which the read loop may lend the socket (direct.go).
func (ep *Endpoint) handleBatchLocked(now time.Time, ds []Datagram) bool {
	ep.rxRequest, ep.rxShortTimeout = false, false
	for i := range ds {
		ep.receiveLocked(now, &ds[i])
	}
	woke := ep.kicker != nil && ep.wakesAllLocked()
	ep.flushReceivedLocked(now)
	return woke
}

// wakesAllLocked says whether signalLocked would wake a goroutine and
// leave none parked in CQ.Wait: then a goroutine comes back to Wait, and
// no other is left waiting on a socket lent to it (a CM Service's
// goroutine parked on QP1's CQ, say, while the application's is woken).
func (ep *Endpoint) wakesAllLocked() bool {
	woke := false
	for _, c := range ep.waiting {
		if len(c.waiters) == 0 {
			continue
		}
		if c.cq.Len() == 0 {
			return false
		}
		woke = true
	}
	return woke
}

// receiveLocked handles one datagram.
func (ep *Endpoint) receiveLocked(now time.Time, d *Datagram) {
	ep.stats.Received++
	p := &ep.rx
	if err := p.Decode(d.Data); err != nil {
		ep.stats.Malformed++
		return
	}
	if ep.checkICRC(d) {
		enc := bth.Encap{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port(),
			TrafficClass: d.TOS, HopLimit: d.TTL}
		if _, _, err := enc.VerifyICRC(d.Data); err != nil {
			ep.stats.BadICRC++
			return
		}
	}
	if p.BTH.Opcode == bth.CNP {
		ep.stats.CNPs++
	}
	q := ep.qps[p.BTH.DestQP]
	if q == nil {
		if p.BTH.DestQP == 1 {
			ep.answerGSILocked(p, d)
			return
		}
		ep.stats.UnknownQP++
		return
	}
	// RC and UC QPs take packets from their remote address only (rxe's
	// check 9); a UD QP from anyone, its Q_Key deciding (check 11).
	ud := q.q.Type() == qp.IBV_QPT_UD
	if !ud {
		if q.peerIP != unzoned(d.Src.Addr()) {
			ep.stats.BadSource++
			return
		}
		if ep.opts.Source == SourceStrict && !q.fromPeerPort(d.Src, p.BTH.Opcode == bth.CNP) {
			return
		}
	}
	q.lastRx = now
	if info := p.BTH.Opcode.Info(); info != nil && info.Op.IsRequest() {
		ep.rxRequest = true
		if q.shortTimeout {
			ep.rxShortTimeout = true
		}
	}
	if ud {
		// The GRH of a UD receive is rebuilt from the headers.
		ri := qp.RecvInfo{Src: d.Src, Dst: d.Dst, TOS: d.TOS, HopLimit: d.TTL}
		q.q.HandleReceived(now, p, &ri)
	} else {
		// RC and UC need the ECN codepoint only (HandleReceived's
		// reading of ri.TOS), without a copy of the addresses per packet.
		q.q.HandlePacket(now, p, bth.ECN(d.TOS&3))
	}
	ep.touchLocked(q)
}

// checkICRC says whether d's ICRC is verified (see ICRCCheck).
func (ep *Endpoint) checkICRC(d *Datagram) bool {
	switch ep.opts.ICRC {
	case ICRCAssumeID0:
		return true
	case ICRCOff:
		return false
	}
	if ep.onNetwork {
		return true
	}
	// IPv6 over a socket: every header field the ICRC covers is known,
	// provided the destination is the one address the Conn is bound to.
	src, dst := d.Src.Addr(), d.Dst.Addr()
	return !src.Unmap().Is4() && dst.Is6() && !dst.Is4In6() && !dst.IsUnspecified()
}

// fromPeerPort says whether a packet from src (the QP's remote address)
// may reach the QP under SourceStrict, pinning the peer's UDP source port
// on the first one that may; it counts and logs what it refuses (ep.mu
// held).
func (w *QP) fromPeerPort(src netip.AddrPort, cnp bool) bool {
	port := src.Port()
	if cnp && port == 0 {
		return true // ConnectX's CNPs; no unprivileged socket sends from 0
	}
	if !w.peerPinned {
		switch w.q.State() {
		case qp.IBV_QPS_RTR, qp.IBV_QPS_RTS, qp.IBV_QPS_SQD, qp.IBV_QPS_SQE:
			w.peerPort, w.peerPinned = port, true
			return true
		}
		return true // the QP takes no packet in this state; nothing to learn from
	}
	if port == w.peerPort {
		return true
	}
	if cnp {
		w.ep.stats.BadSourcePortCNP++
	} else {
		w.ep.stats.BadSourcePort++
	}
	if !w.portWarned {
		w.portWarned = true
		w.ep.log.Warn("dropped packets from the peer's address on another UDP source port than its QP's (strict source check)",
			"qpn", w.q.QPN, "from", src, "peer_port", w.peerPort)
	}
	return false
}

// flushLocked sends what the QPs have to send, signals CQs that got
// completions and re-arms the timer. It writes one batch itself, with
// ep.mu released while the Conn writes (it returns with ep.mu held), and
// leaves the rest to sendLoop; while another batch is being written it
// leaves its packets to that batch's writer.
func (ep *Endpoint) flushLocked(now time.Time) {
	if ep.closed {
		return
	}
	if ep.held {
		if ep.replied {
			ep.unreplied = 0
		} else if ep.unreplied++; ep.unreplied >= 2 {
			// Twice in a row the application took its completion
			// without answering (a stream of SENDs, not a
			// ping-pong): hold nothing for a while.
			ep.holdSkip, ep.unreplied = holdBackoff, 0
		}
	}
	ep.held = false
	if ep.sending {
		ep.pending = true
	} else if ep.sendBatchLocked(now) && !ep.senderOn && !ep.closed {
		ep.senderOn = true
		ep.senders.Add(1)
		go ep.sendFn()
	}
	ep.signalLocked()
	ep.armLocked()
}

// flushReceivedLocked is flushLocked after the read loop handled a batch:
// when the batch held requests (so that there are ACKs to send) and
// completed work that a goroutine waits for, and no packets are held
// already, it wakes that goroutine and holds the packets for its reply
// instead of writing them (Options.ReplyHold). A batch of ACKs alone
// holds nothing: what it lets the requester send (a window opened) goes
// at once.
func (ep *Endpoint) flushReceivedLocked(now time.Time) {
	if ep.holdSkip > 0 {
		ep.holdSkip--
	} else if ep.opts.ReplyHold > 0 && ep.rxRequest && !ep.rxShortTimeout && !ep.held && !ep.sending && !ep.closed && ep.active.Len() > 0 && ep.wakesLocked() && !ep.sendsPendingLocked() {
		ep.held, ep.heldDue, ep.replied = true, now.Add(ep.opts.ReplyHold), false
		ep.holdGen++
		ep.holds++
		for _, c := range ep.waiting {
			if len(c.waiters) > 0 && c.cq.Len() > 0 {
				c.heldGen = ep.holdGen
			}
		}
		ep.signalLocked()
		ep.armLocked()
		return
	}
	ep.flushLocked(now)
}

// sendsPendingLocked says whether a QP touched since the last armLocked
// (those the batch reached) has sends not yet completed: what the batch's
// ACKs let it send, or will, must not wait for the application (a SEND
// stream both ways). In a ping-pong the ACK in the batch completed the
// one send there was.
func (ep *Endpoint) sendsPendingLocked() bool {
	for _, w := range ep.dirty {
		if !w.gone && w.q.SendQueued() > 0 {
			return true
		}
	}
	return false
}

// wakesLocked says whether signalLocked would wake a goroutine.
func (ep *Endpoint) wakesLocked() bool {
	for _, c := range ep.waiting {
		if len(c.waiters) > 0 && c.cq.Len() > 0 {
			return true
		}
	}
	return false
}

// flushHeldLocked writes the packets the read loop held, if any: the
// goroutine they waited for went idle (its CQ is empty) without posting.
func (ep *Endpoint) flushHeldLocked() {
	if ep.held {
		ep.flushLocked(ep.clock.Now())
	}
}

// signalLocked wakes the waiters of CQs that hold completions, and
// forgets the CQs that no goroutine waits on any more.
func (ep *Endpoint) signalLocked() {
	k := 0
	for _, c := range ep.waiting {
		if len(c.waiters) > 0 && c.cq.Len() > 0 {
			if c == ep.inlineCQ {
				// Its waiter is reading the socket, not its channel.
				ep.kickLocked()
			}
			c.signal()
		}
		if len(c.waiters) > 0 {
			ep.waiting[k] = c
			k++
		} else {
			c.listed = false
		}
	}
	if k < len(ep.waiting) {
		clear(ep.waiting[k:])
		ep.waiting = ep.waiting[:k]
	}
}

// sendLoop writes, a batch at a time, what flushLocked's batch could not
// take, until the QPs have nothing more to send, and ends.
func (ep *Endpoint) sendLoop() {
	defer ep.senders.Done()
	ep.mu.Lock()
	defer ep.mu.Unlock()
	for !ep.closed {
		if ep.sending {
			// Another writer: it goes on, or starts this loop again.
			ep.pending = true
			break
		}
		more := ep.sendBatchLocked(ep.clock.Now())
		if ep.closed {
			break
		}
		ep.signalLocked()
		ep.armLocked()
		if !more {
			break
		}
	}
	ep.senderOn = false
}

// sendBatchLocked encodes up to Options.SendBatch packets, taking up to
// sendQuota from each QP in turn, and writes them with ep.mu released.
// It reports whether packets may be left: the batch was full, or some
// were queued while it was written.
func (ep *Endpoint) sendBatchLocked(now time.Time) bool {
	ep.arena = ep.arena[:0]
	ep.batch = ep.batch[:0]
	full := ep.collectLocked(now)
	ackAfterRequests(ep.batch)
	ep.appendGSILocked() // a few CM answers at most (gsiQueueLen)
	if len(ep.batch) == 0 {
		return false
	}
	ep.sending, ep.pending = true, false
	ep.mu.Unlock()
	n, err := ep.conn.WriteBatch(ep.batch)
	ep.mu.Lock()
	ep.sending = false
	ep.sendIdle.Broadcast()
	ep.stats.Sent += uint64(n)
	if err != nil {
		ep.stats.SendErrors += uint64(len(ep.batch) - n)
		if !ep.closed || !errors.Is(err, net.ErrClosed) {
			ep.log.Warn("send failed", "err", err)
		}
	}
	clear(ep.batch) // the arena is reused; drop the slices into it
	more := full || ep.pending
	ep.pending = false
	return more
}

// collectLocked fills ep.batch from the active QPs in turn, up to
// sendQuota packets from each before the next one's turn, and reports
// whether it stopped because the batch was full. A QP with nothing more
// to send leaves the active queue until its next event.
func (ep *Endpoint) collectLocked(now time.Time) bool {
	for n := ep.active.Len(); n > 0; n-- {
		q := ep.active.Pop()
		if q.gone {
			continue
		}
		ep.dirtyLocked(q) // NextPacket arms timers and the pacer
		ud := q.q.Type() == qp.IBV_QPT_UD
		more := true
		for range sendQuota {
			if len(ep.batch) == ep.opts.SendBatch {
				ep.active.Push(q)
				return true
			}
			if !q.q.NextPacket(now, &ep.pkt) {
				more = false
				break
			}
			if ud {
				// A UD packet goes where its work request's address
				// handle says.
				q.setEncap(q.q.SentTo())
			}
			start := len(ep.arena)
			// Room for the ICRC's block (bth.AppendSpare): a no-op once
			// the arena has grown to its batches.
			ep.arena = slices.Grow(ep.arena, ep.pkt.Len()+bth.AppendSpare)
			var err error
			ep.arena, err = ep.pkt.AppendScratch(ep.arena, &q.encap)
			if err != nil {
				ep.stats.EncodeErrors++
				ep.log.Error("cannot encode packet", "qpn", q.q.QPN, "err", err)
				continue
			}
			d := Datagram{Data: ep.arena[start:len(ep.arena):len(ep.arena)], Src: q.src, Dst: q.dst,
				TOS: q.encap.TrafficClass, TTL: q.encap.HopLimit}
			if ep.pkt.BTH.Opcode == bth.CNP {
				d.TOS = q.cnpTOS
			}
			ep.batch = append(ep.batch, d)
		}
		if more {
			// Its quota is used: its next turn comes after the others'.
			ep.active.Push(q)
			n++ // it is still to be asked within this batch
		} else {
			q.active = false
		}
	}
	return false
}

// ackAfterRequests moves each RC ACK (or NAK) of a batch that is
// followed by longer requests of the same flow (UDP source and
// destination, TOS and TTL) to the end of those requests. A ping-pong's
// ACK and reply, held together (Options.ReplyHold), then leave as one UDP
// GSO send, whose segments must all be the first one's size but the last
// (the Conn glues runs), and the peer's socket receives the two at once,
// instead of being woken, perhaps switched to, for each. The ACK answers
// the peer's requests and the requests are this QP's own, two PSN
// streams whose relative order IBTA leaves open (rxe's responder and
// requester run as separate tasks); an ACK is never moved behind READ
// responses or another ACK, which share its stream.
func ackAfterRequests(b []Datagram) {
	for i := 0; i+1 < len(b); i++ {
		if len(b[i].Data) == 0 || bth.Opcode(b[i].Data[0]) != bth.RCAcknowledge || len(b[i+1].Data) <= len(b[i].Data) {
			continue
		}
		j := i
		for j+1 < len(b) && sameFlow(&b[i], &b[j+1]) && isRequest(b[j+1].Data) {
			j++
		}
		if j == i {
			continue
		}
		ack := b[i]
		copy(b[i:j], b[i+1:j+1])
		b[j] = ack
		i = j
	}
}

// sameFlow says whether a and b could leave in one UDP GSO send.
func sameFlow(a, b *Datagram) bool {
	return a.Src == b.Src && a.Dst == b.Dst && a.TOS == b.TOS && a.TTL == b.TTL
}

// isRequest says whether a datagram's BTH opcode is a requester's.
func isRequest(d []byte) bool {
	if len(d) == 0 {
		return false
	}
	info := bth.Opcode(d[0]).Info()
	return info != nil && info.Op.IsRequest()
}

// PD is a protection domain of an Endpoint.
type PD struct {
	ep *Endpoint
	pd *qp.PD
}

// NewPD returns a new protection domain of the Endpoint's device: keys are
// unique across the PDs of one Endpoint.
func (ep *Endpoint) NewPD() *PD { return &PD{ep: ep, pd: ep.dev.NewPD()} }

// RegMR registers buf (see qp.PD.RegMR). The Endpoint reads and writes buf
// while QPs use it: read it after the completion that says it is written,
// and do not write it while a send from it is outstanding.
func (pd *PD) RegMR(buf []byte, access qp.Access) (*qp.MR, error) {
	pd.ep.mu.Lock()
	defer pd.ep.mu.Unlock()
	return pd.pd.RegMR(buf, access)
}

// RegMRAt registers buf at a chosen virtual address (see qp.PD.RegMRAt).
func (pd *PD) RegMRAt(buf []byte, va uint64, access qp.Access) (*qp.MR, error) {
	pd.ep.mu.Lock()
	defer pd.ep.mu.Unlock()
	return pd.pd.RegMRAt(buf, va, access)
}

// DeregMR removes a memory region.
func (pd *PD) DeregMR(mr *qp.MR) error {
	pd.ep.mu.Lock()
	defer pd.ep.mu.Unlock()
	return pd.pd.DeregMR(mr)
}

// CQ is a completion queue of an Endpoint. Any number of goroutines may
// Wait on it.
type CQ struct {
	ep *Endpoint
	cq *qp.CQ
	// waiters are the channels of the goroutines in Wait, each woken
	// (and the list emptied) whenever completions may have arrived or
	// the Endpoint closed: a broadcast. free keeps their channels for
	// reuse, so that a wake-up allocates nothing.
	waiters []chan struct{}
	free    []chan struct{}
	listed  bool   // in ep.waiting
	heldGen uint64 // the hold whose batch last woke its waiters (Endpoint.holdGen)
}

// NewCQ returns a completion queue with room for depth completions.
func (ep *Endpoint) NewCQ(depth int) *CQ {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	c := &CQ{ep: ep, cq: qp.NewCQ(depth)}
	ep.cqs = append(ep.cqs, c)
	return c
}

// signal wakes every waiter; ep.mu must be held.
func (c *CQ) signal() {
	for i, w := range c.waiters {
		if w != c.ep.inlineW {
			// The goroutine reading the socket in Wait is not
			// parked on its channel: it polls its CQ when its read
			// returns (woken by the kick if it is still reading).
			select {
			case w <- struct{}{}:
			default:
			}
		}
		c.waiters[i] = nil
	}
	c.waiters = c.waiters[:0]
}

// Poll moves up to len(wc) completions into wc without waiting.
func (c *CQ) Poll(wc []qp.WC) int {
	c.ep.mu.Lock()
	defer c.ep.mu.Unlock()
	n := c.cq.Poll(wc)
	if n == 0 && c.cq.Len() == 0 && c.ep.held && c.heldGen == c.ep.holdGen {
		// The application the held batch woke is idle: the timer
		// writes what is held at once, from its own goroutine (Poll
		// may be called where the Conn must not be written, as from an
		// Observer). An empty CQ that batch did not wake ends nothing,
		// nor does a Poll into an empty wc of a CQ that is not empty.
		c.ep.heldDue = c.ep.clock.Now()
		c.ep.armLocked()
	}
	return n
}

// ErrClosed is returned by Wait once the Endpoint is closed.
var ErrClosed = errors.New("transport: endpoint closed")

// Wait blocks until at least one completion is there, then polls up to
// len(wc) of them. It returns ctx.Err() when ctx ends first. While the
// read loop has lent it the socket (direct.go), one goroutine in Wait
// reads the Conn itself.
func (c *CQ) Wait(ctx context.Context, wc []qp.WC) (int, error) {
	ep := c.ep
	var w chan struct{}
	parked := false
	defer func() {
		if parked {
			// ctx ended while parked.
			ep.mu.Lock()
			c.leaveLocked(&w)
			ep.mu.Unlock()
		}
	}()
	var spinSince time.Time
	for {
		ep.mu.Lock()
		parked = false
		if n := c.cq.Poll(wc); n > 0 {
			c.leaveLocked(&w)
			ep.mu.Unlock()
			return n, nil
		}
		if ep.closed {
			c.leaveLocked(&w)
			ep.mu.Unlock()
			return 0, ErrClosed
		}
		if c.heldGen == ep.holdGen {
			// Woken by the batch whose packets are held, and idle
			// without a reply: they leave now. A goroutine waiting on
			// another CQ (an rdma_cm Service's, on QP1's) does not end
			// a hold that was not made for it.
			ep.flushHeldLocked()
		}
		if n := c.cq.Poll(wc); n > 0 {
			// Completions came while the lock was released to write.
			c.leaveLocked(&w)
			ep.mu.Unlock()
			return n, nil
		}
		if w == nil {
			if k := len(c.free); k > 0 {
				w = c.free[k-1]
				c.free = c.free[:k-1]
			} else {
				w = make(chan struct{}, 1)
			}
		}
		if ep.lent && !ep.inline && !ep.closed {
			if err := ctx.Err(); err != nil {
				c.leaveLocked(&w)
				ep.mu.Unlock()
				return 0, err
			}
			// The socket is lent: read it here. Listed as a waiter, so
			// that a batch that completes this CQ's work counts as
			// waking a goroutine (Options.ReplyHold).
			c.addWaiterLocked(w)
			ep.inlineW = w
			ep.readDirectLocked(ctx, c)
			ep.inlineW = nil
			c.release(w) // back to c.free
			w = nil
			ep.mu.Unlock()
			continue
		}
		if bp := ep.opts.BusyPoll; bp > 0 {
			// Busy-polling: try again before parking, until the
			// budget is spent or ctx ends.
			now := time.Now()
			if spinSince.IsZero() {
				spinSince = now
			}
			if now.Sub(spinSince) < bp && ctx.Err() == nil {
				ep.mu.Unlock()
				runtime.Gosched()
				continue
			}
		}
		c.addWaiterLocked(w)
		parked = true
		ep.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// addWaiterLocked lists w among the CQ's waiters, and the CQ among the
// Endpoint's CQs with waiters (ep.mu held).
func (c *CQ) addWaiterLocked(w chan struct{}) {
	c.waiters = append(c.waiters, w)
	if !c.listed {
		c.listed = true
		c.ep.waiting = append(c.ep.waiting, c)
	}
}

// leaveLocked is the end of a Wait: its channel, if it took one, goes
// back to the free list, and a lent socket stays lent only if no other
// goroutine is parked in Wait (ep.mu held).
func (c *CQ) leaveLocked(w *chan struct{}) {
	if *w != nil {
		c.release(*w)
		*w = nil
	}
	c.ep.leftWaitLocked()
}

// release takes w off the waiters (when no signal did), empties it and
// keeps it for the next Wait; ep.mu is held.
func (c *CQ) release(w chan struct{}) {
	for i, x := range c.waiters {
		if x == w {
			c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
			c.waiters[len(c.waiters):][:1][0] = nil
			break
		}
	}
	select {
	case <-w:
	default:
	}
	c.free = append(c.free, w)
}

// Overruns returns how many completions were lost because the CQ was full.
func (c *CQ) Overruns() uint64 {
	c.ep.mu.Lock()
	defer c.ep.mu.Unlock()
	return c.cq.Overruns
}

// QP is a queue pair of an Endpoint.
type QP struct {
	ep       *Endpoint
	q        *qp.QP
	encap    bth.Encap
	src, dst netip.AddrPort // of the datagrams, from encap
	// peerIP is the remote address of the QP's address vector, unmapped
	// and without a zone (unzoned), for the source check of receiveLocked;
	// set after each Modify.
	peerIP  netip.Addr
	cnpTOS  uint8
	udSport uint16 // UD: the one UDP source port, once chosen
	// peerPort is the UDP source port the peer sends from, once pinned
	// (SourceStrict); portWarned: a drop for another port was logged.
	peerPort   uint16
	peerPinned bool
	portWarned bool
	// lastRx is when the QP was last handed a packet (LastReceived).
	lastRx time.Time
	// shortTimeout: its local ACK timeout is under minHoldTimeout, so
	// nothing it answers is held (Options.ReplyHold).
	shortTimeout bool
	// The Endpoint's schedule (schedule.go): heapIdx is the QP's index in
	// the deadline heap (-1: not there) and due its deadline there;
	// active: in the active queue; dirty: its deadline is to be
	// refreshed; gone: destroyed.
	heapIdx int
	due     time.Time
	active  bool
	dirty   bool
	gone    bool
}

// NewQP creates a QP in RESET with the device's next free QPN (from 0x11
// up, as rxe). init.QPN is ignored, except 1 for a UD QP: the GSI QP
// (QP1) that the communication manager's MADs go to.
func (ep *Endpoint) NewQP(pd *PD, sendCQ, recvCQ *CQ, init qp.InitAttr) (*QP, error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		return nil, ErrClosed
	}
	if !(init.QPN == 1 && init.QPType == qp.IBV_QPT_UD) {
		init.QPN = 0
	}
	init.PD, init.SendCQ, init.RecvCQ = pd.pd, sendCQ.cq, recvCQ.cq
	q, err := qp.New(init)
	if err != nil {
		return nil, err
	}
	w := &QP{ep: ep, q: q, cnpTOS: bth.TrafficClass(48, bth.ECT0), heapIdx: -1}
	if init.CC != nil {
		w.cnpTOS = bth.TrafficClass(init.CC.CNPDSCP, bth.ECT0)
	}
	ep.qps[q.QPN] = w
	return w, nil
}

// QPN returns the QP number.
func (w *QP) QPN() uint32 { return w.q.QPN }

// State returns the QP state.
func (w *QP) State() qp.State {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.State()
}

// Attr returns the QP's attributes.
func (w *QP) Attr() qp.Attr {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.Attr()
}

// Counters returns a copy of the QP's counters. An ACK held for a reply
// (Options.ReplyHold) is not counted until it is written: call
// Endpoint.Flush first to count a run's last ACK.
func (w *QP) Counters() qp.Counters {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.Counters
}

// LastReceived returns when, by the Endpoint's clock, the QP was last
// handed a packet from its peer (one that passed the Endpoint's checks:
// ICRC, source address and port; the QP may still drop it, as a duplicate
// say), or the zero time when none has come. It tells whether the peer
// is still heard from without polling counters for a change.
func (w *QP) LastReceived() time.Time {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.lastRx
}

// Err returns why the QP is in IBV_QPS_ERR (a *qp.QPError; see
// qp.QP.Err), or nil in another state.
func (w *QP) Err() error {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.Err()
}

// CCState returns the QP's DCQCN rate and alpha (see qp.QP.CCState).
func (w *QP) CCState() (rate cc.Rate, alpha float64, ok bool) {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.CCState()
}

// CCLowestRate returns the lowest rate DCQCN has cut the QP to (see
// qp.QP.CCLowestRate).
func (w *QP) CCLowestRate() cc.Rate {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.CCLowestRate()
}

// PeerSourcePort returns the UDP source port the QP takes its peer's
// packets from under SourceStrict, and false while none is pinned (before
// the first packet, and always for UD QPs and under SourceAddrOnly).
func (w *QP) PeerSourcePort() (uint16, bool) {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.peerPort, w.peerPinned
}

// CCCuts returns the rate cuts of the QP's DCQCN reaction point and the
// CNPs that made none of their own (see qp.QP.CCCuts).
func (w *QP) CCCuts() (cuts, coalesced uint64) {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.CCCuts()
}

// SendQueued returns the number of send WQEs posted and not yet
// completed (qp.QP.SendQueued).
func (w *QP) SendQueued() int {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.SendQueued()
}

// CNPPending reports whether the QP owes a CNP that has not yet been
// written to the Conn: qp.QP.CNPPending, or a batch being written.
func (w *QP) CNPPending() bool {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.q.CNPPending() || w.ep.sending
}

// SourcePort returns the UDP source port the QP sends from.
func (w *QP) SourcePort() uint16 {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	return w.encap.SrcPort
}

// Modify changes the QP's attributes and state (see qp.QP.Modify). When
// the address vector is set, the QP's packets get their headers from it:
// source address (the Endpoint's; AV.Local may name it), destination, traffic
// class, hop limit, and the UDP source port of rdma_get_udp_sport.
func (w *QP) Modify(attr *qp.Attr, mask qp.AttrMask) error {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	if mask&qp.IBV_QP_AV != 0 {
		local := w.ep.conn.LocalAddr().Addr()
		// A GID carries no zone: compare addresses without theirs.
		if attr.AV.Local.IsValid() && attr.AV.Local.Unmap().WithZone("") != local.Unmap().WithZone("") {
			return fmt.Errorf("%w: the QP's local address %s is not the endpoint's %s", qp.ErrBadAttr, attr.AV.Local, local)
		}
		if local.Unmap().Is4() != attr.AV.Remote.Addr().Unmap().Is4() {
			return fmt.Errorf("%w: local address %s and remote address %s are not of one IP version", qp.ErrBadAttr, local, attr.AV.Remote.Addr())
		}
	}
	// What is held for a reply leaves before the state changes: a move
	// to RESET would discard the ACK of a completion already seen.
	w.ep.flushHeldLocked()
	if err := w.q.Modify(attr, mask); err != nil {
		return err
	}
	if mask&qp.IBV_QP_TIMEOUT != 0 {
		short := attr.Timeout > 0 && attr.Timeout < minHoldTimeout
		if short != w.shortTimeout && !w.gone {
			w.shortTimeout = short
			if short {
				w.ep.shortQPs++
				w.ep.unlendLocked()
			} else {
				w.ep.shortQPs--
			}
		}
	}
	dqpn, av := w.q.Remote()
	w.peerIP = unzoned(av.Remote.Addr())
	if mask&qp.IBV_QP_AV != 0 || mask&qp.IBV_QP_DEST_QPN != 0 {
		w.setEncap(dqpn, av)
	}
	if mask&(qp.IBV_QP_AV|qp.IBV_QP_DEST_QPN) != 0 || w.q.State() == qp.IBV_QPS_RESET {
		// Another peer, or none: its source port is learnt again.
		w.peerPort, w.peerPinned, w.portWarned = 0, false, false
	}
	w.ep.touchLocked(w)
	w.ep.flushLocked(w.ep.clock.Now())
	return nil
}

// unzoned returns a as a GID compares it: an IPv4-mapped address as IPv4,
// without an IPv6 zone.
func unzoned(a netip.Addr) netip.Addr {
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Zone() != "" {
		a = a.WithZone("")
	}
	return a
}

// setEncap sets the headers of the QP's next packets for a remote QP
// dqpn at av (ep.mu held).
func (w *QP) setEncap(dqpn uint32, av qp.AddressVector) {
	local := w.ep.conn.LocalAddr().Addr()
	dport := av.Remote.Port()
	if dport == 0 {
		dport = bth.UDPPort
	}
	var sport uint16
	if w.q.Type() == qp.IBV_QPT_UD {
		// One source port per UD QP, chosen once from its QPN (rxe gives a
		// UD QP its port at creation), so that the sockets opened do not
		// grow with the remote QPNs it sends to.
		if w.udSport == 0 {
			w.udSport = w.ep.conn.SourcePort(bth.SourcePort(0, w.q.QPN, w.q.QPN))
		}
		sport = w.udSport
	} else {
		sport = w.ep.conn.SourcePort(bth.SourcePort(av.FlowLabel, w.q.QPN, dqpn))
	}
	tc := av.TrafficClass
	if tc == 0 && w.q.QPN != 1 {
		ecn := bth.ECT0
		if w.ep.opts.NotECT {
			ecn = bth.NotECT
		}
		tc = bth.TrafficClass(w.ep.opts.DSCP, ecn)
	}
	// QP1's MADs (the CM's) go out with the traffic class their address
	// handle gives, 0 by default: DSCP 0 and Not-ECT, as rxe sends them
	// (TOS 0x00 in the rxe rdma_cm capture); Options.DSCP and ECT(0) are
	// for data.
	w.encap = bth.Encap{Src: local.Unmap(), Dst: av.Remote.Addr().Unmap(), SrcPort: sport, DstPort: dport,
		TrafficClass: tc, HopLimit: av.HopLimit, FlowLabel: av.FlowLabel}
	if !local.Unmap().Is4() {
		w.encap.Src, w.encap.Dst = local, av.Remote.Addr()
	}
	w.src = netip.AddrPortFrom(w.encap.Src, w.encap.SrcPort)
	w.dst = netip.AddrPortFrom(w.encap.Dst, w.encap.DstPort)
}

// PostSend posts a send work request (see qp.QP.PostSend) and sends what
// it can at once.
func (w *QP) PostSend(wr qp.SendWR) error {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	if w.ep.closed {
		return ErrClosed
	}
	if err := w.q.PostSend(wr); err != nil {
		return err
	}
	w.ep.touchLocked(w)
	w.ep.replied = true
	w.ep.flushLocked(w.ep.clock.Now())
	return nil
}

// PostRecv posts a receive work request (see qp.QP.PostRecv).
func (w *QP) PostRecv(wr qp.RecvWR) error {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	if w.ep.closed {
		return ErrClosed
	}
	if err := w.q.PostRecv(wr); err != nil {
		return err
	}
	if w.ep.held {
		// A receive sends nothing of its own and moves none of the QP's
		// deadlines (they are the requester's, the completer's and
		// congestion control's): the held ACKs wait for the reply that
		// usually follows (a ping-pong reposts its receive, then
		// sends), and the timer stays as it is. Only a flushed
		// completion (a QP in IBV_QPS_ERR) is signalled.
		w.ep.signalLocked()
		return nil
	}
	w.ep.touchLocked(w)
	w.ep.flushLocked(w.ep.clock.Now())
	return nil
}

// Destroy removes the QP from the Endpoint and frees its QPN (see
// qp.QP.Destroy); packets for it are then counted as for an unknown QP.
// What the QPs queued before Destroy goes out first, as at Close: a CM
// answer posted on QP1 just before its service closes (the DREP to a
// peer's DREQ) is sent, not lost with the QP while another batch was
// being written.
func (w *QP) Destroy() {
	w.ep.mu.Lock()
	defer w.ep.mu.Unlock()
	if !w.ep.closed {
		w.ep.drainLocked()
	}
	delete(w.ep.qps, w.q.QPN)
	if w.shortTimeout && !w.gone {
		w.ep.shortQPs--
	}
	w.ep.dropLocked(w)
	w.q.Destroy()
}

// Locked runs f with the Endpoint's lock held, so that what f does to
// registered memory happens between two of the Endpoint's events: the
// Endpoint neither reads nor writes memory meanwhile. Use it to rewrite a
// buffer a peer may still read (a late duplicate READ request is answered
// from memory even after the READ completed at the peer). f must not call
// the Endpoint's methods.
func (ep *Endpoint) Locked(f func()) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	f()
}

// Sync waits until the Endpoint is between two events. Memory a remote
// peer wrote with RDMA WRITE before this side saw a completion for
// something later (an ACK to the peer, say) is then safe to read: in Go's
// memory model, Sync orders everything the Endpoint did before it before
// what the caller does after.
func (ep *Endpoint) Sync() {
	ep.mu.Lock()
	//lint:ignore SA2001 the empty critical section is the point
	ep.mu.Unlock()
}
