package bth

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ICRC of Append and AppendScratch against refICRC, over every
// opcode, header shape and spare capacity (from a review of 3d9c20c).

// icrcShapeEncaps are the header shapes appendICRC lays out: IPv4 (plain,
// IPv4-mapped, UDP source port 0, another destination port, all-ones
// fields), IPv6 (zero flow label and traffic class, all-ones).
func icrcShapeEncaps() []Encap {
	e4 := testEncap4
	m4 := testEncap4
	m4.Src, m4.Dst = netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2")
	z4 := testEncap4
	z4.SrcPort, z4.DstPort, z4.ID, z4.TrafficClass, z4.HopLimit = 0, 20001, 0, 0, 0
	f4 := Encap{Src: netip.MustParseAddr("255.255.255.255"), Dst: netip.MustParseAddr("255.255.255.254"),
		SrcPort: 0xFFFF, DstPort: 0xFFFF, TrafficClass: 0xFF, HopLimit: 0xFF, ID: 0xFFFF}
	mixed := testEncap4
	mixed.Src = netip.MustParseAddr("::ffff:10.0.0.1") // mapped src, plain IPv4 dst
	e6 := testEncap6
	z6 := Encap{Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("fe80::2")}
	f6 := Encap{Src: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), Dst: netip.MustParseAddr("2001:db8::ff"),
		SrcPort: 0xFFFF, DstPort: 1, TrafficClass: 0xFF, HopLimit: 0xFF, FlowLabel: 0xFFFFFFFF}
	zone := testEncap6
	zone.Src, zone.Dst = netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("fe80::2%eth1")
	return []Encap{e4, m4, z4, f4, mixed, e6, z6, f6, zone}
}

// wantICRC is the ICRC of pkt (BTH to pad) inside e's headers, by refICRC.
func wantICRC(t testing.TB, e *Encap, pkt []byte) uint32 {
	t.Helper()
	h, err := e.AppendIPUDP(nil, len(pkt)+ICRCLen)
	require.NoError(t, err)
	n := e.IPHeaderLen()
	return refICRC(h[:n], h[n:], pkt)
}

// blockEdge is the spare capacity (beyond the packet without its ICRC)
// from which appendICRC takes the block path.
func blockEdge(e *Encap, pktLen int) int {
	rest := pktLen - BTHLen
	n := 4 + e.IPHeaderLen() + UDPLen + BTHLen
	if rest <= icrcInlineMax {
		n += rest
	}
	return max((n+15)&^15, 64) + ICRCLen
}

// Every opcode, every header shape, payloads on both sides of
// icrcInlineMax and up to 4 KiB, and every spare capacity from none to
// past AppendSpare around the block's edge: the bytes Append gives
// equal the table path's and the ICRC is refICRC's.
func TestAppendICRCEveryShape(t *testing.T) {
	sizes := []int{0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 200, 203, 204, 205,
		212, 213, 216, 220, 225, 228, 229, 232, 236, 240, 244, 248, 252, 253, 256, 257, 260, 300, 1024, 4093, 4096, 4099}
	checked := 0
	for _, e := range icrcShapeEncaps() {
		for _, op := range Opcodes() {
			info := op.Info()
			for _, n := range sizes {
				if !info.Payload && n > 0 {
					break
				}
				p := samplePacket(op, n)
				ref, err := p.AppendTransport(nil)
				require.NoError(t, err)
				want := binary.LittleEndian.AppendUint32(append([]byte(nil), ref...), wantICRC(t, &e, ref))
				edge := blockEdge(&e, len(ref))
				spares := []int{0, 1, 2, 3, 4, 5, edge - 2, edge - 1, edge, edge + 1, AppendSpare - 1, AppendSpare, AppendSpare + 13}
				for _, spare := range spares {
					if spare < 0 {
						continue
					}
					for _, scratch := range []bool{false, true} {
						buf := make([]byte, 0, len(want)-ICRCLen+spare)
						got, err := p.append(buf, &e, scratch)
						require.NoError(t, err)
						require.Equal(t, want, got, "%v %s n=%d spare=%d (edge %d) scratch=%v", e.Src, op, n, spare, edge, scratch)
						checked++
					}
				}
			}
		}
	}
	t.Logf("%d appends checked", checked)
}

// Many packets of random shapes and random spare capacities appended
// into one arena with AppendScratch, as the Endpoint does, each checked against refICRC and the one-off Append.
func TestAppendScratchICRCArena(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 25))
	encs := icrcShapeEncaps()
	ops := Opcodes()
	for round := range 60 {
		arena := make([]byte, 0, 1<<20)
		type one struct {
			start, end int
			want       []byte
		}
		var all []one
		for range 300 {
			e := encs[rng.IntN(len(encs))]
			op := ops[rng.IntN(len(ops))]
			n := 0
			if op.Info().Payload {
				n = rng.IntN(600)
				if rng.IntN(10) == 0 {
					n = rng.IntN(4200)
				}
			}
			p := samplePacket(op, n)
			p.BTH.PSN = PSN(rng.Uint32() & PSNMask)
			want, err := p.Append(nil, &e)
			require.NoError(t, err)
			got, _, err := e.VerifyICRC(want)
			require.NoError(t, err)
			require.Equal(t, wantICRC(t, &e, want[:len(want)-ICRCLen]), got)
			if rng.IntN(4) == 0 && cap(arena)-len(arena) > len(want)+AppendSpare {
				// Cut the arena's capacity so the table path runs, or the
				// block path at its edge.
				cut := len(arena) + len(want) + rng.IntN(AppendSpare)
				arena = arena[:len(arena):cut]
			}
			start := len(arena)
			arena, err = p.AppendScratch(arena, &e)
			require.NoError(t, err)
			all = append(all, one{start, len(arena), want})
		}
		for i, o := range all {
			require.Equal(t, o.want, arena[o.start:o.end], "round %d packet %d", round, i)
		}
	}
}

// AppendScratch refuses what the table path refused, with b unchanged,
// and otherwise gives refICRC's ICRC, with spare capacity or without.
func TestAppendTooLong(t *testing.T) {
	for _, e := range []Encap{testEncap4, testEncap6} {
		max := 0xFFFF - e.IPHeaderLen() - UDPLen - BTHLen - ICRCLen - RETHLen
		for _, n := range []int{max - 4, max - 3, max, max + 1} {
			p := samplePacket(RCWriteOnly, n)
			for _, spare := range []int{0, AppendSpare} {
				b := make([]byte, 3, 3+BTHLen+RETHLen+n+8+spare)
				out, err := p.AppendScratch(b, &e)
				h, herr := e.AppendIPUDP(nil, BTHLen+RETHLen+n+PadLen(n)+ICRCLen)
				if herr != nil {
					require.Error(t, err, "%v n=%d spare=%d", e.Src, n, spare)
					require.Len(t, out, 3)
					continue
				}
				require.NoError(t, err, "%v n=%d spare=%d", e.Src, n, spare)
				ipn := e.IPHeaderLen()
				require.Equal(t, refICRC(h[:ipn], h[ipn:], out[3:len(out)-4]), binary.LittleEndian.Uint32(out[len(out)-4:]), fmt.Sprint(n))
			}
		}
	}
}
