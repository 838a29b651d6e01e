package qp

// Counters are a QP's event counts. Names follow the mlx5 hardware counters
// (Documentation/ABI/.../infiniband "hw_counters", "ethtool -S" of
// ConnectX) and, where mlx5 has none, rxe's (rxe_hw_counters.c); the JSON
// names are theirs. Counters only grow; a driver may read them at any time
// it holds the QP.
type Counters struct {
	SentPackets     uint64 `json:"sent_pkts"` // rxe: packets handed out by NextPacket
	ReceivedPackets uint64 `json:"rcvd_pkts"` // rxe: packets given to HandlePacket

	// Requester side.
	PacketSeqErr        uint64 `json:"packet_seq_err"`         // mlx5: PSN sequence error NAKs received
	ImpliedNakSeqErr    uint64 `json:"implied_nak_seq_err"`    // mlx5: ACK or response past a READ/atomic whose response was missing
	LocalAckTimeoutErr  uint64 `json:"local_ack_timeout_err"`  // mlx5: local ACK timer expiries
	RNRNakRetryErr      uint64 `json:"rnr_nak_retry_err"`      // mlx5: RNR NAKs received
	RetryExceededErr    uint64 `json:"retry_exceeded_err"`     // rxe: WQEs failed with RETRY_EXC_ERR
	RetryRNRExceeded    uint64 `json:"retry_rnr_exceeded_err"` // rxe: WQEs failed with RNR_RETRY_EXC_ERR
	CompleterRetry      uint64 `json:"completer_retry_err"`    // rxe: go-back-N restarts, whatever the cause
	RetransmittedPkts   uint64 `json:"retransmitted_pkts"`     // request packets sent again after a restart
	ReqRemoteAccessErr  uint64 `json:"req_remote_access_errors"`
	ReqRemoteInvalidReq uint64 `json:"req_remote_invalid_request"`
	ReqRemoteOpErr      uint64 `json:"req_remote_operational_errors"`
	DuplicateResponse   uint64 `json:"duplicate_response"` // responses for PSNs already completed (dropped)

	// Responder side.
	OutOfSequence       uint64 `json:"out_of_sequence"`   // mlx5: requests dropped for a PSN ahead of the expected one
	DuplicateRequest    uint64 `json:"duplicate_request"` // mlx5: requests with a PSN already seen
	SendRNRErr          uint64 `json:"send_rnr_err"`      // rxe: RNR NAKs sent
	NAKsSent            uint64 `json:"naks_sent"`         // NAKs of every code sent (PSN sequence, invalid request, access, operational)
	RespRemoteAccessErr uint64 `json:"resp_remote_access_errors"`
	RespInvalidRequest  uint64 `json:"resp_remote_invalid_request"`
	RespLocalLengthErr  uint64 `json:"resp_local_length_error"`
	RxReadRequests      uint64 `json:"rx_read_requests"`
	RxWriteRequests     uint64 `json:"rx_write_requests"`
	RxAtomicRequests    uint64 `json:"rx_atomic_requests"`
	RxSendRequests      uint64 `json:"rx_send_requests"`

	// DCQCN (names as mlx5's).
	NPECNMarked  uint64 `json:"np_ecn_marked_roce_packets"` // CE-marked packets received as the data's target
	NPCNPSent    uint64 `json:"np_cnp_sent"`
	RPCNPHandled uint64 `json:"rp_cnp_handled"`
	RPCNPIgnored uint64 `json:"rp_cnp_ignored"`

	// Either side.
	Dropped uint64 `json:"rx_dropped"` // packets dropped for QP state, P_Key, opcode class or a response with nothing outstanding
}
