package cm

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func sampleMessages() []Message {
	req := &REQ{LocalCommID: 0x01020304, ServiceID: ServiceID(PortSpaceTCP, 7174), LocalCAGUID: 0x1122334455667788,
		LocalQKey: 0xdeadbeef, LocalQPN: 0xabcdef, ResponderResources: 16, LocalEECN: 0x123456, InitiatorDepth: 8,
		RemoteEECN: 0x654321, RemoteCMResponseTimeout: 31, TransportServiceType: ServiceUC, EndToEndFlowControl: true,
		StartingPSN: 0xfedcba, LocalCMResponseTimeout: 17, RetryCount: 5, PKey: 0x8001, PathMTU: 5, RDCExists: true,
		RNRRetryCount: 6, MaxCMRetries: 14, SRQ: true, ExtendedTransportType: 2,
		Primary: Path{LocalLID: 1, RemoteLID: 2, LocalGID: netip.MustParseAddr("192.0.2.1"),
			RemoteGID: netip.MustParseAddr("2001:db8::2"), FlowLabel: 0xabcde, PacketRate: 0x2a, TrafficClass: 0x60,
			HopLimit: 255, SL: 9, SubnetLocal: true, LocalACKTimeout: 19},
		Alternate: Path{LocalGID: netip.IPv6Unspecified(), RemoteGID: netip.IPv6Unspecified(), LocalACKTimeout: 31}}
	for i := range req.PrivateData {
		req.PrivateData[i] = byte(i + 1)
	}
	rej := &REJ{LocalCommID: 5, RemoteCommID: 6, MessageRejected: MsgREP, ARILength: 8, Reason: RejConsumer}
	rej.ARI[0], rej.ARI[71], rej.PrivateData[147] = 0xaa, 0xbb, 0xcc
	mra := &MRA{LocalCommID: 7, RemoteCommID: 8, MessageMRAed: MsgREQ, ServiceTimeout: 24}
	mra.PrivateData[221] = 0x99
	rep := &REP{LocalCommID: 9, RemoteCommID: 10, LocalQKey: 11, LocalQPN: 0xffffff, LocalEECN: 12, StartingPSN: 0x800000,
		ResponderResources: 2, InitiatorDepth: 3, TargetACKDelay: 15, FailoverAccepted: 1, EndToEndFlowControl: true,
		RNRRetryCount: 7, SRQ: true, LocalCAGUID: 0x0102030405060708}
	rep.PrivateData[195] = 0x77
	rtu := &RTU{LocalCommID: 13, RemoteCommID: 14}
	rtu.PrivateData[223] = 1
	dreq := &DREQ{LocalCommID: 15, RemoteCommID: 16, RemoteQPN: 0x11}
	dreq.PrivateData[219] = 2
	drep := &DREP{LocalCommID: 17, RemoteCommID: 18}
	drep.PrivateData[223] = 3
	return []Message{req, mra, rej, rep, rtu, dreq, drep}
}

func TestRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		t.Run(m.Attr().String(), func(t *testing.T) {
			b, err := AppendMAD([]byte{0xee}, 0x123456789abcdef0, m)
			require.NoError(t, err)
			require.Len(t, b, 1+MADLen)
			h, got, err := DecodeMAD(b[1:])
			require.NoError(t, err)
			require.Equal(t, CMHeader(0x123456789abcdef0, m.Attr()), h)
			require.Equal(t, m, got)
		})
	}
}

// TestTruncationSweep decodes every prefix of every message: each one
// shorter than 256 bytes is ErrTruncated, never a panic.
func TestTruncationSweep(t *testing.T) {
	for _, m := range sampleMessages() {
		b, err := AppendMAD(nil, 1, m)
		require.NoError(t, err)
		for i := range len(b) {
			_, _, err := DecodeMAD(b[:i])
			require.ErrorIs(t, err, ErrTruncated, "%v cut at %d", m.Attr(), i)
		}
		for i := range MADDataLen {
			require.ErrorIs(t, m.DecodeData(b[MADHeaderLen:MADHeaderLen+i]), ErrTruncated)
		}
	}
	var ip IPHeader
	for i := range IPHeaderLen {
		require.ErrorIs(t, ip.Decode(make([]byte, i)), ErrTruncated)
	}
}

