//go:build linux

package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/qp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// offloadConn opens a Conn on addr (127.0.0.x or ::1) with GSO and GRO as
// asked; GSO needs the computed checksum.
func offloadConn(t testing.TB, addr string, gso, gro bool) Conn {
	t.Helper()
	c, err := ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(addr), 0),
		UDPOptions{EphemeralPort: true, ComputeUDPChecksum: true, NoGSO: !gso, NoGRO: !gro})
	if err != nil && addr == "::1" {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	o, ok := Offloads(c)
	require.True(t, ok)
	require.Equal(t, gso, o.GSO, "GSO: %s", o.GSOOff)
	require.Equal(t, gro, o.GRO, "GRO: %s", o.GROOff)
	return c
}

// numbered returns a datagram of size bytes from src to dst whose bytes
// all derive from seq.
func numbered(src, dst netip.AddrPort, seq, size int, tos uint8) Datagram {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(seq*7 + i)
	}
	if size >= 4 {
		binary.BigEndian.PutUint32(b, uint32(seq))
	}
	return Datagram{Data: b, Src: src, Dst: dst, TOS: tos}
}

// readN reads n datagrams from c, into slots of slot bytes, slots at a
// time; it fails after 5 s without them (closing c to unblock the read).
func readN(t *testing.T, c Conn, n, slots, slot int) []Datagram {
	t.Helper()
	got := make([]Datagram, 0, n)
	done := make(chan error, 1)
	go func() {
		ds := make([]Datagram, slots)
		for len(got) < n {
			for i := range ds {
				ds[i].Data = make([]byte, 0, slot)
			}
			k, err := c.ReadBatch(ds)
			if err != nil {
				done <- err
				return
			}
			got = append(got, ds[:k]...)
		}
		done <- nil
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		c.Close()
		<-done
		t.Fatalf("%d of %d datagrams arrived", len(got), n)
	}
	return got
}

// A batch of same-size datagrams arrives whole and in order, with GSO and
// GRO each on and off, over IPv4 and IPv6, at both RoCE packet sizes
// (1024- and 4096-byte payloads) and with a shorter last one.
func TestUDPOffloadSameSize(t *testing.T) {
	for _, fam := range [][2]string{{"127.0.0.1", "127.0.0.2"}, {"::1", "::1"}} {
		for _, gso := range []bool{false, true} {
			for _, gro := range []bool{false, true} {
				for _, size := range []int{1052, 4124} {
					t.Run(fmt.Sprintf("%s/gso=%v/gro=%v/%d", fam[0], gso, gro, size), func(t *testing.T) {
						a := offloadConn(t, fam[0], gso, gro)
						z := offloadConn(t, fam[1], gso, gro)
						const n = 100
						out := make([]Datagram, n)
						for i := range out {
							l := size
							if i == n-1 {
								l = 100
							}
							out[i] = numbered(a.LocalAddr(), z.LocalAddr(), i, l, 0x02)
						}
						sent, err := a.WriteBatch(out)
						require.NoError(t, err)
						require.Equal(t, n, sent)
						got := readN(t, z, n, 64, 16<<10)
						for i, d := range got {
							require.Equal(t, out[i].Data, d.Data, "datagram %d", i)
							assert.Equal(t, a.LocalAddr(), d.Src)
							assert.True(t, d.TOSKnown)
							assert.Equal(t, uint8(0x02), d.TOS)
						}
						oa, _ := Offloads(a)
						oz, _ := Offloads(z)
						if gso {
							// 100 datagrams: runs of 62 (1052 bytes: 65507 bytes a send) or 15 (4124 bytes).
							assert.Equal(t, uint64(n), oa.GSOSegments)
							assert.Equal(t, uint64((n+maxRun(size)-1)/maxRun(size)), oa.GSOSends)
						} else {
							assert.Zero(t, oa.GSOSends)
						}
						if gso && gro {
							// On loopback a segmented send reaches a GRO socket whole.
							assert.NotZero(t, oz.GROReads)
							assert.Equal(t, uint64(n), oz.GROSegments)
						} else {
							assert.Zero(t, oz.GROReads)
						}
					})
				}
			}
		}
	}
}

func maxRun(size int) int { return min(maxGSOSegments, maxGSOBytes/size) }

