package conform_test

import (
	"context"
	"fmt"

	"github.com/roce-emu/roce-emu/conform"
)

// Two cases against roce-emu itself on the in-memory network: each case
// sets up its own connection through ib_write_bw's or ib_read_bw's
// exchange, then the prober sends its packets and checks the answers.
func Example() {
	s, err := conform.NewSelf(conform.SelfOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	var cases []conform.Case
	for _, c := range conform.Cases() {
		if c.Name == "psn-wrap" || c.Name == "zero-length-read" {
			cases = append(cases, c)
		}
	}
	rep, err := conform.Run(context.Background(), s.Target(), cases, conform.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Cases {
		fmt.Println(r.Name, r.Verdict, r.Peer, r.Frames)
	}
	fmt.Println(rep.Passed, "passed,", rep.Failed, "failed")
	// Output:
	// psn-wrap pass ib_write_bw [1 2 3 4 5 6 7 8]
	// zero-length-read pass ib_read_bw [1 2 3 4]
	// 2 passed, 0 failed
}
