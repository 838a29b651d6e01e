// Package cm implements the InfiniBand communication manager (IBTA Vol. 1
// chapter 12) as RoCEv2 peers run it over QP1, with the RDMA IP CM
// service of Annex A11 that rdma_cm (librdmacm: rping, perftest -R)
// speaks, and Linux's drivers/infiniband/core/cm.c and cma.c as the
// reference where the specification leaves a choice open.
//
// # Messages
//
// Header is the 24-byte MAD header (base version 1, class 0x07, class
// version 2, method Send). REQ, MRA, REJ, REP, RTU, DREQ and DREP are the
// seven connection messages, each a Message with AppendData and
// DecodeData over the 232 data bytes that follow the header; AppendMAD
// and DecodeMAD make and read a whole 256-byte MAD. IPHeader is rdma_cm's
// header at the start of a REQ's private data (IP version, source port,
// addresses) and ServiceID builds the service ID of an rdma_cm port
// (0x0000000001, the port space, the port).
//
// # Connections
//
// A Manager is the CM of one device. It is sans-IO, as packages qp and
// cc: it never reads a clock, sleeps or starts a goroutine; every call
// that may start a timer takes now, and Deadline says when HandleTimeout
// must run next. Listen registers a service ID; Dial starts a connection
// (active side: IDLE -> REQ_SENT -> ESTABLISHED), Accept or Reject
// answers EventConnectRequest (passive side: REQ_RCVD -> REP_SENT ->
// ESTABLISHED), Abandon withdraws a connection not yet established with a
// REJ (the consumer gave up, as Linux's cm_destroy_id), Disconnect sends a
// DREQ (DREQ_SENT -> TIMEWAIT -> IDLE);
// a DREQ from the peer is answered with a DREP at once (TIMEWAIT). REQs,
// REPs and DREQs are resent after the CM response timeout (4.096 us *
// 2^timeout plus two packet lifetimes) up to MaxCMRetries times; then a
// REJ with reason timeout goes out (REQ, REP) or the connection enters
// TIMEWAIT (DREQ). A REQ for a service nobody listens on is answered at
// once with a REJ, reason 8 (invalid service ID); every other check a REQ
// can fail also runs before the consumer sees it, with Linux's reasons:
// a primary path GID that is not in Config.LocalGIDs (12, invalid GID,
// cm.c cm_req_handler), a QP type the rdma_cm port space has not (a UC
// REQ to RDMA_PS_TCP) and an IP CM header that is malformed or names
// another destination (28, consumer defined, as cma.c's REQ handler
// fails and cm_destroy_id rejects). AcceptParams.Apply moves the QP
// before the REP is queued; when it fails a REJ (28) goes out instead,
// as rdma_accept. A duplicate REQ while the consumer has not answered
// gets an MRA (service timeout Config.MRAServiceTimeout, 24 as Linux's
// CM_MRA_SETTING): Linux's rdma_cm asks cm.c to MRA a REQ it handed to
// the user only when a duplicate comes (CMA_CM_MRA_SETTING with
// IB_CM_MRA_FLAG_DELAY, ib_prepare_cm_mra in newer kernels), so a slow
// Accept is covered once the active side resends its REQ after its
// response timeout. Malformed MADs,
// unknown attributes and messages for no connection are dropped and
// counted (Counters).
//
// QPParams are the negotiated values (QPNs, PSNs, path MTU, READ/atomic
// depths, retry and RNR retry counts, local ACK timeout, address); its
// RTRAttr and RTSAttr are the qp.Attr of the INIT->RTR and RTR->RTS
// transitions, and Apply makes both on a qp.QP.
//
// # Wiring it to a transport
//
// A driver gives the device a UD QP1 (qp.InitAttr{QPType: qp.IBV_QPT_UD,
// QPN: 1}, Q_Key bth.GSIQKey) with receive buffers of qp.GRHLen+MADLen
// bytes, and one Manager, and serialises calls on them with the QPs:
//
//   - a receive completion of QP1 carries one MAD: call
//     Manager.HandleMAD(now, wc.SrcAddr.Addr(), buf[qp.GRHLen:wc.ByteLen])
//     and post the buffer again;
//   - after every call into the Manager, send each Manager.PollMAD as a
//     SEND from QP1 to QPN 1 with RemoteQKey bth.GSIQKey, its AH to
//     Outgoing.To (UDP port 4791);
//   - handle each Manager.PollEvent: on EventConnectRequest create an RC
//     QP, move it to INIT and call Accept (or Reject) with an
//     AcceptParams.Apply that moves it to RTR and RTS (the REP is queued
//     only if that worked); give Dial a DialParams.Apply that does the
//     same on the REP (the RTU is queued only if it worked, else a REJ
//     and EventConnectError); on EventDisconnected move the QP to ERR; on
//     EventTimeWaitExit destroy it;
//   - when a QP whose connection is still in REP_SENT receives its first
//     packet (the RTU was lost), call Manager.CommEstablished;
//   - arm one timer at Manager.Deadline and call HandleTimeout when it
//     fires.
//
// Dial is rdma_connect: the driver creates the QP in INIT first and
// passes its QPN; for rdma_cm peers the service ID is
// ServiceID(PortSpaceTCP, port) and SrcPort the local port rdma_cm would
// have bound.
//
// Not implemented: LAP/APR (alternate paths), SIDR (UD service
// resolution), RD, and a REP the active side's consumer could refuse (the
// Manager answers every valid REP with an RTU, as rdma_cm does).
package cm
