package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cm"
)

// jsonCM is a CM MAD (a UD SEND to QP1 carrying management class 0x07,
// IBTA Vol. 1 ch. 12) as decode --json shows it.
type jsonCM struct {
	Message      string  `json:"message"` // REQ, MRA, REJ, REP, RTU, DREQ, DREP
	TID          string  `json:"transaction_id"`
	LocalCommID  string  `json:"local_comm_id"`
	RemoteCommID string  `json:"remote_comm_id,omitempty"`
	QPN          string  `json:"qpn,omitempty"`          // REQ, REP: the sender's QPN
	StartingPSN  *uint32 `json:"starting_psn,omitempty"` // REQ, REP
	PathMTU      int     `json:"path_mtu,omitempty"`     // REQ: bytes
	ServiceID    string  `json:"service_id,omitempty"`   // REQ
	Port         int     `json:"port,omitempty"`         // REQ: the rdma_cm port of the service ID
	Src          string  `json:"src,omitempty"`          // REQ: rdma_cm's private-data header
	Dst          string  `json:"dst,omitempty"`
	Reason       string  `json:"reject_reason,omitempty"` // REJ
	Error        string  `json:"error,omitempty"`         // a MAD that does not decode
}

// cmOf decodes the CM MAD a packet carries, or returns nil when the packet
// is not a UD SEND to QP1.
func cmOf(p *bth.Packet) *jsonCM {
	if p.BTH.DestQP != 1 || (p.BTH.Opcode != bth.UDSendOnly && p.BTH.Opcode != bth.UDSendOnlyImm) {
		return nil
	}
	h, m, err := cm.DecodeMAD(p.Payload)
	j := &jsonCM{TID: fmt.Sprintf("%#x", h.TransactionID)}
	if err != nil {
		j.Message = h.AttrID.String()
		j.Error = err.Error()
		return j
	}
	j.Message = m.Attr().String()
	hex := func(v uint32) string { return fmt.Sprintf("%#x", v) }
	switch m := m.(type) {
	case *cm.REQ:
		j.LocalCommID, j.QPN = hex(m.LocalCommID), fmt.Sprintf("%#06x", m.LocalQPN)
		psn := uint32(m.StartingPSN)
		j.StartingPSN = &psn
		j.PathMTU = 128 << m.PathMTU
		j.ServiceID = fmt.Sprintf("%#016x", m.ServiceID)
		if _, port, ok := cm.ParseServiceID(m.ServiceID); ok {
			j.Port = int(port)
		}
		var ip cm.IPHeader
		if ip.Decode(m.PrivateData[:]) == nil {
			j.Src, j.Dst = ip.Src.String(), netip.AddrPortFrom(ip.Dst, uint16(j.Port)).String()
		}
	case *cm.REP:
		j.LocalCommID, j.RemoteCommID, j.QPN = hex(m.LocalCommID), hex(m.RemoteCommID), fmt.Sprintf("%#06x", m.LocalQPN)
		psn := uint32(m.StartingPSN)
		j.StartingPSN = &psn
	case *cm.REJ:
		j.LocalCommID, j.RemoteCommID, j.Reason = hex(m.LocalCommID), hex(m.RemoteCommID), m.Reason.String()
	case *cm.MRA:
		j.LocalCommID, j.RemoteCommID = hex(m.LocalCommID), hex(m.RemoteCommID)
	case *cm.RTU:
		j.LocalCommID, j.RemoteCommID = hex(m.LocalCommID), hex(m.RemoteCommID)
	case *cm.DREQ:
		j.LocalCommID, j.RemoteCommID = hex(m.LocalCommID), hex(m.RemoteCommID)
	case *cm.DREP:
		j.LocalCommID, j.RemoteCommID = hex(m.LocalCommID), hex(m.RemoteCommID)
	}
	return j
}

// text formats the CM MAD for decode's text line.
func (j *jsonCM) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, " cm{%s tid=%s", j.Message, j.TID)
	if j.Error != "" {
		fmt.Fprintf(&b, " error=%q}", j.Error)
		return b.String()
	}
	fmt.Fprintf(&b, " lcid=%s", j.LocalCommID)
	if j.RemoteCommID != "" {
		fmt.Fprintf(&b, " rcid=%s", j.RemoteCommID)
	}
	if j.QPN != "" {
		fmt.Fprintf(&b, " qpn=%s", j.QPN)
	}
	if j.StartingPSN != nil {
		fmt.Fprintf(&b, " starting_psn=%#06x", *j.StartingPSN)
	}
	if j.PathMTU != 0 {
		fmt.Fprintf(&b, " mtu=%d", j.PathMTU)
	}
	if j.Src != "" {
		fmt.Fprintf(&b, " rdma_cm{%s > %s}", j.Src, j.Dst)
	} else if j.Port != 0 {
		fmt.Fprintf(&b, " port=%d", j.Port)
	}
	if j.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", j.Reason)
	}
	b.WriteString("}")
	return b.String()
}

// appendJSONCM appends the "cm" key (rare packets: encoding/json is fine).
func appendJSONCM(b []byte, j *jsonCM) []byte {
	out, err := json.Marshal(j)
	if err != nil {
		return b
	}
	b = append(b, `,"cm":`...)
	return append(b, out...)
}
