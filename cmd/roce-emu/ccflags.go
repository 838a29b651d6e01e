package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// ccFlags are the DCQCN, path and window flags of the commands that
// connect RC, UC or UD QPs to a peer (server, client, bw, lat).
//
// The notification point is on by default, as on a ConnectX with RoCE
// congestion control (mlx5's roce_np enabled): CE-marked data is answered
// with CNPs, at most one per min_time_between_cnps, with or without the
// reaction point. --dcqcn turns the reaction point on (roce_rp): the QP's
// sends are paced at the rate DCQCN keeps.
type ccFlags struct {
	cnp      bool
	dcqcn    bool
	profile  string
	params   multiFlag
	lineRate string
	via      string
	// peerTimeout ends a run whose QPs have received nothing for this
	// long once traffic runs (0: never); see watchPeerSilence.
	peerTimeout time.Duration
	// unackedPSNs is the RC requester's window
	// (qp.InitAttr.MaxUnackedPSNs).
	unackedPSNs int

	// Set by check.
	p      cc.Params
	viaTo  netip.AddrPort // zero: send to the peer's own address
	viaSet bool
}

func (c *ccFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.cnp, "cnp", true, "answer CE-marked data with CNPs (DCQCN's notification point, on by default as on a ConnectX with RoCE congestion control; --cnp=false turns it off)")
	fs.BoolVar(&c.dcqcn, "dcqcn", false, "DCQCN's reaction point: pace what the QPs send at the rate DCQCN keeps, cut on each CNP received")
	fs.StringVar(&c.profile, "profile", cc.ProfileMLX5, "DCQCN parameter `profile` of both points: paper, mlx5 or hpcc (as roce-emu dcqcn)")
	fs.Var(&c.params, "param", "set one DCQCN parameter by its mlx5 name, NAME=VALUE (repeatable), as roce-emu dcqcn; e.g. min_time_between_cnps=50 or rpg_ai_rate=10")
	fs.StringVar(&c.lineRate, "line-rate", "10", "with --dcqcn, the port speed DCQCN starts at and climbs back to (Gb/s, or 25Gbps, 100Mbps)")
	fs.DurationVar(&c.peerTimeout, "peer-timeout", defaultPeerTimeout, "once traffic runs, end the run with an error when not one RoCEv2 packet has come from the peer for this long (a peer stopped or a dead path; retry_cnt 7 never runs out, as on rxe); keep it well above the ACK timeout (-u); 0: never")
	fs.IntVar(&c.unackedPSNs, "unacked-psns", qp.MaxUnackedPSNs, "RC requester's window: at most this many PSNs in flight, the oldest unacknowledged one included (128 by default, rxe's RXE_MAX_UNACKED_PSNS; rxe itself lets 129 out); a larger `window` keeps more in flight when the peer's ACKs come late, and a go-back-N retransmission resends as many; an RDMA READ takes all its PSNs once started; UC and UD have no window (1 to 4194304; docs/datapath.md, \"The requester's window\")")
	fs.StringVar(&c.via, "roce-via", "", "send RoCEv2 packets to this `address:port` (e.g. a roce-emu switch port) instead of the address and --udp-port of the peer; the peer's packets are taken from that address")
}

// check reads the profile, the parameters and --roce-via.
func (c *ccFlags) check() error {
	rate, err := cc.ParseRate(c.lineRate)
	if err != nil || !(rate > 0) || rate > cc.MaxLineRate {
		return fmt.Errorf("--line-rate %q: give Gb/s as a number, or a rate such as 25Gbps, at most %v", c.lineRate, cc.MaxLineRate)
	}
	if c.p, err = dcqcnParams(c.profile, rate, c.params); err != nil {
		return err
	}
	if err := checkPeerTimeout(c.peerTimeout); err != nil {
		return err
	}
	if c.unackedPSNs < 1 || c.unackedPSNs > qp.MaxUnackedPSNsLimit {
		return fmt.Errorf("--unacked-psns %d: give the RC requester's window in PSNs, 1 to %d (rxe's is %d)", c.unackedPSNs, qp.MaxUnackedPSNsLimit, qp.MaxUnackedPSNs)
	}
	if c.via != "" {
		a, err := netip.ParseAddrPort(c.via)
		if err != nil || a.Port() == 0 || a.Addr().IsUnspecified() || a.Addr().IsMulticast() {
			return fmt.Errorf("--roce-via %q: give the ADDRESS:PORT to send RoCEv2 to, e.g. 127.0.0.100:5001", c.via)
		}
		c.viaTo, c.viaSet = a, true
	}
	return nil
}

