package conform

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/transport"
)

// Frame is one packet of a case, sent or received, as numbered in the
// case's capture (from 1, in the order the Driver sent or received them).
type Frame struct {
	N   int       // frame number in the case's capture
	Out bool      // sent by the prober
	At  time.Time // when it was sent or arrived
	Pkt bth.Packet
}

func (f *Frame) String() string {
	dir := "peer"
	if f.Out {
		dir = "prober"
	}
	s := fmt.Sprintf("#%d %s %s PSN %d", f.N, dir, opName(f.Pkt.BTH.Opcode), f.Pkt.BTH.PSN)
	if info := f.Pkt.BTH.Opcode.Info(); info != nil && info.Ext&bth.ExtAETH != 0 {
		s += " " + f.Pkt.AETH.Syndrome.KindName()
	}
	return s
}

// maxQueued bounds the peer packets a Driver holds unread; more are
// dropped and counted (Driver.Overflow), so a peer that floods costs no
// more memory than this.
const maxQueued = 4096

// Driver is the prober's side of one case: a packet-level RC end that is
// not a QP. It sends whatever bth.Packet a case crafts (with a correct
// ICRC for the headers it travels in), and hands the case the peer's
// packets addressed to its QPN, one at a time, with deadlines. It keeps no
// protocol state beyond the PSNs it is told: what to withhold, repeat,
// delay or forge is the case's choice.
//
// Time is the time package's: under testing/synctest, waits are simulated
// and cost nothing. A Driver is used by one case goroutine; the Runner's
// reader feeds it concurrently.
type Driver struct {
	conn transport.Conn
	enc  bth.Encap

	// QPN is the prober's QP number, as announced in the exchange; the
	// peer's packets to it come to this Driver.
	QPN uint32
	// PeerQPN is the peer's QP number, from the exchange.
	PeerQPN uint32
	// PSN is the PSN of the next request the prober sends; Request
	// advances it. It starts at the PSN announced in the exchange.
	PSN bth.PSN
	// PeerPSN is the PSN the peer announced it starts sending with.
	PeerPSN bth.PSN
	// MTU is the path MTU in bytes (perftest's exchange agrees it; for
	// rc_pingpong it is Target.PingpongMTU).
	MTU int
	// RKey, VA are the peer's memory region from perftest's exchange (0
	// for rc_pingpong).
	RKey uint32
	VA   uint64
	// PeerOutReads is the peer's out_reads from perftest's exchange: the
	// READ and atomic requests its responder takes at once (perftest sets
	// its max_dest_rd_atomic to it; 0 for rc_pingpong, which does not
	// say).
	PeerOutReads int

	mu       sync.Mutex
	capture  *pcap.Writer
	frames   []*Frame
	in       chan *Frame
	overflow uint64
	buf      []byte
}

func newDriver(conn transport.Conn, qpn uint32, psn bth.PSN, w *pcap.Writer) *Driver {
	return &Driver{conn: conn, QPN: qpn, PSN: psn, capture: w, in: make(chan *Frame, maxQueued)}
}

// connect sets the headers the prober's packets travel in.
func (d *Driver) connect(peer netip.AddrPort, peerQPN uint32) {
	d.PeerQPN = peerQPN
	local := d.conn.LocalAddr().Addr()
	src, dst := local, peer.Addr()
	if local.Unmap().Is4() {
		src, dst = local.Unmap(), dst.Unmap()
	}
	port := peer.Port()
	if port == 0 {
		port = bth.UDPPort
	}
	d.enc = bth.Encap{Src: src, Dst: dst, DstPort: port, HopLimit: 64,
		SrcPort: d.conn.SourcePort(bth.SourcePort(0, d.QPN, peerQPN))}
}

// arrive is the Runner's reader handing over a peer packet for this
// Driver's QPN; data is only borrowed.
func (d *Driver) arrive(now time.Time, dg *transport.Datagram, p *bth.Packet) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.in) == cap(d.in) {
		d.overflow++
		return
	}
	f := &Frame{N: len(d.frames) + 1, At: now, Pkt: *p}
	f.Pkt.Payload = append([]byte(nil), p.Payload...)
	d.frames = append(d.frames, f)
	if d.capture != nil {
		enc := bth.Encap{Src: dg.Src.Addr(), Dst: dg.Dst.Addr(), SrcPort: dg.Src.Port(), DstPort: dg.Dst.Port(), TrafficClass: dg.TOS, HopLimit: dg.TTL}
		d.capture.WriteDatagram(now, &enc, dg.Data)
	}
	d.in <- f
}

// Overflow returns how many peer packets were dropped because the case
// did not read them (more than 4096 unread).
func (d *Driver) Overflow() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.overflow
}

