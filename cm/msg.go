package cm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
)

// Private data lengths of each message (IBTA 12.6.5-12.6.11: what is left
// of the 232 data bytes after the message's fields).
const (
	REQPrivateDataLen  = 92
	MRAPrivateDataLen  = 222
	REJPrivateDataLen  = 148
	REPPrivateDataLen  = 196
	RTUPrivateDataLen  = 224
	DREQPrivateDataLen = 220
	DREPPrivateDataLen = 224
	// REJARILen is the size of the REJ's Additional Rejection Information.
	REJARILen = 72
)

// Transport service types of the REQ (IBTA 12.6.5).
const (
	ServiceRC = 0
	ServiceUC = 1
	ServiceRD = 3
)

// Path is one path of a REQ, primary or alternate (IBTA 12.6.5, Table 106,
// bytes 52-95 and 96-139 of the data). On RoCE the LIDs are 0xFFFF
// (permissive) and the GIDs are the IP addresses, IPv4 as ::ffff:a.b.c.d;
// GIDs decode with Unmap, so an IPv4 GID reads as the IPv4 address.
type Path struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID netip.Addr // the zero Addr encodes as the zero GID
	FlowLabel           uint32     // 20 bits
	PacketRate          uint8      // 6 bits, IBTA static rate code
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits: 4.096 us * 2^LocalACKTimeout
}

const pathLen = 44

func gidBytes(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}

func gidAddr(b []byte) netip.Addr { return netip.AddrFrom16([16]byte(b[:16])).Unmap() }

func (p *Path) check(which string) error {
	if p.FlowLabel <= 0xFFFFF && p.PacketRate <= 0x3F && p.SL <= 0xF && p.LocalACKTimeout <= 0x1F {
		return nil
	}
	return fmt.Errorf("%w: %s path: flow label %#x (20 bits), packet rate %#x (6), SL %d (4), local ACK timeout %d (5)",
		ErrFieldRange, which, p.FlowLabel, p.PacketRate, p.SL, p.LocalACKTimeout)
}

func (p *Path) put(d []byte) {
	binary.BigEndian.PutUint16(d[0:], p.LocalLID)
	binary.BigEndian.PutUint16(d[2:], p.RemoteLID)
	l, r := gidBytes(p.LocalGID), gidBytes(p.RemoteGID)
	copy(d[4:], l[:])
	copy(d[20:], r[:])
	binary.BigEndian.PutUint32(d[36:], p.FlowLabel<<12|uint32(p.PacketRate&0x3F))
	d[40], d[41] = p.TrafficClass, p.HopLimit
	d[42] = p.SL<<4 | bit(p.SubnetLocal, 0x08)
	d[43] = p.LocalACKTimeout << 3
}

func (p *Path) get(d []byte) {
	p.LocalLID = binary.BigEndian.Uint16(d[0:])
	p.RemoteLID = binary.BigEndian.Uint16(d[2:])
	p.LocalGID, p.RemoteGID = gidAddr(d[4:]), gidAddr(d[20:])
	w := binary.BigEndian.Uint32(d[36:])
	p.FlowLabel, p.PacketRate = w>>12, uint8(w&0x3F)
	p.TrafficClass, p.HopLimit = d[40], d[41]
	p.SL, p.SubnetLocal = d[42]>>4, d[42]&0x08 != 0
	p.LocalACKTimeout = d[43] >> 3
}

// REQ is ConnectRequest (IBTA 12.6.5, Table 106; Linux cm_req_msg), sent
// by the active side to start a connection. Offsets are of the 232 data
// bytes after the MAD header.
//
//	  0 LocalCommID            8 ServiceID        16 LocalCAGUID
//	 28 LocalQKey             32 LocalQPN:24 ResponderResources:8
//	 36 LocalEECN:24 InitiatorDepth:8
//	 40 RemoteEECN:24 RemoteCMResponseTimeout:5 TransportServiceType:2 EndToEndFlowControl:1
//	 44 StartingPSN:24 LocalCMResponseTimeout:5 RetryCount:3
//	 48 PKey:16 PathMTU:4 RDCExists:1 RNRRetryCount:3 MaxCMRetries:4 SRQ:1 ExtendedTransportType:3
//	 52 primary path (44 bytes)   96 alternate path (44 bytes)
//	140 PrivateData (92 bytes)
//
// StartingPSN is, as Linux uses it, the first PSN the active side expects
// to receive (the passive side's send PSN): the active side's rq_psn.
type REQ struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8  // READ/atomics the active side accepts as responder
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8  // READ/atomics the active side issues at once
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits: how long the passive CM may take to answer
	TransportServiceType    uint8  // 2 bits: ServiceRC, ServiceUC, ServiceRD
	EndToEndFlowControl     bool
	StartingPSN             bth.PSN
	LocalCMResponseTimeout  uint8 // 5 bits: how long the active CM takes to answer
	RetryCount              uint8 // 3 bits: transport retries (retry_cnt)
	PKey                    uint16
	PathMTU                 uint8 // 4 bits, ibv_mtu code (3 = 1024)
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits: RNR retries the passive side's sender makes
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary, Alternate      Path
	PrivateData             [REQPrivateDataLen]byte
}

