package cc_test

import (
	"fmt"
	"log"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cc"
)

// A DCQCN sender at 40 Gb/s with the paper's parameters: the first CNP
// cuts its rate by alpha/2 (alpha starts at 1, so by half), a second one
// inside the rate-increase period cuts again, and the timers then bring the
// rate back up. The pacer keeps the packets to the rate: after a burst, a
// packet with 1024 bytes of data (1082 bytes on the wire) waits its time at
// the current rate.
func ExampleSender() {
	p, err := cc.Profile(cc.ProfilePaper, 40*cc.Gbps)
	if err != nil {
		log.Fatal(err)
	}
	rp, err := cc.NewReactionPoint(p)
	if err != nil {
		log.Fatal(err)
	}
	size := bth.PacketOverhead + 1024 // a packet with 1024 bytes of data, on the wire
	s, err := cc.NewSender(rp, size)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Unix(0, 0)
	fmt.Println("start:", s.Rate())

	s.OnCNP(now)
	fmt.Printf("first CNP: %v, alpha %.4f\n", s.Rate(), rp.Alpha())
	now = now.Add(10 * time.Microsecond)
	s.OnCNP(now)
	fmt.Printf("second CNP: %v, alpha %.4f\n", s.Rate(), rp.Alpha())

	s.OnPacketSent(now, size) // the burst is spent
	fmt.Println("next packet waits:", s.TimeUntilSend(now, size))

	// Without CNPs, the alpha timer decays alpha and the rate-increase
	// timer (every 55 us) runs fast recovery towards the target rate, the
	// rate before the last cut, then additive increase.
	end := now.Add(time.Millisecond)
	for !s.Deadline().After(end) {
		now = s.Deadline()
		s.OnTimeout(now)
	}
	fmt.Printf("1 ms later: %v, target %v, alpha %.4f\n", s.Rate(), rp.Target(), rp.Alpha())
	// Output:
	// start: 40Gb/s
	// first CNP: 20Gb/s, alpha 1.0000
	// second CNP: 10Gb/s, alpha 1.0000
	// next packet waits: 866ns
	// 1 ms later: 20.52Gb/s, target 20.56Gb/s, alpha 0.9320
}

// A switch egress port at 10 Gb/s that marks every ECN-capable packet
// with more than 3000 bytes behind it when it starts to leave (KMin =
// KMax, as DCTCP's step marking; the decision is taken at dequeue, as the
// DCQCN authors' and HPCC's simulators take it) and holds 6000 bytes: of a
// burst of seven 1082-byte packets five are queued and the last two do not
// fit. The line sends one packet every 866 ns (1082 bytes at 10 Gb/s,
// rounded up); Depart takes a packet out when it has left and says
// whether it left marked: packet 0 started to leave at once, with nothing
// behind it; packet 1 started when packet 0 had left, with 3246 bytes
// behind it, and is the one marked.
func ExamplePort() {
	port, err := cc.NewPort(cc.QueueConfig{LineRate: 10 * cc.Gbps, Buffer: 6000, KMin: 3000, KMax: 3000, PMax: 1}, 1)
	if err != nil {
		log.Fatal(err)
	}
	start := time.Unix(0, 0)
	size := bth.PacketOverhead + 1024
	for i := range 7 {
		depth := port.Bytes()
		departs, queued, _ := port.Arrive(start, size, true)
		if !queued {
			fmt.Printf("packet %d: finds %4d bytes, dropped\n", i, depth)
			continue
		}
		fmt.Printf("packet %d: finds %4d bytes, leaves at %v\n", i, depth, departs.Sub(start))
	}
	for i := 0; port.Bytes() > 0; i++ {
		ce, _ := port.Depart(size, true)
		fmt.Printf("packet %d left, CE %v\n", i, ce)
	}
	fmt.Println("enqueued", port.Enqueued, "marked", port.Marked, "dropped", port.Dropped, "deepest", port.MaxBytes)
	// Output:
	// packet 0: finds    0 bytes, leaves at 866ns
	// packet 1: finds 1082 bytes, leaves at 1.732µs
	// packet 2: finds 2164 bytes, leaves at 2.597µs
	// packet 3: finds 3246 bytes, leaves at 3.463µs
	// packet 4: finds 4328 bytes, leaves at 4.328µs
	// packet 5: finds 5410 bytes, dropped
	// packet 6: finds 5410 bytes, dropped
	// packet 0 left, CE false
	// packet 1 left, CE true
	// packet 2 left, CE false
	// packet 3 left, CE false
	// packet 4 left, CE false
	// enqueued 5 marked 1 dropped 2 deepest 5410
}