// Datagrams to two destinations, of mixed sizes and TOS, interleaved in
// one batch, each arrive at their destination in order, with their own
// TOS.
func TestUDPOffloadMixed(t *testing.T) {
	for _, fam := range [][3]string{{"127.0.0.1", "127.0.0.2", "127.0.0.3"}, {"::1", "::1", "::1"}} {
		for _, gso := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gso=%v", fam[0], gso), func(t *testing.T) {
				a := offloadConn(t, fam[0], gso, true)
				z := [2]Conn{offloadConn(t, fam[1], gso, true), offloadConn(t, fam[2], gso, true)}
				var out []Datagram
				var want [2][]Datagram
				seq := 0
				add := func(to, count, size int, tos uint8) {
					for range count {
						d := numbered(a.LocalAddr(), z[to].LocalAddr(), seq, size, tos)
						seq++
						out = append(out, d)
						want[to] = append(want[to], d)
					}
				}
				add(0, 10, 1052, 0x02) // a run
				add(1, 10, 1052, 0x02) // same size, other destination
				add(0, 1, 1068, 0x02)  // larger: a run of its own
				add(0, 5, 1052, 0x03)  // CE marked: not merged with ECT(0)
				add(0, 5, 1052, 0x02)
				add(0, 1, 500, 0x02) // shorter: ends the run
				add(0, 5, 1052, 0x02)
				add(1, 3, 60, 0xb8)
				add(1, 70, 1052, 0x02) // more than one send can hold
				sent, err := a.WriteBatch(out)
				require.NoError(t, err)
				require.Equal(t, len(out), sent)
				for i := range z {
					got := readN(t, z[i], len(want[i]), 8, 4<<10)
					for j, d := range got {
						require.Equal(t, want[i][j].Data, d.Data, "destination %d datagram %d", i, j)
						assert.Equal(t, want[i][j].TOS, d.TOS, "destination %d datagram %d", i, j)
						assert.Equal(t, a.LocalAddr(), d.Src)
					}
				}
				if gso {
					o, _ := Offloads(a)
					// 10 | 10 | 1 alone | 5 | 6 (5 and the shorter one) | 5 | 3 | 62 + 8.
					assert.Equal(t, uint64(8), o.GSOSends)
					assert.Equal(t, uint64(10+10+5+6+5+3+70), o.GSOSegments)
				}
			})
		}
	}
}

// gsoRun cuts where the kernel needs a new message.
func TestGSORun(t *testing.T) {
	x := netip.MustParseAddrPort("192.0.2.1:4791")
	y := netip.MustParseAddrPort("192.0.2.2:4791")
	d := func(size int, dst netip.AddrPort, tos, ttl uint8) Datagram {
		return Datagram{Data: make([]byte, size), Dst: dst, TOS: tos, TTL: ttl}
	}
	run := func(ds ...Datagram) int { return gsoRun(ds) }
	assert.Equal(t, 1, run(d(100, x, 0, 0)))
	assert.Equal(t, 3, run(d(100, x, 0, 0), d(100, x, 0, 0), d(100, x, 0, 0)))
	assert.Equal(t, 2, run(d(100, x, 0, 0), d(50, x, 0, 0), d(50, x, 0, 0)), "a shorter one ends a run")
	assert.Equal(t, 1, run(d(100, x, 0, 0), d(101, x, 0, 0)), "a larger one starts a run")
	assert.Equal(t, 1, run(d(100, x, 0, 0), d(100, y, 0, 0)), "another destination")
	assert.Equal(t, 1, run(d(100, x, 2, 0), d(100, x, 3, 0)), "another TOS")
	assert.Equal(t, 1, run(d(100, x, 0, 64), d(100, x, 0, 1)), "another TTL")
	assert.Equal(t, 1, run(d(0, x, 0, 0), d(0, x, 0, 0)), "empty datagrams are not segmented")
	assert.Equal(t, 1, run(d(100, x, 0, 0), d(0, x, 0, 0)))
	var many []Datagram
	for range 100 {
		many = append(many, d(10, x, 0, 0))
	}
	assert.Equal(t, 64, gsoRun(many), "UDP_MAX_SEGMENTS")
	many = many[:0]
	for range 20 {
		many = append(many, d(4124, x, 0, 0))
	}
	assert.Equal(t, 15, gsoRun(many), "65507 bytes a send")
	many[14].Data = many[14].Data[:4124-20]
	many[15].Data = many[15].Data[:10]
	assert.Equal(t, 15, gsoRun(many), "a shorter last one that fits")
}

