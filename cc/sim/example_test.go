package sim_test

import (
	"fmt"
	"log"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/cc/sim"
)

// Two flows into one 10 Gb/s port for 20 ms of simulated time, with DCQCN
// (the paper's parameters) and WRED-ECN marking from 5 KB to 200 KB. The
// run is deterministic for a seed; the figures are over the last half of
// it. The flows share the link fairly and fill it, with a queue that stays
// short of KMax.
func ExampleRun() {
	params, err := cc.Profile(cc.ProfilePaper, 10*cc.Gbps)
	if err != nil {
		log.Fatal(err)
	}
	r, err := sim.Run(sim.Config{Flows: 2, LinkRate: 10 * cc.Gbps, Duration: 20 * time.Millisecond, MTU: 1024,
		Delay: time.Microsecond, DCQCN: true, Params: params, Seed: 1,
		Queue: cc.QueueConfig{Buffer: 1 << 20, KMin: 5000, KMax: 200000, PMax: 0.01}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("per flow: %.1f and %.1f Gb/s\n", r.PerFlowGbps[0], r.PerFlowGbps[1])
	fmt.Println("fair (Jain > 0.99):", r.JainIndex > 0.99)
	fmt.Println("link used (utilization > 0.95):", r.Utilization > 0.95)
	fmt.Println("queue p99 under KMax:", r.QueueP99 < 200000, "CNPs sent:", r.CNPs > 0, "drops:", r.Drops)
	// Output:
	// per flow: 5.2 and 4.3 Gb/s
	// fair (Jain > 0.99): true
	// link used (utilization > 0.95): true
	// queue p99 under KMax: true CNPs sent: true drops: 0
}
