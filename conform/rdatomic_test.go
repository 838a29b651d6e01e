package conform

import (
	"context"
	"net"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/transport"
)

// deafRequester is a peer Conn that never hears a response to its own
// requests (READ responses and ACKs are dropped before its QP sees them):
// a requester without the implied NAK, which resends only when its ACK
// timer runs out.
type deafRequester struct{ transport.Conn }

func (c deafRequester) ReadBatch(ds []transport.Datagram) (int, error) {
	for {
		n, err := c.Conn.ReadBatch(ds)
		keep := 0
		for i := range n {
			var p bth.Packet
			if p.Decode(ds[i].Data) == nil {
				if info := p.BTH.Opcode.Info(); info != nil && (info.Op == bth.OpReadResponse || info.Op == bth.OpAcknowledge) {
					continue
				}
			}
			ds[keep], ds[i] = ds[i], ds[keep]
			keep++
		}
		if keep > 0 || err != nil {
			return keep, err
		}
	}
}

func TestImpliedNAKLateResendFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wrap := func(c transport.Conn) transport.Conn { return deafRequester{c} }
		rep := runSelf(t, SelfOptions{Seed: 5, WrapConn: wrap}, casesNamed(t, "implied-nak-read-response", "implied-nak-ack"))
		for _, r := range rep.Cases {
			t.Logf("%s: %s %v %s", r.Name, r.Verdict, r.Frames, r.Detail)
			// The READ comes again on the ACK timer (timeout 14, 67 ms).
			if r.Verdict != Fail || !strings.Contains(r.Detail, "its ACK timer, not the implied NAK") || len(r.Frames) != 3 {
				t.Errorf("a requester without the implied NAK: %s is %s (%s) %v, want fail with 3 frames", r.Name, r.Verdict, r.Detail, r.Frames)
			}
		}
	})
}

// A requester with the implied NAK and a short ACK timer (timeout code 8,
// about 1 ms) passes.
func TestImpliedNAKShortTimerPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rep := runSelf(t, SelfOptions{Seed: 9, ACKTimeout: 8}, casesNamed(t, "implied-nak-read-response", "implied-nak-ack"))
		for _, r := range rep.Cases {
			t.Logf("%s: %s %v %s", r.Name, r.Verdict, r.Frames, r.Detail)
			if r.Verdict != Pass {
				t.Errorf("%s is %s (%s), want pass", r.Name, r.Verdict, r.Detail)
			}
		}
	})
}

// Against programs that do not grant what the cases need, they are n/a
// with the reason: ib_write_bw's QP takes no atomics; ib_read_bw (not -b)
// issues no READ.
func TestRdAtomicCasesNotApplicable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := NewSelf(SelfOptions{Seed: 6})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tgt := s.Target()
		selfDial := tgt.Dial
		tgt.Dial = func(ctx context.Context, p Peer) (net.Conn, error) {
			return selfDial(ctx, map[Peer]Peer{AtomicBW: WriteBW, ReadBWBidir: ReadBW}[p])
		}
		rep, err := Run(context.Background(), tgt, casesNamed(t, "misaligned-atomic-fetch-add", "implied-nak-ack"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"the peer's QP or region takes no atomics: an aligned FETCH_AND_ADD got", "not run: the peer sent 0 READ requests"} {
			if r := rep.Cases[i]; r.Verdict != NA || !strings.HasPrefix(r.Detail, want) {
				t.Errorf("case %s: %s %q, want n/a %q", r.Name, r.Verdict, r.Detail, want)
			}
		}
		if rep.NotRun != 1 {
			t.Errorf("report %+v: want the READ-less peer's case counted as not run", rep)
		}
	})
}

// A peer whose QP takes 16 READs at once but that announces 4 answers the
// fifth of a burst: max-rd-atomic-exceeded fails, after its five bursts.
func TestRdAtomicAnsweredBeyondFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rep := runSelf(t, SelfOptions{Seed: 7, AnnouncedOutReads: 4}, casesNamed(t, "max-rd-atomic-exceeded"))
		r := rep.Cases[0]
		t.Logf("%s %v %s", r.Verdict, r.Frames, r.Detail)
		if r.Verdict != Fail || !strings.Contains(r.Detail, "READ 5, beyond the peer's max_dest_rd_atomic 4, was answered") || !strings.Contains(r.Detail, "in each of 5 bursts") {
			t.Errorf("verdict %s (%s), want fail", r.Verdict, r.Detail)
		}
		// The last burst's READ 5 and its answer: 5 bursts of 5 READs and
		// 5 answers.
		if len(r.Frames) != 2 || r.Frames[0] != 45 || r.Frames[1] != 50 {
			t.Errorf("frames %v, want [45 50]", r.Frames)
		}
	})
}

// dropSecondReadResponse is a peer Conn that loses the READ response at
// the second PSN it answers: a responder that NAKs the READ beyond its
// limit but leaves one within it unanswered.
type dropSecondReadResponse struct {
	transport.Conn
	seen *int
}

func (c dropSecondReadResponse) WriteBatch(ds []transport.Datagram) (int, error) {
	keep := ds[:0:0]
	for _, d := range ds {
		var p bth.Packet
		if p.Decode(d.Data) == nil && p.BTH.Opcode == bth.RCReadResponseOnly {
			if *c.seen++; *c.seen == 2 {
				continue
			}
		}
		keep = append(keep, d)
	}
	if _, err := c.Conn.WriteBatch(keep); err != nil {
		return 0, err
	}
	return len(ds), nil
}

// A responder that NAKs the READ beyond its limit but has not answered a
// READ within it fails max-rd-atomic-exceeded, naming that READ.
func TestRdAtomicUnansweredWithinFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen int
		wrap := func(c transport.Conn) transport.Conn { return dropSecondReadResponse{c, &seen} }
		rep := runSelf(t, SelfOptions{Seed: 8, WrapConn: wrap}, casesNamed(t, "max-rd-atomic-exceeded"))
		r := rep.Cases[0]
		t.Logf("%s %v %s", r.Verdict, r.Frames, r.Detail)
		if r.Verdict != Fail || !strings.Contains(r.Detail, "READ 2 of ") || !strings.Contains(r.Detail, "got no 8-byte READ response before the NAK") {
			t.Errorf("verdict %s (%s), want fail naming READ 2", r.Verdict, r.Detail)
		}
	})
}