// Attr returns AttrREQ.
func (*REQ) Attr() AttrID { return AttrREQ }

// AppendData appends the 232 data bytes. It returns ErrFieldRange when a
// field does not fit.
func (r *REQ) AppendData(b []byte) ([]byte, error) {
	if err := errors.Join(
		checkRange("local QPN", uint64(r.LocalQPN), 0xFFFFFF),
		checkRange("local EECN", uint64(r.LocalEECN), 0xFFFFFF),
		checkRange("remote EECN", uint64(r.RemoteEECN), 0xFFFFFF),
		checkRange("remote CM response timeout", uint64(r.RemoteCMResponseTimeout), 0x1F),
		checkRange("transport service type", uint64(r.TransportServiceType), 3),
		checkRange("starting PSN", uint64(r.StartingPSN), bth.PSNMask),
		checkRange("local CM response timeout", uint64(r.LocalCMResponseTimeout), 0x1F),
		checkRange("retry count", uint64(r.RetryCount), 7),
		checkRange("path MTU", uint64(r.PathMTU), 0xF),
		checkRange("RNR retry count", uint64(r.RNRRetryCount), 7),
		checkRange("max CM retries", uint64(r.MaxCMRetries), 0xF),
		checkRange("extended transport type", uint64(r.ExtendedTransportType), 7),
		r.Primary.check("primary"), r.Alternate.check("alternate")); err != nil {
		return b, err
	}
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint64(d[8:], r.ServiceID)
	binary.BigEndian.PutUint64(d[16:], r.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], r.LocalQKey)
	put24(d[32:], r.LocalQPN)
	d[35] = r.ResponderResources
	put24(d[36:], r.LocalEECN)
	d[39] = r.InitiatorDepth
	put24(d[40:], r.RemoteEECN)
	d[43] = r.RemoteCMResponseTimeout<<3 | r.TransportServiceType<<1 | bit(r.EndToEndFlowControl, 1)
	put24(d[44:], uint32(r.StartingPSN))
	d[47] = r.LocalCMResponseTimeout<<3 | r.RetryCount
	binary.BigEndian.PutUint16(d[48:], r.PKey)
	d[50] = r.PathMTU<<4 | bit(r.RDCExists, 0x08) | r.RNRRetryCount
	d[51] = r.MaxCMRetries<<4 | bit(r.SRQ, 0x08) | r.ExtendedTransportType
	r.Primary.put(d[52:])
	r.Alternate.put(d[96:])
	copy(d[140:], r.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes.
func (r *REQ) DecodeData(d []byte) error {
	if err := needData(d, AttrREQ); err != nil {
		return err
	}
	r.LocalCommID = binary.BigEndian.Uint32(d[0:])
	r.ServiceID = binary.BigEndian.Uint64(d[8:])
	r.LocalCAGUID = binary.BigEndian.Uint64(d[16:])
	r.LocalQKey = binary.BigEndian.Uint32(d[28:])
	r.LocalQPN, r.ResponderResources = get24(d[32:]), d[35]
	r.LocalEECN, r.InitiatorDepth = get24(d[36:]), d[39]
	r.RemoteEECN = get24(d[40:])
	r.RemoteCMResponseTimeout, r.TransportServiceType, r.EndToEndFlowControl = d[43]>>3, d[43]>>1&3, d[43]&1 != 0
	r.StartingPSN = bth.PSN(get24(d[44:]))
	r.LocalCMResponseTimeout, r.RetryCount = d[47]>>3, d[47]&7
	r.PKey = binary.BigEndian.Uint16(d[48:])
	r.PathMTU, r.RDCExists, r.RNRRetryCount = d[50]>>4, d[50]&0x08 != 0, d[50]&7
	r.MaxCMRetries, r.SRQ, r.ExtendedTransportType = d[51]>>4, d[51]&0x08 != 0, d[51]&7
	r.Primary.get(d[52:])
	r.Alternate.get(d[96:])
	copy(r.PrivateData[:], d[140:])
	return nil
}

// Message codes of the MRA's MessageMRAed and the REJ's MessageRejected
// (IBTA 12.6.6, 12.6.7).
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2 // MRA: LAP; REJ: no message (a timeout, or a REJ on its own)
)

