// Package rdmacm connects RC queue pairs of a transport.Endpoint as
// librdmacm's rdma_cm does: the communication manager of package cm (IBTA
// Vol. 1 chapter 12, with the RDMA IP CM service of Annex A11) run over the
// Endpoint's QP1, with listen/accept and dial that give a connected QP.
//
// A Service owns QP1 of one Endpoint: it keeps receive WQEs posted on it,
// hands each MAD received (after the 40-byte GRH slot) to a cm.Manager with
// its source address, sends what the Manager queues as UD SENDs to the
// peer's QP1 with Q_Key 0x80010000, and runs the Manager's timers on the
// Service's clock. It starts one goroutine (QP1's completions) and one
// timer; Close stops both.
//
// Listen(port) is rdma_bind_addr + rdma_listen on an rdma_cm TCP port
// (service ID 0x0000000001060000 | port); Listener.Accept waits for a REQ,
// creates the RC QP, moves it through INIT, RTR and RTS with the negotiated
// values (cm.QPParams) and answers with a REP, then waits for the RTU, as
// rdma_get_request + rdma_accept. Dial is rdma_resolve_addr +
// rdma_connect: it creates the QP, sends the REQ, and on the REP moves the
// QP to RTS and sends the RTU. Conn.Disconnect is rdma_disconnect (the QP
// goes to ERR, a DREQ goes out, the DREP is awaited); Conn.Close destroys
// the QP as rdma_destroy_qp.
//
// Every check a REQ can fail runs before a REP can go out (package cm:
// the GID is the Service's address, rdma_cm's TCP port space takes RC
// only, the IP CM header is well-formed and names this address), and
// Accept moves the QP to RTS before the REP is queued; a request that
// fails gets a REJ with Linux's reason and Accept takes the next one
// (Stats.AcceptFailures). Dial moves its QP on the REP before the RTU is
// queued; a REP the QP cannot take gets a REJ and Dial fails with
// ErrConnectError. A slow Accept is covered by an MRA once the peer resends
// its REQ, as Linux's CM does.
//
// A connection attempt that fails before Dial or Accept returns it (the
// peer rejects the REQ or the REP, never answers, or the caller's context
// ends) has its QP destroyed, not moved to ERR: the receive WQEs posted
// for it (ConnParams.RecvWRs) go without completions, as after a failed
// rdma_connect or rdma_accept the application destroys the QP (rping
// destroys its child cm_id's QP and CQ). A caller may thus give the same
// CQs to its next Dial or Accept: nothing of the failed attempt is in them.
// An attempt whose context ends first is withdrawn with a REJ to the peer
// (reason timeout for our REQ, consumer defined for our REP), as
// rdma_destroy_id does at a program's exit (Stats.Abandoned); Service.Drain
// waits until such MADs have left, before Close. A DREQ before the RTU
// fails that attempt (ErrPeerDisconnected) and Accept takes the next
// request.
//
// The communication-established event (IBTA 11.6.3.1, IBV_EVENT_COMM_EST)
// that tells a passive side its peer is sending before the RTU came: the
// transport raises no such event, so while an accepted connection waits
// for its RTU the Service looks at its QP's received-packet counter every
// Config.CommEstPoll and calls cm.Manager.CommEstablished when it moved.
package rdmacm
