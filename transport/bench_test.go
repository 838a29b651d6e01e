//go:build linux

package transport

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/qp"
)

// offloadVariants are the UDP Conns the datapath benchmarks run on: the
// kernel's UDP GSO and GRO off, and on. Both compute the UDP checksum
// (GSO needs it; on loopback it is never computed), so that only the
// offloads differ.
var offloadVariants = []struct {
	name string
	opts UDPOptions
}{
	{"offload=off", UDPOptions{ComputeUDPChecksum: true, NoGSO: true, NoGRO: true}},
	{"offload=on", UDPOptions{ComputeUDPChecksum: true}},
}

// udpPairOpts is udpPair with opts (and udpPair's TOS).
func udpPairOpts(b *testing.B, opts UDPOptions) [2]Conn {
	var conns [2]Conn
	opts.TOS, opts.EphemeralPort = bth.TrafficClass(26, bth.ECT0), true
	for i, a := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(a), 0), opts)
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	return conns
}

// reportOffloads reports how many datagrams each UDP_SEGMENT send carried
// from c, and each coalesced datagram received at c held.
func reportOffloads(b *testing.B, send, recv Conn) {
	if o, ok := Offloads(send); ok && o.GSOSends > 0 {
		b.ReportMetric(float64(o.GSOSegments)/float64(o.GSOSends), "segs/gso-send")
	}
	if o, ok := Offloads(recv); ok && o.GROReads > 0 {
		b.ReportMetric(float64(o.GROSegments)/float64(o.GROReads), "segs/gro-read")
	}
}

// BenchmarkWriteBW measures RDMA WRITE bandwidth of 64 KiB messages between
// two Endpoints over UDP on loopback, 32 WRITEs outstanding, with the
// kernel's UDP offloads off and on (offloadVariants). One op is one
// completed WRITE; Gb/s counts message bytes, Gb/s-cpu the same bytes per
// second of the process's CPU time (both ends, user and system), which a
// loaded machine's other processes do not change: compare it with
// BenchmarkRawUDP's.
func BenchmarkWriteBW(b *testing.B) {
	for _, mtu := range []qp.MTU{qp.IBV_MTU_1024, qp.IBV_MTU_4096} {
		for _, v := range offloadVariants {
			b.Run(fmt.Sprintf("64KiB/mtu%d/%s", mtu.Bytes(), v.name), func(b *testing.B) {
				benchWriteBW(b, mtu, udpPairOpts(b, v.opts))
			})
		}
	}
}

// BenchmarkWriteBWWindow is BenchmarkWriteBW with the offloads on and
// the requester's window (qp.InitAttr.MaxUnackedPSNs) at rxe's 128 and
// above: at MTU 1024, 128 PSNs are two 64 KiB messages in flight.
func BenchmarkWriteBWWindow(b *testing.B) {
	for _, mtu := range []qp.MTU{qp.IBV_MTU_1024, qp.IBV_MTU_4096} {
		for _, w := range []int{128, 512, 2048} {
			b.Run(fmt.Sprintf("64KiB/mtu%d/window=%d", mtu.Bytes(), w), func(b *testing.B) {
				benchWriteBWWindow(b, mtu, w, udpPairOpts(b, UDPOptions{ComputeUDPChecksum: true}))
			})
		}
	}
}

func benchWriteBW(b *testing.B, mtu qp.MTU, conns [2]Conn) {
	benchWriteBWWindow(b, mtu, 0, conns)
}

func benchWriteBWWindow(b *testing.B, mtu qp.MTU, window int, conns [2]Conn) {
	cfg := defaultPair()
	cfg.mtu, cfg.window = mtu, window
	s := connect(b, conns, cfg)
	const size, depth = 64 << 10, 32
	src := make([]byte, size*depth)
	dst := make([]byte, size*depth)
	smr, _ := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
	dmr, _ := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
	// One SGE list per slot, made once: a slice literal per post would be
	// the benchmark's own allocation, not the datapath's.
	sges := make([][]qp.SGE, depth)
	for i := range sges {
		sges[i] = []qp.SGE{smr.SGE(i*size, size)}
	}
	wc := make([]qp.WC, 64)
	ctx := context.Background()
	b.SetBytes(size)
	b.ReportAllocs()
	start, cpu0 := time.Now(), cpuTime(b)
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < depth {
			off := (posted % depth) * size
			if err := s[0].qp.PostSend(qp.SendWR{WRID: uint64(posted), Opcode: qp.IBV_WR_RDMA_WRITE,
				SGEs: sges[posted%depth], RemoteAddr: dmr.VA + uint64(off), RKey: dmr.RKey}); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		n, err := s[0].cq.Wait(ctx, wc)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != qp.IBV_WC_SUCCESS {
				b.Fatal(c.Status)
			}
		}
		done += n
	}
	b.ReportMetric(float64(size)*float64(b.N)*8/time.Since(start).Seconds()/1e9, "Gb/s")
	b.ReportMetric(float64(size)*float64(b.N)*8/(cpuTime(b)-cpu0).Seconds()/1e9, "Gb/s-cpu")
	c := s[0].qp.Counters()
	b.ReportMetric(float64(c.RetransmittedPkts)/float64(b.N), "retrans/op")
	reportOffloads(b, conns[0], conns[1])
}

