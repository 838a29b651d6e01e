// Command udppingpong is the raw-UDP baseline for `roce-emu lat -o send`
// between two processes: one datagram to an echo process and back per
// iteration, over the same Conn roce-emu uses (transport.ListenUDP: the
// computed UDP checksum of a loopback --bind, GRO, optional busy-polling),
// on one Go processor as lat runs, with no RoCE processing. It prints the
// half round trips as lat does (t_min, t_typical: the median, t_99),
// in microseconds.
//
// With -acks each side writes a second, ACK-sized datagram (the 20 bytes
// of an RoCEv2 ACK's BTH, AETH and ICRC) after each message in the same
// batch, and reads until it has both: the datagrams an RC SEND
// ping-pong puts on the wire per message (the SEND, and the ACK of the
// one received, which roce-emu sends with the reply; Options.ReplyHold).
// It is the raw floor of that exchange, where the default is the floor of
// one datagram per message.
//
//	udppingpong -bind 127.0.0.2 -port 14791 -n 20000 &      # the echo side
//	udppingpong -bind 127.0.0.1 -n 20000 127.0.0.2:14791    # the timing side
//
// Not run by CI: docs/datapath.md uses it.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/roce-emu/roce-emu/transport"
)

func main() {
	bind := flag.String("bind", "127.0.0.1", "local IP `address`")
	port := flag.Uint("port", 0, "local UDP `port` (the echo side's; 0: any)")
	n := flag.Int("n", 20000, "round trips (the echo side answers this many)")
	size := flag.Int("s", 60, "datagram `bytes`")
	busy := flag.Duration("busy-poll", 0, "spin on the socket up to this `long` before sleeping (transport.UDPOptions.BusyPoll)")
	procs := flag.Int("gomaxprocs", 1, "Go processors (lat's default is 1)")
	acks := flag.Bool("acks", false, "write an ACK-sized datagram after each message, in the same batch, and read both (an RC SEND ping-pong's datagrams)")
	flag.Parse()
	runtime.GOMAXPROCS(*procs)
	if err := run(*bind, uint16(*port), *n, *size, *busy, *acks, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "udppingpong:", err)
		os.Exit(1)
	}
}

// ackLen is the size of an RoCEv2 ACK's UDP payload: BTH, AETH, ICRC.
const ackLen = 12 + 4 + 4

func run(bind string, port uint16, n, size int, busy time.Duration, acks bool, peer string) error {
	a, err := netip.ParseAddr(bind)
	if err != nil {
		return err
	}
	if n < 2 || size < 1 || size > 9000 {
		return fmt.Errorf("-n must be at least 2 and -s within 1..9000")
	}
	c, err := transport.ListenUDP(netip.AddrPortFrom(a, port), transport.UDPOptions{ComputeUDPChecksum: a.IsLoopback(), BusyPoll: busy, EphemeralPort: port == 0})
	if err != nil {
		return err
	}
	defer c.Close()
	in := []transport.Datagram{{Data: make([]byte, 0, 9000)}, {Data: make([]byte, 0, 9000)}}
	per := 1 // datagrams per message
	if acks {
		per = 2
	}
	// read reads until per datagrams have come (one batch, or two).
	read := func() error {
		for got := 0; got < per; {
			k, err := c.ReadBatch(in[got:per])
			if err != nil {
				return err
			}
			got += k
		}
		return nil
	}
	if peer == "" {
		fmt.Println("echoing on", c.LocalAddr())
		out := make([]transport.Datagram, per)
		for range n {
			if err := read(); err != nil {
				return err
			}
			out[0] = transport.Datagram{Data: in[0].Data, Src: in[0].Dst, Dst: in[0].Src}
			if acks {
				out[1] = transport.Datagram{Data: in[0].Data[:min(ackLen, len(in[0].Data))], Src: in[0].Dst, Dst: in[0].Src}
			}
			if _, err := c.WriteBatch(out); err != nil {
				return err
			}
		}
		return nil
	}
	dst, err := netip.ParseAddrPort(peer)
	if err != nil {
		return err
	}
	out := []transport.Datagram{{Data: make([]byte, size), Src: c.LocalAddr(), Dst: dst}}
	if acks {
		out = append(out, transport.Datagram{Data: make([]byte, ackLen), Src: c.LocalAddr(), Dst: dst})
	}
	half := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if _, err := c.WriteBatch(out); err != nil {
			return err
		}
		if err := read(); err != nil {
			return err
		}
		half = append(half, time.Since(t)/2)
	}
	slices.Sort(half)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("half round trip, us: t_min %.2f t_typical %.2f t_99 %.2f (%d round trips of %d bytes, %d datagrams each way)\n",
		us(half[0]), us(half[len(half)/2]), us(half[len(half)*99/100]), n, size, per)
	return nil
}
