// Command harness runs roce-emu against Linux soft-RoCE (rxe) in a qemu
// guest. interop/run starts it inside a network namespace that holds the
// tap device tap0 (192.0.2.1); the harness boots the guest (192.0.2.2) on
// it, runs the scenarios, and prints one line per scenario and a last line
// "N passed, M failed". It exits 0 only when every scenario passed.
//
// The guest serves one shell command per TCP connection on port 2323
// (interop/guest-init.sh). Each scenario's tap traffic is captured with
// dumpcap into the output directory, decoded by roce-emu and by tshark, and
// the guest's rxe counters are read before and after.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	hostIP  = "192.0.2.1"
	guestIP = "192.0.2.2"
	// The IPv6 addresses beside them (interop/run puts hostIP6 on the tap,
	// the guest's init guestIP6 on eth0; rxe adds a GID for it).
	hostIP6  = "fd00::1"
	guestIP6 = "fd00::2"
	// guestGID6 is guestIP6 as /sys/class/infiniband/rxe0/ports/1/gids/N shows it.
	guestGID6 = "fd00:0000:0000:0000:0000:0000:0000:0002"
	tap       = "tap0"
)

type harness struct {
	guestDir string
	roceEmu  string
	out      string
	qemu     *exec.Cmd
	log      io.Writer
	passed   int
	failed   int
	only     string
	// lastFault is the fault check of the scenario running, for runAll.
	lastFault *faultCheck
	// current is the name of the scenario running.
	current string
	// v6 says the scenario running puts RoCEv2 on IPv6 (hostIP6 and the
	// guest's GID gid6) instead of IPv4 (GID index 1).
	v6   bool
	gid6 int
	// bootTimeout is -boot-timeout; restarts counts the guest restarts
	// (restartStalledGuest).
	bootTimeout time.Duration
	restarts    int
	// clockRetries counts the scenarios run again after perftest's
	// clock calibration failed in the guest (perftestClockFailed).
	clockRetries int
}

// hostRoCE is the host address roce-emu binds RoCEv2 to.
func (h *harness) hostRoCE() string {
	if h.v6 {
		return hostIP6
	}
	return hostIP
}

// gid is the guest's GID index for the scenario's address family.
func (h *harness) gid() int {
	if h.v6 {
		return h.gid6
	}
	return 1
}

func main() {
	var h harness
	flag.StringVar(&h.guestDir, "guest", "", "directory with vmlinuz and initrd.gz (interop/build-guest.sh)")
	flag.StringVar(&h.roceEmu, "roce-emu", "", "the roce-emu binary")
	flag.StringVar(&h.out, "out", "interop/artifacts", "directory for captures and logs")
	flag.StringVar(&h.only, "run", "", "run only scenarios whose name contains this")
	boot := flag.Duration("boot-timeout", 180*time.Second, "how long the guest may take to boot")
	flag.Parse()
	if h.guestDir == "" || h.roceEmu == "" {
		fmt.Fprintln(os.Stderr, "harness: -guest and -roce-emu are required (run interop/run)")
		os.Exit(2)
	}
	if err := os.MkdirAll(h.out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		os.Exit(2)
	}
	h.log = os.Stdout
	start := time.Now()
	h.bootTimeout = *boot
	err := h.bootGuest(*boot)
	if err != nil {
		fmt.Printf("FAIL boot: %v\n", err)
		h.failed++
	} else {
		h.passed++
		fmt.Printf("PASS boot: guest up in %.1fs; rxe0 GID 1 is ::ffff:%s, GID %d is %s\n", time.Since(start).Seconds(), guestIP, h.gid6, guestIP6)
		h.runAll()
	}
	h.stopGuest()
	fmt.Printf("harness took %.0fs; artifacts in %s\n", time.Since(start).Seconds(), h.out)
	fmt.Printf("%d passed, %d failed\n", h.passed, h.failed)
	if h.failed > 0 || h.passed == 0 {
		os.Exit(1)
	}
}

// bootGuest starts qemu (TCG, as /dev/kvm guests hang on these machines:
// docs/wire-format.md section 8) and waits for the guest's command port.
func (h *harness) bootGuest(timeout time.Duration) error {
	logf, err := os.Create(filepath.Join(h.out, "guest-console.log"))
	if err != nil {
		return err
	}
	h.qemu = exec.Command("qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "1",
		"-kernel", filepath.Join(h.guestDir, "vmlinuz"), "-initrd", filepath.Join(h.guestDir, "initrd.gz"),
		"-append", "console=ttyS0 quiet panic=-1 roceemu.ip="+guestIP+"/24 roceemu.ip6="+guestIP6+"/64",
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0",
		"-display", "none", "-serial", "file:"+logf.Name(), "-monitor", "none", "-no-reboot",
		"-pidfile", filepath.Join(h.out, "qemu.pid"))
	h.qemu.Stdout, h.qemu.Stderr = logf, logf
	if err := h.qemu.Start(); err != nil {
		return fmt.Errorf("qemu cannot start: %v (is qemu-system-x86 installed?)", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- h.qemu.Wait() }()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("qemu exited during boot: %v; see %s", err, logf.Name())
		case <-time.After(time.Second):
		}
		if out, rc, err := h.guest("cat /sys/class/infiniband/rxe0/ports/1/state /sys/class/infiniband/rxe0/ports/1/gids/1", 10*time.Second); err == nil && rc == 0 && strings.Contains(out, "ACTIVE") {
			if !strings.Contains(out, "0000:0000:0000:0000:0000:ffff:c000:0202") {
				return fmt.Errorf("rxe0 is ACTIVE but GID 1 is not ::ffff:192.0.2.2: %s", strings.TrimSpace(out))
			}
			return h.findGID6(deadline)
		}
	}
	return fmt.Errorf("the guest did not answer on %s:2323 within %s; see %s", guestIP, timeout, logf.Name())
}

