package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// netFlags are the flags every command that moves traffic takes.
type netFlags struct {
	bind    string
	udpPort uint
	pcap    string
	loss    float64
	faults  multiFlag
	seed    uint64
	icrc    bool
	// csum: --udp-checksum, given or not (udpChecksum decides).
	csum optBool
	// busyPoll: transport.Options.BusyPoll of DefaultBusyPoll; noGSO,
	// noGRO: the UDP offloads off (transport.UDPOptions).
	busyPoll     bool
	noGSO, noGRO bool
	// replyHold: transport.Options.ReplyHold (0: off).
	replyHold time.Duration
	// strictSource pins each RC/UC QP's peer to one UDP source port
	// (transport.SourceStrict); allowGID lets a peer announce a GID other
	// than the address its exchange connection came from.
	strictSource bool
	allowGID     bool
	// exchangeTimeout bounds the out-of-band exchange once a peer has
	// connected (--exchange-timeout; exchange.go).
	exchangeTimeout time.Duration
	// stderr is where the Endpoint's warnings go (the flag set's output).
	stderr io.Writer
	// observe, when set, sees every datagram the Endpoint reads and
	// writes (after the faults, as the capture).
	observe transport.Observer
	// progress: draw a progress line on stderr (watchProgress), both
	// stdout and stderr being terminals.
	progress bool
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func (n *netFlags) register(fs *flag.FlagSet, defaultBind string) {
	n.stderr = fs.Output()
	fs.StringVar(&n.bind, "bind", defaultBind, "local IP `address` to send and receive RoCEv2 from")
	fs.UintVar(&n.udpPort, "udp-port", bth.UDPPort, "UDP `port` for RoCEv2, locally and at the peer")
	fs.StringVar(&n.pcap, "pcap", "", "write every RoCEv2 packet sent and received to this pcap `file`")
	fs.Float64Var(&n.loss, "loss", 0, "drop each packet, in both directions, with `probability` P (0-1)")
	fs.Var(&n.faults, "fault", "inject a fault, as ACTION[:KEY=VALUE,...] (repeatable); e.g. drop:dir=out,opcode=RC_RDMA_WRITE_MIDDLE,nth=2 (see README)")
	fs.Uint64Var(&n.seed, "seed", 1, "random `seed` for --loss and probabilistic faults")
	fs.Var(&n.csum, "udp-checksum", "send a computed UDP checksum instead of 0 (rxe sends 0, over IPv4 and IPv6; roce-emu accepts both). Default: computed when --bind is a loopback address, where the kernel neither computes nor checks it and UDP segmentation offload (GSO) needs it; 0 otherwise; --udp-checksum=false sends 0 everywhere")
	fs.BoolVar(&n.icrc, "verify-icrc", false, "check the ICRC of received IPv4 packets assuming the sender's IP ID is 0 (true of roce-emu peers, not of rxe); IPv6 packets are always checked")
	fs.BoolVar(&n.busyPoll, "busy-poll", false, "spin instead of sleeping where completions and packets are awaited (up to 50 us each time, then sleep): lower latency, a busy CPU")
	fs.BoolVar(&n.noGSO, "no-gso", false, "send each datagram on its own, without UDP segmentation offload (GSO is used only where the UDP checksum is computed: see --udp-checksum)")
	fs.BoolVar(&n.noGRO, "no-gro", false, "receive without UDP generic receive offload (GRO)")
	fs.DurationVar(&n.replyHold, "reply-hold", transport.DefaultReplyHold, "hold the ACKs of packets that completed work the program waits for, so that they leave in one write with its reply (a ping-pong's ACK and answer together), for at most this `duration` (Go's timer may add about a millisecond); not for QPs with an ACK timeout of 8 us to 2.1 ms (bw and lat: -u 1 to 9; the peer's own timeout is not known here); 0 sends each ACK as its packet is handled, as rxe does")
	fs.BoolVar(&n.strictSource, "strict-source", true, "take a QP's packets from the UDP source port of the peer's first packet only, counting and dropping the rest (--strict-source=false: any port of the peer's address, as rxe)")
}

// checkPeerGID refuses a GID that is not the address the exchange's
// connection came from (oob.CheckGID), unless --allow-gid-mismatch.
func (n *netFlags) checkPeerGID(gid, from netip.Addr, qpn uint32) error {
	if n.allowGID {
		return nil
	}
	if err := oob.CheckGID(gid, from, qpn); err != nil {
		return fmt.Errorf("%v; refused, since a peer could so aim this side's RoCE traffic (READ responses, say) at a third host. If %s is the peer's own address (a multi-homed host, or RoCE over IPv6 with the exchange over IPv4), run with --allow-gid-mismatch",
			err, oob.GIDString(gid))
	}
	return nil
}

// check validates the flags (a bad value is a usage error: exit 2).
func (n *netFlags) check() error {
	a, err := netip.ParseAddr(n.bind)
	if err != nil {
		return fmt.Errorf("--bind %q: not an IP address", n.bind)
	}
	// The bound address is the GID the peer sends to: it must be one
	// host's unicast address.
	if u := a.Unmap(); u.IsUnspecified() || u.IsMulticast() || u == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("--bind %s: give this host's own unicast address (it becomes the GID the peer sends to)", n.bind)
	}
	if n.udpPort == 0 || n.udpPort > 65535 {
		return fmt.Errorf("--udp-port %d: must be 1-65535", n.udpPort)
	}
	if n.exchangeTimeout < 0 {
		return fmt.Errorf("--exchange-timeout %v: must not be negative (0: no bound)", n.exchangeTimeout)
	}
	_, err = n.faultSet()
	return err
}