// BenchmarkSendLatency measures SEND ping-pong over UDP on loopback: one op
// is a round trip of 8-byte SENDs; us/half-rtt is what ib_send_lat reports.
// It runs with Options.BusyPoll off and at 50 us, and once with
// Options.ReplyHold off (each ACK written as its SEND is handled);
// BenchmarkRawUDPPingPong is its baseline. The Conns compute the UDP
// checksum, as roce-emu's commands do on a loopback --bind, so that UDP
// GSO is on.
//
//	go test ./transport -run '^$' -bench 'SendLatency|RawUDPPingPong'
func BenchmarkSendLatency(b *testing.B) {
	for _, bp := range busyPolls {
		b.Run(bp.name, func(b *testing.B) { benchSendLatency(b, Options{BusyPoll: bp.d}) })
	}
	b.Run("reply-hold=off", func(b *testing.B) { benchSendLatency(b, Options{ReplyHold: -1}) })
}

// busyPolls are the busy-poll settings the latency benchmarks run with.
var busyPolls = []struct {
	name string
	d    time.Duration
}{{"busy-poll=off", 0}, {"busy-poll=50us", 50 * time.Microsecond}}

func benchSendLatency(b *testing.B, opts Options) {
	s := connectOpts(b, udpPairOpts(b, UDPOptions{ComputeUDPChecksum: true}), defaultPair(), opts)
	a, z := s[0], s[1]
	buf := [2][]byte{make([]byte, 8), make([]byte, 8)}
	var mr [2]*qp.MR
	for i, sd := range s {
		mr[i], _ = sd.pd.RegMR(buf[i], qp.IBV_ACCESS_LOCAL_WRITE)
	}
	// One SGE list per side, made once: a slice literal per post would
	// be the benchmark's own allocation, not the datapath's.
	sges := [2][]qp.SGE{{mr[0].SGE(0, 8)}, {mr[1].SGE(0, 8)}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, sd := range s {
		for range 64 {
			sd.qp.PostRecv(qp.RecvWR{SGEs: sges[i]})
		}
	}
	// The echo side: every receive is answered with a SEND.
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		wc := make([]qp.WC, 16)
		for {
			n, err := z.cq.Wait(ctx, wc)
			if err != nil {
				return
			}
			for _, c := range wc[:n] {
				if c.Opcode == qp.IBV_WC_RECV {
					z.qp.PostRecv(qp.RecvWR{SGEs: sges[1]})
					z.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sges[1]})
				}
			}
		}
	}()
	wc := make([]qp.WC, 16)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if err := a.qp.PostSend(qp.SendWR{Opcode: qp.IBV_WR_SEND, SGEs: sges[0]}); err != nil {
			b.Fatal(err)
		}
		got := false
		for !got {
			n, err := a.cq.Wait(ctx, wc)
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range wc[:n] {
				if c.Status != qp.IBV_WC_SUCCESS {
					b.Fatal(c.Status)
				}
				if c.Opcode == qp.IBV_WC_RECV {
					got = true
					a.qp.PostRecv(qp.RecvWR{SGEs: sges[0]})
				}
			}
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/2000, "us/half-rtt")
	cancel()
	z.ep.Close()
	<-echoDone
}

// BenchmarkRawUDP is the baseline for BenchmarkWriteBW: the same Conn
// with the same offloads (offloadVariants), datagrams of the size an RDMA
// WRITE packet has at each MTU (BTH, RETH on some, payload, ICRC: MTU+32
// bytes), the same batching and a window of 128 datagrams in flight (the
// RC window), but no RoCE processing. One op is 64 KiB of payload.
func BenchmarkRawUDP(b *testing.B) {
	for _, mtu := range []int{1024, 4096} {
		for _, v := range offloadVariants {
			b.Run(fmt.Sprintf("64KiB/mtu%d/%s", mtu, v.name), func(b *testing.B) {
				benchRawUDP(b, mtu, udpPairOpts(b, v.opts))
			})
		}
	}
}

