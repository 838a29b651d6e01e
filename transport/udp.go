package transport

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// UDPOptions configure a UDP Conn (ListenUDP). On Linux every option
// applies; the portable Conn of other systems sets TOS, TTL and
// SocketBuffer on its sockets and ignores BatchSize, ComputeUDPChecksum,
// NoGSO, NoGRO and BusyPoll (see its BUG note).
type UDPOptions struct {
	// TOS is the IPv4 TOS / IPv6 traffic class set on the sockets
	// (DSCP<<2 | ECN). On Linux every datagram sent carries its own
	// Datagram.TOS in a control message, so this matters only to what the
	// kernel sends by itself; elsewhere every datagram carries this TOS.
	TOS uint8
	// TTL is the default IPv4 TTL / IPv6 hop limit (0: 64).
	TTL uint8
	// BatchSize is the most datagrams read per system call (default 64).
	BatchSize int
	// SocketBuffer is SO_RCVBUF and SO_SNDBUF in bytes (default 4 MiB;
	// the kernel caps it at net.core.rmem_max / wmem_max).
	SocketBuffer int
	// EphemeralPort makes port 0 mean "any free port" instead of 4791.
	EphemeralPort bool
	// ComputeUDPChecksum makes the kernel compute the UDP checksum of
	// the datagrams sent. By default (false) they leave with UDP checksum
	// 0, over IPv4 (SO_NO_CHECK) and IPv6 (UDP_NO_CHECK6_TX) alike, as rxe
	// sends RoCEv2 (rxe_net.c writes checksum 0; seen on the wire in
	// ../shared/testdata/cases/interop) and as RFC 6935 and 6936 allow for
	// tunnel protocols over IPv6: the ICRC protects the packet. Receiving
	// never depends on it: every socket accepts checksum 0 over IPv6
	// (UDP_NO_CHECK6_RX), which a stock Linux UDP/IPv6 socket drops and
	// counts in Udp6InErrors.
	ComputeUDPChecksum bool
	// NoGSO turns off UDP generic segmentation offload on send (Linux
	// 4.18+, UDP_SEGMENT; quic-go's and wireguard-go's Linux conns are the
	// models). With it on, WriteBatch sends a run of consecutive datagrams
	// to one destination with one TOS and TTL and one size (the last may
	// be shorter), at most 64 datagrams and 65507 bytes, as one message
	// the kernel cuts into those datagrams. It needs ComputeUDPChecksum:
	// the kernel refuses UDP_SEGMENT on a socket that sends checksum 0
	// (EINVAL), so with checksum 0 (the default) GSO stays off. Over IPv4
	// only datagrams to a loopback address are segmented: on a real link
	// the segments get IP IDs 0, 1, 2, ... (net/ipv4/af_inet.c,
	// inet_gso_segment), which the ICRC covers, so rxe would drop all but
	// the first; IPv6 has no IP ID. Where the kernel refuses a segmented
	// send anyway (EIO without checksum offload on the route) the Conn
	// sends those datagrams one by one and turns GSO off for good;
	// Offloads tells. docs/sockets.md has the measurements.
	NoGSO bool
	// NoGRO turns off UDP generic receive offload (Linux 5.0+, UDP_GRO).
	// With it on, the kernel may hand the receive socket datagrams of one
	// source coalesced, up to 64 KiB (on loopback: every segmented send);
	// ReadBatch splits them again by the segment size the kernel reports.
	// Reads then land in BatchSize buffers of 64 KiB owned by the Conn
	// and are copied into the callers' buffers.
	NoGRO bool
	// BusyPoll, when positive, makes ReadBatch spin on a non-blocking
	// recvmmsg (yielding the processor between tries) for up to this long
	// before it waits on the runtime's network poller: a datagram that
	// arrives meanwhile is read without a wake-up, which saves
	// microseconds per round trip at the price of a busy CPU (as Linux's
	// SO_BUSY_POLL and net.core.busy_read, in µs, for which 50 is the
	// suggested value). Zero (the default) always waits. Close waits for
	// a spin in progress to end. Endpoint Options.BusyPoll sets it too.
	BusyPoll time.Duration
}

// UDPOffloads says which kernel offloads a UDP Conn uses (Offloads).
type UDPOffloads struct {
	// GSO and GRO say the offload is on; GSOOff and GROOff say why not
	// (the option, the checksum, the kernel's refusal).
	GSO, GRO       bool
	GSOOff, GROOff string
	// GSOSends counts the messages sent with UDP_SEGMENT, GSOSegments
	// the datagrams they carried.
	GSOSends, GSOSegments uint64
	// GROReads counts the coalesced datagrams received, GROSegments the
	// datagrams split from them.
	GROReads, GROSegments uint64
}

// Offloads reports the kernel offloads of the UDP Conn c, or of the UDP
// Conn that c wraps (WithFaults, WithObserver); ok is false when there is
// none, or it is the portable Conn, which has no offloads.
func Offloads(c Conn) (o UDPOffloads, ok bool) {
	u, ok := innermost(c).(interface{ Offloads() UDPOffloads })
	if !ok {
		return UDPOffloads{}, false
	}
	return u.Offloads(), true
}

// listenAddr applies the defaults of ListenUDP to addr and opts, and
// refuses a link-local address without a zone.
func listenAddr(addr netip.AddrPort, opts *UDPOptions) (netip.AddrPort, error) {
	if addr.Port() == 0 && !opts.EphemeralPort {
		addr = netip.AddrPortFrom(addr.Addr(), bth.UDPPort)
	}
	if a := addr.Addr(); a.Is6() && a.IsLinkLocalUnicast() && a.Zone() == "" {
		return addr, fmt.Errorf("transport: link-local address %s needs a zone, as in %s%%eth0", a, a)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 64
	}
	if opts.SocketBuffer <= 0 {
		opts.SocketBuffer = 4 << 20
	}
	if opts.TTL == 0 {
		opts.TTL = 64
	}
	return addr, nil
}

// withZone gives a link-local destination without a zone the zone of the
// local address: GIDs carry none, and the kernel needs one to pick the
// interface (fe80::2 reached through fe80::1%tap0 goes out of tap0).
func withZone(local netip.Addr, dst netip.AddrPort) netip.AddrPort {
	if a := dst.Addr(); a.Zone() == "" && a.Is6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) {
		return netip.AddrPortFrom(a.WithZone(local.Zone()), dst.Port())
	}
	return dst
}
