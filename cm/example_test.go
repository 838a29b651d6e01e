package cm_test

import (
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/roce-emu/roce-emu/cm"
	"github.com/roce-emu/roce-emu/qp"
)

// Two Managers connect and disconnect, sans-IO: what one queues
// (PollMAD) is handed to the other (HandleMAD) with the sender's address,
// as a driver would after sending it from QP1 to the peer's QP1 and
// receiving it there. The passive side answers the connect request with
// Accept; both learn the values for their QPs (QPParams.Apply).
func Example() {
	client, server := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	active := cm.NewManager(cm.Config{CAGUID: 1})
	passive := cm.NewManager(cm.Config{CAGUID: 2})
	port := cm.ServiceID(cm.PortSpaceTCP, 7174) // rping's default port
	if err := passive.Listen(port); err != nil {
		log.Fatal(err)
	}
	now := time.Unix(0, 0)
	pump := func() {
		for moved := true; moved; {
			moved = false
			for o, ok := active.PollMAD(); ok; o, ok = active.PollMAD() {
				moved = true
				_ = passive.HandleMAD(now, client, o.MAD[:])
			}
			for o, ok := passive.PollMAD(); ok; o, ok = passive.PollMAD() {
				moved = true
				_ = active.HandleMAD(now, server, o.MAD[:])
			}
		}
	}
	id, err := active.Dial(now, cm.DialParams{Local: client, Remote: server, ServiceID: port, SrcPort: 40000,
		QPN: 0x11, StartingPSN: 100, PathMTU: qp.IBV_MTU_1024, ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 7, RNRRetryCount: 7})
	if err != nil {
		log.Fatal(err)
	}
	pump()
	req, _ := passive.PollEvent()
	fmt.Println(req.Type, req.Peer, req.IP.Src, "QPN", req.Params.RemoteQPN)
	if _, err := passive.Accept(now, req.ID, cm.AcceptParams{QPN: 0x12, StartingPSN: 200,
		ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		log.Fatal(err)
	}
	pump()
	est, _ := active.PollEvent()
	fmt.Println("active:", est.Type, "SQ PSN", est.Params.SQPSN, "RQ PSN", est.Params.RQPSN, "remote QPN", est.Params.RemoteQPN)
	est, _ = passive.PollEvent()
	fmt.Println("passive:", est.Type, "SQ PSN", est.Params.SQPSN, "RQ PSN", est.Params.RQPSN, "remote QPN", est.Params.RemoteQPN)

	if err := active.Disconnect(now, id, nil); err != nil {
		log.Fatal(err)
	}
	pump()
	d, _ := passive.PollEvent()
	fmt.Println("passive:", d.Type, passive.State(d.ID))
	now = active.Deadline()
	active.HandleTimeout(now)
	passive.HandleTimeout(now)
	for _, m := range []*cm.Manager{active, passive} {
		for e, ok := m.PollEvent(); ok; e, ok = m.PollEvent() {
			fmt.Println(e.Type)
		}
	}
	fmt.Println("held:", active.Len(), passive.Len())
	// Output:
	// CONNECT_REQUEST 192.0.2.1 192.0.2.1:40000 QPN 17
	// active: ESTABLISHED SQ PSN 200 RQ PSN 100 remote QPN 18
	// passive: ESTABLISHED SQ PSN 100 RQ PSN 200 remote QPN 17
	// passive: DISCONNECTED TIMEWAIT
	// DISCONNECTED
	// TIMEWAIT_EXIT
	// TIMEWAIT_EXIT
	// held: 0 0
}