// Send sends p to the peer's QP as it is, but for DestQP (the peer's QPN)
// and PKey (0xFFFF when 0); PadCnt and the ICRC are computed. It returns
// the frame sent. Sending a packet whose fields do not fit the wire is an
// error.
func (d *Driver) Send(p *bth.Packet) (*Frame, error) {
	fs, err := d.SendBatch([]*bth.Packet{p})
	if err != nil {
		return nil, err
	}
	return fs[0], nil
}

// SendBatch sends ps in one write, in order (a burst), as Send does.
func (d *Driver) SendBatch(ps []*bth.Packet) ([]*Frame, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	d.buf = d.buf[:0]
	ends := make([]int, len(ps))
	for i, p := range ps {
		p.BTH.DestQP = d.PeerQPN
		if p.BTH.PKey == 0 {
			p.BTH.PKey = 0xFFFF
		}
		var err error
		if d.buf, err = p.Append(d.buf, &d.enc); err != nil {
			return nil, fmt.Errorf("cannot encode %s PSN %d: %w", opName(p.BTH.Opcode), p.BTH.PSN, err)
		}
		ends[i] = len(d.buf)
	}
	ds := make([]transport.Datagram, len(ps))
	frames := make([]*Frame, len(ps))
	start := 0
	for i, p := range ps {
		data := d.buf[start:ends[i]:ends[i]]
		start = ends[i]
		ds[i] = transport.Datagram{Data: data, Src: netip.AddrPortFrom(d.enc.Src, d.enc.SrcPort),
			Dst: netip.AddrPortFrom(d.enc.Dst, d.enc.DstPort), TTL: d.enc.HopLimit}
		f := &Frame{N: len(d.frames) + 1, Out: true, At: now, Pkt: *p}
		f.Pkt.Payload = append([]byte(nil), p.Payload...)
		d.frames = append(d.frames, f)
		frames[i] = f
		if d.capture != nil {
			d.capture.WriteDatagram(now, &d.enc, data)
		}
	}
	if _, err := d.conn.WriteBatch(ds); err != nil {
		return frames, fmt.Errorf("send: %w", err)
	}
	return frames, nil
}

// Request builds a request packet of opcode op at the Driver's PSN with
// AckReq set and the payload given, and advances PSN by one. Set its RETH
// or other fields before sending it.
func (d *Driver) Request(op bth.Opcode, payload []byte) *bth.Packet {
	p := &bth.Packet{BTH: bth.BTH{Opcode: op, PSN: d.PSN, AckReq: true}, Payload: payload}
	d.PSN = d.PSN.Next()
	return p
}

// Write builds an RDMA WRITE Only of payload to the peer's region at
// offset off (its R_Key and VA from the exchange), at the next PSN.
func (d *Driver) Write(off uint64, payload []byte) *bth.Packet {
	p := d.Request(bth.RCWriteOnly, payload)
	p.RETH = bth.RETH{VA: d.VA + off, RKey: d.RKey, DMALength: uint32(len(payload))}
	return p
}

// Ack builds an ACK (credits field 0x1F, "no credit count") for the
// peer's request at psn with MSN msn.
func (d *Driver) Ack(psn bth.PSN, msn uint32) *bth.Packet {
	return &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PSN: psn}, AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: msn}}
}

// NAK builds an acknowledge packet with syndrome s for the peer's request
// at psn.
func (d *Driver) NAK(psn bth.PSN, s bth.Syndrome, msn uint32) *bth.Packet {
	return &bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PSN: psn}, AETH: bth.AETH{Syndrome: s, MSN: msn}}
}

// errTimeout is Next's error when nothing came in time.
var errTimeout = errors.New("nothing from the peer in time")

// Next returns the peer's next packet, waiting at most wait.
func (d *Driver) Next(wait time.Duration) (*Frame, error) {
	select {
	case f := <-d.in:
		return f, nil
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case f := <-d.in:
		return f, nil
	case <-t.C:
		return nil, fmt.Errorf("%w (%v)", errTimeout, wait)
	}
}

// Until returns the peer's packets up to and including the first that
// match accepts, waiting at most wait in all; the last is nil when none
// matched in time.
func (d *Driver) Until(wait time.Duration, match func(*Frame) bool) (seen []*Frame, last *Frame) {
	end := time.Now().Add(wait)
	for {
		left := time.Until(end)
		if left < 0 {
			left = 0
		}
		f, err := d.Next(left)
		if err != nil {
			return seen, nil
		}
		seen = append(seen, f)
		if match(f) {
			return seen, f
		}
	}
}

// Collect returns every peer packet that arrives within wait.
func (d *Driver) Collect(wait time.Duration) []*Frame {
	seen, _ := d.Until(wait, func(*Frame) bool { return false })
	return seen
}

// Frames returns every frame of the case so far, sent and received.
func (d *Driver) Frames() []*Frame {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Frame(nil), d.frames...)
}

// opName names an opcode as Linux's ib_pack.h does, or in hex.
func opName(op bth.Opcode) string { return op.String() }
