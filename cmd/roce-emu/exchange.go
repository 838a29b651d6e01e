package main

// The out-of-band exchange's bounds: a deadline on each accepted (or
// dialled) exchange, so that a TCP peer that connects and sends nothing,
// or dribbles a byte a minute, cannot hold a server for ever; the
// client's exchange connection bound to --bind, so that the server sees
// it come from the address whose GID it announces; and what a client
// says when a server refuses it.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
)

// defaultExchangeTimeout is --exchange-timeout's default. Neither
// perftest (ctx_xchg_data, blocking read() and write() on the socket) nor
// rc_pingpong (pp_server_exch_dest) bound their exchange: a silent peer
// holds them until it closes. Both exchange a few hundred bytes in well
// under a second between live peers, so a minute leaves room for a slow
// or loaded host.
const defaultExchangeTimeout = 60 * time.Second

// registerExchange registers the flags of the commands whose exchange
// runs over TCP and announces GIDs (pingpong and perftest):
// --allow-gid-mismatch and --exchange-timeout.
func (n *netFlags) registerExchange(fs *flag.FlagSet) {
	fs.BoolVar(&n.allowGID, "allow-gid-mismatch", false, "let the peer announce a GID other than the address its exchange connection came from (a multi-homed peer, or RoCE over IPv6 with the exchange over IPv4)")
	fs.DurationVar(&n.exchangeTimeout, "exchange-timeout", defaultExchangeTimeout, "longest the out-of-band exchange may take once a peer has connected (the set-up messages together, and each later message from the last packet the peer's QPs sent); a server still waits for its client for ever; 0: no bound")
}

// exchangeStallError is the cause of an exchange cut short by
// --exchange-timeout.
type exchangeStallError struct {
	peer    string        // the peer's address, as the connection gives it
	timeout time.Duration // --exchange-timeout
	after   string        // "" or what the bound counted from
}

func (e *exchangeStallError) Error() string {
	return fmt.Sprintf("the exchange with %s stalled: no complete message within --exchange-timeout %v%s", e.peer, e.timeout, e.after)
}

// exchangeBound is the deadline of the set-up part of one exchange
// (--exchange-timeout from when the peer connected). Every step up to the
// traffic runs under a context with it (under); explain turns a step's
// error at the deadline into one line naming the peer, the step and how
// much of its message had come.
type exchangeBound struct {
	deadline time.Time // zero: no bound
	cause    *exchangeStallError
	finished bool // the set-up is over: later errors are not the bound's
}

// exchangeBound starts the bound of an exchange with peer that begins now.
func (n *netFlags) exchangeBound(peer string) *exchangeBound {
	b := &exchangeBound{cause: &exchangeStallError{peer: peer, timeout: n.exchangeTimeout}}
	if n.exchangeTimeout > 0 {
		b.deadline = time.Now().Add(n.exchangeTimeout)
	}
	return b
}

// under returns parent bounded by b's deadline.
func (b *exchangeBound) under(parent context.Context) (context.Context, context.CancelFunc) {
	if b.deadline.IsZero() {
		return context.WithCancel(parent)
	}
	return context.WithDeadlineCause(parent, b.deadline, b.cause)
}

// explain is err, told as a stall when the set-up's deadline ended it.
func (b *exchangeBound) explain(err error) error {
	if err == nil || b == nil || b.finished || b.deadline.IsZero() || time.Now().Before(b.deadline) || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return stalled(b.cause, err)
}

// stalledStep is a step of the exchange that a stall ended: the stall,
// then the step as its error names it, without the context's "context
// canceled" or "context deadline exceeded" that the stall already says.
// It unwraps to the step's error.
type stalledStep struct {
	stall *exchangeStallError
	err   error
}

// stalled is err, a step's error, told as ended by stall.
func stalled(stall *exchangeStallError, err error) error { return &stalledStep{stall, err} }

func (e *stalledStep) Error() string {
	step := e.err.Error()
	for _, c := range []error{context.Canceled, context.DeadlineExceeded} {
		step = strings.TrimSuffix(step, ": "+c.Error())
	}
	return e.stall.Error() + ": " + step
}

func (e *stalledStep) Unwrap() error { return e.err }

