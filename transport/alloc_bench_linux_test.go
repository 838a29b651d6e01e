//go:build linux

package transport

import "testing"

func BenchmarkConnUDP(b *testing.B) { benchConn(b, udpPair(b)) }

func BenchmarkEndpointUDP(b *testing.B) {
	b.Run("write", func(b *testing.B) { benchEndpointWrite(b, udpPair(b)) })
	b.Run("send", func(b *testing.B) { benchEndpointSend(b, udpPair(b)) })
}

// Sending and receiving a datagram on the Linux UDP Conn allocates
// nothing.
func TestAllocsConnUDP(t *testing.T) {
	cs := udpPair(t)
	defer cs[0].Close()
	defer cs[1].Close()
	allocGate(t, "UDP Conn", connRound(t, cs))
}

// The same WRITE round as TestAllocsEndpointMem, over UDP on loopback.
func TestAllocsEndpointUDP(t *testing.T) {
	allocGate(t, "Endpoint WRITE over UDP", endpointWriteRound(t, udpPair(t)))
}
