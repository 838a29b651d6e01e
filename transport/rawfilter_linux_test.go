package transport

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// keepUDPDstPort makes the raw UDP socket fd take only datagrams to port
// and empties what it queued before: a raw socket gets a copy of every UDP
// datagram on the host, and on a busy host (other tests' traffic, -race
// runs of several packages at once) its buffer fills with those before
// the one a test waits for arrives, which the kernel then drops. The
// classic BPF program sees what the socket would read: from the IPv4
// header on an AF_INET raw socket (ipv4), from the UDP header on an
// AF_INET6 one.
func keepUDPDstPort(t *testing.T, fd int, port uint16, ipv4 bool) {
	t.Helper()
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 2}, // UDP destination port
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(port)},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xFFFF},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if ipv4 {
		// X = the IPv4 header's length (4 * IHL), then the port at X+2.
		prog = append([]unix.SockFilter{{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0}}, prog...)
		prog[1] = unix.SockFilter{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2}
	}
	require.NoError(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}))
	b := make([]byte, 65536)
	for {
		if _, _, err := unix.Recvfrom(fd, b, unix.MSG_DONTWAIT); err != nil {
			return // EAGAIN: empty
		}
	}
}
