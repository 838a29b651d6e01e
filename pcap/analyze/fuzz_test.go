package analyze_test

import (
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap/analyze"
)

// FuzzAnalyzer feeds packets built from the fuzzer's bytes (five per
// packet: direction and opcode, PSN low byte, PSN high bits and AckReq,
// syndrome, time step) to an Analyzer with small bounds: it never panics,
// and its report keeps within them.
func FuzzAnalyzer(f *testing.F) {
	f.Add([]byte{0x04, 1, 0, 0, 1, 0x04, 2, 0, 0, 1, 0x91, 1, 0, 0x60, 1, 0x04, 1, 0, 0, 5})
	f.Add([]byte{0x0c, 10, 0, 0, 1, 0x8d, 10, 0, 0x1f, 1, 0x8f, 12, 0, 0x1f, 1, 0x91, 13, 0, 0x20, 9, 0xe4, 0, 0, 0, 1})
	f.Add([]byte{0x00, 0xfe, 0xff, 0, 1, 0x02, 0xff, 0xff, 0, 1, 0x01, 0, 0, 0, 1, 0x81, 0, 0, 0, 1})
	f.Fuzz(runFuzzBody)
}

func runFuzzBody(t *testing.T, data []byte) {
	ops := bth.Opcodes()
	{
		w := newWire(t, analyze.Config{MaxConnections: 2, MaxEvents: 3, MaxBins: 4, MaxSamples: 4, Points: 3, Bin: time.Microsecond})
		for len(data) >= 5 {
			b := data[:5]
			data = data[5:]
			op := ops[int(b[0]&0x7F)%len(ops)]
			psn := uint32(b[1]) | uint32(b[2]&0x0F)<<20
			p := &bth.Packet{BTH: bth.BTH{Opcode: op, PKey: bth.DefaultPKey, DestQP: 0x10 + uint32(b[2]>>6), PSN: bth.PSN(psn), AckReq: b[2]&0x10 != 0, BECN: op == bth.CNP},
				DETH: bth.DETH{QKey: 1, SrcQP: uint32(b[3])}, RETH: bth.RETH{DMALength: uint32(b[3]) * 97},
				AETH: bth.AETH{Syndrome: bth.Syndrome(b[3]), MSN: uint32(b[4])}}
			if op.Info().Payload {
				p.Payload = make([]byte, int(b[3])*5)
			}
			src, dst := hostA, hostB
			if b[0]&0x80 != 0 {
				src, dst = hostB, hostA
			}
			w.send(time.Duration(b[4])*100*time.Nanosecond, src, dst, bth.ECN(b[4]&3), p)
		}
		rep := w.report()
		if len(rep.Connections) > 2*2 {
			t.Fatalf("%d connections reported with MaxConnections 2", len(rep.Connections))
		}
		for _, c := range rep.Connections {
			if len(c.GBNEpisodes) > 3 || len(c.Checks) > 3 || len(c.RNRWaits) > 3 || len(c.Throughput) > 4 {
				t.Fatalf("bounds exceeded: %d episodes, %d checks, %d RNR waits, %d bins", len(c.GBNEpisodes), len(c.Checks), len(c.RNRWaits), len(c.Throughput))
			}
			if c.RTT.Samples > 0 && (c.RTT.P50 == nil || *c.RTT.P50 < 0) {
				t.Fatalf("RTT %+v", c.RTT)
			}
		}
	}
}
