package cc

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixed is the smallest Algorithm: a constant rate, counting its events.
type fixed struct {
	rate       Rate
	cnps, sent int
}

func (f *fixed) OnCNP(time.Time) bool      { f.cnps++; return true }
func (f *fixed) OnSent(_ time.Time, n int) { f.sent += n }
func (f *fixed) Rate() Rate                { return f.rate }
func (f *fixed) Deadline() time.Time       { return time.Time{} }
func (f *fixed) OnTimeout(time.Time)       {}

func TestSenderQueryHasNoSideEffects(t *testing.T) {
	alg := &fixed{rate: 8 * Gbps} // 1 byte per ns
	s, err := NewSender(alg, 2000)
	require.NoError(t, err)
	for range 3 {
		assert.True(t, s.CanSend(t0, 2000), "a full bucket")
		assert.Zero(t, s.TimeUntilSend(t0, 2000))
	}
	s.OnPacketSent(t0, 2000)
	assert.Equal(t, 2000, alg.sent, "the commit reaches the algorithm")
	// Asking again and again, at the same or later times, changes nothing.
	for _, now := range []time.Time{t0, t0.Add(300 * time.Nanosecond), t0, t0.Add(999 * time.Nanosecond)} {
		want := 1000*time.Nanosecond - now.Sub(t0)
		assert.Equal(t, want, s.TimeUntilSend(now, 1000), "at %v", now.Sub(t0))
		assert.Equal(t, want, s.TimeUntilSend(now, 1000), "asked twice at %v", now.Sub(t0))
		assert.False(t, s.CanSend(now, 1000))
	}
	assert.Equal(t, 2000, alg.sent, "queries are not sends")
	at := t0.Add(time.Microsecond)
	assert.True(t, s.CanSend(at, 1000))
	s.OnPacketSent(at, 1000)
	assert.Equal(t, time.Microsecond, s.TimeUntilSend(at, 1000), "the commit spent the tokens")
}

func TestSenderCommitConsumesTokens(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rate       Rate
		burst      int
		sent, next int
		want       time.Duration
	}{
		{"bucket emptied", 8 * Gbps, 1000, 1000, 500, 500 * time.Nanosecond},
		{"half the bucket left", 8 * Gbps, 1000, 500, 500, 0},
		{"a packet larger than the bucket waits for a full bucket", 8 * Gbps, 1000, 0, 5000, 0},
		{"in debt after a large packet", 8 * Gbps, 1000, 3000, 1000, 3000 * time.Nanosecond},
		{"1 Gb/s", Gbps, 2164, 2164, 1082, 8656 * time.Nanosecond},
	} {
		s, err := NewSender(&fixed{rate: tc.rate}, tc.burst)
		require.NoError(t, err)
		if tc.sent > 0 {
			s.OnPacketSent(t0, tc.sent)
		}
		assert.Equal(t, tc.want, s.TimeUntilSend(t0, tc.next), tc.name)
	}
}

// A CNP lowers the rate the next query sees, from the time of the CNP:
// tokens earned before it are kept at the old rate.
func TestSenderCNPLowersRate(t *testing.T) {
	p, _ := Profile(ProfilePaper, 8*Gbps)
	rp, err := NewReactionPoint(p)
	require.NoError(t, err)
	s, err := NewSender(rp, 1000)
	require.NoError(t, err)
	s.OnPacketSent(t0, 1000)
	before := s.TimeUntilSend(t0, 1000)
	assert.Equal(t, time.Microsecond, before, "1000 bytes at 8 Gb/s")
	assert.True(t, s.OnCNP(t0))
	assert.Less(t, s.Rate(), 8*Gbps)
	assert.Equal(t, rp.Rate(), s.Rate())
	after := s.TimeUntilSend(t0, 1000)
	assert.Greater(t, after, before, "the next query sees the lower rate")
	assert.Equal(t, time.Duration(math.Ceil(1000*8/float64(s.Rate())*1e9)), after, "1000 bytes at the cut rate")
	// A CNP half-way: the first half earned at 8 Gb/s stays.
	s2, _ := NewSender(mustRP(t, p), 1000)
	s2.OnPacketSent(t0, 1000)
	s2.OnCNP(t0.Add(500 * time.Nanosecond))
	want := time.Duration(math.Ceil(500 * 8 / float64(s2.Rate()) * 1e9))
	assert.Equal(t, want, s2.TimeUntilSend(t0.Add(500*time.Nanosecond), 1000), "500 bytes earned, 500 to earn at the cut rate")
	// The reaction point's timers run through the sender and raise the rate.
	d := s.Deadline()
	require.False(t, d.IsZero())
	cut := s.Rate()
	for range 20 {
		s.OnTimeout(s.Deadline())
	}
	assert.Greater(t, s.Rate(), cut, "recovery reaches the pacer")
	assert.Equal(t, rp.Rate(), s.Rate())
}

