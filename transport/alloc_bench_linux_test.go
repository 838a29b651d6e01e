//go:build linux

package transport

import "testing"

func BenchmarkConnUDP(b *testing.B) { benchConn(b, udpPair(b)) }

func BenchmarkEndpointUDP(b *testing.B) {
	b.Run("write", func(b *testing.B) { benchEndpointWrite(b, udpPair(b)) })
	b.Run("send", func(b *testing.B) { benchEndpointSend(b, udpPair(b)) })
}
