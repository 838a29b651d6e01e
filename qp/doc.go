// Package qp implements InfiniBand Reliable Connected queue pairs as RoCEv2
// carries them (IBTA Vol. 1 chapters 9 and 10, Annex A17), with Linux
// soft-RoCE (drivers/infiniband/sw/rxe) as the reference for behaviour the
// specification leaves open.
//
// The package is sans-IO: it never reads a clock, sleeps or starts a
// goroutine. Every event takes the current time as an argument:
//
//   - QP.HandlePacket(now, pkt, ecn) feeds a received packet;
//   - QP.NextPacket(now, out) hands out the next packet to transmit;
//   - QP.Deadline() reports when the QP next needs QP.HandleTimeout(now).
//
// A driver (package transport) owns sockets and timers and calls these.
// Verbs-like objects (protection domains, memory regions, completion
// queues) are plain values; none of them is safe for concurrent use, so a
// driver serialises calls on the QPs, CQs and MRs of one endpoint.
package qp
