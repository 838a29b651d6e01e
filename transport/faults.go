package transport

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roce-emu/roce-emu/bth"
)

// Direction selects outgoing or incoming packets.
type Direction uint8

// Directions.
const (
	Out  Direction = 1
	In   Direction = 2
	Both Direction = Out | In
)

func (d Direction) String() string {
	switch d {
	case Out:
		return "out"
	case In:
		return "in"
	}
	return "both"
}

// FaultKind is what a fault rule does to the packets it selects.
type FaultKind uint8

// Fault kinds.
const (
	FaultDrop FaultKind = iota
	FaultDuplicate
	FaultDelay
)

// FaultRule selects packets and drops, duplicates or delays them. A packet
// is selected when it goes in a chosen direction, has the chosen opcode
// and PSN (when set), is the Nth such packet (when set), and wins a draw
// of probability Prob (when set). Count bounds how many times the rule
// acts (0: no bound).
type FaultRule struct {
	Kind   FaultKind
	Dir    Direction
	Opcode *bth.Opcode
	PSN    *bth.PSN
	Nth    int
	Count  int
	Prob   float64
	Delay  time.Duration
	Spec   string // the text the rule was parsed from
	seen   int
	acted  atomic.Int64 // read by Acted from any goroutine
}

// Faults is a set of rules applied to every packet that crosses a Conn
// wrapped by WithFaults (outgoing: Out, incoming: In), or that a Network
// carries (Impairments.Faults, where every rule applies whatever its Dir).
// It is safe for concurrent use.
type Faults struct {
	mu    sync.Mutex
	rules []*FaultRule
	rng   *rand.Rand
	// Dropped, Duplicated and Delayed count the packets the rules acted
	// on, indexed by the Direction Apply was asked about (Both for a
	// Network). Read them while no packet crosses, or under the Conn's
	// quiescence (synctest, or after Close).
	Dropped, Duplicated, Delayed [4]uint64
}

// NewFaults returns a rule set drawing its probabilities from seed.
func NewFaults(seed uint64, rules ...*FaultRule) *Faults {
	return &Faults{rules: rules, rng: rand.New(rand.NewPCG(seed, 0x5EED))}
}

// Add appends a rule.
func (f *Faults) Add(r *FaultRule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
}

// SetRules replaces every rule.
func (f *Faults) SetRules(rules ...*FaultRule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = rules
}

// Rules returns the rules.
func (f *Faults) Rules() []*FaultRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*FaultRule(nil), f.rules...)
}

// Action is what the rules decide for one packet: drop it, deliver it
// twice, and delay it (the delays of every rule that acted, added up).
type Action struct {
	Drop      bool
	Duplicate bool
	Delay     time.Duration
}

// Apply decides what happens to one packet going in direction dir (Out,
// In, or Both where a path has no direction, as in a Network). It is the
// one rule engine: the WithFaults decorator asks it about every datagram
// that crosses a Conn, and a Network about every datagram it carries
// (Impairments.Faults). A nil *Faults decides nothing.
func (f *Faults) Apply(dir Direction, p *bth.Packet) Action {
	var a Action
	if f == nil {
		return a
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.Dir&dir == 0 || (r.Opcode != nil && p.BTH.Opcode != *r.Opcode) || (r.PSN != nil && p.BTH.PSN != *r.PSN) {
			continue
		}
		r.seen++
		if r.Nth > 0 && r.seen != r.Nth {
			continue
		}
		if r.Count > 0 && int(r.acted.Load()) >= r.Count {
			continue
		}
		if r.Prob > 0 && f.rng.Float64() >= r.Prob {
			continue
		}
		r.acted.Add(1)
		switch r.Kind {
		case FaultDrop:
			a.Drop = true
			f.Dropped[dir]++
		case FaultDuplicate:
			a.Duplicate = true
			f.Duplicated[dir]++
		case FaultDelay:
			a.Delay += r.Delay
			f.Delayed[dir]++
		}
	}
	return a
}

// Acted returns how many packets the rule has acted on.
func (r *FaultRule) Acted() int { return int(r.acted.Load()) }

