package bth

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

// PSN arithmetic is modulo 2^24 (docs/wire-format.md section 4). Every expected value
// below is worked out by hand.

func TestPSNAdd(t *testing.T) {
	cases := []struct {
		p    PSN
		n    int
		want PSN
	}{
		{0, 0, 0},
		{5, 0, 5},
		{0, 1, 1},
		{0xFFFFFF, 1, 0},                // the wrap
		{0xFFFFFF, 2, 1},                // past the wrap
		{0xFFFFF0, 0x20, 0x000010},      // across the wrap
		{0, -1, 0xFFFFFF},               // backwards across the wrap
		{0x000010, -0x20, 0xFFFFF0},     // backwards across the wrap
		{0x123456, -0x123457, 0xFFFFFF}, // backwards to just before 0
		{0, 1 << 23, 0x800000},          // half the space
		{0x800000, 1 << 23, 0},          // the other half
		{0, 1 << 24, 0},                 // a whole turn
		{1, 1<<24 + 5, 6},               // more than a whole turn
		{7, -(1 << 24), 7},              // a whole turn backwards
		{0xABCDEF, 0x1000000 * 3, 0xABCDEF},
		{0x7FFFFF, 1, 0x800000},
	}
	for _, c := range cases {
		got := c.p.Add(c.n)
		assert.Equal(t, c.want, got, "PSN(%#x).Add(%d)", uint32(c.p), c.n)
		assert.True(t, got.Valid(), "PSN(%#x).Add(%d) = %#x is not 24 bits", uint32(c.p), c.n, uint32(got))
	}
}

func TestPSNNext(t *testing.T) {
	cases := []struct{ p, want PSN }{
		{0, 1},
		{0xFFFFFE, 0xFFFFFF},
		{0xFFFFFF, 0},
		{0x7FFFFF, 0x800000},
		{0xd080f3, 0xd080f4},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.p.Next(), "PSN(%#x).Next()", uint32(c.p))
	}
}

func TestPSNDiffAndOrder(t *testing.T) {
	// diff is p - q as a signed 24-bit number, in [-2^23, 2^23).
	cases := []struct {
		p, q PSN
		diff int32
	}{
		{0, 0, 0},
		{0xFFFFFF, 0xFFFFFF, 0},
		{10, 3, 7},
		{3, 10, -7},
		{0, 0xFFFFFF, 1},  // 0 comes right after 0xFFFFFF
		{0xFFFFFF, 0, -1}, // and 0xFFFFFF right before 0
		{5, 0xFFFFFA, 11},
		{0xFFFFFA, 5, -11},
		{0x7FFFFF, 0, 0x7FFFFF},        // 2^23-1: the farthest "after"
		{0, 0x7FFFFF, -0x7FFFFF},       // and its mirror
		{0x800000, 0, -0x800000},       // 2^23 apart: -2^23 (rxe's (s32)(d<<8) gives INT_MIN)
		{0, 0x800000, -0x800000},       // same distance the other way is also -2^23
		{0x800001, 0, -0x7FFFFF},       // 2^23+1 apart reads as before
		{0x800000, 0x000001, 0x7FFFFF}, // 2^23-1 apart
		{0x000001, 0x800000, -0x7FFFFF},
		{0x123456, 0x923456, -0x800000},
		{0xFFFFFF, 0x7FFFFF, -0x800000},
		{0xFFFFFF, 0x800000, 0x7FFFFF},
	}
	for _, c := range cases {
		d := c.p.Diff(c.q)
		assert.Equal(t, c.diff, d, "PSN(%#x).Diff(%#x)", uint32(c.p), uint32(c.q))
		assert.Equal(t, c.diff < 0, c.p.Before(c.q), "PSN(%#x).Before(%#x)", uint32(c.p), uint32(c.q))
		assert.Equal(t, c.diff > 0, c.p.After(c.q), "PSN(%#x).After(%#x)", uint32(c.p), uint32(c.q))
		want := 0
		if c.diff < 0 {
			want = -1
		} else if c.diff > 0 {
			want = 1
		}
		assert.Equal(t, want, c.p.Compare(c.q), "PSN(%#x).Compare(%#x)", uint32(c.p), uint32(c.q))
	}
}

