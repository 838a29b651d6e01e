// Package gencap writes a synthetic RoCEv2 capture with a known truth, for
// the analyzer's tests and its benchmark script (scripts/bench-analyze.sh):
// RC connections carrying RDMA WRITEs, each ACKed, a share of the data
// packets CE-marked with a CNP each, and a go-back-N episode (a PSN
// sequence NAK and the resend from the NAKed PSN) every so many messages.
package gencap

import (
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
)

// Config shapes the capture. The zero value of a field takes the default.
type Config struct {
	Conns    int           // RC connections; 4
	Messages int           // WRITEs per connection; 1000
	Size     int           // bytes per WRITE; 65536
	MTU      int           // path MTU; 1024
	CEEvery  int           // every CEEvery-th data packet is CE-marked and draws a CNP; 100 (1%)
	GBNEvery int           // every GBNEvery-th message of a connection loses a packet; 50
	Gap      time.Duration // between frames; 100 ns
}

func (c *Config) defaults() {
	if c.Conns <= 0 {
		c.Conns = 4
	}
	if c.Messages <= 0 {
		c.Messages = 1000
	}
	if c.Size <= 0 {
		c.Size = 65536
	}
	if c.MTU <= 0 {
		c.MTU = 1024
	}
	if c.CEEvery <= 0 {
		c.CEEvery = 100
	}
	if c.GBNEvery <= 0 {
		c.GBNEvery = 50
	}
	if c.Gap <= 0 {
		c.Gap = 100 * time.Nanosecond
	}
}

// Episode is one go-back-N episode the generator made.
type Episode struct {
	Conn             int
	NAKFrame         int
	FirstResendFrame int
	FromPSN          uint32
	PacketsResent    int
	BytesResent      uint64
}

// Truth is what the capture holds.
type Truth struct {
	Frames   int
	Episodes []Episode
	CE       []int // CE-marked data packets per connection
	CNPs     []int // CNPs per connection
	Messages int   // per connection
}

// Endpoints returns connection i's requester and responder as the
// analyzer names them ("IP/0xQPN").
func Endpoints(i int) (requester, responder string) {
	return fmt.Sprintf("10.0.0.1/%#06x", reqQPN(i)), fmt.Sprintf("10.0.1.%d/%#06x", i+1, respQPN(i))
}

func reqQPN(i int) uint32  { return 0x100 + uint32(i) }
func respQPN(i int) uint32 { return 0x200 + uint32(i) }

// Generate writes the capture to out.
func Generate(out io.Writer, cfg Config) (*Truth, error) {
	cfg.defaults()
	w, err := pcap.NewWriter(out)
	if err != nil {
		return nil, err
	}
	tr := &Truth{CE: make([]int, cfg.Conns), CNPs: make([]int, cfg.Conns), Messages: cfg.Messages}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	type conn struct {
		fwd, back bth.Encap
		psn       bth.PSN
		msn       uint32
		data      int
	}
	conns := make([]*conn, cfg.Conns)
	for i := range conns {
		a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr(fmt.Sprintf("10.0.1.%d", i+1))
		conns[i] = &conn{
			fwd:  bth.Encap{Src: a, Dst: b, SrcPort: 49152 + uint16(i), TrafficClass: bth.TrafficClass(26, bth.ECT0)},
			back: bth.Encap{Src: b, Dst: a, SrcPort: 49152 + uint16(i), TrafficClass: bth.TrafficClass(26, bth.ECT0)},
			psn:  bth.PSN(0xFFF000 + 0x10*i), // every connection crosses the PSN wrap
		}
	}
	payload := make([]byte, cfg.MTU)
	npkts := (cfg.Size + cfg.MTU - 1) / cfg.MTU
	var p bth.Packet
	write := func(e *bth.Encap, ecn bth.ECN) error {
		now = now.Add(cfg.Gap)
		tr.Frames++
		e.TrafficClass = bth.TrafficClass(26, ecn)
		return w.WritePacket(now, e, &p)
	}
	// data sends packet k of message m of connection c at PSN psn.
	data := func(ci int, c *conn, k int, psn bth.PSN, ce bool) error {
		n := min(cfg.MTU, cfg.Size-k*cfg.MTU)
		var op bth.Opcode
		switch {
		case npkts == 1:
			op = bth.RCWriteOnly
		case k == 0:
			op = bth.RCWriteFirst
		case k == npkts-1:
			op = bth.RCWriteLast
		default:
			op = bth.RCWriteMiddle
		}
		p = bth.Packet{BTH: bth.BTH{Opcode: op, PKey: bth.DefaultPKey, DestQP: respQPN(ci), PSN: psn, AckReq: k == npkts-1},
			RETH: bth.RETH{VA: 0x10000, RKey: 0x1234, DMALength: uint32(cfg.Size)}, Payload: payload[:n]}
		ecn := bth.ECT0
		if ce {
			ecn = bth.CE
		}
		if err := write(&c.fwd, ecn); err != nil {
			return err
		}
		if ce {
			tr.CE[ci]++
			tr.CNPs[ci]++
			p = bth.Packet{BTH: bth.BTH{Opcode: bth.CNP, PKey: bth.DefaultPKey, DestQP: reqQPN(ci), BECN: true}}
			return write(&c.back, bth.ECT0)
		}
		return nil
	}
	for m := range cfg.Messages {
		for ci, c := range conns {
			first := c.psn
			lose := m%cfg.GBNEvery == cfg.GBNEvery-1
			lost := npkts / 3
			for k := range npkts {
				c.data++
				if err := data(ci, c, k, first.Add(k), c.data%cfg.CEEvery == 0); err != nil {
					return nil, err
				}
			}
			if lose {
				// The responder missed packet `lost` (after the capture
				// point): it NAKs that PSN, the requester goes back.
				p = bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: reqQPN(ci), PSN: first.Add(lost)},
					AETH: bth.AETH{Syndrome: bth.NAKSyndrome(bth.NAKPSNSequenceError), MSN: c.msn}}
				if err := write(&c.back, bth.ECT0); err != nil {
					return nil, err
				}
				e := Episode{Conn: ci, NAKFrame: tr.Frames, FirstResendFrame: tr.Frames + 1, FromPSN: uint32(first.Add(lost))}
				for k := lost; k < npkts; k++ {
					e.PacketsResent++
					e.BytesResent += uint64(min(cfg.MTU, cfg.Size-k*cfg.MTU))
					if err := data(ci, c, k, first.Add(k), false); err != nil {
						return nil, err
					}
				}
				tr.Episodes = append(tr.Episodes, e)
			}
			c.msn++
			c.psn = first.Add(npkts)
			p = bth.Packet{BTH: bth.BTH{Opcode: bth.RCAcknowledge, PKey: bth.DefaultPKey, DestQP: reqQPN(ci), PSN: c.psn.Add(-1)},
				AETH: bth.AETH{Syndrome: bth.SyndromeACKNoCredits, MSN: c.msn}}
			if err := write(&c.back, bth.ECT0); err != nil {
				return nil, err
			}
		}
	}
	return tr, w.Flush()
}
