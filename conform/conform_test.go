package conform

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/roce-emu/roce-emu/transport"
)

func runSelf(t *testing.T, opts SelfOptions, cases []Case) Report {
	t.Helper()
	s, err := NewSelf(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rep, err := Run(context.Background(), s.Target(), cases, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestSelfPassesEveryCase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rep := runSelf(t, SelfOptions{Seed: 1}, Cases())
		for _, r := range rep.Cases {
			t.Logf("%-30s %-4s %v %s", r.Name, r.Verdict, r.Frames, r.Detail)
			if r.Verdict != Pass {
				t.Errorf("case %s: %s (%s), frames %v", r.Name, r.Verdict, r.Detail, r.Frames)
			}
		}
	})
}

// dropNAKs is a peer Conn that never sends a NAK: a peer broken on
// purpose.
type dropNAKs struct{ transport.Conn }

func (c dropNAKs) WriteBatch(ds []transport.Datagram) (int, error) {
	keep := ds[:0:0]
	for _, d := range ds {
		var p bth.Packet
		if p.Decode(d.Data) == nil && p.BTH.Opcode == bth.RCAcknowledge && !p.AETH.Syndrome.IsACK() {
			continue
		}
		keep = append(keep, d)
	}
	if _, err := c.Conn.WriteBatch(keep); err != nil {
		return 0, err
	}
	return len(ds), nil
}

func verdicts(rep Report) map[string]Verdict {
	m := map[string]Verdict{}
	for _, r := range rep.Cases {
		m[r.Name] = r.Verdict
	}
	return m
}

func TestBrokenPeerFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rep := runSelf(t, SelfOptions{Seed: 2, WrapConn: func(c transport.Conn) transport.Conn { return dropNAKs{c} }}, Cases())
		v := verdicts(rep)
		for _, name := range []string{"psn-sequence-error-nak-once", "first-psn-not-announced", "write-mtu-plus-1",
			"r-key-violation", "bounds-violation", "rnr-nak-no-receive-wqe", "write-middle-short", "write-middle-without-first",
			"read-bounds-violation", "psn-half-windows", "write-permission-violation", "read-permission-violation",
			"max-rd-atomic-exceeded", "misaligned-atomic-cmp-swap", "misaligned-atomic-fetch-add"} {
			if v[name] != Fail {
				t.Errorf("a peer that sends no NAK: case %s is %s, want fail", name, v[name])
			}
		}
		// What needs no NAK from the peer still passes.
		for _, name := range []string{"psn-wrap", "zero-length-read", "zero-length-write-no-r-key", "zero-length-read-no-r-key", "go-back-n", "rnr-timer-code-0",
			"implied-nak-read-response", "implied-nak-ack"} {
			if v[name] != Pass {
				t.Errorf("a peer that sends no NAK: case %s is %s, want pass", name, v[name])
			}
		}
		if rep.Failed == 0 || rep.Passed+rep.Failed+rep.NA != len(Cases()) {
			t.Errorf("report counts %+v", rep)
		}
	})
}

func TestRxeRetryCountFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rep := runSelf(t, SelfOptions{Seed: 3, RxeRetryCount: true}, casesNamed(t, "retry-exhaustion", "go-back-n"))
		if rep.Cases[0].Verdict != Fail || rep.Cases[1].Verdict != Pass {
			t.Errorf("verdicts %+v", rep.Cases)
		}
		if len(rep.Cases[0].Frames) != 29 {
			t.Errorf("evidence of a retransmission without end: %d frames, want the 29 counted", len(rep.Cases[0].Frames))
		}
	})
}

func casesNamed(t *testing.T, names ...string) []Case {
	var cs []Case
	for _, n := range names {
		found := false
		for _, c := range Cases() {
			if c.Name == n {
				cs, found = append(cs, c), true
			}
		}
		if !found {
			t.Fatalf("no case %s", n)
		}
	}
	return cs
}

// TestDocCase runs the case package's doc shows, as it is shown.
func TestDocCase(t *testing.T) {
	c := Case{Name: "rnr-nak-send-imm", IBTA: "IBTA Vol. 1 ch. 9.7 (RNR NAK)", Peer: WriteBW,
		Run: func(t *T) {
			p := t.Request(bth.RCSendOnlyImm, []byte("hello"))
			s := t.send(p)
			if s == nil {
				return // could not send: n/a
			}
			a := t.ackFor(p.BTH.PSN) // the peer's ACK or NAK, within t.Wait
			if a == nil || a.Pkt.AETH.Syndrome.Kind() != bth.KindRNRNAK {
				t.Failf(append(s, a), "want an RNR NAK for PSN %d", p.BTH.PSN)
			}
		}}
	synctest.Test(t, func(t *testing.T) {
		rep := runSelf(t, SelfOptions{}, []Case{c})
		if r := rep.Cases[0]; r.Verdict != Pass || len(r.Frames) != 0 {
			t.Errorf("%+v", r)
		}
	})
}

