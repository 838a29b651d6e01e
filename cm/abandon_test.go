package cm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A REQ given up before its REP came is withdrawn with a REJ (timeout,
// ARI the CA GUID, message other), as Linux's cm_destroy_id in REQ_SENT;
// the passive side drops the request, and no event follows on the active
// side.
func TestAbandonREQSent(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	idA, err := p.a.Dial(p.now, dialParams())
	require.NoError(t, err)
	p.deliver()
	idB := p.lastEvent(1, EventConnectRequest).ID
	require.NoError(t, p.a.Abandon(p.now, idA))
	o, ok := p.a.PollMAD()
	require.True(t, ok, "a REJ")
	_, msg, err := DecodeMAD(o.MAD[:])
	require.NoError(t, err)
	rej, isREJ := msg.(*REJ)
	require.True(t, isREJ, "a REJ, not %v", msg.Attr())
	assert.Equal(t, REJ{LocalCommID: idA, MessageRejected: MsgOther, ARILength: 8, Reason: RejTimeout,
		ARI: [72]byte{0x50, 0x54, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x01}}, *rej)
	require.NoError(t, p.b.HandleMAD(p.now, addrA, o.MAD[:]))
	assert.Equal(t, StateIdle, p.a.State(idA))
	assert.Zero(t, p.a.Len())
	assert.True(t, p.a.Deadline().IsZero(), "no REQ retry left armed")
	assert.Equal(t, uint64(1), p.a.Counters().RejectsSent)
	assert.Equal(t, StateIdle, p.b.State(idB), "the passive side dropped the request")
	_, more := p.a.PollEvent()
	assert.False(t, more)
}

// A REP given up before its RTU came is withdrawn with a REJ (consumer
// defined, message other), as cm_destroy_id in REP_SENT; the connection
// stays in TIMEWAIT. The active side, which took the REP, sees the REJ.
func TestAbandonREPSent(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	p.drop = func(fromA bool, a AttrID) bool { return fromA && a == AttrRTU }
	idA, idB := p.connect()
	require.Equal(t, StateREPSent, p.b.State(idB))
	p.takeEvents(0)
	p.takeEvents(1)
	require.NoError(t, p.b.Abandon(p.now, idB))
	p.sent = nil
	p.deliver()
	require.Equal(t, []AttrID{AttrREJ}, p.sent)
	assert.Equal(t, StateTimeWait, p.b.State(idB))
	assert.Empty(t, p.takeEvents(1))
	rej := p.lastEvent(0, EventRejected)
	assert.Equal(t, RejConsumer, rej.Reason)
	assert.Equal(t, uint64(1), p.b.Counters().RejectsSent)
	_ = idA
	// An established connection is not abandoned but disconnected.
	q := newPair(t, Config{}, Config{})
	a2, _ := q.connect()
	require.ErrorIs(t, q.a.Abandon(q.now, a2), ErrState)
}
