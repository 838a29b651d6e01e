package qp

// Counters are a QP's event counts. Names follow the mlx5 hardware counters
// (Documentation/ABI/.../infiniband "hw_counters", "ethtool -S" of
// ConnectX) and, where mlx5 has none, rxe's (rxe_hw_counters.c); the JSON
// names are theirs. Counters only grow; a driver may read them at any time
// it holds the QP.
//
// Every packet the QP drops, and every response it cannot queue, is
// counted in exactly one of the drop counters, one per cause; Drops sums
// them. The drop counters are marked "drop" below. Other counters count
// events (a duplicate request that is answered again, a NAK received).
type Counters struct {
	SentPackets     uint64 `json:"sent_pkts"` // rxe: packets handed out by NextPacket
	ReceivedPackets uint64 `json:"rcvd_pkts"` // rxe: packets given to HandlePacket

	// Requester and completer.
	PacketSeqErr          uint64 `json:"packet_seq_err"`           // mlx5 (rxe rcvd_seq_err): PSN sequence error NAKs received
	ImpliedNakSeqErr      uint64 `json:"implied_nak_seq_err"`      // mlx5: drop: a response past a READ/atomic, or a READ response past one, whose response was missing; go-back-N starts
	ImpliedNakDuringRetry uint64 `json:"implied_nak_during_retry"` // drop: such a response while a retry is under way (rxe's comp.started_retry; rxe drops these uncounted)
	LocalAckTimeoutErr    uint64 `json:"local_ack_timeout_err"`    // mlx5: local ACK timer expiries
	RNRNakRetryErr        uint64 `json:"rnr_nak_retry_err"`        // mlx5 (rxe rcvd_rnr_err): RNR NAKs received
	RetryExceededErr      uint64 `json:"retry_exceeded_err"`       // rxe: WQEs failed with RETRY_EXC_ERR
	RetryRNRExceeded      uint64 `json:"retry_rnr_exceeded_err"`   // rxe: WQEs failed with RNR_RETRY_EXC_ERR
	CompleterRetry        uint64 `json:"completer_retry_err"`      // rxe: go-back-N restarts, whatever the cause
	RetransmittedPkts     uint64 `json:"retransmitted_pkts"`       // request packets sent again after a restart
	ReqRemoteAccessErr    uint64 `json:"req_remote_access_errors"`
	ReqRemoteInvalidReq   uint64 `json:"req_remote_invalid_request"`
	ReqRemoteOpErr        uint64 `json:"req_remote_operational_errors"`
	DuplicateResponse     uint64 `json:"duplicate_response"`      // drop: a response for PSNs already completed
	UnexpectedResponse    uint64 `json:"unexpected_response"`     // drop: a response with nothing outstanding, or for a PSN never sent
	ResponseMismatch      uint64 `json:"response_mismatch"`       // drop: a response of the wrong kind for the WQE it names (an ACK inside a READ or atomic, an atomic ACK or READ response for another operation)
	ReadResponseMalformed uint64 `json:"read_response_malformed"` // drop: a READ response out of First/Middle/Last order or of the wrong length
	ReservedSyndrome      uint64 `json:"aeth_reserved_syndrome"`  // drop: an AETH with the reserved syndrome kind (IBTA Table 43)

	// Responder.
	OutOfSequence       uint64 `json:"out_of_sequence"`       // mlx5 (rxe out_of_seq_request): drop: a request with a PSN ahead of the expected one (RC: the first of a gap is NAKed; UC: a Middle/Last after a gap, which abandons its message)
	DuplicateRequest    uint64 `json:"duplicate_request"`     // mlx5, rxe: requests with a PSN already seen (answered again, or dropped as below)
	DuplicateNoResource uint64 `json:"duplicate_no_resource"` // drop: a duplicate READ or atomic that matches no remembered responder resource (IBTA class D, rxe drops it)
	SendRNRErr          uint64 `json:"send_rnr_err"`          // rxe: RNR NAKs sent
	NAKsSent            uint64 `json:"naks_sent"`             // NAKs of every code sent (PSN sequence, invalid request, access, operational)
	RespRemoteAccessErr uint64 `json:"resp_remote_access_errors"`
	RespInvalidRequest  uint64 `json:"resp_remote_invalid_request"`
	RespLocalLengthErr  uint64 `json:"resp_local_length_error"`
	// RespRdAtomicExceeded counts READ and atomic requests refused (NAK
	// Invalid Request, the QP to ERR; also counted in RespInvalidRequest)
	// because max_dest_rd_atomic responses were still being sent.
	RespRdAtomicExceeded uint64 `json:"resp_rd_atomic_exceeded"`
	RespQueueFull        uint64 `json:"resp_queue_full"` // drop: an ACK, NAK or READ/atomic response not queued, the responder's output queue being full
	RxReadRequests       uint64 `json:"rx_read_requests"`
	RxWriteRequests      uint64 `json:"rx_write_requests"`
	RxAtomicRequests     uint64 `json:"rx_atomic_requests"`
	RxSendRequests       uint64 `json:"rx_send_requests"`
	// UC and UD.
	OutOfBuffer    uint64 `json:"out_of_buffer"`    // mlx5: drop: a UC or UD message with no receive WQE posted (RC sends an RNR NAK instead)
	DroppedMsgPkts uint64 `json:"dropped_msg_pkts"` // drop: UC/UD: a request the responder cannot execute (its cause counted in a Resp* counter), and the rest of a UC message abandoned after it or after a PSN gap, up to the next First/Only
	QKeyViolations uint64 `json:"qkey_violations"`  // drop: a UD packet whose DETH Q_Key is not the QP's (IBTA 10.2.5; PortCounters have no such counter, rxe drops it uncounted)

	// DCQCN (names as mlx5's).
	NPECNMarked  uint64 `json:"np_ecn_marked_roce_packets"` // CE-marked packets received as the data's target
	NPCNPSent    uint64 `json:"np_cnp_sent"`
	RPCNPHandled uint64 `json:"rp_cnp_handled"`
	RPCNPIgnored uint64 `json:"rp_cnp_ignored"` // drop: CNPs the QP does not act on (no congestion control, or the reaction point ignores it)

	// Either side: the checks before a packet reaches a half.
	OpcodeErr      uint64 `json:"rx_opcode_err"`   // drop: an opcode of another service class (a UC opcode at an RC QP, IBTA C9-43) or none at all
	PKeyViolations uint64 `json:"pkey_violations"` // drop: a P_Key that does not match the QP's (IBTA 9.6.1.1 / PortCounters P_KeyViolations)
	QPStateErr     uint64 `json:"rx_qp_state_err"` // drop: a request before RTR or in ERR, a response outside RTS, SQD and SQE (IBTA 10.3.1)
}

