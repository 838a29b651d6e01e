package qp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Keys and addresses are the device's: unique across its PDs, and two
// devices number on their own, as two hosts do.
func TestDeviceKeysAndVAs(t *testing.T) {
	d1, d2 := NewDevice(), NewDevice()
	a, b := d1.NewPD(), d1.NewPD()
	assert.Same(t, d1, a.Device())
	keys, vas := map[uint32]bool{}, map[uint64]bool{}
	for i := range 50 {
		pd := []*PD{a, b}[i%2]
		mr, err := pd.RegMR(make([]byte, 100+i*1000), IBV_ACCESS_LOCAL_WRITE)
		require.NoError(t, err)
		assert.False(t, keys[mr.LKey], "key %#x given twice", mr.LKey)
		assert.False(t, vas[mr.VA], "VA %#x given twice", mr.VA)
		assert.Zero(t, mr.VA%4096, "page-aligned")
		keys[mr.LKey], vas[mr.VA] = true, true
	}
	// Another device starts its own sequence: its first key and address
	// are the first device's first ones.
	m1, err := d2.NewPD().RegMR(make([]byte, 8), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	d3 := NewDevice()
	m2, err := d3.NewPD().RegMR(make([]byte, 8), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	assert.Equal(t, m1.LKey, m2.LKey)
	assert.Equal(t, m1.VA, m2.VA)
	assert.Equal(t, uint64(firstVA), m1.VA)
	_, err = a.RegMR(nil, IBV_ACCESS_LOCAL_WRITE)
	assert.ErrorIs(t, err, ErrEmptyMR)
	// A PD not made by a device is refused, not a panic.
	var zero PD
	_, err = zero.RegMR(make([]byte, 8), IBV_ACCESS_LOCAL_WRITE)
	assert.ErrorIs(t, err, ErrNoDevice)
	_, err = zero.RegMRAt(make([]byte, 8), firstVA, IBV_ACCESS_LOCAL_WRITE)
	assert.ErrorIs(t, err, ErrNoDevice)
	_, err = New(InitAttr{PD: &zero, SendCQ: NewCQ(1), RecvCQ: NewCQ(1)})
	assert.ErrorIs(t, err, ErrNoDevice)
	assert.ErrorIs(t, err, ErrBadAttr)
}

// The device numbers QPs from 0x11 (rxe's first), refuses a QPN in use,
// and reuses a destroyed QP's number.
func TestDeviceQPNs(t *testing.T) {
	d := NewDevice()
	pd := d.NewPD()
	cq := NewCQ(8)
	newQP := func(qpn uint32) (*QP, error) { return New(InitAttr{PD: pd, SendCQ: cq, RecvCQ: cq, QPN: qpn}) }
	q1, err := newQP(0)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x11), q1.QPN)
	q2, err := newQP(0)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x12), q2.QPN)
	q3, err := newQP(0x13)
	require.NoError(t, err)
	_, err = newQP(0x13)
	assert.ErrorIs(t, err, ErrQPNInUse)
	assert.ErrorIs(t, err, ErrBadAttr)
	q4, err := newQP(0)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x14), q4.QPN, "0x13 is taken")
	_, err = newQP(1)
	assert.ErrorIs(t, err, ErrBadAttr, "QP1 is special")
	_, err = newQP(1 << 24)
	assert.ErrorIs(t, err, ErrBadAttr)
	// Another device numbers on its own.
	o, err := New(InitAttr{PD: NewDevice().NewPD(), SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	assert.Equal(t, uint32(0x11), o.QPN)

	require.NoError(t, q3.Modify(&Attr{State: IBV_QPS_INIT}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS))
	mr, _ := pd.RegMR(make([]byte, 8), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, q3.PostRecv(RecvWR{WRID: 1, SGEs: []SGE{mr.SGE(0, 8)}}))
	q3.Destroy()
	q3.Destroy() // twice is harmless
	assert.Equal(t, IBV_QPS_RESET, q3.State())
	assert.Zero(t, q3.RecvQueued(), "work requests discarded")
	assert.Zero(t, cq.Len(), "without completions")
	assert.ErrorIs(t, q3.Modify(&Attr{State: IBV_QPS_INIT}, IBV_QP_STATE|IBV_QP_ACCESS_FLAGS), ErrBadState)
	assert.ErrorIs(t, q3.PostRecv(RecvWR{}), ErrBadState)
	q5, err := newQP(0x13)
	require.NoError(t, err, "a destroyed QP's number is free")
	assert.Equal(t, uint32(0x13), q5.QPN)
	q1.Destroy()
	q6, err := newQP(0)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x15), q6.QPN, "allocation goes on upward before it reuses")
}