// GSO stays off over IPv4 off loopback (the segments' IP IDs would count
// up, and the ICRC covers them); on over IPv6.
func TestGSOSafe(t *testing.T) {
	for a, want := range map[string]bool{
		"127.0.0.1": true, "127.0.0.2": true, "::1": true, "::ffff:127.0.0.1": true,
		"192.0.2.1": false, "::ffff:192.0.2.1": false, "10.0.0.1": false,
		"2001:db8::1": true, "fe80::1%eth0": true,
	} {
		assert.Equal(t, want, gsoSafe(netip.MustParseAddr(a)), a)
	}
}

// A coalesced datagram larger than the caller's batch is handed out
// over several ReadBatch calls, in order; a segment larger than its slot
// is handed on empty, the others intact.
func TestUDPGROSplit(t *testing.T) {
	a := offloadConn(t, "127.0.0.1", true, true)
	z := offloadConn(t, "127.0.0.2", false, true)
	out := make([]Datagram, 15)
	for i := range out {
		out[i] = numbered(a.LocalAddr(), z.LocalAddr(), i, 4124, 0x02)
	}
	_, err := a.WriteBatch(out)
	require.NoError(t, err)
	got := readN(t, z, 15, 4, 16<<10) // 4 slots: 4 + 4 + 4 + 3
	for i, d := range got {
		require.Equal(t, out[i].Data, d.Data, "datagram %d", i)
		assert.Equal(t, uint8(0x02), d.TOS)
	}
	o, _ := Offloads(z)
	assert.Equal(t, uint64(1), o.GROReads)
	assert.Equal(t, uint64(15), o.GROSegments)

	_, err = a.WriteBatch(out[:3])
	require.NoError(t, err)
	got = readN(t, z, 3, 3, 2048) // slots too small for 4124 bytes
	for _, d := range got {
		assert.Empty(t, d.Data)
	}
	_, err = a.WriteBatch(out[:3])
	require.NoError(t, err)
	got = readN(t, z, 3, 3, 0) // slots with no capacity get their own buffers
	for i, d := range got {
		assert.Equal(t, out[i].Data, d.Data)
	}
}

// GSO stays off with checksum 0 (the kernel refuses it), and with NoGSO;
// GRO with NoGRO.
func TestUDPOffloadsOff(t *testing.T) {
	c, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer c.Close()
	o, ok := Offloads(WithFaults(c, NewFaults(1), nil))
	require.True(t, ok, "through a decorator")
	assert.False(t, o.GSO)
	assert.Contains(t, o.GSOOff, "checksum 0")
	assert.True(t, o.GRO)
	c2, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{EphemeralPort: true, ComputeUDPChecksum: true, NoGSO: true, NoGRO: true})
	require.NoError(t, err)
	defer c2.Close()
	o, _ = Offloads(c2)
	assert.False(t, o.GSO)
	assert.False(t, o.GRO)
	assert.Equal(t, "UDPOptions.NoGSO", o.GSOOff)
	assert.Equal(t, "UDPOptions.NoGRO", o.GROOff)
	m, err := NewNetwork(Impairments{}, 1).Listen(netip.MustParseAddrPort("192.0.2.1:4791"))
	require.NoError(t, err)
	defer m.Close()
	_, ok = Offloads(m)
	assert.False(t, ok, "the in-memory network has no offloads")
}

