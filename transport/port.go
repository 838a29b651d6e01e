package transport

import "github.com/roce-emu/roce-emu/qp"

// ActiveMTU returns the port's active MTU (ibv_port_attr.active_mtu), the
// largest UD message: IBV_MTU_1024 unless SetActiveMTU changed it.
func (ep *Endpoint) ActiveMTU() qp.MTU {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.dev.ActiveMTU()
}

// SetActiveMTU sets the port's active MTU, as rxe derives it from its
// link's MTU; UD QPs created afterwards take it as their MTU. It fails
// for a code other than IBV_MTU_256 to IBV_MTU_4096.
func (ep *Endpoint) SetActiveMTU(m qp.MTU) error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.dev.SetActiveMTU(m)
}
