// Package kubeone runs the KubeOne CLI (`kubeone apply`, `kubeone reset`)
// for a cluster the hub manages. KubeOne does the SSH work itself: the
// manifest names the hub as its bastion, so every connection it opens goes
// through the hub's SSH server and the nodes' tunnels. This package only
// prepares what one run needs — a private directory (0700) holding the
// manifest and the cluster's private key (0600) — runs the binary there
// with its output streamed to the caller, stops its whole process group
// when the caller's context ends, and removes the directory afterwards,
// whatever happened.
//
// It imports nothing of the hub: the hub hands it the secrets and a
// function that renders the manifest for the paths of this run.
package kubeone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Action is what a run asks of KubeOne.
type Action string

// The actions the hub runs.
const (
	Apply Action = "apply" // install or reconcile the cluster
	Reset Action = "reset" // undo the installation on every host
)

// Valid reports whether a is an action this package runs.
func (a Action) Valid() bool { return a == Apply || a == Reset }

// Sentinel errors callers branch on.
var (
	// ErrNoBinary: no kubeone executable was found.
	ErrNoBinary = errors.New("kubeone: binary not found")
	// ErrStopped: the run was stopped because its context ended (cancel,
	// timeout, hub shutdown); the process group was killed.
	ErrStopped = errors.New("kubeone: run stopped")
)

// runDirPrefix starts the name of every per-run directory under
// Config.WorkDir, so CleanStale removes only what Run created.
const runDirPrefix = "run-"

// Config is how the hub runs KubeOne.
type Config struct {
	// Binary is the kubeone executable (the hub's --kubeone flag): a path,
	// or a name looked up on PATH at each run (so installing KubeOne after
	// the hub started works). "" means "kubeone".
	Binary string
	// WorkDir is the parent of the per-run private directories; it is
	// created 0700 if missing. Required.
	WorkDir string
	// Env is the environment of the process; nil means the hub's own,
	// without SSH_AUTH_SOCK (KubeOne must authenticate with the cluster's
	// key only, never with keys of an agent the hub happened to inherit).
	Env []string
	// StopGrace is how long the process group has between SIGTERM and
	// SIGKILL when a run is stopped. Default 5 s.
	StopGrace time.Duration
	Logger    *slog.Logger
}

// Runner runs KubeOne. It is safe for concurrent use; each run has its
// own directory.
type Runner struct{ cfg Config }

// New checks cfg and returns a Runner.
func New(cfg Config) (*Runner, error) {
	if cfg.WorkDir == "" {
		return nil, errors.New("kubeone: Config.WorkDir is required")
	}
	if cfg.Binary == "" {
		cfg.Binary = "kubeone"
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Env == nil {
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SSH_AUTH_SOCK=") {
				cfg.Env = append(cfg.Env, kv)
			}
		}
	}
	return &Runner{cfg: cfg}, nil
}

// Binary resolves the kubeone executable now.
func (r *Runner) Binary() (string, error) {
	p, err := exec.LookPath(r.cfg.Binary)
	if err != nil {
		// The operator reads this on another machine, with a PATH of
		// their own: say whose PATH was searched.
		where := fmt.Sprintf("no %q on the hub's PATH (the hub process's, on the hub's machine; not this CLI's)",
			r.cfg.Binary)
		if strings.ContainsRune(r.cfg.Binary, filepath.Separator) {
			where = fmt.Sprintf("--kubeone %s is not an executable on the hub's machine", r.cfg.Binary)
		}
		if !errors.Is(err, exec.ErrNotFound) {
			where += fmt.Sprintf(" (%v)", err)
		}
		return "", fmt.Errorf("%w: %s; install KubeOne %s or later on the hub's machine "+
			"(see docs/clusters-and-kubeone.md, \"KubeOne clusters\") or start the hub with --kubeone /path/to/kubeone",
			ErrNoBinary, where, MinRelease)
	}
	return filepath.Abs(p)
}

// Secrets are the credentials a run hands KubeOne, written into the run's
// private directory.
type Secrets struct {
	PrivateKey  []byte // OpenSSH private key of the cluster (required)
	Certificate []byte // SSH user certificate of that key (optional)
}

// Paths are where a run's files are; Manifest renders the manifest for
// them (sshPrivateKeyFile = PrivateKey, sshCertFile = Certificate).
type Paths struct {
	Dir         string
	Manifest    string
	PrivateKey  string
	Certificate string // "" without a certificate
}

// Result is how a run ended.
type Result struct {
	// ExitCode is the process's exit status; -1 if it was killed by a
	// signal or did not start.
	ExitCode int
	Duration time.Duration
}