// dcqcnParams is a profile at rate with the --param assignments applied,
// checked (the parsing of roce-emu dcqcn).
func dcqcnParams(profile string, rate cc.Rate, params []string) (cc.Params, error) {
	p, err := cc.Profile(profile, rate)
	if err != nil {
		return cc.Params{}, fmt.Errorf("--profile: %v", err)
	}
	for _, a := range params {
		if err := p.Set(a); err != nil {
			return cc.Params{}, fmt.Errorf("--param: %v", err)
		}
	}
	if err := p.Check(); err != nil {
		return cc.Params{}, err
	}
	return p, nil
}

// apply gives init the congestion control the flags ask for.
func (c *ccFlags) apply(init *qp.InitAttr) {
	init.MaxUnackedPSNs = c.unackedPSNs
	p := c.p
	switch {
	case c.dcqcn:
		init.CC, init.RPOnly = &p, !c.cnp
	case c.cnp:
		init.NP = &p
	}
}

// peer is where packets for the peer at to go: --roce-via's address, or
// to itself.
func (c *ccFlags) peer(to netip.AddrPort) netip.AddrPort {
	if c.viaSet {
		return c.viaTo
	}
	return to
}

// describe says which DCQCN points run, for the banner, and the
// requester's window when it is not the default and the QPs are RC (UC
// and UD have none).
func (c *ccFlags) describe(rc bool) string {
	var s []string
	switch {
	case c.dcqcn:
		s = append(s, fmt.Sprintf("DCQCN %s at %v", c.profile, c.p.LineRate))
	default:
		s = append(s, "no reaction point (add --dcqcn)")
	}
	if c.cnp {
		per := "per QP"
		if c.p.CNPPerPort {
			per = "per port"
		}
		s = append(s, fmt.Sprintf("CNPs at most one per %v %s", c.p.MinTimeBetweenCNPs, per))
	} else {
		s = append(s, "no CNPs (--cnp=false)")
	}
	if c.viaSet {
		s = append(s, "RoCEv2 via "+c.viaTo.String())
	}
	if c.unackedPSNs != qp.MaxUnackedPSNs && rc {
		s = append(s, fmt.Sprintf("window of %d unacknowledged PSNs", c.unackedPSNs))
	}
	return strings.Join(s, ", ")
}

// ccCounts are the DCQCN counters of a run's QPs, summed.
type ccCounts struct {
	ceSeen, cnpSent, cnpHandled, cnpIgnored, cuts, coalesced uint64
	lowest                                                   cc.Rate
}

func sumCC(qps []*transport.QP) ccCounts {
	var s ccCounts
	for _, q := range qps {
		c := q.Counters()
		s.ceSeen += c.NPECNMarked
		s.cnpSent += c.NPCNPSent
		s.cnpHandled += c.RPCNPHandled
		s.cnpIgnored += c.RPCNPIgnored
		cuts, co := q.CCCuts()
		s.cuts += cuts
		s.coalesced += co
		if l := q.CCLowestRate(); l > 0 && (s.lowest == 0 || l < s.lowest) {
			s.lowest = l
		}
	}
	return s
}

// String is the line printed after a run, with the mlx5 counter names.
func (s ccCounts) String() string {
	l := ""
	if s.lowest > 0 {
		l = fmt.Sprintf(", lowest rate %v", s.lowest)
	}
	return fmt.Sprintf("CE seen %d (np_ecn_marked_roce_packets), CNPs sent %d (np_cnp_sent), CNPs received %d (rp_cnp_handled %d, rp_cnp_ignored %d), rate cuts %d (CNPs coalesced into a pending cut %d)%s",
		s.ceSeen, s.cnpSent, s.cnpHandled+s.cnpIgnored, s.cnpHandled, s.cnpIgnored, s.cuts, s.coalesced, l)
}

// cnpFlushBound bounds flushCNPs: a deferred CNP is due at the end of
// its interval (min_time_between_cnps, microseconds), far sooner.
const cnpFlushBound = time.Second

// flushCNPs waits until none of qps owes a CNP (one deferred to the end
// of its interval, or one not yet written to the socket), so that the
// CNPs a run counts as sent have left before its last exchange with the
// peer, and the peer, which counts after that exchange, has been sent
// them all. It returns at once without DCQCN's notification point, and
// after cnpFlushBound or when ctx ends whatever happens.
func flushCNPs(ctx context.Context, qps ...*transport.QP) {
	end := time.Now().Add(cnpFlushBound)
	t := time.NewTicker(100 * time.Microsecond)
	defer t.Stop()
	for {
		pending := false
		for _, q := range qps {
			if q.CNPPending() {
				pending = true
				break
			}
		}
		if !pending || time.Now().After(end) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
