package cm

import (
	"encoding/binary"
	"fmt"
)

// MAD sizes (IBTA Vol. 1 13.4.2: every MAD is 256 bytes, a 24-byte common
// header and 232 bytes of class data).
const (
	MADLen       = 256
	MADHeaderLen = 24
	MADDataLen   = MADLen - MADHeaderLen
)

// Values of the MAD header of every CM message (IBTA 13.4.2 and 12.6).
const (
	BaseVersion  = 1    // MAD base version
	MgmtClassCM  = 0x07 // communication management class
	ClassVersion = 2    // CM class version
	MethodSend   = 0x03 // CM messages all use the Send method
)

// AttrID is a CM MAD's attribute ID: which message it is (IBTA 12.6, Table 104).
type AttrID uint16

// CM attribute IDs.
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010 // ConnectRequest
	AttrMRA           AttrID = 0x0011 // MsgRcptAck
	AttrREJ           AttrID = 0x0012 // ConnectReject
	AttrREP           AttrID = 0x0013 // ConnectReply
	AttrRTU           AttrID = 0x0014 // ReadyToUse
	AttrDREQ          AttrID = 0x0015 // DisconnectRequest
	AttrDREP          AttrID = 0x0016 // DisconnectReply
	AttrSIDRREQ       AttrID = 0x0017 // ServiceIDResReq
	AttrSIDRREP       AttrID = 0x0018 // ServiceIDResReqResp
	AttrLAP           AttrID = 0x0019 // LoadAlternatePath
	AttrAPR           AttrID = 0x001A // AlternatePathResponse
)

var attrNames = map[AttrID]string{
	AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ",
	AttrREP: "REP", AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP",
	AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP", AttrLAP: "LAP", AttrAPR: "APR",
}

// String returns the message's short name (REQ, REP, ...) or the ID in hex.
func (a AttrID) String() string {
	if s, ok := attrNames[a]; ok {
		return s
	}
	return fmt.Sprintf("attr(0x%04x)", uint16(a))
}

// Header is the MAD common header (IBTA 13.4.2, Table 150), 24 bytes:
//
//	 0: BaseVersion  1: MgmtClass  2: ClassVersion  3: R|Method
//	 4: Status (16)  6: ClassSpecific (16)
//	 8: TransactionID (64)
//	16: AttributeID (16)  18: reserved (16)  20: AttributeModifier (32)
type Header struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8 // with the response bit (0x80)
	Status        uint16
	ClassSpecific uint16
	TransactionID uint64
	AttrID        AttrID
	AttrModifier  uint32
}

// CMHeader returns the header of a CM message: base version 1, class 0x07,
// class version 2, method Send, the transaction ID and attribute ID given.
func CMHeader(tid uint64, attr AttrID) Header {
	return Header{BaseVersion: BaseVersion, MgmtClass: MgmtClassCM, ClassVersion: ClassVersion,
		Method: MethodSend, TransactionID: tid, AttrID: attr}
}

// Append appends the 24-byte header to b.
func (h *Header) Append(b []byte) []byte {
	b = append(b, h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method)
	b = binary.BigEndian.AppendUint16(b, h.Status)
	b = binary.BigEndian.AppendUint16(b, h.ClassSpecific)
	b = binary.BigEndian.AppendUint64(b, h.TransactionID)
	b = binary.BigEndian.AppendUint16(b, uint16(h.AttrID))
	b = append(b, 0, 0)
	return binary.BigEndian.AppendUint32(b, h.AttrModifier)
}

// Decode reads the header from the first 24 bytes of b. It returns
// ErrTruncated when b is shorter; it does not check the values (IsCM does).
func (h *Header) Decode(b []byte) error {
	if len(b) < MADHeaderLen {
		return fmt.Errorf("%w: %d bytes, the MAD header needs %d", ErrTruncated, len(b), MADHeaderLen)
	}
	h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method = b[0], b[1], b[2], b[3]
	h.Status = binary.BigEndian.Uint16(b[4:])
	h.ClassSpecific = binary.BigEndian.Uint16(b[6:])
	h.TransactionID = binary.BigEndian.Uint64(b[8:])
	h.AttrID = AttrID(binary.BigEndian.Uint16(b[16:]))
	h.AttrModifier = binary.BigEndian.Uint32(b[20:])
	return nil
}

// IsCM reports whether the header is a CM Send: base version 1, class
// 0x07, class version 2, method 0x03.
func (h *Header) IsCM() bool {
	return h.BaseVersion == BaseVersion && h.MgmtClass == MgmtClassCM &&
		h.ClassVersion == ClassVersion && h.Method == MethodSend
}

// Message is one CM message's attribute data: REQ, MRA, REJ, REP, RTU,
// DREQ or DREP. AppendData appends exactly MADDataLen bytes; DecodeData
// reads them (ErrTruncated when fewer).
type Message interface {
	Attr() AttrID
	AppendData(b []byte) ([]byte, error)
	DecodeData(data []byte) error
}

// AppendMAD appends a whole 256-byte CM MAD, header and m's data, to b.
func AppendMAD(b []byte, tid uint64, m Message) ([]byte, error) {
	h := CMHeader(tid, m.Attr())
	start := len(b)
	b = h.Append(b)
	b, err := m.AppendData(b)
	if err != nil {
		return b[:start], err
	}
	return b, nil
}

// DecodeMAD decodes a CM MAD: the header, then the message its attribute
// ID names. Bytes after the 256th are ignored. It returns ErrTruncated,
// ErrNotCM or ErrUnknownAttr (with the header filled in) for what it
// cannot decode.
func DecodeMAD(mad []byte) (Header, Message, error) {
	var h Header
	if err := h.Decode(mad); err != nil {
		return h, nil, err
	}
	if !h.IsCM() {
		return h, nil, fmt.Errorf("%w: base version %d, class 0x%02x, class version %d, method 0x%02x",
			ErrNotCM, h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method)
	}
	var m Message
	switch h.AttrID {
	case AttrREQ:
		m = new(REQ)
	case AttrMRA:
		m = new(MRA)
	case AttrREJ:
		m = new(REJ)
	case AttrREP:
		m = new(REP)
	case AttrRTU:
		m = new(RTU)
	case AttrDREQ:
		m = new(DREQ)
	case AttrDREP:
		m = new(DREP)
	default:
		return h, nil, fmt.Errorf("%w: %v", ErrUnknownAttr, h.AttrID)
	}
	if err := m.DecodeData(mad[MADHeaderLen:]); err != nil {
		return h, nil, err
	}
	return h, m, nil
}

// grow appends MADDataLen zero bytes to b and returns b and the new bytes.
func grow(b []byte) ([]byte, []byte) {
	start := len(b)
	b = append(b, make([]byte, MADDataLen)...)
	return b, b[start:]
}

func needData(data []byte, what AttrID) error {
	if len(data) < MADDataLen {
		return fmt.Errorf("%w: %v data is %d bytes, want %d", ErrTruncated, what, len(data), MADDataLen)
	}
	return nil
}

func checkRange(name string, v, max uint64) error {
	if v > max {
		return fmt.Errorf("%w: %s %#x over %#x", ErrFieldRange, name, v, max)
	}
	return nil
}

func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }
func get24(b []byte) uint32    { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
func bit(v bool, mask byte) byte {
	if v {
		return mask
	}
	return 0
}