// Run runs `kubeone ACTION --manifest M --auto-approve` in a fresh private
// directory and removes the directory when it returns. manifest renders the
// manifest for that directory's paths. The process's stdout and stderr go
// to stdout and stderr as they come. When ctx ends the process group gets
// SIGTERM, then SIGKILL after StopGrace, and Run returns ErrStopped. A
// process that ran and exited non-zero is not an error: see ExitCode.
func (r *Runner) Run(
	ctx context.Context, action Action, secrets Secrets, manifest func(Paths) ([]byte, error), stdout, stderr io.Writer,
) (Result, error) {
	res := Result{ExitCode: -1}
	if !action.Valid() {
		return res, fmt.Errorf("kubeone: unknown action %q", action)
	}
	if len(secrets.PrivateKey) == 0 {
		return res, errors.New("kubeone: no private key for the run")
	}
	bin, err := r.Binary()
	if err != nil {
		return res, err
	}
	p, err := r.prepare(secrets)
	if err != nil {
		return res, err
	}
	defer func() {
		if err := os.RemoveAll(p.Dir); err != nil {
			r.cfg.Logger.Error("remove the kubeone run directory (it holds the cluster key)", "dir", p.Dir, "err", err)
		}
	}()
	m, err := manifest(p)
	if err != nil {
		return res, fmt.Errorf("kubeone: manifest: %w", err)
	}
	if err := writeFile(p.Manifest, m, 0o600); err != nil {
		return res, err
	}
	cmd := exec.Command(bin, string(action), "--manifest", p.Manifest, "--auto-approve")
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = p.Dir, r.cfg.Env, stdout, stderr
	cmd.SysProcAttr = sysProcAttr()
	// Output pipes a stray grandchild keeps open must not hold Wait.
	cmd.WaitDelay = r.cfg.StopGrace
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("kubeone: start %s: %w", bin, err)
	}
	pgid := cmd.Process.Pid
	log := r.cfg.Logger.With("action", string(action), "pid", pgid)
	log.Info("kubeone started", "binary", bin, "dir", p.Dir)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
	stopped := false
	select {
	case waitErr = <-done:
	case <-ctx.Done():
		stopped = true
		log.Info("stopping kubeone", "reason", context.Cause(ctx))
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case waitErr = <-done:
		case <-time.After(r.cfg.StopGrace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			waitErr = <-done
		}
	}
	// Whatever KubeOne left behind in its group goes with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	res.Duration = time.Since(start)
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	log.Info("kubeone ended", "exit_code", res.ExitCode, "duration", res.Duration, "stopped", stopped)
	if stopped {
		return res, fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx))
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return res, fmt.Errorf("kubeone: %w", waitErr)
	}
	return res, nil
}

// prepare makes the run's private directory and writes the secrets.
func (r *Runner) prepare(s Secrets) (Paths, error) {
	if err := os.MkdirAll(r.cfg.WorkDir, 0o700); err != nil {
		return Paths{}, fmt.Errorf("kubeone: work directory: %w", err)
	}
	dir, err := os.MkdirTemp(r.cfg.WorkDir, runDirPrefix+"*") // mode 0700
	if err != nil {
		return Paths{}, fmt.Errorf("kubeone: run directory: %w", err)
	}
	p := Paths{Dir: dir, Manifest: filepath.Join(dir, "kubeone.yaml"), PrivateKey: filepath.Join(dir, "cluster_ed25519")}
	if err := writeFile(p.PrivateKey, s.PrivateKey, 0o600); err != nil {
		os.RemoveAll(dir)
		return Paths{}, err
	}
	if len(s.Certificate) > 0 {
		p.Certificate = p.PrivateKey + "-cert.pub"
		if err := writeFile(p.Certificate, s.Certificate, 0o600); err != nil {
			os.RemoveAll(dir)
			return Paths{}, err
		}
	}
	return p, nil
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("kubeone: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("kubeone: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("kubeone: write %s: %w", path, err)
	}
	return nil
}

// CleanStale removes run directories a previous hub process left behind
// (it was killed before it could): they hold cluster keys. Call it at
// start, before any run. It returns how many it removed.
func CleanStale(workDir string) (int, error) {
	entries, err := os.ReadDir(workDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kubeone: %w", err)
	}
	n := 0
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), runDirPrefix) {
			if err := os.RemoveAll(filepath.Join(workDir, e.Name())); err != nil {
				return n, fmt.Errorf("kubeone: remove stale run directory: %w", err)
			}
			n++
		}
	}
	return n, nil
}
