package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/edge/sshdconf"
	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/tunnel"
)

// exitRefused is the exit status of `tether-edge run` when the hub refuses
// this node for good (revoked, removed, or its certificate expired while
// offline; see edge.Refused). It is sysexits' EX_NOPERM, which systemd
// shows as 77/NOPERMISSION; the shipped unit names it in
// RestartPreventExitStatus= so that a refused node is not restarted
// forever. Every other failure exits 1 and is retried.
const exitRefused = 77

// exitNotJoined is the exit status of `tether-edge run` on a node that has
// not joined and was given no join string (edge.ErrNoJoinString):
// sysexits' EX_CONFIG, 78/CONFIG to systemd. The shipped unit names it in
// RestartPreventExitStatus= too: restarting cannot help until someone
// gives a join string, and then restarts the unit.
const exitNotJoined = 78

// exitStatus is the process exit status for an error a command returned.
func exitStatus(err error) int {
	var se *statusError
	if errors.As(err, &se) {
		return se.code
	}
	if edge.Refused(err) {
		return exitRefused
	}
	if errors.Is(err, edge.ErrNoJoinString) {
		return exitNotJoined
	}
	return 1
}

func newRunCmd() *edgecli.Command {
	var cfg edge.Config
	var join, joinFile, name, transport string
	var ports edgecli.UintList
	var manage, supervise bool
	var sshdPidFile string
	mgr := &edge.SSHDManager{Paths: sshdconf.DefaultPaths()}
	tc := tunnel.DefaultConfig()
	cmd := &edgecli.Command{
		Use:   "run",
		Short: "Stay connected to the hub (joining first if --join is given and the state dir is empty)",
		Long: `Connect to the hub and serve its streams until stopped, reconnecting forever
with capped exponential backoff and full jitter.

When --state-dir holds no identity yet, the agent joins first with the join
string from --join (or TETHER_JOIN), else from --join-file (default
/etc/tether-edge/join, where packages and images expect it), so the same
command line works on every boot.

--ssh selects where SSH streams go: "embedded" (a built-in SSH server with
shell, exec, PTY and sftp that accepts the operator keys the hub pushes; it
runs commands as this agent's OS user, whatever login name is given) or
HOST:PORT of a local sshd. --allow-port opens individual local TCP ports to the
hub (none by default).

When the hub refuses this node for good (it was revoked or removed on the hub,
or its certificate expired while it was offline), the agent says how to bring
it back and exits with status 77 instead of 1, so that a supervisor stops
restarting it (systemd: RestartPreventExitStatus=77). A node that has not
joined and has no join string exits with status 78 (78/CONFIG to systemd),
saying the commands that give it one; the unit does not restart on that
either. Every other failure is retried.

Upgrades: this command is also the launcher of installed agent versions.
When an over-the-air upgrade has installed one (STATE_DIR/agent/current), it
runs that version with the same arguments (exec), after the launcher's
checks: an upgrade interrupted mid-switch, a new version that keeps exiting
(3 times in a row) or that missed its health check while no updater ran is
switched back to the previous version first. The unit file needs no change.

--supervise keeps a small parent process that runs the agent as its child,
starts it again 1s after it exits, and restarts it when the updater asks
(SIGUSR1): the service manager for machines without systemd. The supervisor
is never replaced while it runs (its child runs the installed version).`,
		Example: `  tether-edge run --join "$JOIN" --state-dir ./n1 --name n1 --ssh embedded
  tether-edge run --join "$JOIN" --state-dir ./n2 --name n2 --ssh 127.0.0.1:22 --transport tcp`,
		Args: edgecli.NoArgs,
		Run: func(ctx context.Context, cmd *edgecli.Command, _ []string) error {
			setAgentGC()
			log, err := newLogger()
			if err != nil {
				return err
			}
			if supervise {
				return runSupervisor(ctx, cfg.StateDir)
			}
			if cfg.Upgrade, err = launch(cfg.StateDir, log); err != nil {
				return err
			}
			if cfg.Transport, err = tunnel.ParseTransport(transport); err != nil {
				return fmt.Errorf("--transport: %w", err)
			}
			for _, p := range ports {
				if p == 0 || p > 65535 {
					return fmt.Errorf("--allow-port %d: want 1-65535", p)
				}
				cfg.AllowPorts = append(cfg.AllowPorts, uint16(p))
			}
			if _, err := edge.LoadIdentity(cfg.StateDir); errors.Is(err, edge.ErrNotJoined) {
				if join == "" && joinFile != "" {
					switch s, ferr := edge.ReadJoinFile(joinFile); {
					case errors.Is(ferr, fs.ErrNotExist):
					case ferr != nil:
						return ferr
					default:
						join = s
					}
				}
				if join == "" {
					return edge.NoJoinString(cfg.StateDir, joinFile, upgrade.SystemdUnit())
				}
				id, err := edge.Join(ctx, edge.JoinOptions{JoinString: join, StateDir: cfg.StateDir, Name: name})
				if err != nil {
					return err
				}
				log.Info("joined hub", "node", id.Config.Name, "node_id", id.Config.NodeID)
			} else if err != nil {
				return err
			}
			cfg.Logger = log
			cfg.Tunnel = tc
			cfg.OnStatus = releaseAfterStart(log)
			if manage {
				if cfg.SSHTarget == edge.SSHEmbedded {
					return fmt.Errorf("--manage-sshd configures a local sshd; it cannot be combined with --ssh embedded")
				}
				mgr.Paths.HostKey = cfg.SSHDHostKey
				if sshdPidFile != "" {
					mgr.Reload = sshdconf.PidFileReloader(sshdPidFile)
				}
				if err := mgr.Check(); err != nil {
					return err
				}
				if err := mgr.CheckForwarding(ctx); err != nil {
					log.Warn("the local sshd refuses port forwarding: `tether kubeone apply` fails on this node until it allows "+
						"local forwarding", "err", err)
				}
				cfg.ManageSSHD = mgr
			}
			a, err := edge.New(cfg)
			if err != nil {
				return err
			}
			return a.Run(ctx)
		},
	}
	f := &cmd.Flags
	f.StringVar(&cfg.StateDir, "state-dir", defaultStateDir(), "node identity directory (env TETHER_STATE_DIR)")
	f.StringVar(&join, "join", os.Getenv("TETHER_JOIN"),
		"join string; used only when --state-dir has no identity yet (env TETHER_JOIN keeps it out of the process list)")
	f.StringVar(&joinFile, "join-file", edge.DefaultJoinFile,
		"file holding the join string (first non-comment line), read when --state-dir has no identity yet and --join is "+
			"empty; a missing file is not an error until a join string is needed")
	f.StringVar(&name, "name", "", "node name used when joining (default: derived from the hostname)")
	f.StringVar(&cfg.SSHTarget, "ssh", "127.0.0.1:22", `target of SSH streams: "embedded" or HOST:PORT of a local sshd`)
	f.StringVar(&cfg.SSHShell, "shell", "",
		`with --ssh embedded: shell of SSH sessions (default: the agent user's login shell; `+
			`/bin/sh for a nologin account, said in the log)`)
	f.StringVar(&cfg.SSHDHostKey, "sshd-host-key", "/etc/ssh/ssh_host_ed25519_key",
		"the local sshd's host key; its .pub is certified by the hub's host CA (with --ssh HOST:PORT)")
	f.BoolVar(&manage, "manage-sshd", false,
		"install the hub's host certificate, user CAs and revoked keys into the local sshd (drop-in + files) and reload it")
	f.StringVar(&mgr.Paths.Dir, "sshd-dir", mgr.Paths.Dir,
		"with --manage-sshd: directory for the certificate, CA and revoked-key files")
	f.StringVar(&mgr.Paths.DropIn, "sshd-drop-in", mgr.Paths.DropIn,
		"with --manage-sshd: sshd_config drop-in to write (must be Included by --sshd-config)")
	f.StringVar(&mgr.SSHDConfig, "sshd-config", "/etc/ssh/sshd_config", "with --manage-sshd: the main sshd_config")
	f.StringVar(&sshdPidFile, "sshd-pid-file", "",
		"with --manage-sshd: reload sshd by SIGHUP to this pid file's process (default: systemctl reload ssh)")
	f.StringVar(&cfg.LabelsFile, "labels-file", edge.DefaultLabelsFile,
		"KEY=VALUE lines this node reports as its labels at every connect (shown by the hub as reported labels, "+
			"never used for access)")
	f.Var(&ports, "allow-port", "local TCP port the hub may open streams to (repeatable)")
	f.BoolVar(&supervise, "supervise", false,
		"run the agent as a supervised child: restarted when it exits or an upgrade asks (for machines without systemd)")
	f.StringVar(&transport, "transport", "auto", "auto (race QUIC and TCP), quic, or tcp")
	f.DurationVar(&cfg.BackoffMax, "backoff-max", 0, "cap of the reconnect backoff (default 30s)")
	f.DurationVar(&tc.KeepAliveInterval, "keepalive", tc.KeepAliveInterval,
		"tunnel keepalive interval: an agent pings its hub after a little more than this without hearing it (at most about "+
			"25s keeps a QUIC agent's UDP NAT binding open; docs/design/tunnels.md, Keepalive and windows)")
	f.DurationVar(&tc.IdleTimeout, "dead-peer-timeout", tc.IdleTimeout,
		"a tunnel silent this long is considered dead (set on hub and agents alike; 3 × --keepalive by default)")
	return cmd
}

