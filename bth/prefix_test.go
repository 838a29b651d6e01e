package bth

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// DecodePrefix on every cut of every opcode's packet: the headers come back
// when they are all present, the payload is the part that was captured, and
// ErrTruncated is returned only when the cut falls inside the headers.
func TestDecodePrefixEveryCut(t *testing.T) {
	for _, op := range Opcodes() {
		for _, n := range payloadSizes(op) {
			if op.Info().Payload {
				n += 40
			}
			want := samplePacket(op, n)
			b, err := want.Append(nil, &testEncap4)
			require.NoError(t, err)
			hdr := BTHLen + op.Info().Ext.Len()
			pad := PadLen(n)
			for cut := 0; cut <= len(b); cut++ {
				var p Packet
				err := p.DecodePrefix(b[:cut], len(b))
				if cut < hdr {
					require.ErrorIs(t, err, ErrTruncated, "%s n=%d cut=%d", op, n, cut)
					continue
				}
				require.NoError(t, err, "%s n=%d cut=%d", op, n, cut)
				assert.Equal(t, want.BTH.Opcode, p.BTH.Opcode)
				assert.Equal(t, uint8(pad), p.BTH.PadCnt)
				assert.Equal(t, want.BTH.PSN, p.BTH.PSN)
				assert.Equal(t, want.BTH.DestQP, p.BTH.DestQP)
				e := op.Info().Ext
				if e&ExtRETH != 0 {
					assert.Equal(t, want.RETH, p.RETH)
				}
				if e&ExtAETH != 0 {
					assert.Equal(t, want.AETH, p.AETH)
				}
				if e&ExtDETH != 0 {
					assert.Equal(t, want.DETH, p.DETH)
				}
				if e&ExtAtomicETH != 0 {
					assert.Equal(t, want.AtomicETH, p.AtomicETH)
				}
				if e&ExtAtomicAckETH != 0 {
					assert.Equal(t, want.AtomicAckETH, p.AtomicAckETH)
				}
				if e&ExtImmDt != 0 {
					assert.Equal(t, want.ImmDt, p.ImmDt)
				}
				if e&ExtIETH != 0 {
					assert.Equal(t, want.IETH, p.IETH)
				}
				// The payload present, never the pad or the ICRC.
				have := min(cut, hdr+n) - hdr
				require.Len(t, p.Payload, have, "%s n=%d cut=%d", op, n, cut)
				assert.Equal(t, want.Payload[:have], p.Payload)
				assert.Equal(t, have, cap(p.Payload), "payload capacity stops at its end")
				// On the wire: total - headers - pad - ICRC.
				assert.Equal(t, n, len(b)-hdr-int(p.BTH.PadCnt)-ICRCLen)
				if cut == len(b) {
					var q Packet
					require.NoError(t, q.Decode(b))
					assert.True(t, samePacket(q, p), "DecodePrefix of the whole packet is Decode")
				} else {
					assert.Zero(t, p.ICRC)
				}
			}
		}
	}
}

// The length checks of Decode are made against total, not against the
// bytes present.
func TestDecodePrefixLengthErrors(t *testing.T) {
	send := samplePacket(RCSendOnly, 8)
	b, err := send.Append(nil, &testEncap4)
	require.NoError(t, err)
	ack := samplePacket(RCAcknowledge, 0)
	a, err := ack.Append(nil, &testEncap4)
	require.NoError(t, err)

	cases := []struct {
		name  string
		b     []byte
		total int
		want  error
	}{
		{"BTH cut", b[:11], len(b), ErrTruncated},
		{"AETH cut", a[:BTHLen+3], len(a), ErrTruncated},
		{"total too small for the ICRC", b[:BTHLen], BTHLen + 3, ErrTruncated},
		{"ACK with payload by its length", a[:BTHLen+AETHLen], len(a) + 4, ErrUnexpectedPayload},
		{"pad count larger than the payload", withPad(b[:BTHLen+2], 3), BTHLen + 2 + ICRCLen, ErrPadCnt},
		{"unknown opcode", append([]byte{0x1F}, b[1:BTHLen]...), 100, ErrUnknownOpcode},
		{"negative total", b[:BTHLen], -1, ErrTruncated},
	}
	for _, c := range cases {
		var p Packet
		err := p.DecodePrefix(c.b, c.total)
		assert.ErrorIs(t, err, c.want, c.name)
		var de *DecodeError
		assert.True(t, errors.As(err, &de), c.name)
	}
	// A payload of 0 bytes with the pad: the pad is not payload.
	var p Packet
	require.NoError(t, p.DecodePrefix(withPad(b[:BTHLen+2], 2), BTHLen+2+ICRCLen))
	assert.Empty(t, p.Payload)
}

// withPad returns a copy of b with the BTH PadCnt set to pad.
func withPad(b []byte, pad uint8) []byte {
	c := append([]byte(nil), b...)
	c[1] = c[1]&^0x30 | pad<<4
	return c
}

func TestAllocsPacketDecodePrefix(t *testing.T) {
	for _, op := range Opcodes() {
		n := 0
		if op.Info().Payload {
			n = 61
		}
		p := samplePacket(op, n)
		b, err := p.Append(nil, &testEncap4)
		require.NoError(t, err)
		cut := BTHLen + op.Info().Ext.Len() + n/2
		var d Packet
		allocs := testing.AllocsPerRun(100, func() {
			if err := d.DecodePrefix(b[:cut], len(b)); err != nil {
				t.Fatal(err)
			}
		})
		assert.Zero(t, allocs, "Packet.DecodePrefix(%s)", op)
	}
}
