package onboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// Applier applies user-data now, as cloud-init would at boot: write_files,
// then runcmd. Without systemd (containers, tests) it supervises the agent
// itself: systemctl commands are replaced by starting `tether-edge run` in
// the background (its pid in agent.pid, its log in agent.log in the state
// dir), and a re-run finds that agent instead of starting a second one.
type Applier struct {
	Root     string // the machine's root; every path but the state dir's is written under it
	StateDir string // where files the user-data puts in AgentStateDir go
	Systemd  bool   // run runcmd as given; otherwise supervise
	Exe      string // the tether-edge binary, for supervised mode
	Log      func(format string, args ...any)
}

// ErrAgentFailed means the agent stopped for good (refused by the hub, or
// exited) before it connected.
var ErrAgentFailed = errors.New("onboard: the agent did not connect")

// protected are state-dir files the user-data must not replace: the key
// never comes from the hub.
var protected = map[string]bool{"node.key": true}

// target maps a user-data path to where it is written here.
func (a *Applier) target(p string) (string, error) {
	if rel, ok := strings.CutPrefix(p, AgentStateDir+"/"); ok {
		if protected[rel] {
			return "", fmt.Errorf("user-data writes %s: the node key is made on this machine and never replaced", p)
		}
		return filepath.Join(a.StateDir, rel), nil
	}
	return filepath.Join(a.Root, p), nil
}

// WriteFiles writes every write_files entry (atomically, with its mode).
func (a *Applier) WriteFiles(cc *onboardproto.UserData) ([]string, error) {
	var written []string
	for _, f := range cc.WriteFiles {
		dst, err := a.target(f.Path)
		if err != nil {
			return written, err
		}
		data, _ := f.Bytes() // checked by onboardproto.ParseUserData
		mode, _ := f.Mode()
		dirMode := os.FileMode(0o755)
		if strings.HasPrefix(dst, a.StateDir+string(filepath.Separator)) {
			dirMode = 0o700
		}
		if err := os.MkdirAll(filepath.Dir(dst), dirMode); err != nil {
			return written, fmt.Errorf("write %s: %w", dst, err)
		}
		if err := pki.WriteFileAtomic(dst, data, mode); err != nil {
			return written, err
		}
		written = append(written, dst)
	}
	return written, nil
}

// EnsureBinary installs this binary where a unit the user-data wrote
// starts the agent (ExecStart=/usr/local/bin/tether-edge …, or a bare
// tether-edge found nowhere in systemd's search path: then it goes to
// /usr/local/bin) when nothing is there yet: a person who copied tether-edge to the machine by hand and
// ran it from their home directory gets a unit that starts. An existing
// binary (a package's) is left alone.
func (a *Applier) EnsureBinary(cc *onboardproto.UserData) (string, error) {
	for _, f := range cc.WriteFiles {
		if !strings.HasSuffix(f.Path, ".service") {
			continue
		}
		data, _ := f.Bytes()
		bin := execStartBinary(string(data))
		if bin == "" || !strings.Contains(filepath.Base(bin), "tether-edge") {
			continue
		}
		if !filepath.IsAbs(bin) {
			// A bare name, as in the shipped unit: systemd looks it up in
			// its fixed search path; a package's /usr/bin copy counts.
			for _, dir := range unitSearchPath {
				if _, err := os.Stat(filepath.Join(a.Root, dir, bin)); err == nil {
					return "", nil
				}
			}
			bin = filepath.Join("/usr/local/bin", bin)
		}
		dst := filepath.Join(a.Root, bin)
		if _, err := os.Stat(dst); err == nil {
			return "", nil
		}
		self, err := os.ReadFile(a.Exe)
		if err != nil {
			return "", fmt.Errorf("install the agent binary for %s: %w", f.Path, err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", fmt.Errorf("install the agent binary: %w", err)
		}
		if err := pki.WriteFileAtomic(dst, self, 0o755); err != nil {
			return "", fmt.Errorf("install the agent binary: %w", err)
		}
		return dst, nil
	}
	return "", nil
}

// unitSearchPath is where systemd (239 and later) finds an ExecStart=
// program given by a bare name.
var unitSearchPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// execStartBinary is the program of a unit's ExecStart= (its prefixes
// such as "-" or "@" dropped): an absolute path or a bare name; "" when
// there is none.
func execStartBinary(unit string) string {
	for _, line := range strings.Split(unit, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "ExecStart=")
		if !ok {
			continue
		}
		f := strings.Fields(strings.TrimLeft(v, "-@:+!"))
		if len(f) > 0 && (filepath.IsAbs(f[0]) || !strings.Contains(f[0], "/")) {
			return f[0]
		}
	}
	return ""
}

func isSystemctl(argv []string) bool {
	return filepath.Base(argv[0]) == "systemctl"
}