// runSupervisor is `run --supervise`: this process stays the supervisor,
// its child is `run` with the same arguments but --supervise.
func runSupervisor(ctx context.Context, stateDir string) error {
	n, err := upgradeNode(stateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.Dir, 0o700); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := slices.DeleteFunc(slices.Clone(os.Args[1:]), func(a string) bool {
		a = "-" + strings.TrimLeft(a, "-") // flag takes -supervise as well
		return a == "-supervise" || strings.HasPrefix(a, "-supervise=")
	})
	// The supervisor's start-up is over once its child runs.
	t := time.AfterFunc(startupPagesDelay, func() { _, _ = releaseExePages() })
	defer t.Stop()
	code, err := upgrade.Supervise(ctx, n, self, args, []int{exitRefused, exitNotJoined})
	if err != nil {
		return err
	}
	if code != 0 {
		return &statusError{code: code, msg: fmt.Sprintf("the agent exited with status %d", code)}
	}
	return nil
}

// launch is the launcher's part of `run`: on its first start (not in an
// installed version it exec'd) it records the service manager, settles
// agent upgrades under way (upgrade.Node.Launch) and execs the installed
// version if that is not this executable. It returns the updater the
// agent announces.
func launch(stateDir string, log *slog.Logger) (*upgrade.Node, error) {
	n, err := upgradeNode(stateDir)
	if err != nil {
		return nil, err
	}
	if os.Getenv(envLauncher) != "" {
		return n, nil // exec'd by the launcher, which did all this
	}
	if _, err := os.Stat(n.Dir); err != nil {
		return n, nil // not joined yet: nothing installed, nothing to record
	}
	if os.Getenv(upgrade.EnvSupervisor) == "" {
		m := upgrade.Manager{Kind: upgrade.ManagerNone}
		if u := upgrade.SystemdUnit(); u != "" {
			m = upgrade.Manager{Kind: upgrade.ManagerSystemd, Unit: u}
		}
		if err := n.SetManager(m); err != nil {
			log.Warn("cannot record the service manager: agent upgrades will fail", "err", err)
		}
	}
	target, changed := n.Launch()
	for _, s := range changed {
		log.Warn("agent upgrade settled at start", "upgrade", s.Name, "step", s.Step, "reason", s.Reason)
	}
	if target == "" || sameFile(target, n.Exe) {
		return n, nil
	}
	log.Info("running the installed agent version", "exe", target)
	env := append(os.Environ(), envLauncher+"="+n.Exe)
	if err := syscall.Exec(target, append([]string{target}, os.Args[1:]...), env); err != nil {
		return nil, fmt.Errorf("run the installed agent %s: %w (remove %s to run this executable)", target, err,
			filepath.Join(n.Dir, "agent", "current"))
	}
	return n, nil
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// agentGCPercent is the long-running agent's GOGC: its live heap is a few
// MiB and it is idle nearly always, so the default 100 (garbage may grow as
// large as the live heap before a collection) is most of what an idle
// agent's RSS carries above its live data, for GC work an idle agent
// hardly ever does. GOGC in the environment wins.
const agentGCPercent = 50

func setAgentGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGCPercent)
	}
}

// startupPagesDelay is how long after its first connection the agent
// releases its executable's start-up pages (releaseExePages): the
// start-up work (the first heartbeat, key and certificate pushes) is over
// by then.
const startupPagesDelay = 5 * time.Second

// releaseAfterStart is the agent's status hook that releases the
// executable's start-up pages once, startupPagesDelay after the first
// connection.
func releaseAfterStart(log *slog.Logger) func(edge.Status) {
	var once sync.Once
	return func(st edge.Status) {
		if st.State != "connected" {
			return
		}
		once.Do(func() {
			time.AfterFunc(startupPagesDelay, func() {
				n, err := releaseExePages()
				if err != nil {
					log.Warn("cannot release the executable's start-up pages: its RSS stays as it is", "err", err)
					return
				}
				log.Debug("released the executable's start-up pages", "address_space", n)
			})
		})
	}
}
