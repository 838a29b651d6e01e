package cm

import (
	"math/rand/v2"
	"testing"
	"time"
)

// FuzzManager gives a Manager that listens and holds connections in
// several states arbitrary MADs, with their CM header made valid half of
// the time, and runs its timers: it must never panic, and every MAD it
// drops must be counted.
func FuzzManager(f *testing.F) {
	for _, m := range sampleMessages() {
		b, _ := AppendMAD(nil, 7, m)
		f.Add(b, uint8(0), false)
	}
	f.Add([]byte{1, 7, 2, 3, 0, 0}, uint8(3), true)
	f.Fuzz(func(t *testing.T, b []byte, pick uint8, fix bool) {
		p := newPair(t, Config{}, Config{})
		idA, idB := p.connect() // established on both sides
		_, err := p.a.Dial(p.now, dialParams())
		if err != nil {
			t.Fatal(err)
		}
		p.deliver() // a second connection in REQ_RCVD at B, REQ_SENT at A
		mad := append([]byte(nil), b...)
		if fix && len(mad) >= MADHeaderLen {
			h := CMHeader(1, AttrREQ+AttrID(pick%7))
			copy(mad, h.Append(nil))
			if len(mad) >= MADHeaderLen+8 {
				// Aim at a real connection now and then.
				ids := []uint32{idA, idB, 0, uint32(pick)}
				r := rand.New(rand.NewPCG(uint64(pick), 0))
				be := func(o int, v uint32) {
					mad[o], mad[o+1], mad[o+2], mad[o+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
				}
				be(MADHeaderLen, ids[r.IntN(4)])
				be(MADHeaderLen+4, ids[r.IntN(4)])
			}
		}
		for _, m := range []*Manager{p.a, p.b} {
			before := m.Counters()
			err := m.HandleMAD(p.now, addrA, mad)
			after := m.Counters()
			drops := func(c Counters) uint64 {
				return c.DropMalformed + c.DropUnknownAttr + c.DropUnknownConn + c.DropBadState + c.DropBadQPN +
					c.DropQueueFull + c.DropNoResources + c.DropBadTransport + c.DropBadGID + c.DropBadPrivateData + c.NoListener
			}
			if err != nil && drops(after) == drops(before) {
				t.Fatalf("error %v without a counted drop", err)
			}
			m.HandleTimeout(p.now.Add(time.Hour))
			for range 64 {
				if _, ok := m.PollMAD(); !ok {
					break
				}
			}
		}
	})
}
