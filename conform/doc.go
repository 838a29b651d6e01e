// Package conform runs IBTA transport conformance cases (InfiniBand
// Architecture Specification Vol. 1, chapter 9, as RoCEv2 carries it)
// against a live RC peer and gives each a verdict: pass, fail or n/a, with
// the evidence as frame numbers of the case's capture.
//
// The prober is not a queue pair. A [Driver] sends whatever [bth.Packet] a
// case crafts (the ICRC computed for the headers it travels in, see
// bth.Encap), withholds, repeats, delays or forges packets, and reads the
// peer's answers with deadlines. The peer is whatever speaks an
// out-of-band exchange the prober speaks as client (package oob): a QP
// and, for perftest, a memory region are made by the peer's own program,
// ibv_rc_pingpong's server or a perftest server (ib_write_bw, ib_read_bw,
// ib_atomic_bw, ib_read_bw -b: [Peer]), one connection per case. [Self] is roce-emu itself as that peer on an
// in-memory transport.Network; everything, waits included, runs under
// testing/synctest, where a case of seconds takes microseconds.
//
// # Adding a case
//
// A case is a [Case] in the list [Cases] returns: a name, the IBTA section
// it checks, the peer program it needs, and a Run function that drives the
// [T] it is given (a Driver with the PSNs, QPNs and R_Key of the exchange)
// and calls t.Failf with the frames that show a departure. For example,
// that a SEND with immediate data and no receive WQE is RNR NAKed:
//
//	{Name: "rnr-nak-send-imm", IBTA: "IBTA Vol. 1 ch. 9.7 (RNR NAK)", Peer: WriteBW,
//		Run: func(t *T) {
//			p := t.Request(bth.RCSendOnlyImm, []byte("hello"))
//			s := t.send(p)
//			if s == nil {
//				return // could not send: n/a
//			}
//			a := t.ackFor(p.BTH.PSN) // the peer's ACK or NAK, within t.Wait
//			if a == nil || a.Pkt.AETH.Syndrome.Kind() != bth.KindRNRNAK {
//				t.Failf(append(s, a), "want an RNR NAK for PSN %d", p.BTH.PSN)
//			}
//		}},
//
// then add it to docs/conform.md's table (TestSelfPassesEveryCase
// requires that roce-emu passes it), with a test that a broken Self fails
// it. docs/conform.md lists the steps, a new peer program's included.
//
// Waits are bounded by Target.Wait and Target.Quiet, memory by a queue of
// 4096 unread packets per case; a peer that floods or stays silent costs no
// more. Received ICRCs are not checked (a live peer's IP ID is not seen).
package conform