// faultSet builds the fault rules the flags ask for.
func (n *netFlags) faultSet() (*transport.Faults, error) {
	if !(n.loss >= 0 && n.loss <= 1) { // also refuses NaN
		return nil, fmt.Errorf("--loss %g: must be between 0 and 1", n.loss)
	}
	f := transport.NewFaults(n.seed)
	if n.loss > 0 {
		f.Add(transport.LossRule(n.loss))
	}
	for _, s := range n.faults {
		r, err := transport.ParseFault(s)
		if err != nil {
			return nil, fmt.Errorf("--fault: %v", err)
		}
		f.Add(r)
	}
	return f, nil
}

// openEndpoint opens the UDP endpoint, the capture and the faults.
func (n *netFlags) openEndpoint() (*transport.Endpoint, func(), error) {
	addr, err := netip.ParseAddr(n.bind)
	if err != nil {
		return nil, nil, fmt.Errorf("--bind %q: not an IP address", n.bind)
	}
	if n.udpPort == 0 || n.udpPort > 65535 {
		return nil, nil, fmt.Errorf("--udp-port %d: must be 1-65535", n.udpPort)
	}
	faults, err := n.faultSet()
	if err != nil {
		return nil, nil, err
	}
	conn, err := transport.ListenUDP(netip.AddrPortFrom(addr, uint16(n.udpPort)), n.udpOptions())
	if err != nil {
		return nil, nil, addrInUseHint(fmt.Errorf("cannot listen on %s UDP port %d: %w", addr, n.udpPort, err), udpInUse)
	}
	opts := n.endpointOptions()
	var w *pcap.Writer
	if n.pcap != "" {
		w, err = pcap.Create(n.pcap)
		if err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("--pcap: %v", err)
		}
		// The capture sees what crosses the socket: outgoing packets
		// after the faults, incoming ones before.
		conn = transport.WithObserver(conn, nil, transport.CaptureObserver(w, [6]byte{}, [6]byte{}))
	}
	if n.observe != nil {
		conn = transport.WithObserver(conn, nil, n.observe)
	}
	if len(faults.Rules()) > 0 {
		conn = transport.WithFaults(conn, faults, nil)
	}
	ep := transport.NewEndpoint(conn, opts)
	closeAll := func() {
		ep.Close()
		if w != nil {
			w.Close()
		}
	}
	return ep, closeAll, nil
}

// udpOptions are the UDP Conn's options the flags ask for.
func (n *netFlags) udpOptions() transport.UDPOptions {
	return transport.UDPOptions{ComputeUDPChecksum: n.udpChecksum(), NoGSO: n.noGSO, NoGRO: n.noGRO}
}

// udpChecksum says whether the UDP checksum is computed: as
// --udp-checksum says when given; else when --bind is a loopback address.
// A RoCEv2 peer on a real link gets checksum 0 by default, as rxe and
// ConnectX send it (docs/sockets.md). Over loopback the kernel computes no
// checksum either way (the device takes the send as checksummed), but it
// refuses UDP segmentation offload (GSO) on a socket that sends 0, and
// GSO moves several times the bytes per CPU second (docs/datapath.md).
func (n *netFlags) udpChecksum() bool {
	if n.csum.set {
		return n.csum.v
	}
	a, err := netip.ParseAddr(n.bind)
	return err == nil && a.Unmap().IsLoopback()
}