// LossRule is "drop each packet, in both directions, with probability p".
func LossRule(p float64) *FaultRule {
	return &FaultRule{Kind: FaultDrop, Dir: Both, Prob: p, Spec: fmt.Sprintf("drop:prob=%g", p)}
}

// ParseFault parses a rule written as
//
//	ACTION[:KEY=VALUE[,KEY=VALUE...]]
//
// where ACTION is drop, dup or delay=DURATION (e.g. delay=5ms) and the keys
// are dir (out, in or both; default both), opcode (an ib_pack.h name such
// as RC_RDMA_WRITE_MIDDLE or SEND_ONLY, or a number), psn (decimal or
// 0x hex), nth (act on the Nth selected packet only), count (act at most
// this many times) and prob (0-1). Examples:
//
//	drop:dir=out,opcode=RC_RDMA_WRITE_MIDDLE,nth=2
//	drop:dir=in,opcode=RC_ACKNOWLEDGE,count=1
//	dup:psn=0x100
//	delay=2ms:prob=0.1
func ParseFault(spec string) (*FaultRule, error) {
	r := &FaultRule{Dir: Both, Spec: spec}
	action, params, _ := strings.Cut(spec, ":")
	name, val, hasVal := strings.Cut(action, "=")
	switch strings.ToLower(name) {
	case "drop":
		r.Kind = FaultDrop
	case "dup", "duplicate":
		r.Kind = FaultDuplicate
	case "delay":
		r.Kind = FaultDelay
		if !hasVal {
			return nil, fmt.Errorf("fault %q: delay needs a duration, as delay=5ms", spec)
		}
		d, err := time.ParseDuration(val)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("fault %q: bad delay %q (use a Go duration such as 500us or 5ms)", spec, val)
		}
		r.Delay = d
	default:
		return nil, fmt.Errorf("fault %q: unknown action %q (drop, dup or delay=DURATION)", spec, name)
	}
	if hasVal && r.Kind != FaultDelay {
		return nil, fmt.Errorf("fault %q: %s takes no value", spec, name)
	}
	if params == "" {
		return r, nil
	}
	for _, kv := range strings.Split(params, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("fault %q: %q is not KEY=VALUE", spec, kv)
		}
		switch strings.ToLower(k) {
		case "dir":
			switch strings.ToLower(v) {
			case "out":
				r.Dir = Out
			case "in":
				r.Dir = In
			case "both":
				r.Dir = Both
			default:
				return nil, fmt.Errorf("fault %q: dir must be out, in or both", spec)
			}
		case "opcode":
			op, err := ParseOpcode(v)
			if err != nil {
				return nil, fmt.Errorf("fault %q: %v", spec, err)
			}
			r.Opcode = &op
		case "psn":
			n, err := strconv.ParseUint(v, 0, 32)
			if err != nil || n > bth.PSNMask {
				return nil, fmt.Errorf("fault %q: psn %q is not a 24-bit number", spec, v)
			}
			psn := bth.PSN(n)
			r.PSN = &psn
		case "nth", "count":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("fault %q: %s must be a whole number of at least 1", spec, k)
			}
			if k == "nth" {
				r.Nth = n
			} else {
				r.Count = n
			}
		case "prob":
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || !(p > 0 && p <= 1) { // also refuses NaN
				return nil, fmt.Errorf("fault %q: prob must be in (0, 1]", spec)
			}
			r.Prob = p
		default:
			return nil, fmt.Errorf("fault %q: unknown key %q (dir, opcode, psn, nth, count, prob)", spec, k)
		}
	}
	return r, nil
}

// ParseOpcode accepts an ib_pack.h opcode name (RC_SEND_FIRST; the RC_
// prefix may be left out) in any case, or a number (decimal or 0x hex).
func ParseOpcode(s string) (bth.Opcode, error) {
	if n, err := strconv.ParseUint(s, 0, 8); err == nil {
		return bth.Opcode(n), nil
	}
	u := strings.ToUpper(s)
	for _, op := range bth.Opcodes() {
		if op.String() == u || op.String() == "RC_"+u {
			return op, nil
		}
	}
	return 0, fmt.Errorf("unknown opcode %q (use a name such as RC_SEND_ONLY or RDMA_WRITE_MIDDLE, or a number)", s)
}