// RunCommands runs runcmd. Supervised, systemctl commands are left to the
// supervisor and, under a root other than "/", no command is run at all:
// they name the real machine's paths.
func (a *Applier) RunCommands(ctx context.Context, cc *onboardproto.UserData) (ran, skipped []string, err error) {
	for _, argv := range cc.RunCmd {
		line := strings.Join(argv, " ")
		if !a.Systemd && (isSystemctl(argv) || filepath.Clean(a.Root) != "/") {
			skipped = append(skipped, line)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		out, err := exec.CommandContext(cctx, argv[0], argv[1:]...).CombinedOutput()
		cancel()
		if err != nil {
			return ran, skipped, fmt.Errorf("runcmd %q: %w: %s", line, err, bytes.TrimSpace(out))
		}
		ran = append(ran, line)
	}
	return ran, skipped, nil
}

// Supervise starts `tether-edge run` for the state dir unless an agent it
// started before is still running; it returns the agent's pid.
func (a *Applier) Supervise() (pid int, started bool, err error) {
	pidPath := filepath.Join(a.StateDir, "agent.pid")
	if b, err := os.ReadFile(pidPath); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && agentAlive(p) {
			return p, false, nil
		}
	}
	// A run killed between starting the agent and writing its pid left an
	// agent no pid file names: find it by its state dir.
	if p := AgentFor(a.StateDir); p != 0 {
		_ = pki.WriteFileAtomic(pidPath, []byte(strconv.Itoa(p)+"\n"), 0o600)
		return p, false, nil
	}
	args := []string{"run", "--state-dir", a.StateDir}
	if filepath.Clean(a.Root) != "/" {
		// The labels the user-data wrote are under the root too.
		args = append(args, "--labels-file", filepath.Join(a.Root, edge.DefaultLabelsFile))
	}
	// The unit's environment files, the later winning as in systemd.
	extra := envArgs(filepath.Join(a.Root, "/etc/tether-edge.env"))
	if v := envArgs(filepath.Join(a.Root, "/etc/tether-edge/tether-edge.env")); v != nil {
		extra = v
	}
	args = append(args, extra...)
	logf, err := os.OpenFile(filepath.Join(a.StateDir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, false, fmt.Errorf("agent log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(a.Exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the agent outlives this CLI and its terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, false, fmt.Errorf("start %s %s: %w", a.Exe, strings.Join(args, " "), err)
	}
	pid = cmd.Process.Pid
	_ = cmd.Process.Release()
	if err := pki.WriteFileAtomic(pidPath, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return pid, true, err
	}
	if a.Log != nil {
		a.Log("started the agent (pid %d): %s %s; log %s", pid, a.Exe, strings.Join(args, " "),
			filepath.Join(a.StateDir, "agent.log"))
	}
	return pid, true, nil
}

// AgentFor returns the pid of a running `tether-edge run` whose
// --state-dir is dir, or 0.
func AgentFor(dir string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !agentAlive(pid) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		for i, arg := range argv {
			if (arg == "--state-dir" && i+1 < len(argv) && argv[i+1] == dir) || arg == "--state-dir="+dir {
				return pid
			}
		}
	}
	return 0
}

// agentAlive reports whether pid is a running tether-edge agent (not a
// recycled pid of something else, not a zombie): for a pid read from
// agent.pid, which may be long gone.
func agentAlive(pid int) bool {
	if !processRunning(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv := strings.Split(string(b), "\x00")
	return len(argv) >= 2 && strings.Contains(filepath.Base(argv[0]), "tether-edge") && argv[1] == "run"
}

// processRunning reports whether pid exists and is not a zombie. It is how
// WaitConnected watches the agent Supervise has just started: that
// process's /proc/PID/cmdline can still be empty for a moment after Start
// returns (the kernel closes the close-on-exec pipe Start waits on before
// it sets up the new program's arguments), which agentAlive would take for
// an exited agent.
func processRunning(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(st), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// envArgs reads TETHER_EDGE_ARGS from the unit's environment file, the
// flags the unit adds to `tether-edge run`.
func envArgs(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "TETHER_EDGE_ARGS=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"'`)
		return strings.Fields(v)
	}
	return nil
}

// WaitConnected polls the agent's status file until it says connected
// (written by a live agent), the agent ends for good, or ctx ends. pid,
// when not 0, is the supervised agent: its exit ends the wait.
func WaitConnected(ctx context.Context, stateDir string, pid int) (edge.Status, error) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		st, err := edge.ReadStatus(stateDir)
		if err == nil {
			switch st.State {
			case "connected":
				if st.PID == 0 || syscall.Kill(st.PID, 0) == nil {
					return st, nil
				}
			case "refused", "rejoin-needed":
				if pid == 0 || st.PID == pid {
					return st, fmt.Errorf("%w: %s: %s", ErrAgentFailed, st.State, st.LastError)
				}
			}
		}
		if pid != 0 && !processRunning(pid) {
			return st, fmt.Errorf("%w: the agent (pid %d) exited; see %s", ErrAgentFailed, pid,
				filepath.Join(stateDir, "agent.log"))
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("%w within the timeout (last state %q %s): %w", ErrAgentFailed, st.State, st.LastError,
				ctx.Err())
		case <-t.C:
		}
	}
}