// Drops returns the packets the QP dropped, the sum of the drop counters
// (see Counters).
func (c Counters) Drops() uint64 {
	return c.ImpliedNakSeqErr + c.ImpliedNakDuringRetry + c.DuplicateResponse + c.UnexpectedResponse +
		c.ResponseMismatch + c.ReadResponseMalformed + c.ReservedSyndrome + c.OutOfSequence +
		c.DuplicateNoResource + c.RespQueueFull + c.RPCNPIgnored + c.OpcodeErr + c.PKeyViolations + c.QPStateErr +
		c.OutOfBuffer + c.DroppedMsgPkts + c.QKeyViolations
}

// Count is one counter: its JSON name (as in Counters' tags) and value.
type Count struct {
	Name  string
	Value uint64
}

// Refusals returns the counters of what the QP dropped or refused, each
// cause its own counter, leaving out those at zero: every drop counter
// (see Drops), the requests the responder refused (NAKs by cause, RNR
// NAKs sent), and the requester's work requests the peer refused or the
// retries ran out on. Names are the JSON names, in field order. A driver
// prints them so that a user sees why packets went nowhere.
func (c Counters) Refusals() []Count {
	all := [...]Count{
		{"implied_nak_seq_err", c.ImpliedNakSeqErr},
		{"implied_nak_during_retry", c.ImpliedNakDuringRetry},
		{"retry_exceeded_err", c.RetryExceededErr},
		{"retry_rnr_exceeded_err", c.RetryRNRExceeded},
		{"req_remote_access_errors", c.ReqRemoteAccessErr},
		{"req_remote_invalid_request", c.ReqRemoteInvalidReq},
		{"req_remote_operational_errors", c.ReqRemoteOpErr},
		{"duplicate_response", c.DuplicateResponse},
		{"unexpected_response", c.UnexpectedResponse},
		{"response_mismatch", c.ResponseMismatch},
		{"read_response_malformed", c.ReadResponseMalformed},
		{"aeth_reserved_syndrome", c.ReservedSyndrome},
		{"out_of_sequence", c.OutOfSequence},
		{"duplicate_no_resource", c.DuplicateNoResource},
		{"send_rnr_err", c.SendRNRErr},
		{"resp_remote_access_errors", c.RespRemoteAccessErr},
		{"resp_remote_invalid_request", c.RespInvalidRequest},
		{"resp_local_length_error", c.RespLocalLengthErr},
		{"resp_rd_atomic_exceeded", c.RespRdAtomicExceeded},
		{"resp_queue_full", c.RespQueueFull},
		{"out_of_buffer", c.OutOfBuffer},
		{"dropped_msg_pkts", c.DroppedMsgPkts},
		{"qkey_violations", c.QKeyViolations},
		{"rp_cnp_ignored", c.RPCNPIgnored},
		{"rx_opcode_err", c.OpcodeErr},
		{"pkey_violations", c.PKeyViolations},
		{"rx_qp_state_err", c.QPStateErr},
	}
	var out []Count
	for _, x := range all {
		if x.Value != 0 {
			out = append(out, x)
		}
	}
	return out
}