// TestCaptureFrames checks that the frames a Result cites are those of its
// capture: the NAKs of the sequence-error case (one per gap) and the NAK
// go-back-n sends are the capture's only NAKs, and they are cited.
func TestCaptureFrames(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		s, err := NewSelf(SelfOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rep, err := Run(context.Background(), s.Target(), casesNamed(t, "psn-sequence-error-nak-once", "go-back-n"), Options{PcapDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Cases {
			if r.Verdict != Pass || r.Capture == "" {
				t.Fatalf("%+v", r)
			}
			frames := readCapture(t, r.Capture)
			cited := map[int]bool{}
			for _, n := range r.Frames {
				if n < 1 || n > len(frames) {
					t.Fatalf("%s cites frame %d of %d", r.Name, n, len(frames))
				}
				cited[n] = true
			}
			naks := 0
			for i, p := range frames {
				if p.BTH.Opcode == bth.RCAcknowledge && !p.AETH.Syndrome.IsACK() {
					naks++
					if !cited[i+1] {
						t.Errorf("%s: the NAK in frame %d is not cited (%v)", r.Name, i+1, r.Frames)
					}
				}
			}
			want := map[string]int{"psn-sequence-error-nak-once": 2, "go-back-n": 1}[r.Name] // two gaps; one NAK of ours
			if naks != want {
				t.Errorf("%s: %d NAKs in the capture, want %d", r.Name, naks, want)
			}
		}
	})
}

// readCapture decodes the RoCEv2 packets of a capture of IPv4 frames.
func readCapture(t *testing.T, path string) []bth.Packet {
	t.Helper()
	r, err := pcap.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var ps []bth.Packet
	for {
		data, _, _, err := r.Next()
		if err == io.EOF {
			return ps
		}
		if err != nil {
			t.Fatal(err)
		}
		var p bth.Packet
		if err := p.Decode(data[bth.EthernetLen+bth.IPv4Len+bth.UDPLen:]); err != nil {
			t.Fatalf("frame %d: %v", len(ps)+1, err)
		}
		ps = append(ps, p)
	}
}

// forgetful is a peer Conn that takes every duplicate request for a new
// one: it rewrites a request's PSN that is not past the last one seen on
// its QP to the next one (re-encoding the ICRC), as a responder that
// executes duplicates again would see them.
type forgetful struct {
	transport.Conn
	next map[uint32]bth.PSN
}

func (c *forgetful) ReadBatch(ds []transport.Datagram) (int, error) {
	n, err := c.Conn.ReadBatch(ds)
	for i := range n {
		d := &ds[i]
		var p bth.Packet
		if p.Decode(d.Data) != nil || p.BTH.Opcode == bth.RCAcknowledge || p.BTH.Opcode == bth.CNP {
			continue
		}
		next, seen := c.next[p.BTH.DestQP]
		if seen && p.BTH.PSN.Before(next) {
			p.BTH.PSN = next
			enc := bth.Encap{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port()}
			if b, err := p.Append(nil, &enc); err == nil {
				d.Data = append(d.Data[:0], b...)
			}
		}
		if !seen || !p.BTH.PSN.Before(next) {
			npkts := 1
			if p.BTH.Opcode == bth.RCReadRequest {
				npkts = max(1, (int(p.RETH.DMALength)+1023)/1024)
			}
			c.next[p.BTH.DestQP] = p.BTH.PSN.Add(npkts)
		}
	}
	return n, err
}

func TestForgetfulPeerFailsDuplicates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wrap := func(c transport.Conn) transport.Conn { return &forgetful{Conn: c, next: map[uint32]bth.PSN{}} }
		dups := []string{"psn-half-windows", "duplicate-request-reacked", "duplicate-write-not-reexecuted", "duplicate-send-not-redelivered", "duplicate-read-reexecuted"}
		rep := runSelf(t, SelfOptions{Seed: 4, WrapConn: wrap}, casesNamed(t, append(dups, "psn-wrap", "write-segmented")...))
		for i, r := range rep.Cases {
			want := Fail
			if i >= len(dups) {
				want = Pass
			}
			t.Logf("%s: %s: %s", r.Name, r.Verdict, r.Detail)
			if r.Verdict != want {
				t.Errorf("a peer that executes duplicates again: %s is %s (%s), want %s", r.Name, r.Verdict, r.Detail, want)
			}
		}
	})
}

// A peer program that is not there is n/a; one that does not answer is
// n/a and counted as not run; a broken exchange too.
func TestNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := NewSelf(SelfOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tgt := s.Target()
		selfDial := tgt.Dial
		tgt.Dial = func(ctx context.Context, p Peer) (net.Conn, error) {
			switch p {
			case ReadBW:
				return nil, ErrNoPeer
			case Pingpong:
				return nil, errors.New("connection refused")
			}
			c, err := selfDial(ctx, p)
			if err != nil {
				return nil, err
			}
			c.Write([]byte("garbage"))
			return c, nil
		}
		rep, err := Run(context.Background(), tgt, casesNamed(t, "zero-length-read", "go-back-n", "psn-wrap"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.NA != 3 || rep.NotRun != 2 {
			t.Errorf("report %+v", rep)
		}
		for i, want := range []string{"not run: the target runs no ib_read_bw", "not run: cannot reach ibv_rc_pingpong: connection refused", "not run: ib_write_bw's exchange: "} {
			if r := rep.Cases[i]; r.Verdict != NA || !strings.HasPrefix(r.Detail, want) {
				t.Errorf("case %s: %s %q, want n/a %q", r.Name, r.Verdict, r.Detail, want)
			}
		}
	})
}
