package transport

import (
	"fmt"
	"net/netip"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/cm"
)

// gsiQueueLen bounds the CM answers an Endpoint without QP1 holds between
// two flushes; more are dropped and counted (Stats.CMDropped).
const gsiQueueLen = 64

// gsiAnswer is one MAD an Endpoint without QP1 sends back.
type gsiAnswer struct {
	to  netip.Addr
	mad [cm.MADLen]byte
}

// answerGSILocked handles a datagram to QP1 when no QP1 exists (no
// communication manager, such as package rdmacm, runs on the Endpoint).
// A host always has a CM: Linux's ib_cm answers a REQ for a service
// nobody listens on with a REJ, reason invalid service ID (8), at once
// (cm.c cm_req_handler: cm_issue_rej), and a DREQ for a connection it does
// not know with a DREP (cm_issue_drep), so that the peer's rping -c or
// ib_*_bw -R fails at once instead of resending its REQ until it times
// out. The Endpoint does as much: a REQ gets that REJ, a DREQ its DREP,
// each counted in Stats.CMRejects or Stats.CMDREPs. Anything else (not a
// UD SEND Only with Q_Key 0x80010000, not a CM MAD, another CM message)
// is dropped and counted in Stats.CMDropped.
func (ep *Endpoint) answerGSILocked(p *bth.Packet, d *Datagram) {
	if p.BTH.Opcode != bth.UDSendOnly || p.DETH.QKey != bth.GSIQKey || len(ep.gsiOut) >= gsiQueueLen {
		ep.stats.CMDropped++
		return
	}
	h, msg, err := cm.DecodeMAD(p.Payload)
	if err != nil {
		ep.stats.CMDropped++
		return
	}
	var answer cm.Message
	switch m := msg.(type) {
	case *cm.REQ:
		ep.stats.CMRejects++
		ep.log.Warn("a CM REQ (rdma_cm: rping -c, perftest -R) came to QP1 and was rejected (invalid service ID): no rdma_cm service runs on this endpoint",
			"from", d.Src.Addr(), "service_id", fmt.Sprintf("%#016x", m.ServiceID))
		answer = &cm.REJ{RemoteCommID: m.LocalCommID, MessageRejected: cm.MsgREQ, Reason: cm.RejInvalidServiceID}
	case *cm.DREQ:
		ep.stats.CMDREPs++
		answer = &cm.DREP{LocalCommID: m.RemoteCommID, RemoteCommID: m.LocalCommID}
	default:
		ep.stats.CMDropped++
		return
	}
	a := gsiAnswer{to: d.Src.Addr()}
	if _, err := cm.AppendMAD(a.mad[:0], h.TransactionID, answer); err != nil {
		ep.stats.CMDropped++ // cannot happen: the messages are built from decoded fields
		return
	}
	ep.gsiOut = append(ep.gsiOut, a)
}

// appendGSILocked encodes the queued CM answers into ep.batch, as QP1
// would send them: UD SEND Only from QP1 to QP1, Q_Key 0x80010000, AckReq
// set, TOS 0 and hop limit 64, as rxe sends MADs.
func (ep *Endpoint) appendGSILocked() {
	if len(ep.gsiOut) == 0 {
		return
	}
	local := ep.conn.LocalAddr()
	for i := range ep.gsiOut {
		a := &ep.gsiOut[i]
		to := a.to
		if local.Addr().Unmap().Is4() {
			to = to.Unmap()
		}
		e := bth.Encap{Src: local.Addr(), Dst: to, DstPort: local.Port(),
			SrcPort: ep.conn.SourcePort(bth.SourcePort(0, 1, 1)), HopLimit: 64}
		if local.Addr().Unmap().Is4() {
			e.Src = local.Addr().Unmap()
		}
		if e.Src.Is4() != e.Dst.Is4() {
			ep.stats.CMDropped++
			continue
		}
		ep.gsiPSN = (ep.gsiPSN + 1) & bth.PSNMask
		pkt := bth.Packet{BTH: bth.BTH{Opcode: bth.UDSendOnly, PKey: 0xFFFF, DestQP: 1, AckReq: true, PSN: ep.gsiPSN},
			DETH: bth.DETH{QKey: bth.GSIQKey, SrcQP: 1}, Payload: a.mad[:]}
		start := len(ep.arena)
		var err error
		if ep.arena, err = pkt.Append(ep.arena, &e); err != nil {
			ep.stats.CMDropped++
			continue
		}
		ep.batch = append(ep.batch, Datagram{Data: ep.arena[start:len(ep.arena):len(ep.arena)],
			Src: netip.AddrPortFrom(e.Src, e.SrcPort), Dst: netip.AddrPortFrom(e.Dst, e.DstPort), TTL: e.HopLimit})
	}
	clear(ep.gsiOut)
	ep.gsiOut = ep.gsiOut[:0]
}