// optBool is a boolean flag that records whether it was given.
type optBool struct{ v, set bool }

func (b *optBool) String() string {
	if b == nil {
		return "false"
	}
	return strconv.FormatBool(b.v)
}

func (b *optBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	b.v, b.set = v, true
	return nil
}

func (b *optBool) IsBoolFlag() bool { return true }

// endpointOptions are the Endpoint's options the flags ask for.
func (n *netFlags) endpointOptions() transport.Options {
	opts := transport.Options{}
	if n.stderr != nil {
		opts.Logger = slog.New(&warnOnce{w: n.stderr})
	}
	if n.icrc {
		opts.ICRC = transport.ICRCAssumeID0
	}
	if !n.strictSource {
		opts.Source = transport.SourceAddrOnly
	}
	if n.busyPoll {
		opts.BusyPoll = busyPollBudget
	}
	opts.ReplyHold = n.replyHold
	if n.replyHold <= 0 {
		opts.ReplyHold = -1
	}
	return opts
}

// busyPollBudget is how long --busy-poll spins before it sleeps: Linux's
// suggested net.core.busy_read, 50 us.
const busyPollBudget = 50 * time.Microsecond

// randomPSN draws a starting PSN as rc_pingpong does (lrand48() & 0xffffff).
func randomPSN() bth.PSN { return bth.PSN(rand.Uint32() & bth.PSNMask) }

// gidAddr is where a peer whose GID is gid is reached from local: the
// GID's address, with local's zone when both are IPv6 link-local (a GID
// carries no zone).
func gidAddr(gid, local netip.Addr) netip.Addr {
	if gid.Is6() && gid.IsLinkLocalUnicast() && local.IsLinkLocalUnicast() && local.Zone() != "" {
		return gid.WithZone(local.Zone())
	}
	return gid
}

// routeHopLimit is the TTL / hop limit the commands send with. The
// programs they stand in for put another in their GRH (ibv_rc_pingpong 1,
// perftest 0xFF), but on RoCE the kernel resolves an address vector
// through the IP route and takes the route's hop limit, 64 on Linux by
// default (our reading of ib_core's ib_resolve_eth_dmac and
// rdma_addr_find_l2_eth_by_grh); rxe sent 64 for both programs in the
// interop captures, over IPv4 and IPv6 (docs/sockets.md).
const routeHopLimit = 64

// rcPingpongAttrs are ibv_rc_pingpong's: min_rnr_timer 12, timeout 14,
// retry_cnt 7, rnr_retry 7, max_rd_atomic 1 (docs/wire-format.md section 6); the hop limit
// on the wire is the route's (routeHopLimit).
func rcPingpongAttrs(mtu qp.MTU) transport.ConnectAttr {
	return transport.ConnectAttr{PathMTU: mtu, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1,
		HopLimit: routeHopLimit, Access: qp.IBV_ACCESS_LOCAL_WRITE}
}

// mtuFlag parses -m: 256, 512, 1024, 2048 or 4096.
func mtuFlag(n int) (qp.MTU, error) {
	m, err := qp.MTUFromBytes(n)
	if err != nil {
		return 0, fmt.Errorf("-m %d: path MTU must be 256, 512, 1024, 2048 or 4096", n)
	}
	return m, nil
}

// describeCounters gives the counters worth printing after a run.
func describeCounters(c qp.Counters) string {
	return fmt.Sprintf("sent %d, received %d, retransmitted %d, seq NAKs received %d, implied NAKs %d, ACK timeouts %d, RNR NAKs received %d / sent %d, out-of-sequence %d, duplicates %d",
		c.SentPackets, c.ReceivedPackets, c.RetransmittedPkts, c.PacketSeqErr, c.ImpliedNakSeqErr, c.LocalAckTimeoutErr,
		c.RNRNakRetryErr, c.SendRNRErr, c.OutOfSequence, c.DuplicateRequest)
}

// sumCounters adds up the counters of several QPs, field by field.
func sumCounters(cs ...qp.Counters) qp.Counters {
	var sum qp.Counters
	sv := reflect.ValueOf(&sum).Elem()
	for _, c := range cs {
		v := reflect.ValueOf(c)
		for i := range v.NumField() {
			f := sv.Field(i)
			f.SetUint(f.Uint() + v.Field(i).Uint())
		}
	}
	return sum
}

