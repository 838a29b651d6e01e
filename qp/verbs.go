package qp

import (
	"fmt"
	"strconv"
)

// State is a QP state (IBTA 10.3.1), named as ibv_qp_state.
type State uint8

// QP states.
const (
	IBV_QPS_RESET State = iota
	IBV_QPS_INIT
	IBV_QPS_RTR
	IBV_QPS_RTS
	IBV_QPS_SQD
	IBV_QPS_SQE
	IBV_QPS_ERR
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns "RESET", "INIT", "RTR", "RTS", "SQD", "SQE" or "ERR".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// MTU is a path MTU code as in ibv_mtu: 1 = 256 bytes ... 5 = 4096 bytes.
type MTU uint8

// Path MTUs (IBTA 7.7.9 / ibv_mtu).
const (
	IBV_MTU_256  MTU = 1
	IBV_MTU_512  MTU = 2
	IBV_MTU_1024 MTU = 3
	IBV_MTU_2048 MTU = 4
	IBV_MTU_4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid code.
func (m MTU) Bytes() int {
	if m < IBV_MTU_256 || m > IBV_MTU_4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the code for 256, 512, 1024, 2048 or 4096 bytes.
func MTUFromBytes(n int) (MTU, error) {
	for m := IBV_MTU_256; m <= IBV_MTU_4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("qp: path MTU %d is not one of 256, 512, 1024, 2048, 4096", n)
}

// String returns the size in bytes, e.g. "1024".
func (m MTU) String() string { return strconv.Itoa(m.Bytes()) }

// Access is a set of memory region and QP access flags, as ibv_access_flags.
type Access uint32

// Access flags.
const (
	IBV_ACCESS_LOCAL_WRITE   Access = 1
	IBV_ACCESS_REMOTE_WRITE  Access = 2
	IBV_ACCESS_REMOTE_READ   Access = 4
	IBV_ACCESS_REMOTE_ATOMIC Access = 8
)

// String lists the flags, e.g. "LOCAL_WRITE|REMOTE_READ".
func (a Access) String() string {
	s := ""
	for i, n := range []string{"LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC"} {
		if a&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if s == "" {
		return "0"
	}
	return s
}

// WROpcode is a send work request opcode, as ibv_wr_opcode.
type WROpcode uint8

// Send work request opcodes.
const (
	IBV_WR_RDMA_WRITE WROpcode = iota
	IBV_WR_RDMA_WRITE_WITH_IMM
	IBV_WR_SEND
	IBV_WR_SEND_WITH_IMM
	IBV_WR_RDMA_READ
	IBV_WR_ATOMIC_CMP_AND_SWP
	IBV_WR_ATOMIC_FETCH_AND_ADD
	IBV_WR_SEND_WITH_INV
)

var wrNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "SEND_WITH_INV"}

// String returns the name without the IBV_WR_ prefix.
func (o WROpcode) String() string {
	if int(o) < len(wrNames) {
		return wrNames[o]
	}
	return "WROpcode(" + strconv.Itoa(int(o)) + ")"
}

// WCOpcode is a work completion opcode, as ibv_wc_opcode.
type WCOpcode uint8

// Work completion opcodes (the values of ibv_wc_opcode).
const (
	IBV_WC_SEND               WCOpcode = 0
	IBV_WC_RDMA_WRITE         WCOpcode = 1
	IBV_WC_RDMA_READ          WCOpcode = 2
	IBV_WC_COMP_SWAP          WCOpcode = 3
	IBV_WC_FETCH_ADD          WCOpcode = 4
	IBV_WC_RECV               WCOpcode = 128
	IBV_WC_RECV_RDMA_WITH_IMM WCOpcode = 129
)

// String returns the name without the IBV_WC_ prefix.
func (o WCOpcode) String() string {
	switch o {
	case IBV_WC_SEND:
		return "SEND"
	case IBV_WC_RDMA_WRITE:
		return "RDMA_WRITE"
	case IBV_WC_RDMA_READ:
		return "RDMA_READ"
	case IBV_WC_COMP_SWAP:
		return "COMP_SWAP"
	case IBV_WC_FETCH_ADD:
		return "FETCH_ADD"
	case IBV_WC_RECV:
		return "RECV"
	case IBV_WC_RECV_RDMA_WITH_IMM:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WCOpcode(" + strconv.Itoa(int(o)) + ")"
}

// WCStatus is a work completion status, as ibv_wc_status.
type WCStatus uint8

// Work completion statuses (the values of ibv_wc_status).
const (
	IBV_WC_SUCCESS            WCStatus = 0
	IBV_WC_LOC_LEN_ERR        WCStatus = 1
	IBV_WC_LOC_QP_OP_ERR      WCStatus = 2
	IBV_WC_LOC_EEC_OP_ERR     WCStatus = 3
	IBV_WC_LOC_PROT_ERR       WCStatus = 4
	IBV_WC_WR_FLUSH_ERR       WCStatus = 5
	IBV_WC_MW_BIND_ERR        WCStatus = 6
	IBV_WC_BAD_RESP_ERR       WCStatus = 7
	IBV_WC_LOC_ACCESS_ERR     WCStatus = 8
	IBV_WC_REM_INV_REQ_ERR    WCStatus = 9
	IBV_WC_REM_ACCESS_ERR     WCStatus = 10
	IBV_WC_REM_OP_ERR         WCStatus = 11
	IBV_WC_RETRY_EXC_ERR      WCStatus = 12
	IBV_WC_RNR_RETRY_EXC_ERR  WCStatus = 13
	IBV_WC_LOC_RDD_VIOL_ERR   WCStatus = 14
	IBV_WC_REM_INV_RD_REQ_ERR WCStatus = 15
	IBV_WC_REM_ABORT_ERR      WCStatus = 16
	IBV_WC_INV_EECN_ERR       WCStatus = 17
	IBV_WC_INV_EEC_STATE_ERR  WCStatus = 18
	IBV_WC_FATAL_ERR          WCStatus = 19
	IBV_WC_RESP_TIMEOUT_ERR   WCStatus = 20
	IBV_WC_GENERAL_ERR        WCStatus = 21
)

var statusNames = [...]string{"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
	"REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR"}

// String returns the name as ibv_wc_status_str's enum, e.g. "RETRY_EXC_ERR".
func (s WCStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "WCStatus(" + strconv.Itoa(int(s)) + ")"
}

// SendFlags are ibv_send_flags.
type SendFlags uint8

// Send flags.
const (
	IBV_SEND_FENCE     SendFlags = 1
	IBV_SEND_SIGNALED  SendFlags = 2
	IBV_SEND_SOLICITED SendFlags = 4
	IBV_SEND_INLINE    SendFlags = 8
)
