package qp

import (
	"errors"
	"fmt"
	"time"

	"github.com/roce-emu/roce-emu/cc"
)

// Device is one emulated RDMA device, as an ibv_context: it numbers the
// QPs created on it and hands out the L_Keys, R_Keys and virtual addresses
// of the memory regions of all its protection domains, so that keys are
// unique across the domains of one device (a key of another domain is
// then unknown to a QP, IBTA 10.6.3.2) and regions get distinct addresses,
// as the buffers of one process have. Two devices number independently,
// as two hosts do. The zero value is not usable; call NewDevice. A Device
// is not safe for concurrent use: a driver serialises calls on the device,
// its PDs and its QPs (package transport holds the Endpoint's lock).
type Device struct {
	keySeq    uint32
	liveKeys  map[uint32]bool // keys of registered regions, across the PDs
	nextVA    uint64
	nextQPN   uint32
	qpns      map[uint32]*QP
	activeMTU MTU
	events    []AsyncEvent
	// portNP is the device's one port's CNP pacing, shared by the QPs
	// whose congestion control paces CNPs per port (cc.Params.CNPPerPort).
	portNP *cc.NotificationPoint
	// EventOverruns counts asynchronous events lost because MaxEvents
	// were waiting unread.
	EventOverruns uint64
}

// EventType is an asynchronous event type, as ibv_event_type (the values
// are rdma-core's).
type EventType uint8

// Asynchronous event types this package raises.
const (
	IBV_EVENT_SRQ_LIMIT_REACHED EventType = 15
)

// String returns the name without the IBV_EVENT_ prefix.
func (t EventType) String() string {
	if t == IBV_EVENT_SRQ_LIMIT_REACHED {
		return "SRQ_LIMIT_REACHED"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// AsyncEvent is an asynchronous event of a device, as ibv_async_event:
// its type and the object it concerns.
type AsyncEvent struct {
	Type EventType
	SRQ  *SRQ // IBV_EVENT_SRQ_LIMIT_REACHED
}

// MaxEvents bounds the asynchronous events a device keeps unread.
const MaxEvents = 256

// PollEvents moves up to len(out) unread asynchronous events into out,
// oldest first, and returns how many (ibv_get_async_event without the
// wait: a driver polls after the calls that may raise one, HandlePacket
// among them).
func (d *Device) PollEvents(out []AsyncEvent) int {
	n := copy(out, d.events)
	d.events = append(d.events[:0], d.events[n:]...)
	return n
}

func (d *Device) raise(ev AsyncEvent) {
	if len(d.events) >= MaxEvents {
		d.EventOverruns++
		return
	}
	d.events = append(d.events, ev)
}

// ActiveMTU returns the port's active MTU (ibv_port_attr.active_mtu),
// which bounds UD messages: IBV_MTU_1024 unless SetActiveMTU changed it,
// what rxe reports on a 1500-byte Ethernet link.
func (d *Device) ActiveMTU() MTU { return d.activeMTU }

// SetActiveMTU sets the port's active MTU; UD QPs created afterwards
// take it as their MTU.
func (d *Device) SetActiveMTU(m MTU) error {
	if m.Bytes() == 0 {
		return fmt.Errorf("%w: MTU code %d (1=256 ... 5=4096)", ErrBadAttr, m)
	}
	d.activeMTU = m
	return nil
}

// portNotificationPoint returns the port's notification point, made with
// interval on first use.
func (d *Device) portNotificationPoint(interval time.Duration) *cc.NotificationPoint {
	if d.portNP == nil {
		d.portNP = cc.NewNotificationPoint(interval, false)
	}
	return d.portNP
}

// firstVA is where memory regions are placed: an address of the shape a
// user-space buffer has on x86-64 Linux, so that captures look like those
// of real stacks.
const firstVA = 0x7f0000000000

// firstQPN is the first QPN a device allocates (rxe's RXE_MIN_QP_INDEX
// range starts at 0x11; 0 and 1 are the special QPs, IBTA 3.5.1).
const firstQPN = 0x11

// ErrQPNInUse is returned by New when the QPN asked for already names a
// QP of the device.
var ErrQPNInUse = errors.New("qp: QPN already in use on this device")

// NewDevice returns a device with no QPs and no memory regions.
func NewDevice() *Device {
	return &Device{nextVA: firstVA, nextQPN: firstQPN, qpns: map[uint32]*QP{}, activeMTU: IBV_MTU_1024}
}

// NewPD returns an empty protection domain of d (ibv_alloc_pd).
func (d *Device) NewPD() *PD { return &PD{dev: d, mrs: map[uint32]*MR{}} }

// newKey returns the next memory-region key: a 24-bit index and an 8-bit
// key byte, as rxe composes them (index << 8 | key).
//
// After 2^24 registrations the index wraps; keys of regions still
// registered are skipped, so a new region never takes a live one's key.
// It returns 0 when all 2^24 indexes are in use.
func (d *Device) newKey() uint32 {
	if d.liveKeys == nil {
		d.liveKeys = map[uint32]bool{}
	}
	for range 1 << 24 {
		d.keySeq = (d.keySeq + 1) & 0xFFFFFF
		if d.keySeq == 0 {
			d.keySeq = 1 // index 0 (keys 0x00-0xFF) is never handed out
		}
		seq := d.keySeq
		key := seq<<8 | (seq*37+11)&0xFF
		if !d.liveKeys[key] {
			d.liveKeys[key] = true
			return key
		}
	}
	return 0
}

// newVA reserves size bytes of virtual address space, page-aligned, with a
// guard page after them, and returns where they start.
func (d *Device) newVA(size uint64) uint64 {
	size = (size + 4095) &^ 4095
	va := d.nextVA
	d.nextVA += size + 4096
	return va
}

// bindQPN gives q the QPN qpn, or, when qpn is 0, the next free one from
// 0x11 up (wrapping at 24 bits, skipping 0 and 1).
func (d *Device) bindQPN(q *QP, qpn uint32) error {
	if qpn != 0 {
		if d.qpns[qpn] != nil {
			return fmt.Errorf("%w: %w: %#x", ErrBadAttr, ErrQPNInUse, qpn)
		}
		d.qpns[qpn] = q
		q.QPN = qpn
		return nil
	}
	if len(d.qpns) >= 0xFFFFFF-1 {
		return fmt.Errorf("%w: no free QPN on the device", ErrBadAttr)
	}
	for d.qpns[d.nextQPN] != nil || d.nextQPN < 2 {
		d.nextQPN = (d.nextQPN + 1) & 0xFFFFFF
	}
	q.QPN = d.nextQPN
	d.qpns[q.QPN] = q
	d.nextQPN = (d.nextQPN + 1) & 0xFFFFFF
	return nil
}

// releaseQPN frees q's QPN for reuse.
func (d *Device) releaseQPN(q *QP) {
	if d.qpns[q.QPN] == q {
		delete(d.qpns, q.QPN)
	}
}