func benchRawUDP(b *testing.B, mtu int, conns [2]Conn) {
	defer conns[0].Close()
	defer conns[1].Close()
	dgram := mtu + bth.BTHLen + bth.RETHLen + bth.ICRCLen
	perOp := (64 << 10) / mtu
	var received atomic.Int64
	progress := make(chan struct{}, 1)
	stop := make(chan struct{})
	go func() {
		ds := make([]Datagram, 64)
		for i := range ds {
			ds[i].Data = make([]byte, 0, 16<<10)
		}
		for {
			n, err := conns[1].ReadBatch(ds)
			if err != nil {
				close(stop)
				return
			}
			received.Add(int64(n))
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}()
	batch := make([]Datagram, 32)
	payload := make([]byte, dgram)
	for i := range batch {
		batch[i] = Datagram{Data: payload, Src: conns[0].LocalAddr(), Dst: conns[1].LocalAddr()}
	}
	b.SetBytes(64 << 10)
	b.ReportAllocs()
	start, cpu0 := time.Now(), cpuTime(b)
	total := int64(b.N * perOp)
	var sent, lost int64
	wait := time.NewTimer(time.Hour) // reused: time.After would allocate per wait
	defer wait.Stop()
	for sent < total {
		// Stay within a 128-datagram window, as the RC requester
		// does; datagrams the kernel dropped are written off after
		// 5 ms without progress.
		for sent-received.Load()-lost >= 128 {
			wait.Reset(5 * time.Millisecond)
			select {
			case <-progress:
			case <-wait.C:
				lost = sent - received.Load()
			}
		}
		n := min(int64(len(batch)), total-sent, 128-(sent-received.Load()-lost))
		if _, err := conns[0].WriteBatch(batch[:n]); err != nil {
			b.Fatal(err)
		}
		sent += n
	}
	for deadline := time.Now().Add(5 * time.Millisecond); received.Load()+lost < total && time.Now().Before(deadline); {
		time.Sleep(10 * time.Microsecond)
	}
	el, cpu := time.Since(start), cpuTime(b)-cpu0
	b.ReportMetric(float64(received.Load())*float64(mtu)*8/el.Seconds()/1e9, "Gb/s")
	b.ReportMetric(float64(received.Load())*float64(mtu)*8/cpu.Seconds()/1e9, "Gb/s-cpu")
	b.ReportMetric(float64(total-received.Load())/float64(total), "lost")
	reportOffloads(b, conns[0], conns[1])
}

// BenchmarkRawUDPPingPong is the baseline for BenchmarkSendLatency: one
// 60-byte datagram to an echo goroutine and back per op, over Conns with
// the same options (busy-polling as the Endpoint's would), with no RoCE
// processing.
// The acks=on runs send a 20-byte datagram (an RoCEv2 ACK's BTH, AETH and
// ICRC) after each message in the same batch, and read both: the
// datagrams an RC SEND ping-pong puts on the wire per message, the SEND
// and the ACK of the one received (sent with the reply,
// Options.ReplyHold), so the floor of that exchange.
func BenchmarkRawUDPPingPong(b *testing.B) {
	for _, bp := range busyPolls {
		for _, acks := range []bool{false, true} {
			name := bp.name
			if acks {
				name += ",acks=on"
			}
			b.Run(name, func(b *testing.B) { benchRawPingPong(b, bp.d, acks) })
		}
	}
}

func benchRawPingPong(b *testing.B, busyPoll time.Duration, acks bool) {
	// The options of BenchmarkSendLatency's Conns: the UDP checksum
	// computed, so that GSO can send a message and its ACK as one
	// segmented datagram, as the Endpoint does.
	conns := udpPairOpts(b, UDPOptions{ComputeUDPChecksum: true, BusyPoll: busyPoll})
	per := 1
	if acks {
		per = 2
	}
	// read reads per datagrams from c into ds, in one batch or more.
	read := func(c Conn, ds []Datagram) error {
		for got := 0; got < per; {
			n, err := c.ReadBatch(ds[got:per])
			if err != nil {
				return err
			}
			got += n
		}
		return nil
	}
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		ds := make([]Datagram, per)
		for i := range ds {
			ds[i].Data = make([]byte, 0, 2048)
		}
		for {
			if read(conns[1], ds) != nil {
				return
			}
			for i := range ds {
				ds[i].Src, ds[i].Dst = ds[i].Dst, ds[i].Src
			}
			if _, err := conns[1].WriteBatch(ds); err != nil {
				return
			}
		}
	}()
	out := []Datagram{{Data: make([]byte, 60), Src: conns[0].LocalAddr(), Dst: conns[1].LocalAddr()}}
	if acks {
		out = append(out, Datagram{Data: make([]byte, 20), Src: conns[0].LocalAddr(), Dst: conns[1].LocalAddr()})
	}
	in := make([]Datagram, per)
	for i := range in {
		in[i].Data = make([]byte, 0, 2048)
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if _, err := conns[0].WriteBatch(out); err != nil {
			b.Fatal(err)
		}
		if err := read(conns[0], in); err != nil || len(in[0].Data) != 60 {
			b.Fatal(len(in[0].Data), err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/2000, "us/half-rtt")
	reportOffloads(b, conns[0], conns[1])
	conns[0].Close()
	conns[1].Close()
	<-echoDone
}