func mustRP(t *testing.T, p Params) *ReactionPoint {
	rp, err := NewReactionPoint(p)
	require.NoError(t, err)
	return rp
}

func TestNewSenderRefuses(t *testing.T) {
	_, err := NewSender(nil, 1000)
	assert.Error(t, err)
	_, err = NewSender(&fixed{rate: Gbps}, 0)
	assert.Error(t, err)
	_, err = NewSender(&fixed{rate: 0}, 1000)
	assert.Error(t, err)
}

// The per-packet path of the face: a query and a commit.
func BenchmarkSenderPerPacket(b *testing.B) {
	p, _ := Profile(ProfilePaper, 40*Gbps)
	rp, _ := NewReactionPoint(p)
	s, _ := NewSender(rp, 2*1082)
	rp.OnCNP(t0)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		if wait := s.TimeUntilSend(now, 1082); wait > 0 {
			now = now.Add(wait)
		}
		s.OnPacketSent(now, 1082)
	}
}

// TrySend is TimeUntilSend and OnPacketSent in one call: over a run of
// sends at irregular times, with cuts and increases of the rate between
// them, a sender driven by TrySend keeps the same bucket, to the last bit,
// waits the same and counts the same bytes as one driven by the two calls.
func TestSenderTrySendIsQueryThenSend(t *testing.T) {
	p, err := Profile(ProfileMLX5, 100*Gbps)
	require.NoError(t, err)
	rpA, err := NewReactionPoint(p)
	require.NoError(t, err)
	rpB, err := NewReactionPoint(p)
	require.NoError(t, err)
	a, err := NewSender(rpA, 2164)
	require.NoError(t, err)
	b, err := NewSender(rpB, 2164)
	require.NoError(t, err)
	now := time.Unix(0, 0)
	var sends, waits int
	for i := 0; i < 20000; i++ {
		// Steps of 0 to 172 ns: some sends come early, most on time.
		now = now.Add(time.Duration((i * 37) % 173))
		if i%997 == 0 {
			a.OnCNP(now)
			b.OnCNP(now)
		}
		if d := a.Deadline(); !d.IsZero() && !d.After(now) {
			a.OnTimeout(now)
			b.OnTimeout(now)
		}
		wantWait := a.TimeUntilSend(now, 1082)
		if wantWait == 0 {
			a.OnPacketSent(now, 1082)
			sends++
		} else {
			waits++
		}
		require.Equal(t, wantWait, b.TrySend(now, 1082), "step %d", i)
		require.Equal(t, a.pacer, b.pacer, "step %d", i)
		require.Equal(t, rpA.Rate(), rpB.Rate(), "step %d", i)
		require.Equal(t, rpA.bytes, rpB.bytes, "step %d", i)
	}
	assert.NotZero(t, sends)
	assert.NotZero(t, waits, "the pacer held some packets back")
	assert.NotZero(t, rpA.Cuts)
}

