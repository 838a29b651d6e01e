package main

import (
	"context"
	"flag"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/oob"
	"github.com/roce-emu/roce-emu/qp"
	"github.com/roce-emu/roce-emu/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// thirdHost is where a hostile client aims the server's RoCE traffic.
var thirdHost = netip.MustParseAddr("192.0.2.99")

// perftestKeysFrom plays a perftest client up to the key strings,
// announcing gid, and returns the server's keys or the error.
func perftestKeysFrom(t *testing.T, c net.Conn, gid netip.Addr) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := oob.NewPerftestClient(c)
	_, err := s.Versions(ctx)
	require.NoError(t, err)
	_, err = s.SysData(ctx, oob.SysData{CycleBuffer: oob.DefaultCycleBuffer, CacheLine: oob.DefaultCacheLine})
	require.NoError(t, err)
	_, err = s.MTU(ctx, qp.IBV_MTU_1024)
	require.NoError(t, err)
	_, err = s.Keys(ctx, []oob.PerftestKey{{OutReads: 16, QPN: 0x11, PSN: 0x1234, GID: gid, RKey: 0x100, VA: 0x1000}})
	return err
}

// A READ server refuses a client that connected from 127.0.0.1 and
// announces a third host's GID, which would aim its READ responses there;
// the refusal says how to allow a multi-homed peer.
func TestPerftestRefusesThirdHostGID(t *testing.T) {
	c, wait := startPerftestServer(t, "bw", "-o", "read", "-n", "5")
	defer c.Close()
	perftestKeysFrom(t, c, thirdHost) // the server may close before or after its keys go
	code, out := wait()
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "the peer at 127.0.0.1 announced GID ::ffff:192.0.2.99 for QPN 0x11")
	assert.Contains(t, out, "run with --allow-gid-mismatch")
	assert.NotContains(t, out, "remote address")
}

// With --allow-gid-mismatch the same keys are taken: the server goes on to
// the barrier that follows them (and fails there, as this client stops).
func TestPerftestAllowGIDMismatch(t *testing.T) {
	c, wait := startPerftestServer(t, "bw", "-o", "read", "-n", "5", "--allow-gid-mismatch")
	require.NoError(t, perftestKeysFrom(t, c, thirdHost))
	c.Close()
	code, out := wait()
	assert.Equal(t, 1, code, out)
	assert.NotContains(t, out, "announced GID")
	assert.Contains(t, out, "barrier")
}

// rc_pingpong's server refuses the same, and takes a GID that is the
// client's address.
func TestPingpongRefusesThirdHostGID(t *testing.T) {
	for _, allow := range []bool{false, true} {
		tcp, udp := freeTCPPort(t), freeUDPPort(t)
		args := []string{"server", "--bind", "127.0.0.2", "--udp-port", udp, "-p", tcp, "-n", "1", "--timeout", "3s"}
		if allow {
			args = append(args, "--allow-gid-mismatch")
		}
		out := &lockedBuffer{}
		done := make(chan int)
		go func() { done <- run(args, out, out) }()
		c, err := dialListening("127.0.0.1:" + tcp)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		oob.PingpongClient(ctx, c, oob.Dest{QPN: 0x11, PSN: 0x1234, GID: thirdHost}, func(oob.Dest) error { return nil })
		cancel()
		if !allow {
			code := <-done
			c.Close()
			assert.Equal(t, 1, code, out.String())
			assert.Contains(t, out.String(), "the peer at 127.0.0.1 announced GID ::ffff:192.0.2.99 for QPN 0x11")
			assert.Contains(t, out.String(), "--allow-gid-mismatch")
			assert.NotContains(t, out.String(), "remote address")
			continue
		}
		// Allowed: the exchange completes and the server prints the
		// peer's address, then gives up waiting for its SENDs.
		io.Copy(io.Discard, c)
		c.Close()
		code := <-done
		assert.Equal(t, 1, code, out.String())
		assert.NotContains(t, out.String(), "announced GID")
		assert.Contains(t, out.String(), "remote address: LID 0x0000, QPN 0x000011, PSN 0x001234, GID ::ffff:192.0.2.99")
	}
}

// --strict-source is on by default; --strict-source=false checks the
// address only, as rxe.
func TestStrictSourceFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want transport.SourceCheck
	}{
		{nil, transport.SourceStrict},
		{[]string{"--strict-source=false"}, transport.SourceAddrOnly},
		{[]string{"--strict-source"}, transport.SourceStrict},
	} {
		var n netFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		n.register(fs, "127.0.0.1")
		require.NoError(t, fs.Parse(c.args))
		assert.Equal(t, c.want, n.endpointOptions().Source, "%v", c.args)
	}
}

func TestDescribeDrops(t *testing.T) {
	// describeDrops names each cause by its counter (it took the
	// Endpoint's counters alone and described them in words before the
	// QPs' refusals were added to it).
	assert.Equal(t, "none", describeDrops(qp.Counters{}, transport.Stats{Received: 10, CNPs: 3}))
	assert.Equal(t, "rx_bad_icrc 4, rx_bad_source_port 2, rx_bad_source_port_cnp 1",
		describeDrops(qp.Counters{}, transport.Stats{BadSourcePort: 2, BadSourcePortCNP: 1, BadICRC: 4}))
}