// Where the kernel refuses a segmented send (here: the socket was made to
// send checksum 0 behind the Conn's back, which makes UDP_SEGMENT fail
// with EINVAL), the datagrams still go, one by one, and GSO stays off.
func TestUDPGSOFallback(t *testing.T) {
	for _, fam := range [][2]string{{"127.0.0.1", "127.0.0.2"}, {"::1", "::1"}} {
		t.Run(fam[0], func(t *testing.T) {
			a := offloadConn(t, fam[0], true, true)
			z := offloadConn(t, fam[1], false, false)
			raw := a.(*udpConn).main.raw
			var serr error
			require.NoError(t, raw.Control(func(fd uintptr) {
				if a.(*udpConn).v6 {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
				}
			}))
			require.NoError(t, serr)
			out := make([]Datagram, 40)
			for i := range out {
				out[i] = numbered(a.LocalAddr(), z.LocalAddr(), i, 1052, 0)
				if i < 3 {
					out[i].Data = out[i].Data[:60+i] // three single sends first
				}
			}
			sent, err := a.WriteBatch(out)
			require.NoError(t, err)
			require.Equal(t, len(out), sent)
			got := readN(t, z, len(out), 64, 16<<10)
			for i, d := range got {
				require.Equal(t, out[i].Data, d.Data, "datagram %d", i)
			}
			o, _ := Offloads(a)
			assert.False(t, o.GSO)
			assert.Contains(t, o.GSOOff, "refused")
			assert.Zero(t, o.GSOSends)
			sent, err = a.WriteBatch(out)
			require.NoError(t, err)
			require.Equal(t, len(out), sent)
			readN(t, z, len(out), 64, 16<<10)
		})
	}
}

// Sending a batch with GSO and receiving it with GRO allocates nothing,
// over IPv4 and IPv6.
func TestAllocsConnUDPOffloads(t *testing.T) {
	for _, fam := range [][2]string{{"127.0.0.1", "127.0.0.2"}, {"::1", "::1"}} {
		t.Run(fam[0], func(t *testing.T) {
			a := offloadConn(t, fam[0], true, true)
			z := offloadConn(t, fam[1], true, true)
			out := make([]Datagram, 32)
			for i := range out {
				out[i] = numbered(a.LocalAddr(), z.LocalAddr(), i, 1052, 0x02)
			}
			in := make([]Datagram, 64)
			for i := range in {
				in[i].Data = make([]byte, 0, 16<<10)
			}
			allocGate(t, "UDP Conn with GSO and GRO", func() {
				if _, err := a.WriteBatch(out); err != nil {
					t.Fatal(err)
				}
				for got := 0; got < len(out); {
					n, err := z.ReadBatch(in)
					if err != nil {
						t.Fatal(err)
					}
					got += n
				}
			})
			o, _ := Offloads(z)
			assert.NotZero(t, o.GROReads)
		})
	}
}