// SendTrain is TrySend once per attempt, in one call: two senders, one
// driven attempt by attempt (each send a gap after the last, each held-back
// attempt again when TrySend says), the other by trains of random lengths
// that stop at random times and at the byte counter's increases, with the
// same CNPs and timers between, send at the same times, keep the same
// bucket to the last bit and leave the reaction point in the same state.
// The byte counter is short (64 x 64 bytes; for the paper profile five
// packets exactly) so that trains cross it often;
// the fixed-rate algorithm (not a QuietSender) stops every train after one
// packet.
func TestSenderTrainIsTrySendPerAttempt(t *testing.T) {
	base := time.Unix(0, 0)
	const n, gap = 1082, 86 * time.Nanosecond
	for _, prof := range []string{ProfileMLX5, ProfilePaper, ProfileHPCC, ""} {
		var algA, algB Algorithm
		var rpA, rpB *ReactionPoint
		if prof == "" {
			algA, algB = &fixed{rate: 37 * Gbps}, &fixed{rate: 37 * Gbps}
		} else {
			p, err := Profile(prof, 100*Gbps)
			require.NoError(t, err)
			switch prof {
			case ProfileMLX5:
				require.NoError(t, p.Set("rpg_byte_reset=64"))
			case ProfilePaper: // a counter that packets fill exactly
				require.NoError(t, p.Set("rpg_byte_reset_unit=1"))
				require.NoError(t, p.Set(fmt.Sprintf("rpg_byte_reset=%d", 5*n)))
			}
			rpA, rpB = mustRP(t, p), mustRP(t, p)
			algA, algB = rpA, rpB
		}
		a, err := NewSender(algA, 2*n)
		require.NoError(t, err)
		b, err := NewSender(algB, 2*n)
		require.NoError(t, err)
		// a: one attempt at a time.
		attA, want := time.Duration(17), []TrainSend(nil)
		afterA := time.Duration(-1)
		attB, afterB := attA, afterA
		var got []TrainSend
		rng := uint64(12345)
		rnd := func(k uint64) time.Duration {
			rng = rng*6364136223846793005 + 1442695040888963407
			return time.Duration((rng >> 33) % k)
		}
		var trains, acted int
		for now := time.Duration(0); now < 3*time.Millisecond; {
			stop := now + 1 + rnd(20000)
			// The reference, attempt by attempt, up to stop.
			for attA < stop {
				if w := a.TrySend(base.Add(attA), n); w > 0 {
					afterA, attA = attA, attA+w
					continue
				}
				want = append(want, TrainSend{At: attA, After: afterA})
				afterA, attA = attA, attA+gap
			}
			// Trains up to stop.
			for attB < stop {
				var stopped bool
				attB, afterB, stopped, got = b.SendTrain(base, attB, afterB, stop, gap, n, 1+int(rnd(300)), got)
				trains++
				if stopped {
					acted++
				}
			}
			require.Equal(t, want, got, "%s: sends up to %v", prof, stop)
			require.Equal(t, attA, attB, prof)
			require.Equal(t, afterA, afterB, prof)
			require.Equal(t, a.pacer, b.pacer, prof)
			if rpA != nil {
				require.Equal(t, *rpA, *rpB, prof)
			} else {
				require.Equal(t, algA, algB)
			}
			now = stop
			// The timers due, and a CNP one time in forty (every 400 us on average), for both.
			if d := a.Deadline(); !d.IsZero() && !d.After(base.Add(now)) {
				a.OnTimeout(base.Add(now))
				b.OnTimeout(base.Add(now))
			}
			if rnd(40) == 0 {
				a.OnCNP(base.Add(now))
				b.OnCNP(base.Add(now))
			}
		}
		t.Logf("%s: %d packets, %d trains, %d stopped for the algorithm", prof, len(got), trains, acted)
		assert.Greater(t, len(got), 1000, prof)
		if prof != ProfileHPCC { // HPCC has no byte counter
			assert.NotZero(t, acted, prof)
		}
		if rpA != nil {
			assert.NotZero(t, rpA.Cuts, prof)
			assert.NotZero(t, rpA.Increases, prof)
		}
	}
}
