package oob_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
)

// rc_pingpong's address message for a QP on an IPv4 address: the GID is
// IPv4-mapped.
func ExampleDest_AppendPingpong() {
	d := oob.Dest{QPN: 0x11, PSN: 0xd080f3, GID: netip.MustParseAddr("192.0.2.2")}
	b, _ := d.AppendPingpong(nil)
	fmt.Printf("%q\n", b)
	back, _ := oob.ParsePingpong(b)
	fmt.Println(back)
	// Output:
	// "0000:000011:d080f3:00000000000000000000ffffc0000202\x00"
	// LID 0x0000, QPN 0x000011, PSN 0xd080f3, GID ::ffff:192.0.2.2
}

// Both sides of rc_pingpong's exchange over an in-memory connection; on a
// network the client dials TCP port oob.PingpongPort and the server
// accepts there. Over IPv6 the GID is the address itself.
func ExamplePingpongClient() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go oob.PingpongServer(ctx, s, oob.Dest{QPN: 0x12, PSN: 0x222222, GID: netip.MustParseAddr("fd00::2")},
		func(client oob.Dest) error {
			// Move the server's QP to RTR and RTS towards client here.
			return nil
		})
	server, err := oob.PingpongClient(ctx, c, oob.Dest{QPN: 0x11, PSN: 0x111111, GID: netip.MustParseAddr("fd00::1")},
		func(server oob.Dest) error {
			// Move the client's QP to RTR and RTS towards server here.
			return nil
		})
	fmt.Println(server, err)
	// Output:
	// LID 0x0000, QPN 0x000012, PSN 0x222222, GID fd00::2 <nil>
}

// A perftest key string as ib_write_bw on rxe sends it.
func ExampleParsePerftestKey() {
	k, err := oob.ParsePerftestKey([]byte("0000:0001:000011:5df3ee:000002d1:0000562bb641e000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:00:02:02:00000000:\x00"))
	fmt.Printf("QPN %#x PSN %#x R_Key %#x VA %#x GID %s out_reads %d, %v\n", k.QPN, uint32(k.PSN), k.RKey, k.VA, k.GID, k.OutReads, err)
	// Output:
	// QPN 0x11 PSN 0x5df3ee R_Key 0x2d1 VA 0x562bb641e000 GID 192.0.2.2 out_reads 1, <nil>
}

// The exchange of an ib_write_bw run, both sides as roce-emu speaks it
// with perftest: versions, system data, MTU, keys, barriers, the client's
// results, done.
func ExamplePerftest() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()

	side := func(p *oob.Perftest, mtu qp.MTU, key oob.PerftestKey, rep oob.BWReport) (string, error) {
		if _, err := p.Versions(ctx); err != nil {
			return "", err
		}
		sys, err := p.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine})
		if err != nil {
			return "", err
		}
		if mtu, err = p.MTU(ctx, mtu); err != nil {
			return "", err
		}
		peers, err := p.Keys(ctx, []oob.PerftestKey{key})
		if err != nil {
			return "", err
		}
		// Connect the QP towards peers[0] here, then:
		for _, b := range []string{"connected", "addresses printed", "traffic done"} {
			if err := p.Barrier(ctx, b); err != nil {
				return "", err
			}
		}
		peerRep, err := p.BWReports(ctx, rep)
		if err != nil {
			return "", err
		}
		if err := p.Done(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("MTU %d, cycle buffer %d, peer QPN %#x at VA %#x, peer's results %d x %d bytes, %.2f Gb/s",
			mtu.Bytes(), sys.CycleBuffer, peers[0].QPN, peers[0].VA, peerRep.Iters, peerRep.Size, peerRep.AvgBW), nil
	}
	out := make(chan string)
	go func() {
		r, err := side(oob.NewPerftestServer(s), qp.IBV_MTU_4096,
			oob.PerftestKey{OutReads: 1, QPN: 0x12, PSN: 2, RKey: 0x200, VA: 0x2000, GID: netip.MustParseAddr("192.0.2.2")}, oob.BWReport{})
		out <- fmt.Sprintln("server:", r, err)
	}()
	r, err := side(oob.NewPerftestClient(c), qp.IBV_MTU_1024,
		oob.PerftestKey{OutReads: 1, QPN: 0x11, PSN: 1, RKey: 0x100, VA: 0x1000, GID: netip.MustParseAddr("192.0.2.1")},
		oob.BWReport{Size: 65536, Iters: 1000, PeakBW: 9.9, AvgBW: 9.5, MsgRate: 0.018})
	fmt.Println("client:", r, err)
	fmt.Print(<-out)
	// Output:
	// client: MTU 1024, cycle buffer 4096, peer QPN 0x12 at VA 0x2000, peer's results 0 x 0 bytes, 0.00 Gb/s <nil>
	// server: MTU 1024, cycle buffer 4096, peer QPN 0x11 at VA 0x1000, peer's results 1000 x 65536 bytes, 9.50 Gb/s <nil>
}
