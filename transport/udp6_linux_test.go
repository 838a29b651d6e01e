//go:build linux

package transport

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// listen6 opens a Conn on ::1 or skips when the machine has no IPv6 loopback.
func listen6(t *testing.T, opts UDPOptions) Conn {
	opts.EphemeralPort = true
	c, err := ListenUDP(netip.MustParseAddrPort("[::1]:0"), opts)
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rxeLikeSender is a plain UDP/IPv6 socket that sends with checksum 0, as
// rxe's tunnel socket does (UDP_NO_CHECK6_TX).
func rxeLikeSender(t *testing.T, zero bool) *net.UDPConn {
	s, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	if zero {
		raw, err := s.SyscallConn()
		require.NoError(t, err)
		var serr error
		require.NoError(t, raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1)
		}))
		require.NoError(t, serr)
	}
	return s
}

func sendOnly(t *testing.T, from, to netip.AddrPort, psn bth.PSN) []byte {
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: psn, AckReq: true}, Payload: []byte("rxe over IPv6")}
	e := bth.Encap{Src: from.Addr(), Dst: to.Addr(), SrcPort: from.Port(), DstPort: to.Port()}
	b, err := p.Append(nil, &e)
	require.NoError(t, err)
	return b
}

// A RoCEv2 packet that arrives over IPv6 with UDP checksum 0 (what rxe
// sends; ../shared/testdata/cases/interop/rxe-ipv6-rc_pingpong-client-zero-udp-checksum.pcapng)
// reaches the Conn. The control: a stock UDP/IPv6 socket gets the
// checksummed marker sent after it, not the zero-checksum packet, which
// the kernel dropped.
func TestUDPZeroChecksum6Received(t *testing.T) {
	c := listen6(t, UDPOptions{})
	zero := rxeLikeSender(t, true)
	from := zero.LocalAddr().(*net.UDPAddr).AddrPort()
	data := sendOnly(t, from, c.LocalAddr(), 7)
	_, err := zero.WriteToUDPAddrPort(data, c.LocalAddr())
	require.NoError(t, err)
	ds := make([]Datagram, 4)
	got := make(chan int, 1)
	go func() { n, _ := c.ReadBatch(ds); got <- n }()
	select {
	case n := <-got:
		require.Equal(t, 1, n)
		assert.Equal(t, data, ds[0].Data)
		assert.Equal(t, from.Port(), ds[0].Src.Port())
		var p bth.Packet
		require.NoError(t, p.Decode(ds[0].Data))
		assert.Equal(t, bth.PSN(7), p.BTH.PSN)
	case <-time.After(10 * time.Second):
		t.Fatal("the zero-checksum IPv6 datagram never reached the Conn (UDP_NO_CHECK6_RX not set?)")
	}

	stock, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	require.NoError(t, err)
	defer stock.Close()
	to := stock.LocalAddr().(*net.UDPAddr).AddrPort()
	_, err = zero.WriteToUDPAddrPort([]byte("zero checksum"), to)
	require.NoError(t, err)
	normal := rxeLikeSender(t, false)
	_, err = normal.WriteToUDPAddrPort([]byte("marker"), to)
	require.NoError(t, err)
	stock.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 64)
	n, err := stock.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "marker", string(b[:n]), "a stock socket drops the zero-checksum datagram (the kernel this test runs on behaves as docs/wire-format.md section 9 says)")
}

// What the Conn puts in the UDP checksum field over IPv6, read from a raw
// socket that sees every UDP/IPv6 datagram: 0 by default (as rxe), the
// kernel's checksum with ComputeUDPChecksum. Needs CAP_NET_RAW.
func TestUDPZeroChecksum6Sent(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_UDP)
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
		src := listen6(t, UDPOptions{ComputeUDPChecksum: compute})
		dst := listen6(t, UDPOptions{})
		keepUDPDstPort(t, fd, dst.LocalAddr().Port(), false)
		data := sendOnly(t, src.LocalAddr(), dst.LocalAddr(), 9)
		_, err := src.WriteBatch([]Datagram{{Data: data, Src: src.LocalAddr(), Dst: dst.LocalAddr()}})
		require.NoError(t, err)
		var csum uint16
		found := false
		b := make([]byte, 65536)
		for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(fd, b, 0)
			if err != nil {
				continue // timeout: try again until the deadline
			}
			// A raw IPv6 socket hands over the UDP header and payload.
			if n < 8 || uint16(b[0])<<8|uint16(b[1]) != src.LocalAddr().Port() || uint16(b[2])<<8|uint16(b[3]) != dst.LocalAddr().Port() {
				continue
			}
			csum, found = uint16(b[6])<<8|uint16(b[7]), true
		}
		require.True(t, found, "the raw socket saw the datagram")
		if compute {
			assert.NotZero(t, csum, "ComputeUDPChecksum: the kernel's checksum")
		} else {
			assert.Zero(t, csum, "default: UDP checksum 0 over IPv6, as rxe")
		}
	}
}

// A link-local address needs a zone to be bound; without one the error
// says so.
func TestUDPLinkLocalNeedsZone(t *testing.T) {
	_, err := ListenUDP(netip.MustParseAddrPort("[fe80::1]:0"), UDPOptions{EphemeralPort: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "needs a zone")
}

// A link-local destination without a zone (as a GID gives it) is sent
// through the local address's interface.
func TestUDPWithZone(t *testing.T) {
	c := &udpConn{local: netip.MustParseAddrPort("[fe80::1%tap0]:4791")}
	assert.Equal(t, "tap0", c.withZone(netip.MustParseAddrPort("[fe80::2]:4791")).Addr().Zone())
	assert.Equal(t, "eth1", c.withZone(netip.MustParseAddrPort("[fe80::2%eth1]:4791")).Addr().Zone(), "a zone given is kept")
	assert.Equal(t, "", c.withZone(netip.MustParseAddrPort("[fd00::2]:4791")).Addr().Zone(), "global addresses get none")
}
