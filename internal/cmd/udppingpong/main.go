// Command udppingpong is the raw-UDP baseline for `roce-emu lat -o send`
// between two processes: one datagram to an echo process and back per
// iteration, over the same Conn roce-emu uses (transport.ListenUDP: the
// computed UDP checksum of a loopback --bind, GRO, optional busy-polling),
// on one Go processor as lat runs, with no RoCE processing. It prints the
// half round trips as lat does (t_min, t_typical: the median, t_99),
// in microseconds.
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
	flag.Parse()
	runtime.GOMAXPROCS(*procs)
	if err := run(*bind, uint16(*port), *n, *size, *busy, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "udppingpong:", err)
		os.Exit(1)
	}
}

func run(bind string, port uint16, n, size int, busy time.Duration, peer string) error {
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
	in := []transport.Datagram{{Data: make([]byte, 0, 9000)}}
	if peer == "" {
		fmt.Println("echoing on", c.LocalAddr())
		for range n {
			if _, err := c.ReadBatch(in); err != nil {
				return err
			}
			in[0].Src, in[0].Dst = in[0].Dst, in[0].Src
			if _, err := c.WriteBatch(in); err != nil {
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
	half := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if _, err := c.WriteBatch(out); err != nil {
			return err
		}
		if k, err := c.ReadBatch(in); err != nil || k != 1 {
			return fmt.Errorf("read %d datagrams: %v", k, err)
		}
		half = append(half, time.Since(t)/2)
	}
	slices.Sort(half)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("half round trip, us: t_min %.2f t_typical %.2f t_99 %.2f (%d round trips of %d bytes)\n",
		us(half[0]), us(half[len(half)/2]), us(half[len(half)*99/100]), n, size)
	return nil
}
