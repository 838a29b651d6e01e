package cm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/internal/testenv"
	"github.com/roce-emu/roce-emu/pcap"
	"github.com/stretchr/testify/require"
)

// TestTsharkDecodesOurMADs records the MADs of a connection the Managers
// make (REQ, REP, RTU, DREQ, DREP, then a REJ for a port nobody listens
// on) as UD SENDs between the QP1s, and checks that Wireshark's CM
// dissector reads back the values the Managers put in.
func TestTsharkDecodesOurMADs(t *testing.T) {
	tshark := testenv.Tool(t, "tshark", "apt-get install -y tshark")
	p := newPair(t, Config{}, Config{})
	path := filepath.Join(t.TempDir(), "cm.pcap")
	w, err := pcap.Create(path)
	require.NoError(t, err)
	psn := bth.PSN(0)
	pump := func() {
		for moved := true; moved; {
			moved = false
			for i, m := range []*Manager{p.a, p.b} {
				other, src := p.b, addrA
				if i == 1 {
					other, src = p.a, addrB
				}
				for o, ok := m.PollMAD(); ok; o, ok = m.PollMAD() {
					moved = true
					pkt := bth.Packet{BTH: bth.BTH{Opcode: bth.UDSendOnly, PKey: 0xFFFF, DestQP: 1, AckReq: true, PSN: psn},
						DETH: bth.DETH{QKey: bth.GSIQKey, SrcQP: 1}, Payload: o.MAD[:]}
					psn++
					e := bth.Encap{Src: src, Dst: o.To, SrcPort: 55410}
					require.NoError(t, w.WritePacket(p.now, &e, &pkt))
					_ = other.HandleMAD(p.now, src, o.MAD[:])
				}
			}
		}
	}
	dp := dialParams()
	idA, err := p.a.Dial(p.now, dp)
	require.NoError(t, err)
	pump()
	req, ok := p.b.PollEvent()
	require.True(t, ok)
	_, err = p.b.Accept(p.now, req.ID, acceptParams())
	require.NoError(t, err)
	pump()
	require.NoError(t, p.a.Disconnect(p.now, idA, nil))
	pump()
	dp.ServiceID = ServiceID(PortSpaceTCP, 9999)
	_, err = p.a.Dial(p.now, dp)
	require.NoError(t, err)
	pump()
	require.NoError(t, w.Close())

	fields := []string{"infiniband.mad.attributeid", "infiniband.cm.req.localqpn", "infiniband.cm.req.startpsn",
		"infiniband.cm.req.pppmtu", "infiniband.cm.req.serviceid.dport", "infiniband.cm.req.ip_cm.sport",
		"infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4", "infiniband.cm.req.prim_localgid_ipv4",
		"infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqpn", "infiniband.cm.rep.startpsn",
		"infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid", "infiniband.cm.dreq.localcommid",
		"infiniband.cm.drsp.remotecommid", "infiniband.cm.rej.reason", "infiniband.cm.rej.remotecommid"}
	args := []string{"-n", "-r", path, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tshark, args...)
	cmd.Env = append(os.Environ(), "WIRESHARK_CONFIG_DIR="+t.TempDir(), "LC_ALL=C")
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	require.Len(t, lines, 7)
	num := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 0, 64)
		require.NoError(t, err, "%q", s)
		return v
	}
	rows := make([]map[string]string, len(lines))
	for i, l := range lines {
		cols := strings.Split(l, "\t")
		require.Len(t, cols, len(fields), "%q", l)
		rows[i] = map[string]string{}
		for j, f := range fields {
			rows[i][strings.TrimPrefix(f, "infiniband.")] = cols[j]
		}
	}
	for i, a := range []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrREQ, AttrREJ} {
		require.Equal(t, uint64(a), num(rows[i]["mad.attributeid"]), "frame %d", i+1)
	}
	r := rows[0]
	require.Equal(t, uint64(0x11), num(r["cm.req.localqpn"]))
	require.Equal(t, uint64(0xe1a47d), num(r["cm.req.startpsn"]))
	require.Equal(t, uint64(3), num(r["cm.req.pppmtu"]))
	require.Equal(t, uint64(7174), num(r["cm.req.serviceid.dport"]))
	require.Equal(t, uint64(0xc725), num(r["cm.req.ip_cm.sport"]))
	require.Equal(t, "192.0.2.1", r["cm.req.ip_cm.sip4"])
	require.Equal(t, "192.0.2.2", r["cm.req.ip_cm.dip4"])
	require.Equal(t, "192.0.2.1", r["cm.req.prim_localgid_ipv4"])
	r = rows[1]
	require.Equal(t, uint64(idA), num(r["cm.rep.remotecommid"]))
	require.Equal(t, uint64(0x12), num(r["cm.rep.localqpn"]))
	require.Equal(t, uint64(0x8c84dd), num(r["cm.rep.startpsn"]))
	require.Equal(t, uint64(idA), num(rows[2]["cm.rtu.localcommid"]))
	require.Equal(t, uint64(req.ID), num(rows[2]["cm.rtu.remotecommid"]))
	require.Equal(t, uint64(idA), num(rows[3]["cm.dreq.localcommid"]))
	require.Equal(t, uint64(idA), num(rows[4]["cm.drsp.remotecommid"]))
	require.Equal(t, uint64(RejInvalidServiceID), num(rows[6]["cm.rej.reason"]))
	require.Equal(t, uint64(9999), num(rows[5]["cm.req.serviceid.dport"]))
}