// RC QPs on Conns with GSO and GRO on, over IPv4 and IPv6 loopback: a
// 256 KiB WRITE and a SEND cross in segmented sends and coalesced reads,
// and every packet passes the receiver's ICRC check assuming IP ID 0.
func TestUDPOffloadEndpoints(t *testing.T) {
	for _, fam := range [][2]string{{"127.0.0.1", "127.0.0.2"}, {"::1", "::1"}} {
		t.Run(fam[0], func(t *testing.T) {
			conns := [2]Conn{offloadConn(t, fam[0], true, true), offloadConn(t, fam[1], true, true)}
			var s [2]*side
			for i := range 2 {
				ep := NewEndpoint(conns[i], Options{ICRC: ICRCAssumeID0})
				t.Cleanup(func() { ep.Close() })
				pd := ep.NewPD()
				cq := ep.NewCQ(64)
				q, err := ep.NewQP(pd, cq, cq, qp.InitAttr{SQSigAll: true})
				require.NoError(t, err)
				s[i] = &side{ep, pd, cq, q}
			}
			cfg := defaultPair()
			for i := range 2 {
				q, peer := s[i].qp, s[1-i]
				require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_INIT, AccessFlags: qp.IBV_ACCESS_REMOTE_WRITE | qp.IBV_ACCESS_LOCAL_WRITE}, qp.IBV_QP_STATE|qp.IBV_QP_ACCESS_FLAGS))
				require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTR, PathMTU: cfg.mtu, DestQPN: peer.qp.QPN(), RQPSN: cfg.psn[1-i],
					MaxDestRdAtomic: 1, MinRNRTimer: 1, AV: qp.AddressVector{Remote: peer.ep.LocalAddr()}},
					qp.IBV_QP_STATE|qp.IBV_QP_AV|qp.IBV_QP_PATH_MTU|qp.IBV_QP_DEST_QPN|qp.IBV_QP_RQ_PSN|qp.IBV_QP_MAX_DEST_RD_ATOMIC|qp.IBV_QP_MIN_RNR_TIMER))
				require.NoError(t, q.Modify(&qp.Attr{State: qp.IBV_QPS_RTS, SQPSN: cfg.psn[i], Timeout: 12, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
					qp.IBV_QP_STATE|qp.IBV_QP_SQ_PSN|qp.IBV_QP_TIMEOUT|qp.IBV_QP_RETRY_CNT|qp.IBV_QP_RNR_RETRY|qp.IBV_QP_MAX_QP_RD_ATOMIC))
			}
			const n = 256 << 10
			src := pattern(n, 3)
			dst := make([]byte, n)
			got := make([]byte, 5000)
			smr, _ := s[0].pd.RegMR(src, qp.IBV_ACCESS_LOCAL_WRITE)
			dmr, _ := s[1].pd.RegMR(dst, qp.IBV_ACCESS_LOCAL_WRITE|qp.IBV_ACCESS_REMOTE_WRITE)
			gmr, _ := s[1].pd.RegMR(got, qp.IBV_ACCESS_LOCAL_WRITE)
			require.NoError(t, s[1].qp.PostRecv(qp.RecvWR{WRID: 9, SGEs: []qp.SGE{gmr.SGE(0, len(got))}}))
			require.NoError(t, s[0].qp.PostSend(qp.SendWR{WRID: 1, Opcode: qp.IBV_WR_RDMA_WRITE, SGEs: []qp.SGE{smr.SGE(0, n)}, RemoteAddr: dmr.VA, RKey: dmr.RKey}))
			require.NoError(t, s[0].qp.PostSend(qp.SendWR{WRID: 2, Opcode: qp.IBV_WR_SEND, SGEs: []qp.SGE{smr.SGE(0, len(got))}}))
			for _, c := range wait(t, s[0].cq, 2) {
				require.Equal(t, qp.IBV_WC_SUCCESS, c.Status)
			}
			rc := wait(t, s[1].cq, 1)
			require.Equal(t, qp.IBV_WC_SUCCESS, rc[0].Status)
			s[1].ep.Sync()
			assert.Equal(t, src, dst)
			assert.Equal(t, src[:len(got)], got)
			for i := range 2 {
				st := s[i].ep.Stats()
				assert.Zero(t, st.BadICRC, "side %d", i)
				assert.Zero(t, st.Malformed, "side %d", i)
			}
			o0, _ := Offloads(conns[0])
			o1, _ := Offloads(conns[1])
			assert.NotZero(t, o0.GSOSends, "the requester's packets left segmented")
			assert.NotZero(t, o1.GROReads, "and arrived coalesced")
		})
	}
}

// parseGRO and parseTOS read control messages as the kernel lays them out
// (IP_TOS then UDP_GRO), and on every truncation of them return what is
// whole and nothing else, without panicking.
func TestParseGROTruncated(t *testing.T) {
	oob := make([]byte, unix.CmsgSpace(1)+unix.CmsgSpace(4))
	h := (*unix.Cmsghdr)(unsafePointer(oob))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
	h.SetLen(unix.CmsgLen(1))
	oob[unix.CmsgLen(0)] = 0x03
	m := oob[unix.CmsgSpace(1):]
	h = (*unix.Cmsghdr)(unsafePointer(m))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(m[unix.CmsgLen(0):], 1052)
	seg, ok := parseGRO(oob)
	assert.True(t, ok)
	assert.Equal(t, 1052, seg)
	tos, ok := parseTOS(oob)
	assert.True(t, ok)
	assert.Equal(t, uint8(3), tos)
	for i := range len(oob) {
		whole := i >= unix.CmsgSpace(1)+unix.CmsgLen(4) // the padding after it may be cut
		seg, ok := parseGRO(oob[:i])
		assert.Equal(t, whole, ok, "GRO in %d bytes", i)
		if !whole {
			assert.Zero(t, seg)
		}
		_, ok = parseTOS(oob[:i])
		assert.Equal(t, i >= unix.CmsgLen(1), ok, "TOS in %d bytes", i)
	}
	// A length that claims more than the buffer holds ends the parse.
	h.SetLen(1000)
	_, ok = parseGRO(oob)
	assert.False(t, ok)
}