func TestDecodeMADRejects(t *testing.T) {
	good, err := AppendMAD(nil, 1, &RTU{})
	require.NoError(t, err)
	for i, mut := range []func(b []byte){
		func(b []byte) { b[0] = 2 },    // base version
		func(b []byte) { b[1] = 0x81 }, // class
		func(b []byte) { b[2] = 1 },    // class version
		func(b []byte) { b[3] = 0x01 }, // method Get
	} {
		b := append([]byte(nil), good...)
		mut(b)
		_, _, err := DecodeMAD(b)
		require.ErrorIs(t, err, ErrNotCM, "case %d", i)
	}
	for _, a := range []AttrID{AttrClassPortInfo, AttrLAP, AttrAPR, AttrSIDRREQ, AttrSIDRREP, 0x00ff} {
		b := append([]byte(nil), good...)
		b[16], b[17] = byte(a>>8), byte(a)
		h, _, err := DecodeMAD(b)
		require.ErrorIs(t, err, ErrUnknownAttr)
		require.Equal(t, a, h.AttrID)
	}
}

func TestAppendRange(t *testing.T) {
	for _, m := range []Message{
		&REQ{LocalQPN: 1 << 24}, &REQ{StartingPSN: 1 << 24}, &REQ{RemoteCMResponseTimeout: 32},
		&REQ{RetryCount: 8}, &REQ{PathMTU: 16}, &REQ{MaxCMRetries: 16}, &REQ{Primary: Path{FlowLabel: 1 << 20}},
		&REQ{Alternate: Path{SL: 16}}, &MRA{ServiceTimeout: 32}, &MRA{MessageMRAed: 4},
		&REJ{ARILength: 73}, &REP{LocalQPN: 1 << 24}, &REP{StartingPSN: 1 << 24}, &REP{RNRRetryCount: 8},
		&REP{TargetACKDelay: 32}, &DREQ{RemoteQPN: 1 << 24},
	} {
		b, err := AppendMAD([]byte{1, 2}, 1, m)
		require.ErrorIs(t, err, ErrFieldRange, "%#v", m)
		require.Equal(t, []byte{1, 2}, b)
	}
}

func TestIPHeader(t *testing.T) {
	for _, h := range []IPHeader{
		{Src: netip.MustParseAddrPort("192.0.2.2:51237"), Dst: netip.MustParseAddr("192.0.2.1")},
		{Src: netip.MustParseAddrPort("[fd00::2]:1"), Dst: netip.MustParseAddr("fd00::1")},
	} {
		b, err := h.Append(nil)
		require.NoError(t, err)
		require.Len(t, b, IPHeaderLen)
		var got IPHeader
		require.NoError(t, got.Decode(b))
		require.Equal(t, h, got)
	}
	// An IPv4-mapped source counts as IPv4 and encodes as rdma_cm does.
	h := IPHeader{Src: netip.MustParseAddrPort("[::ffff:192.0.2.2]:7"), Dst: netip.MustParseAddr("192.0.2.1")}
	b, err := h.Append(nil)
	require.NoError(t, err)
	require.Equal(t, []byte{0, 0x40, 0, 7}, b[:4])
	require.Equal(t, []byte{192, 0, 2, 2}, b[16:20])
	require.Equal(t, []byte{192, 0, 2, 1}, b[32:36])
	_, err = (&IPHeader{Src: netip.MustParseAddrPort("192.0.2.2:1"), Dst: netip.MustParseAddr("fd00::1")}).Append(nil)
	require.ErrorIs(t, err, ErrFieldRange)
	_, err = (&IPHeader{}).Append(nil)
	require.ErrorIs(t, err, ErrFieldRange)
	bad := make([]byte, IPHeaderLen)
	bad[1] = 0x50
	require.ErrorIs(t, new(IPHeader).Decode(bad), ErrNotIPCM)
	bad[0], bad[1] = 0x10, 0x40
	require.ErrorIs(t, new(IPHeader).Decode(bad), ErrNotIPCM)
}

