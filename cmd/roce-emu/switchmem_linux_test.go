//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roce-emu/roce-emu/bth"
	"github.com/roce-emu/roce-emu/transport"
)

// A switch with --pfc --hold-bytes 256 MiB under a flood of 16,000-byte
// datagrams above its 1 Gb/s egress (the hold full, the rest dropped,
// 640 MB forwarded: the hold turned over twice) keeps its RSS within hold + buffer + 64 MiB: the memory limit
// makes the collector run before the garbage of the dropped datagrams
// doubles the heap (issue 14: the process ran above hold + 64 MiB with
// its live heap within it). Heavy (a few hundred MiB, seconds of
// flooding): skipped with -short and under the race detector; Linux
// only (/proc).
func TestSwitchPFCFloodRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("a 256 MiB flood; skipped with -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/PID/status")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory is part of the RSS")
	}
	const hold, buffer = 256 << 20, 4 << 20
	sender, err := transport.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), transport.UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer sender.Close()
	recv, err := transport.ListenUDP(netip.MustParseAddrPort("127.0.0.2:0"), transport.UDPOptions{EphemeralPort: true})
	require.NoError(t, err)
	defer recv.Close()
	port := freeUDPPortOn(t, "127.0.0.100")
	args := fmt.Sprintf("switch --addr 127.0.0.100 --link %d=%s --receiver %s --rate 1Gbps --pfc --hold-bytes %d --buffer %d --kmin 1048576 --kmax 2097152 --xoff 2097152 --xon 1048576 --stats 100ms --json --duration 5m",
		port, sender.LocalAddr(), recv.LocalAddr(), hold, buffer)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSwitchHelperProcess$")
	cmd.Env = append(os.Environ(), "ROCE_EMU_SWITCH_HELPER="+args, "GOMEMLIMIT=")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	stats := make(chan transport.SwitchStats, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var st transport.SwitchStats
			if json.Unmarshal(sc.Bytes(), &st) == nil {
				select {
				case stats <- st:
				default:
				}
			}
		}
		close(stats)
	}()

	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.100"), port)
	p := bth.Packet{BTH: bth.BTH{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x11, PSN: 1}, Payload: make([]byte, 16000-bth.BTHLen-bth.ICRCLen)}
	pkt, err := p.Append(nil, &bth.Encap{Src: sender.LocalAddr().Addr(), Dst: to.Addr(), SrcPort: sender.LocalAddr().Port(), DstPort: to.Port()})
	require.NoError(t, err)
	batch := make([]transport.Datagram, 16)
	for k := range batch {
		batch[k] = transport.Datagram{Data: pkt, Src: sender.LocalAddr(), Dst: to}
	}
	// Flood, the hold full and overflowing, until the switch has
	// forwarded 640 MB (40,000 datagrams): the hold has turned over
	// more than twice, each datagram it let go garbage for the collector.
	var last transport.SwitchStats
	deadline := time.Now().Add(3 * time.Minute) // a guard against a switch that never reports, not a measure
	for sent := 0; sent < 2000000 && last.Forwarded < 40000 && time.Now().Before(deadline); sent += len(batch) {
		if _, err := sender.WriteBatch(batch); err != nil {
			time.Sleep(time.Millisecond) // the sender's socket buffer is full
		}
	drain:
		for {
			select {
			case st, ok := <-stats:
				if !ok {
					t.Fatal("the switch ended")
				}
				last = st
			default:
				break drain
			}
		}
	}
	hwm, rss := procMemory(t, cmd.Process.Pid)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	cmd.Wait()
	t.Logf("switch: %+v; peak RSS (VmHWM) %d MiB, RSS %d MiB; hold %d MiB + buffer %d MiB", last, hwm>>20, rss>>20, hold>>20, buffer>>20)
	require.GreaterOrEqual(t, last.Forwarded, uint64(40000), "the hold turned over")
	require.NotZero(t, last.HoldDrops, "the flood overflowed the hold")
	assert.LessOrEqual(t, last.HeldMax, hold)
	assert.LessOrEqual(t, hwm, uint64(hold+buffer+64<<20), "peak RSS within hold + buffer + 64 MiB")
}

// procMemory reads a process's peak and current RSS in bytes.
func procMemory(t *testing.T, pid int) (hwm, rss uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmHWM:":
			hwm = v << 10
		case "VmRSS:":
			rss = v << 10
		}
	}
	require.NotZero(t, hwm)
	return hwm, rss
}
