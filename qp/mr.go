package qp

import (
	"errors"
	"fmt"
)

// SGE is a scatter/gather element, as ibv_sge: Length bytes at virtual
// address Addr of the memory region whose L_Key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// PD is a protection domain of a Device: memory regions and the QPs that
// may use them. A QP reaches only the regions of its own PD: keys are
// unique across every PD of the device, so a key from another PD is
// unknown to it. The zero value is not usable; call Device.NewPD.
type PD struct {
	dev *Device
	mrs map[uint32]*MR // by key: L_Key and R_Key are equal, as in rxe
}

// Device returns the device the PD belongs to.
func (pd *PD) Device() *Device { return pd.dev }

// MR is a memory region over a caller's buffer (ibv_reg_mr). Remote peers
// address it by VA and R_Key; local work requests by VA and L_Key. The
// buffer is read and written in place.
type MR struct {
	PD     *PD
	Buf    []byte
	VA     uint64 // virtual address of Buf[0]
	LKey   uint32
	RKey   uint32
	Access Access
	valid  bool
}

// Errors of memory registration.
var (
	ErrEmptyMR    = errors.New("qp: memory region of zero bytes")
	ErrBadAccess  = errors.New("qp: remote write or atomic access needs local write access")
	ErrMROverlaps = errors.New("qp: memory region overlaps another in the protection domain")
	ErrUnknownMR  = errors.New("qp: memory region not registered in this protection domain")
	ErrNoDevice   = errors.New("qp: protection domain not made by Device.NewPD")
)

// RegMR registers buf with the given access and places it at the device's
// next free page-aligned virtual address.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if pd.dev == nil {
		return nil, ErrNoDevice
	}
	if len(buf) == 0 {
		return nil, ErrEmptyMR
	}
	return pd.RegMRAt(buf, pd.dev.newVA(uint64(len(buf))), access)
}

// RegMRAt registers buf at a chosen virtual address, for tests and for
// peers that must reproduce a known address. As in verbs, REMOTE_WRITE and
// REMOTE_ATOMIC require LOCAL_WRITE.
func (pd *PD) RegMRAt(buf []byte, va uint64, access Access) (*MR, error) {
	if pd.dev == nil {
		return nil, ErrNoDevice
	}
	if len(buf) == 0 {
		return nil, ErrEmptyMR
	}
	if access&(IBV_ACCESS_REMOTE_WRITE|IBV_ACCESS_REMOTE_ATOMIC) != 0 && access&IBV_ACCESS_LOCAL_WRITE == 0 {
		return nil, ErrBadAccess
	}
	end := va + uint64(len(buf))
	if end < va {
		return nil, fmt.Errorf("qp: memory region at %#x of %d bytes wraps the address space", va, len(buf))
	}
	for _, m := range pd.mrs {
		if va < m.VA+uint64(len(m.Buf)) && m.VA < end {
			return nil, ErrMROverlaps
		}
	}
	key := pd.dev.newKey()
	if key == 0 {
		return nil, fmt.Errorf("qp: no memory-region key left (2^24 regions registered)")
	}
	mr := &MR{PD: pd, Buf: buf, VA: va, LKey: key, RKey: key, Access: access, valid: true}
	pd.mrs[key] = mr
	return mr, nil
}

// DeregMR removes mr from its domain: later accesses by its keys fail.
func (pd *PD) DeregMR(mr *MR) error {
	if mr == nil || pd.mrs[mr.LKey] != mr {
		return ErrUnknownMR
	}
	delete(pd.mrs, mr.LKey)
	delete(pd.dev.liveKeys, mr.LKey)
	mr.valid = false
	return nil
}

// SGE returns the scatter/gather element for n bytes at offset off of mr.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.VA + uint64(off), Length: uint32(n), LKey: mr.LKey}
}

// slice returns the n bytes at va if they lie inside mr.
func (mr *MR) slice(va uint64, n uint64) ([]byte, bool) {
	if va < mr.VA {
		return nil, false
	}
	off := va - mr.VA
	if off > uint64(len(mr.Buf)) || n > uint64(len(mr.Buf))-off {
		return nil, false
	}
	return mr.Buf[off : off+n], true
}

// remote looks up the region a remote access names and checks its key,
// bounds and permission (IBTA 10.6.3.2 / C9-88). It returns nil when any
// check fails.
func (pd *PD) remote(rkey uint32, va uint64, n uint64, need Access) []byte {
	mr := pd.mrs[rkey]
	if mr == nil || !mr.valid || mr.RKey != rkey || mr.Access&need != need {
		return nil
	}
	b, ok := mr.slice(va, n)
	if !ok {
		return nil
	}
	return b
}

// local resolves a list of SGEs into the memory they name, checking L_Keys
// and bounds; write asks for LOCAL_WRITE access. It returns false when an
// SGE is not valid (a local protection error).
func (pd *PD) local(sges []SGE, write bool, out sgList) (sgList, bool) {
	for _, s := range sges {
		mr := pd.mrs[s.LKey]
		if mr == nil || !mr.valid || (write && mr.Access&IBV_ACCESS_LOCAL_WRITE == 0) {
			return out, false
		}
		b, ok := mr.slice(s.Addr, uint64(s.Length))
		if !ok {
			return out, false
		}
		out = append(out, sgEntry{mr: mr, b: b})
	}
	return out, true
}

// sgEntry is one resolved SGE: the bytes and the region they belong to.
// mr is nil for inline data copied at post time.
type sgEntry struct {
	mr *MR
	b  []byte
}

// sgList is a resolved scatter/gather list: data placed or taken at a
// running offset. Every access checks that the regions are still
// registered, as rxe looks the L_Key up when it copies: a region
// deregistered after posting fails the work request.
type sgList []sgEntry

func (l sgList) valid() bool {
	for _, e := range l {
		if e.mr != nil && !e.mr.valid {
			return false
		}
	}
	return true
}

// copyOut copies len(dst) bytes starting at offset off of the list into
// dst. It returns false when a region is no longer registered.
func (l sgList) copyOut(dst []byte, off int) bool {
	if !l.valid() {
		return false
	}
	for _, e := range l {
		b := e.b
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n := copy(dst, b[off:])
		dst = dst[n:]
		off = 0
		if len(dst) == 0 {
			break
		}
	}
	return true
}

// copyIn copies src into the list starting at offset off. It returns false
// when the list is too short or a region is no longer registered.
func (l sgList) copyIn(src []byte, off int) bool {
	if !l.valid() {
		return false
	}
	for _, e := range l {
		b := e.b
		if len(src) == 0 {
			return true
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n := copy(b[off:], src)
		src = src[n:]
		off = 0
	}
	return len(src) == 0
}

// contiguous returns the bytes at [off, off+n) when they lie in one element,
// so a packet can carry them without a copy.
func (l sgList) contiguous(off, n int) ([]byte, bool) {
	for _, e := range l {
		b := e.b
		if off >= len(b) {
			off -= len(b)
			continue
		}
		if off+n <= len(b) {
			return b[off : off+n], true
		}
		return nil, false
	}
	return nil, n == 0
}
