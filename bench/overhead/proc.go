package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/infergate/infergate/internal/testutil"
)

// proc is a process the harness started, pinned to cpus when set.
type proc struct {
	*testutil.Proc
	name string
	cpus string
}

// startProc runs bin with args under `taskset -c cpus` (unpinned when cpus
// is empty), output to dir/name.log.
func startProc(dir, name, cpus string, env []string, bin string, args ...string) (*proc, error) {
	log, err := testutil.CreateLog(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	argv := append([]string{bin}, args...)
	if cpus != "" {
		// taskset execs the program: the pid is the program's own.
		argv = append([]string{"taskset", "-c", cpus}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group: a Ctrl-C to the harness does not kill it
	// before the harness has read its CPU time; stop does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p, err := testutil.Start(cmd, testutil.ProcOptions{Name: name, Log: log, StopSignal: syscall.SIGTERM, StopGrace: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	return &proc{Proc: p, name: name, cpus: cpus}, nil
}

func (p *proc) pid() int { return p.Pid() }

func (p *proc) exited() bool { return p.Exited() }

// stop ends the process: SIGTERM, then SIGKILL after 5 s.
func (p *proc) stop() {
	if p != nil {
		p.Stop()
	}
}

// tail is the end of the process's log, for error messages.
func (p *proc) tail() string { return p.Log.Tail(2000) }

// waitReady polls url until it answers 200, the process exits, or 30 s pass.
func (p *proc) waitReady(url string) error { return p.waitReadyFor(url, 30*time.Second) }

// waitReadyFor polls url until it answers 200, the process exits, or d passes.
func (p *proc) waitReadyFor(url string, d time.Duration) error {
	return p.WaitReady(d, testutil.HTTPReady(url))
}

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat times.
var clockTick = func() float64 {
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return float64(n)
		}
	}
	return 100
}()

// cpuSeconds is the CPU time (user + system) pid has used so far, from
// /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14 and stime 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unreadable /proc stat times")
	}
	return (utime + stime) / clockTick, nil
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return n << 10 // kB
			}
		}
	}
	return 0
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Machine is what the numbers ran on.
type Machine struct {
	CPUs     int    `json:"cpus"` // online CPUs (nproc)
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
	GoVer    string `json:"go"`
	Envoy    string `json:"envoy"`
	// LoadAvg is /proc/loadavg when the run started: the machine is shared.
	LoadAvg string `json:"load_avg"`
}

func machine(envoyBin string) Machine {
	m := Machine{GoVer: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "processor") {
				m.CPUs++
			}
			if v, ok := strings.CutPrefix(line, "model name"); ok && m.CPUModel == "" {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if out, err := exec.Command(envoyBin, "--version").Output(); err == nil {
		// "<path>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
		if _, v, ok := strings.Cut(string(out), "version: "); ok {
			if parts := strings.Split(strings.TrimSpace(v), "/"); len(parts) > 1 {
				m.Envoy = parts[1]
			}
		}
	}
	return m
}
