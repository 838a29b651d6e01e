package qp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// After 2^24 registrations the key index wraps; a new region must not
// take the key of one still registered (found by a review: it replaced
// the live region in its PD).
func TestKeyWrapSkipsLiveKeys(t *testing.T) {
	d := NewDevice()
	pd := d.NewPD()
	a, err := pd.RegMR(make([]byte, 64), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	d.keySeq = 0xFFFFFF // as after 2^24-1 registrations and deregistrations
	b, err := pd.RegMR(make([]byte, 64), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	assert.NotEqual(t, a.LKey, b.LKey, "the index wrapped onto a's: skipped")
	assert.Same(t, a, pd.mrs[a.LKey], "the live region is still found by its key")
	assert.Same(t, b, pd.mrs[b.LKey])
	// A deregistered region's key may come back.
	require.NoError(t, pd.DeregMR(a))
	d.keySeq = 0xFFFFFF
	c, err := pd.RegMR(make([]byte, 64), IBV_ACCESS_LOCAL_WRITE)
	require.NoError(t, err)
	assert.Equal(t, a.LKey, c.LKey)
}