// findGID6 finds the index of rxe's GID for guestIP6, by address: the
// table's order depends on when the kernel added each address.
func (h *harness) findGID6(deadline time.Time) error {
	var last string
	for time.Now().Before(deadline) {
		// One grep over the whole table (a process per GID file takes
		// longer than the timeout on a busy machine under TCG).
		out, rc, err := h.guest("cd /sys/class/infiniband/rxe0/ports/1/gids && grep -H . * | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$'; ip -6 addr show dev eth0", 30*time.Second)
		last = fmt.Sprintf("%s (exit %d, %v)", out, rc, err)
		if err == nil {
			for _, l := range strings.Split(out, "\n") {
				// "N:gid" as grep -H prints it.
				idx, gid, ok := strings.Cut(strings.TrimSpace(l), ":")
				if ok && gid == guestGID6 {
					h.gid6, _ = strconv.Atoi(idx)
					return nil
				}
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("rxe0 has no GID for %s: %s", guestIP6, strings.TrimSpace(last))
}

func (h *harness) stopGuest() {
	if h.qemu != nil && h.qemu.Process != nil {
		h.qemu.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { h.qemu.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			h.qemu.Process.Kill()
		}
	}
}

// guest runs one shell command in the guest and returns its output
// (stdout and stderr) and exit code.
func (h *harness) guest(cmd string, timeout time.Duration) (string, int, error) {
	c, err := net.DialTimeout("tcp", guestIP+":2323", 5*time.Second)
	if err != nil {
		return "", -1, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", -1, err
	}
	b, err := io.ReadAll(c)
	out := string(b)
	i := strings.LastIndex(out, "__rc=")
	if i < 0 {
		if err == nil {
			err = errors.New("no exit status (guest command cut off)")
		}
		return out, -1, fmt.Errorf("guest command %q: %v", cmd, err)
	}
	rc, _ := strconv.Atoi(strings.TrimSpace(out[i+5:]))
	return out[:i], rc, nil
}

// counters reads the guest's rxe hardware counters.
// A failed read is an error: a scenario must not compare counters against
// a missing "before".
func (h *harness) counters() (map[string]int64, error) {
	out, rc, err := h.guest("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for f in *; do echo $f $(cat $f); done", 10*time.Second)
	m := map[string]int64{}
	if err != nil || rc != 0 {
		return nil, fmt.Errorf("reading rxe's counters: %v (exit %d)", err, rc)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				m[f[0]] = v
			}
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("reading rxe's counters: none found")
	}
	return m, nil
}

func delta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range after {
		if v-before[k] != 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

func fmtCounters(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, m[k])
	}
	if b.Len() == 0 {
		return " (none changed)"
	}
	return b.String()
}

// capture runs dumpcap on the tap device until stop is called.
type capture struct {
	cmd  *exec.Cmd
	file string
}

func (h *harness) startCapture(name string) (*capture, error) {
	file := filepath.Join(h.out, name+".pcapng")
	cmd := exec.Command("dumpcap", "-q", "-i", tap, "-f", "udp or tcp", "-w", file)
	logf, _ := os.Create(filepath.Join(h.out, name+".dumpcap.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("dumpcap: %v (install tshark)", err)
	}
	// dumpcap needs a moment to open the device.
	for i := 0; i < 50; i++ {
		if st, err := os.Stat(file); err == nil && st.Size() > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return &capture{cmd: cmd, file: file}, nil
}

func (c *capture) stop() {
	time.Sleep(300 * time.Millisecond) // let the last packets reach the file
	c.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
	}
}

// roceEmuCmd prepares a roce-emu command with a log file.
func (h *harness) roceEmuCmd(ctx context.Context, name string, args ...string) (*exec.Cmd, *strings.Builder) {
	cmd := exec.CommandContext(ctx, h.roceEmu, args...)
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	return cmd, &buf
}

func (h *harness) writeLog(name, text string) {
	// Prefixed with the scenario, so that scenarios running the same
	// command keep their own logs.
	os.WriteFile(filepath.Join(h.out, h.current+"."+name+".log"), []byte(text), 0o644)
}