// stepBound bounds the exchange's steps once traffic runs, when a step
// may legitimately wait as long as the peer's traffic lasts (perftest's
// "traffic done" barrier, the bandwidth reports, the closing barrier): a
// step fails when --exchange-timeout has gone by since it began and since
// the last packet any of qps received. A peer that stops both its traffic
// and the exchange is let go after the timeout; one that is still
// sending is waited for.
type stepBound struct {
	timeout time.Duration
	peer    string
	qps     []*transport.QP
}

// step returns the context for one step under parent; cancel ends its
// watcher.
func (b *stepBound) step(parent context.Context) (context.Context, context.CancelFunc) {
	if b == nil || b.timeout <= 0 {
		return context.WithCancel(parent)
	}
	ctx, cancel := context.WithCancelCause(parent)
	start := time.Now()
	stop := poll(ctx, max(b.timeout/8, time.Millisecond), func(<-chan struct{}) bool {
		if time.Since(lastHeard(start, b.qps...)) < b.timeout {
			return true
		}
		cancel(&exchangeStallError{peer: b.peer, timeout: b.timeout, after: " (nor any RoCE packet from it)"})
		return false
	}, nil)
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// do runs one step under b (see step), telling its error as a stall when
// the bound ended it.
func (b *stepBound) do(parent context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := b.step(parent)
	err := f(ctx)
	var stall *exchangeStallError
	if err != nil && errors.As(context.Cause(ctx), &stall) {
		err = stalled(stall, err)
	}
	cancel()
	return err
}

// dialExchange connects to a server's exchange at host:port from bind,
// the address RoCE is sent from and whose GID the exchange announces, so
// that the server's check of that GID against the connection's address
// (oob.CheckGID) sees the same address. Without it the kernel picks the
// source (127.0.0.1 for any loopback server, the outgoing interface's
// first address otherwise), and a host with several addresses is refused.
// When host has no address of bind's family (RoCE over IPv6, the exchange
// over IPv4) the kernel picks the source, and the server needs
// --allow-gid-mismatch, as before.
func dialExchange(ctx context.Context, bind netip.Addr, host string, port int) (net.Conn, error) {
	var d net.Dialer
	if bind.IsValid() {
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else if addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if a.Unmap().Is4() == bind.Unmap().Is4() {
				d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(bind, 0))
				c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), strconv.Itoa(port)))
				var oe *net.OpError
				if errors.As(err, &oe) && oe.Op == "dial" {
					oe.Source = nil // "dial tcp HOST:PORT: ...", as an unbound dial says
				}
				return c, err
			}
		}
	}
	return d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
}

// refusedHint explains err, a client's exchange step that found the
// connection closed by the server after the client's GID went across:
// the likely cause is the server's GID check. Other errors come back as
// they are.
func refusedHint(err error, gid, from netip.Addr) error {
	if !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		return err
	}
	if !from.IsValid() || from.Unmap() == gid.Unmap() || from.Unmap().Is4() != gid.Unmap().Is4() {
		// Not a GID the check refuses: the same address, or another
		// IP version (which the server refuses for that reason).
		return fmt.Errorf("%w; the server closed the exchange after our address (%s): its own output says why", err, gid)
	}
	src := from.String()
	return fmt.Errorf("%w; the server closed the exchange after our address: it likely refused the GID we announced (%s) as not the address our exchange connection came from (%s); a server that must take it runs with --allow-gid-mismatch (its own output says why it refused)",
		err, gid, src)
}

// explainQPErr adds to err, a run that failed after its QPs were
// connected, why any of qps went to IBV_QPS_ERR (a peer's NAK, a retry
// count run out), when err does not say it already: a peer that leaves
// after its NAK ended a QP would otherwise be all the run says.
func explainQPErr(err error, qps ...*transport.QP) error {
	var qe *qp.QPError
	var told *qpToldError
	if err == nil || errors.As(err, &qe) || errors.As(err, &told) {
		return err
	}
	if qerr := qpErrors(qps...); qerr != nil {
		return fmt.Errorf("%w; %w", err, qerr)
	}
	return err
}

// qpToldError marks an error whose text already gives the QP's state and
// why it went to IBV_QPS_ERR (qpStateWhy), so that explainQPErr does not
// say it twice.
type qpToldError struct{ error }

func (e *qpToldError) Unwrap() error { return e.error }

// qpTold marks err as telling the QP's state.
func qpTold(err error) error { return &qpToldError{err} }