func TestServiceID(t *testing.T) {
	require.Equal(t, uint64(0x0000000001061C06), ServiceID(PortSpaceTCP, 7174))
	require.Equal(t, uint64(0x0000000001114853), ServiceID(PortSpaceUDP, 18515))
	require.Equal(t, uint64(0x00000000013F0001), ServiceID(PortSpaceIB, 1))
	ps, port, ok := ParseServiceID(0x0000000001064853)
	require.Equal(t, []any{uint16(PortSpaceTCP), uint16(18515), true}, []any{ps, port, ok})
	_, _, ok = ParseServiceID(0x1000000001064853)
	require.False(t, ok)
	_, _, ok = ParseServiceID(0x0000000002064853)
	require.False(t, ok)
}

func TestIBTime(t *testing.T) {
	require.Equal(t, 4096*1<<20, int(IBTime(20)))        // 4.29 s
	require.Equal(t, int64(4096)<<31, int64(IBTime(40))) // clamped at 31
	require.Equal(t, "6.442450944s", REQTimeout(&REQ{RemoteCMResponseTimeout: 20}, 18).String())
}

func TestStrings(t *testing.T) {
	require.Equal(t, "REQ", AttrREQ.String())
	require.Equal(t, "attr(0x00ff)", AttrID(0xff).String())
	require.Equal(t, "invalid service ID (8)", RejInvalidServiceID.String())
	require.Equal(t, "consumer reject (28)", RejConsumer.String())
	require.Equal(t, "reason 99", RejectReason(99).String())
}

func TestDecodeAllocs(t *testing.T) {
	b, err := AppendMAD(nil, 1, sampleMessages()[0])
	require.NoError(t, err)
	var r REQ
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if err := r.DecodeData(b[MADHeaderLen:]); err != nil {
			panic(err)
		}
	}))
	out := make([]byte, 0, MADLen)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if _, err := AppendMAD(out[:0], 1, &r); err != nil {
			panic(err)
		}
	}))
}

func FuzzDecodeMAD(f *testing.F) {
	for _, m := range sampleMessages() {
		b, _ := AppendMAD(nil, 7, m)
		f.Add(b)
	}
	f.Add([]byte{1, 7, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, m, err := DecodeMAD(b)
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrNotCM) && !errors.Is(err, ErrUnknownAttr) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		// What decoded re-encodes, and decodes again to the same message.
		enc, err := AppendMAD(nil, h.TransactionID, m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		_, m2, err := DecodeMAD(enc)
		if err != nil {
			t.Fatal(err)
		}
		require.Equal(t, m, m2)
	})
}

func FuzzIPHeader(f *testing.F) {
	b, _ := (&IPHeader{Src: netip.MustParseAddrPort("192.0.2.2:1"), Dst: netip.MustParseAddr("192.0.2.1")}).Append(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var h IPHeader
		if err := h.Decode(b); err != nil {
			return
		}
		enc, err := h.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		var h2 IPHeader
		require.NoError(t, h2.Decode(enc))
		require.Equal(t, h, h2)
	})
}

func BenchmarkDecodeREQ(b *testing.B) {
	mad, err := AppendMAD(nil, 1, sampleMessages()[0])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(MADLen)
	var r REQ
	for b.Loop() {
		if err := r.DecodeData(mad[MADHeaderLen:]); err != nil {
			b.Fatal(err)
		}
	}
}