// MRA is MsgRcptAck (IBTA 12.6.6, Table 107): "I got your message and
// need ServiceTimeout more to answer it".
//
//	0 LocalCommID  4 RemoteCommID  8 MessageMRAed:2  9 ServiceTimeout:5  10 PrivateData (222)
type MRA struct {
	LocalCommID, RemoteCommID uint32
	MessageMRAed              uint8 // 2 bits: MsgREQ, MsgREP or MsgOther (LAP)
	ServiceTimeout            uint8 // 5 bits: 4.096 us * 2^ServiceTimeout
	PrivateData               [MRAPrivateDataLen]byte
}

// Attr returns AttrMRA.
func (*MRA) Attr() AttrID { return AttrMRA }

// AppendData appends the 232 data bytes.
func (m *MRA) AppendData(b []byte) ([]byte, error) {
	if err := errors.Join(checkRange("message MRAed", uint64(m.MessageMRAed), 3),
		checkRange("service timeout", uint64(m.ServiceTimeout), 0x1F)); err != nil {
		return b, err
	}
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8], d[9] = m.MessageMRAed<<6, m.ServiceTimeout<<3
	copy(d[10:], m.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes.
func (m *MRA) DecodeData(d []byte) error {
	if err := needData(d, AttrMRA); err != nil {
		return err
	}
	m.LocalCommID, m.RemoteCommID = binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
	m.MessageMRAed, m.ServiceTimeout = d[8]>>6, d[9]>>3
	copy(m.PrivateData[:], d[10:])
	return nil
}

// RejectReason is a REJ's reason code (IBTA 12.6.7.2, Table 109; Linux
// enum ib_cm_rej_reason).
type RejectReason uint16

// Reject reasons.
const (
	RejNoQP                     RejectReason = 1
	RejNoEEC                    RejectReason = 2
	RejNoResources              RejectReason = 3
	RejTimeout                  RejectReason = 4 // ARI: the rejecting CA's GUID
	RejUnsupported              RejectReason = 5
	RejInvalidCommID            RejectReason = 6
	RejInvalidCommInstance      RejectReason = 7
	RejInvalidServiceID         RejectReason = 8 // nobody listens on the service ID
	RejInvalidTransportType     RejectReason = 9
	RejStaleConn                RejectReason = 10
	RejRDCNotExist              RejectReason = 11
	RejInvalidGID               RejectReason = 12
	RejInvalidLID               RejectReason = 13
	RejInvalidSL                RejectReason = 14
	RejInvalidTrafficClass      RejectReason = 15
	RejInvalidHopLimit          RejectReason = 16
	RejInvalidPacketRate        RejectReason = 17
	RejPortCMRedirect           RejectReason = 24
	RejPortRedirect             RejectReason = 25
	RejInvalidMTU               RejectReason = 26
	RejInsufficientRespResource RejectReason = 27
	RejConsumer                 RejectReason = 28 // the application said no (rdma_reject)
	RejInvalidRNRRetry          RejectReason = 29
	RejDuplicateLocalCommID     RejectReason = 30
	RejInvalidClassVersion      RejectReason = 31
	RejInvalidFlowLabel         RejectReason = 32
)

var rejectNames = map[RejectReason]string{
	RejNoQP: "no QP", RejNoEEC: "no EEC", RejNoResources: "no resources", RejTimeout: "timeout",
	RejUnsupported: "unsupported request", RejInvalidCommID: "invalid communication ID",
	RejInvalidCommInstance: "invalid communication instance", RejInvalidServiceID: "invalid service ID",
	RejInvalidTransportType: "invalid transport type", RejStaleConn: "stale connection",
	RejRDCNotExist: "RDC does not exist", RejInvalidGID: "invalid GID", RejInvalidLID: "invalid LID",
	RejInvalidSL: "invalid SL", RejInvalidTrafficClass: "invalid traffic class",
	RejInvalidHopLimit: "invalid hop limit", RejInvalidPacketRate: "invalid packet rate",
	RejPortCMRedirect: "port and CM redirection", RejPortRedirect: "port redirection",
	RejInvalidMTU: "invalid path MTU", RejInsufficientRespResource: "insufficient responder resources",
	RejConsumer: "consumer reject", RejInvalidRNRRetry: "invalid RNR retry count",
	RejDuplicateLocalCommID: "duplicate local communication ID", RejInvalidClassVersion: "invalid class version",
	RejInvalidFlowLabel: "invalid flow label",
}

// String names the reason as IBTA does, with its code.
func (r RejectReason) String() string {
	if s, ok := rejectNames[r]; ok {
		return fmt.Sprintf("%s (%d)", s, uint16(r))
	}
	return fmt.Sprintf("reason %d", uint16(r))
}

// REJ is ConnectReject (IBTA 12.6.7, Table 108).
//
//	0 LocalCommID  4 RemoteCommID  8 MessageRejected:2  9 RejectedInfoLength:7
//	10 Reason:16  12 ARI (72)  84 PrivateData (148)
type REJ struct {
	LocalCommID, RemoteCommID uint32
	MessageRejected           uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	ARILength                 uint8 // 7 bits: bytes of ARI that matter
	Reason                    RejectReason
	ARI                       [REJARILen]byte
	PrivateData               [REJPrivateDataLen]byte
}

// Attr returns AttrREJ.
func (*REJ) Attr() AttrID { return AttrREJ }

// AppendData appends the 232 data bytes.
func (r *REJ) AppendData(b []byte) ([]byte, error) {
	if err := errors.Join(checkRange("message rejected", uint64(r.MessageRejected), 3),
		checkRange("ARI length", uint64(r.ARILength), REJARILen)); err != nil {
		return b, err
	}
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	d[8], d[9] = r.MessageRejected<<6, r.ARILength<<1
	binary.BigEndian.PutUint16(d[10:], uint16(r.Reason))
	copy(d[12:], r.ARI[:])
	copy(d[84:], r.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes. An ARI length over 72 (the 7-bit
// field can say up to 127; the ARI holds 72 bytes) is read as 72: all the
// ARI the message carries. Linux (cm.c) hands the length on unchecked;
// reading it as 72 keeps every REJ that decodes one that re-encodes.
func (r *REJ) DecodeData(d []byte) error {
	if err := needData(d, AttrREJ); err != nil {
		return err
	}
	r.LocalCommID, r.RemoteCommID = binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
	r.MessageRejected, r.ARILength = d[8]>>6, min(d[9]>>1, REJARILen)
	r.Reason = RejectReason(binary.BigEndian.Uint16(d[10:]))
	copy(r.ARI[:], d[12:])
	copy(r.PrivateData[:], d[84:])
	return nil
}

// ARIBytes returns the meaningful part of the ARI (ARILength bytes, at
// most 72).
func (r *REJ) ARIBytes() []byte { return r.ARI[:min(int(r.ARILength), REJARILen)] }

// REP is ConnectReply (IBTA 12.6.8, Table 110), the passive side's answer.
//
//	 0 LocalCommID  4 RemoteCommID  8 LocalQKey  12 LocalQPN:24
//	16 LocalEECN:24  20 StartingPSN:24  24 ResponderResources  25 InitiatorDepth
//	26 TargetACKDelay:5 FailoverAccepted:2 EndToEndFlowControl:1
//	27 RNRRetryCount:3 SRQ:1  28 LocalCAGUID  36 PrivateData (196)
//
// StartingPSN is the first PSN the passive side expects to receive: the
// active side's send PSN (Linux: the passive side's rq_psn).
type REP struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	LocalEECN                 uint32 // 24 bits
	StartingPSN               bth.PSN
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	EndToEndFlowControl       bool
	RNRRetryCount             uint8 // 3 bits: RNR retries the active side's sender makes
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               [REPPrivateDataLen]byte
}

// Attr returns AttrREP.
func (*REP) Attr() AttrID { return AttrREP }

// AppendData appends the 232 data bytes.
func (r *REP) AppendData(b []byte) ([]byte, error) {
	if err := errors.Join(
		checkRange("local QPN", uint64(r.LocalQPN), 0xFFFFFF),
		checkRange("local EECN", uint64(r.LocalEECN), 0xFFFFFF),
		checkRange("starting PSN", uint64(r.StartingPSN), bth.PSNMask),
		checkRange("target ACK delay", uint64(r.TargetACKDelay), 0x1F),
		checkRange("failover accepted", uint64(r.FailoverAccepted), 3),
		checkRange("RNR retry count", uint64(r.RNRRetryCount), 7)); err != nil {
		return b, err
	}
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], r.LocalQKey)
	put24(d[12:], r.LocalQPN)
	put24(d[16:], r.LocalEECN)
	put24(d[20:], uint32(r.StartingPSN))
	d[24], d[25] = r.ResponderResources, r.InitiatorDepth
	d[26] = r.TargetACKDelay<<3 | r.FailoverAccepted<<1 | bit(r.EndToEndFlowControl, 1)
	d[27] = r.RNRRetryCount<<5 | bit(r.SRQ, 0x10)
	binary.BigEndian.PutUint64(d[28:], r.LocalCAGUID)
	copy(d[36:], r.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes.
func (r *REP) DecodeData(d []byte) error {
	if err := needData(d, AttrREP); err != nil {
		return err
	}
	r.LocalCommID, r.RemoteCommID = binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
	r.LocalQKey = binary.BigEndian.Uint32(d[8:])
	r.LocalQPN, r.LocalEECN = get24(d[12:]), get24(d[16:])
	r.StartingPSN = bth.PSN(get24(d[20:]))
	r.ResponderResources, r.InitiatorDepth = d[24], d[25]
	r.TargetACKDelay, r.FailoverAccepted, r.EndToEndFlowControl = d[26]>>3, d[26]>>1&3, d[26]&1 != 0
	r.RNRRetryCount, r.SRQ = d[27]>>5, d[27]&0x10 != 0
	r.LocalCAGUID = binary.BigEndian.Uint64(d[28:])
	copy(r.PrivateData[:], d[36:])
	return nil
}

// RTU is ReadyToUse (IBTA 12.6.9, Table 111): the active side's QP is
// ready.
//
//	0 LocalCommID  4 RemoteCommID  8 PrivateData (224)
type RTU struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               [RTUPrivateDataLen]byte
}

// Attr returns AttrRTU.
func (*RTU) Attr() AttrID { return AttrRTU }

// AppendData appends the 232 data bytes.
func (r *RTU) AppendData(b []byte) ([]byte, error) {
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	copy(d[8:], r.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes.
func (r *RTU) DecodeData(d []byte) error {
	if err := needData(d, AttrRTU); err != nil {
		return err
	}
	r.LocalCommID, r.RemoteCommID = binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
	copy(r.PrivateData[:], d[8:])
	return nil
}

// DREQ is DisconnectRequest (IBTA 12.6.10, Table 112).
//
//	0 LocalCommID  4 RemoteCommID  8 RemoteQPN:24  12 PrivateData (220)
//
// RemoteQPN is the receiver's QPN (the sender's remote QP).
type DREQ struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 uint32 // 24 bits
	PrivateData               [DREQPrivateDataLen]byte
}

// Attr returns AttrDREQ.
func (*DREQ) Attr() AttrID { return AttrDREQ }

// AppendData appends the 232 data bytes.
func (r *DREQ) AppendData(b []byte) ([]byte, error) {
	if err := checkRange("remote QPN", uint64(r.RemoteQPN), 0xFFFFFF); err != nil {
		return b, err
	}
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	put24(d[8:], r.RemoteQPN)
	copy(d[12:], r.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes.
func (r *DREQ) DecodeData(d []byte) error {
	if err := needData(d, AttrDREQ); err != nil {
		return err
	}
	r.LocalCommID, r.RemoteCommID = binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
	r.RemoteQPN = get24(d[8:])
	copy(r.PrivateData[:], d[12:])
	return nil
}

// DREP is DisconnectReply (IBTA 12.6.11, Table 113).
//
//	0 LocalCommID  4 RemoteCommID  8 PrivateData (224)
type DREP struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               [DREPPrivateDataLen]byte
}

// Attr returns AttrDREP.
func (*DREP) Attr() AttrID { return AttrDREP }

// AppendData appends the 232 data bytes.
func (r *DREP) AppendData(b []byte) ([]byte, error) {
	b, d := grow(b)
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	copy(d[8:], r.PrivateData[:])
	return b, nil
}

// DecodeData reads the 232 data bytes.
func (r *DREP) DecodeData(d []byte) error {
	if err := needData(d, AttrDREP); err != nil {
		return err
	}
	r.LocalCommID, r.RemoteCommID = binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
	copy(r.PrivateData[:], d[8:])
	return nil
}
