package bth

import (
	"fmt"
	"strings"
	"testing"
)

// Zero-allocation gates: the package documents that decoding, the ICRC and
// appending into a buffer with room do not allocate.

func TestAllocsPacketDecode(t *testing.T) {
	for _, op := range Opcodes() {
		n := 0
		if op.Info().Payload {
			n = 61
		}
		p := samplePacket(op, n)
		b, err := p.Append(nil, &testEncap4)
		if err != nil {
			t.Fatal(err)
		}
		var d Packet
		allocs := testing.AllocsPerRun(100, func() {
			if err := d.Decode(b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Packet.Decode(%s): %v allocations per run, want 0", op, allocs)
		}
	}
}

func TestAllocsHeaderDecode(t *testing.T) {
	buf := make([]byte, 64)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	var (
		bth  BTH
		reth RETH
		aeth AETH
		deth DETH
		imm  ImmDt
		ieth IETH
		at   AtomicETH
		ack  AtomicAckETH
	)
	decoders := map[string]func([]byte) error{
		"BTH": bth.Decode, "RETH": reth.Decode, "AETH": aeth.Decode, "DETH": deth.Decode,
		"ImmDt": imm.Decode, "IETH": ieth.Decode, "AtomicETH": at.Decode, "AtomicAckETH": ack.Decode,
	}
	for name, dec := range decoders {
		allocs := testing.AllocsPerRun(100, func() {
			if err := dec(buf); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s.Decode: %v allocations per run, want 0", name, allocs)
		}
	}
}

// icrcFixture returns the IP header, UDP header and UDP payload of an RC
// SEND_ONLY of n bytes in the encapsulation e.
func icrcFixture(tb testing.TB, e Encap, n int) (ip, udp, roce []byte) {
	tb.Helper()
	p := samplePacket(RCSendOnly, n)
	frame, err := e.AppendFrame(nil, &p)
	if err != nil {
		tb.Fatal(err)
	}
	_, ip, udp, roce = splitFrame(tb, frame, !e.IsIPv4())
	return ip, udp, roce
}

func TestAllocsICRC(t *testing.T) {
	for _, enc := range testEncaps {
		e := enc.e
		ip, udp, roce := icrcFixture(t, e, 64)
		pkt := roce[:len(roce)-4]

		allocs := testing.AllocsPerRun(100, func() {
			if _, err := ICRC(ip, udp, pkt); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("ICRC (%s): %v allocations per run, want 0", enc.name, allocs)
		}

		allocs = testing.AllocsPerRun(100, func() {
			if _, _, err := VerifyICRC(ip, udp, roce); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("VerifyICRC (%s): %v allocations per run, want 0", enc.name, allocs)
		}

		allocs = testing.AllocsPerRun(100, func() {
			if _, err := e.ICRC(pkt); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Encap.ICRC (%s): %v allocations per run, want 0", enc.name, allocs)
		}
	}
}

func TestAllocsPacketAppend(t *testing.T) {
	for _, enc := range testEncaps {
		e := enc.e
		var failed []string
		for _, op := range Opcodes() {
			n := 0
			if op.Info().Payload {
				n = 61
			}
			p := samplePacket(op, n)
			buf := make([]byte, 0, 256)
			allocs := testing.AllocsPerRun(100, func() {
				if _, err := p.Append(buf[:0], &e); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				failed = append(failed, fmt.Sprintf("%s: %v", op, allocs))
			}
			// The transport part alone (no ICRC).
			allocs = testing.AllocsPerRun(100, func() {
				if _, err := p.AppendTransport(buf[:0]); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("Packet.AppendTransport(%s): %v allocations per run, want 0", op, allocs)
			}
		}
		if len(failed) != 0 {
			t.Errorf("Packet.Append into a buffer with room (%s) allocates, want 0 allocations; opcode: allocations per run:\n%s",
				enc.name, strings.Join(failed, "\n"))
		}
	}
}

// benchCases are the representative packets of the benchmarks.
var benchCases = []struct {
	name string
	op   Opcode
	n    int
}{
	{"RC_SEND_ONLY_64B", RCSendOnly, 64},
	{"RC_RDMA_WRITE_FIRST_1024B", RCWriteFirst, 1024},
	{"RC_ACKNOWLEDGE", RCAcknowledge, 0},
	{"RC_RDMA_READ_RESPONSE_MIDDLE_4096B", RCReadResponseMiddle, 4096},
	{"CNP", CNP, 0},
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			p := samplePacket(c.op, c.n)
			pkt, err := p.Append(nil, &testEncap4)
			if err != nil {
				b.Fatal(err)
			}
			var d Packet
			b.ReportAllocs()
			b.SetBytes(int64(len(pkt)))
			for b.Loop() {
				if err := d.Decode(pkt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkICRC(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"64B", 64}, {"4096B", 4096}} {
		b.Run(c.name, func(b *testing.B) {
			ip, udp, roce := icrcFixture(b, testEncap4, c.n)
			pkt := roce[:len(roce)-4]
			b.ReportAllocs()
			b.SetBytes(int64(len(roce)))
			for b.Loop() {
				if _, err := ICRC(ip, udp, pkt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			p := samplePacket(c.op, c.n)
			pkt, err := p.Append(nil, &testEncap4)
			if err != nil {
				b.Fatal(err)
			}
			for _, spare := range []int{0, AppendSpare} {
				b.Run(fmt.Sprintf("spare=%d", spare), func(b *testing.B) {
					buf := make([]byte, 0, len(pkt)+spare)
					b.ReportAllocs()
					b.SetBytes(int64(len(pkt)))
					for b.Loop() {
						if _, err := p.AppendScratch(buf[:0], &testEncap4); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