// describeDrops lists every packet dropped and request refused, each
// cause by its counter's name, the QPs' (qp.Counters.Refusals) then the
// Endpoint's (transport.Stats.Drops), then completions lost to a full CQ
// of cqs (cq_overruns), or says there were none.
func describeDrops(c qp.Counters, st transport.Stats, cqs ...*transport.CQ) string {
	var parts []string
	for _, x := range c.Refusals() {
		parts = append(parts, fmt.Sprintf("%s %d", x.Name, x.Value))
	}
	for _, x := range st.Drops() {
		parts = append(parts, fmt.Sprintf("%s %d", x.Name, x.Value))
	}
	var over uint64
	for _, cq := range cqs {
		over += cq.Overruns()
	}
	if over > 0 {
		parts = append(parts, fmt.Sprintf("cq_overruns %d", over))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// qpErrors says which of qps ended in IBV_QPS_ERR and why, or returns nil.
// A QP the command (or rdma_cm's disconnection) moved to ERR itself does
// not count: only one a peer's NAK, a retry count or a local error ended.
func qpErrors(qps ...*transport.QP) error {
	var errs []error
	for _, q := range qps {
		var qe *qp.QPError
		if err := q.Err(); errors.As(err, &qe) && !qe.Modified {
			errs = append(errs, fmt.Errorf("QP %#x ended in IBV_QPS_ERR: %w", q.QPN(), err))
		}
	}
	return errors.Join(errs...)
}

// qpStateWhy names q's state, with why when it is IBV_QPS_ERR.
func qpStateWhy(q *transport.QP) string {
	if err := q.Err(); err != nil {
		return fmt.Sprintf("%s: %v", q.State(), err)
	}
	return q.State().String()
}

func since(t time.Time) float64 { return time.Since(t).Seconds() }

// parseFlags parses args, printing the usage on -h. It returns the exit
// code to end with and false when the command should not go on (help: 0;
// a bad flag: 2, the flag package having said why).
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	if err := parseInterspersed(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// queueFlags registers the congestion-point queue flags shared by dcqcn
// and switch.
func queueFlags(fs *flag.FlagSet, q *cc.QueueConfig) {
	fs.IntVar(&q.KMin, "kmin", q.KMin, "WRED-ECN Kmin in `bytes`")
	fs.IntVar(&q.KMax, "kmax", q.KMax, "WRED-ECN Kmax in `bytes`")
	fs.Float64Var(&q.PMax, "pmax", q.PMax, "WRED-ECN marking `probability` at Kmax")
	fs.BoolVar(&q.MarkAtEnqueue, "mark-at-enqueue", false, "decide ECN marks when a packet arrives, on the depth it finds (default: when it starts to leave, on the depth behind it, as ns3-rdma and HPCC's ns-3)")
	fs.IntVar(&q.Buffer, "buffer", q.Buffer, "buffer in `bytes` (tail drop beyond it)")
	fs.BoolVar(&q.PFC, "pfc", false, "pause (dcqcn) or hold (switch) above XOFF instead of dropping")
	fs.IntVar(&q.XOFF, "xoff", q.XOFF, "PFC XOFF threshold in `bytes`")
	fs.IntVar(&q.XON, "xon", q.XON, "PFC XON threshold in `bytes`")
}

// warnOnce is the commands' Endpoint logger: it prints each kind of
// warning or error (by message) once on stderr. A send error repeats with
// every retransmission (a path MTU above the link's MTU fails each send,
// since DF is set); said once, with a hint, it tells the user why the run
// is not moving instead of leaving them to the timeout.
type warnOnce struct {
	w    io.Writer
	mu   sync.Mutex
	seen map[string]bool
}

func (h *warnOnce) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *warnOnce) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *warnOnce) WithGroup(string) slog.Handler                { return h }

func (h *warnOnce) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen[r.Message] {
		return nil
	}
	if h.seen == nil {
		h.seen = map[string]bool{}
	}
	h.seen[r.Message] = true
	var b strings.Builder
	fmt.Fprintf(&b, "roce-emu: %s", r.Message)
	hint := ""
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, ", %s: %v", a.Key, a.Value)
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, syscall.EMSGSIZE) {
			hint = " (a packet is larger than the link allows: lower the path MTU -m; roce-emu sets Don't Fragment)"
		}
		return true
	})
	fmt.Fprintf(h.w, "%s%s (said once)\n", b.String(), hint)
	return nil
}