func TestPSNWrapOrdering(t *testing.T) {
	assert.True(t, PSN(0).After(0xFFFFFF))
	assert.False(t, PSN(0).Before(0xFFFFFF))
	assert.True(t, PSN(0xFFFFFF).Before(0))
	assert.False(t, PSN(0xFFFFFF).After(0))
	assert.Equal(t, 1, PSN(0).Compare(0xFFFFFF))
	assert.Equal(t, -1, PSN(0xFFFFFF).Compare(0))
	assert.Equal(t, 0, PSN(0x123456).Compare(0x123456))
	assert.False(t, PSN(7).Before(7))
	assert.False(t, PSN(7).After(7))
	assert.Equal(t, PSN(0), PSN(0xFFFFFF).Next())
	assert.Equal(t, int32(PSNWindow-1), PSN(PSNWindow-1).Diff(0))
	assert.Equal(t, int32(-PSNWindow), PSN(PSNWindow).Diff(0))
}

// Bits above the 24th are ignored ("only the low 24 bits are meaningful").
func TestPSNHighBitsIgnored(t *testing.T) {
	assert.Equal(t, int32(0), PSN(0x1000005).Diff(5))
	assert.Equal(t, int32(1), PSN(0xFF000000).Diff(0xFFFFFF))
	assert.Equal(t, PSN(6), PSN(0x1000005).Next())
}

func TestPSNInRange(t *testing.T) {
	cases := []struct {
		p, first PSN
		n        int
		want     bool
	}{
		{0xFFFFFE, 0xFFFFFE, 3, true}, // window 0xFFFFFE, 0xFFFFFF, 0
		{0xFFFFFF, 0xFFFFFE, 3, true},
		{0x000000, 0xFFFFFE, 3, true},
		{0x000001, 0xFFFFFE, 3, false}, // one past the end
		{0xFFFFFD, 0xFFFFFE, 3, false}, // one before the start
		{5, 5, 1, true},
		{5, 5, 0, false}, // empty window
		{6, 5, 1, false},
		{4, 5, 10, false},
		{14, 5, 10, true},
		{15, 5, 10, false},
		{0, 0, 1 << 23, true},
		{0x7FFFFF, 0, 1 << 23, true},
		{0x800000, 0, 1 << 23, false}, // reads as before 0
		{100, 0, -1, false},           // negative n: empty
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.p.InRange(c.first, c.n), "PSN(%#x).InRange(%#x, %d)", uint32(c.p), uint32(c.first), c.n)
	}
}

func TestPSNValid(t *testing.T) {
	for _, c := range []struct {
		p    PSN
		want bool
	}{
		{0, true}, {1, true}, {0x7FFFFF, true}, {0xFFFFFF, true},
		{0x1000000, false}, {0x1FFFFFF, false}, {0xFFFFFFFF, false},
	} {
		assert.Equal(t, c.want, c.p.Valid(), "PSN(%#x).Valid()", uint32(c.p))
	}
	assert.Equal(t, PSN(0xFFFFFF), PSN(PSNMask))
	assert.Equal(t, 1<<23, PSNWindow)
}

func TestPSNString(t *testing.T) {
	assert.Equal(t, "0", PSN(0).String())
	assert.Equal(t, "13571856", PSN(13571856).String())
	assert.Equal(t, "16777215", PSN(0xFFFFFF).String())
}

// A property check against arithmetic done with plain integers: for any p and
// any |n| < 2^23, p.Add(n) is (p+n) mod 2^24 and Diff gives n back.
func TestPSNAddDiffProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		p := PSN(r.Uint32() & 0xFFFFFF)
		n := int(r.Int32N(1<<24)) - 1<<23 // [-2^23, 2^23)
		q := p.Add(n)
		want := PSN(((int64(p)+int64(n))%(1<<24) + (1 << 24)) % (1 << 24))
		if q != want {
			t.Fatalf("PSN(%#x).Add(%d) = %#x, want %#x", uint32(p), n, uint32(q), uint32(want))
		}
		if d := q.Diff(p); int(d) != n {
			t.Fatalf("PSN(%#x).Diff(%#x) = %d, want %d", uint32(q), uint32(p), d, n)
		}
		if n > 0 && !q.After(p) || n < 0 && !q.Before(p) || n == 0 && q.Compare(p) != 0 {
			t.Fatalf("order of PSN(%#x) vs PSN(%#x) wrong for n=%d", uint32(q), uint32(p), n)
		}
	}
}
