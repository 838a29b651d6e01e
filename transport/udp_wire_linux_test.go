//go:build linux

package transport

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// ipv6FlowInfo is IPV6_FLOWINFO of linux/in6.h (not in x/sys/unix): with
// it set, recvmsg hands over the flow label and traffic class of a
// datagram whose flow information is not zero.
const ipv6FlowInfo = 11

// flowInfoOf sends one datagram through send to a plain receiving socket on
// ::1 and returns the IPV6_FLOWINFO the receiver saw (0: none).
func flowInfoOf(t *testing.T, send func(to *net.UDPAddr)) uint32 {
	r, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	require.NoError(t, err)
	defer r.Close()
	raw, err := r.SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, ipv6FlowInfo, 1),
			unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1))
	}))
	require.NoError(t, serr)
	send(r.LocalAddr().(*net.UDPAddr))
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, oob := make([]byte, 2048), make([]byte, 256)
	_, oobn, _, _, err := r.ReadMsgUDP(b, oob)
	require.NoError(t, err)
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == ipv6FlowInfo && len(m.Data) >= 4 {
			return binary.BigEndian.Uint32(m.Data) & 0xFFFFF
		}
	}
	return 0
}

// The Conn sends flow label 0 as rxe does (IPV6_AUTOFLOWLABEL 0). The control: a plain socket on the same
// machine gets the kernel's automatic flow label (net.ipv6.auto_flowlabels).
func TestUDPFlowLabelZero(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/net/ipv6/auto_flowlabels"); err != nil || string(b) == "0\n" {
		t.Skipf("automatic flow labels are off here (%q, %v): nothing to tell apart", b, err)
	}
	plain := flowInfoOf(t, func(to *net.UDPAddr) {
		s := rxeLikeSender(t, false)
		_, err := s.WriteToUDP([]byte("plain"), to)
		require.NoError(t, err)
	})
	require.NotZero(t, plain, "control: a plain socket gets an automatic flow label")
	c := listen6(t, UDPOptions{})
	got := flowInfoOf(t, func(to *net.UDPAddr) {
		_, err := c.WriteBatch([]Datagram{{Data: []byte("roce-emu"), Src: c.LocalAddr(), Dst: to.AddrPort()}})
		require.NoError(t, err)
	})
	assert.Zero(t, got, "the Conn's datagrams carry flow label 0 (IPV6_AUTOFLOWLABEL 0)")
}

// Over IPv4 the Conn sends UDP checksum 0 by default (SO_NO_CHECK), as docs/sockets.md says, and a computed one with
// ComputeUDPChecksum. Read from a raw IPv4 socket. Needs CAP_NET_RAW.
func TestUDPZeroChecksum4Sent(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("raw socket: %v (CI runs as root)", err)
		}
		t.Skipf("raw socket: %v (needs CAP_NET_RAW)", err)
	}
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}))
	for _, compute := range []bool{false, true} {
		src, err := ListenUDP(netipMust("127.0.0.1:0"), UDPOptions{EphemeralPort: true, ComputeUDPChecksum: compute})
		require.NoError(t, err)
		defer src.Close()
		dst, err := ListenUDP(netipMust("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
		require.NoError(t, err)
		defer dst.Close()
		keepUDPDstPort(t, fd, dst.LocalAddr().Port(), true)
		data := sendOnly(t, src.LocalAddr(), dst.LocalAddr(), 9)
		_, err = src.WriteBatch([]Datagram{{Data: data, Src: src.LocalAddr(), Dst: dst.LocalAddr()}})
		require.NoError(t, err)
		var csum uint16
		found := false
		b := make([]byte, 65536)
		for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(fd, b, 0)
			if err != nil || n < 28 {
				continue
			}
			ihl := int(b[0]&0xF) * 4 // a raw IPv4 socket hands over the IP header too
			u := b[ihl:n]
			if len(u) < 8 || binary.BigEndian.Uint16(u) != src.LocalAddr().Port() || binary.BigEndian.Uint16(u[2:]) != dst.LocalAddr().Port() {
				continue
			}
			csum, found = binary.BigEndian.Uint16(u[6:]), true
		}
		require.True(t, found, "the raw socket saw the datagram")
		if compute {
			assert.NotZero(t, csum, "ComputeUDPChecksum: the kernel's checksum")
		} else {
			assert.Zero(t, csum, "default: UDP checksum 0 over IPv4 (SO_NO_CHECK), as rxe")
		}
	}
}

func netipMust(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
