package cm

import "time"

// DefaultPacketLifeTime is the packet lifetime exponent Linux's rdma_cm
// gives RoCE paths (CMA_IBOE_PACKET_LIFETIME in cma.c): 4.096 us * 2^18,
// about 1.07 s. The REQs of the rxe captures carry PacketLifeTime+1 = 19
// as their primary local ACK timeout.
const DefaultPacketLifeTime = 18

// DefaultCMResponseTimeout and DefaultMaxCMRetries are rdma_cm's
// (CMA_CM_RESPONSE_TIMEOUT 20, about 4.3 s; CMA_MAX_CM_RETRIES 15).
const (
	DefaultCMResponseTimeout = 20
	DefaultMaxCMRetries      = 15
)

// IBTime converts an IBTA time exponent to a duration: 4.096 us * 2^x
// (IBTA 12.6.5 CM response timeouts, 9.7.6.1.3 the local ACK timeout).
// Exponents above 31 count as 31.
func IBTime(x uint8) time.Duration {
	return time.Duration(4096<<min(x, 31)) * time.Nanosecond
}

// REQTimeout is how long the active side waits for a REP (or MRA) before
// it resends the REQ: the passive CM's response time plus a round trip,
// RemoteCMResponseTimeout + 2 * PacketLifeTime (IBTA 12.7.27).
func REQTimeout(r *REQ, packetLifeTime uint8) time.Duration {
	return IBTime(r.RemoteCMResponseTimeout) + 2*IBTime(packetLifeTime)
}
