// Package qp implements InfiniBand Reliable Connected, Unreliable
// Connected and Unreliable Datagram queue pairs as RoCEv2 carries them
// (IBTA Vol. 1 chapters 9 and 10, Annex A17), with Linux soft-RoCE
// (drivers/infiniband/sw/rxe) as the reference for behaviour the
// specification leaves open.
//
// The package is sans-IO: it never reads a clock, sleeps or starts a
// goroutine. Every event takes the current time as an argument:
//
//   - QP.HandlePacket(now, pkt, ecn) feeds a received packet, or
//     QP.HandleReceived(now, pkt, info) with its IP and UDP headers' facts;
//   - QP.NextPacket(now, out) hands out the next packet to transmit;
//   - QP.Deadline() reports when the QP next needs QP.HandleTimeout(now).
//
// A driver (package transport) owns sockets and timers and calls these.
// Verbs-like objects (a Device with its protection domains and memory
// regions, completion queues) are plain values; none of them is safe for
// concurrent use, so a driver serialises calls on the QPs, CQs, PDs and
// MRs of one device. A Device hands out QPNs, L_Keys/R_Keys and memory
// region addresses: keys are unique across the PDs of one device, and
// two devices number independently.
//
// # Structure
//
// A QP holds the state machine (Modify), its attributes, the verbs entry
// points (PostSend, PostRecv) and the dispatch of packets and timers to
// three halves, as rxe splits rxe_req.c, rxe_comp.c and rxe_resp.c:
//
//   - the requester (requester.go) owns the send queue: segmentation,
//     PSN assignment, pacing, and where go-back-N resumes;
//   - the completer (completer.go) takes ACKs, NAKs, READ responses and
//     atomic ACKs, writes send completions, and runs the local ACK timer
//     and the retry counters;
//   - the responder (responder.go) owns the receive queue: placement of
//     SEND and WRITE data, READ and atomic execution, duplicates, and the
//     queue of ACKs, NAKs and responses it sends back.
//
// What depends on the transport service goes through one internal
// interface, service (service.go), whose Reliable Connected
// implementation is rcService: which opcodes are valid (the BTH opcode
// class, IBTA 9.2.1, and the work request opcodes), the responder's PSN
// check, and acknowledgement (AckReq and the ACK timer at the requester;
// ACK, RNR NAK and NAK-and-ERR at the responder).
//
// Unreliable Connected and Unreliable Datagram are the other two
// implementations of service (unreliable.go), chosen in New from
// InitAttr.QPType (ibv_qp_init_attr.qp_type). A UC service's opcode table
// holds the UC class (0x20-0x3F: SEND and RDMA WRITE only) and its
// postable refuses READ and atomics; its outOfSequence abandons the
// message in progress on a gap and resynchronises on the next First/Only
// instead of NAKing (as rxe's check_psn does for IB_QPT_UC); its
// requestSent completes a WQE when its last packet leaves, so the
// completer never runs; its ackRequested sends nothing, and noReceiveWQE
// and reject drop the message (a receive WQE already begun goes back to
// its queue). UD adds to that the DETH (Q_Key, source QPN), one-packet
// messages of at most the MTU, an address per work request (SendWR.AH,
// RemoteQPN, RemoteQKey; QP.SentTo tells a driver where each packet
// goes), PSNs that are not checked, and the GRH slot at the start of each
// receive buffer, rebuilt from the RecvInfo a driver passes to
// QP.HandleReceived (ud.go). QP1, the GSI QP, is a UD QP with QPN 1.
//
// A QP created with an SRQ (srq.go) takes its receive WQEs from it; the
// SRQ's limit event goes to its Device's asynchronous event queue
// (Device.PollEvents).
//
// Every packet a QP drops is counted in exactly one counter named for its
// cause (see Counters and Counters.Drops); Counters.Refusals lists them
// with the requests the QP refused. QP.Err says why a QP is in ERR.
//
// # Responder resources
//
// max_dest_rd_atomic is the number of READ and atomic requests the
// responder answers at once (IBTA 9.7.5.1.x "responder resources"). A new
// one that arrives while that many first answers are still queued is
// NAKed Invalid Request and the QP goes to ERR (Counters.
// RespRdAtomicExceeded); with 0 every READ and atomic is refused. rxe
// (rxe_resp.c, check_resource) refuses them with
// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, NAK Invalid Request and
// IB_WC_REM_INV_REQ_ERR, only when max_dest_rd_atomic is 0; otherwise it
// leaves "the requester's job" to the requester and recycles its resource
// ring, but it answers one READ at a time (get_req goes back to
// READ_REPLY while a response is under way, one packet per pass, before
// it looks at the next request), so its memory never holds more than one
// response packet. Here responses are handed out a packet at a time from
// the memory region too, and the refusal bounds how many are queued: a
// peer that keeps to the max_rd_atomic it was given is never refused,
// one that floods READs ends its QP. The answers queued before the NAK,
// to requests within the limit, still go out ahead of it, in PSN order,
// as rxe's have left by the time it takes the next request. Duplicates
// are answered from the
// last max_dest_rd_atomic requests remembered, as rxe's find_resource
// does (IBTA 9.7.5.1.2), each replacing an answer to the same request
// still queued.
package qp
