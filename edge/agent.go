package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tether-dev/tether/edge/sshserver"
	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// SSHEmbedded selects the embedded SSH server as the target of ssh streams.
const SSHEmbedded = "embedded"

// Config configures the agent.
type Config struct {
	StateDir   string
	SSHTarget  string   // "embedded" or HOST:PORT of a local sshd (default 127.0.0.1:22)
	AllowPorts []uint16 // local TCP ports the hub may open streams to; empty = none
	// SSHDHostKey is the local sshd's host key (its ".pub" is read and sent
	// to the hub to be certified); used when SSHTarget is not embedded.
	// Default /etc/ssh/ssh_host_ed25519_key.
	SSHDHostKey string
	// ManageSSHD, if set, installs the host certificate, the user CAs and
	// the revoked keys from the hub into the local sshd's configuration
	// (see edge/sshdconf) and reloads it when they change.
	ManageSSHD *SSHDManager
	Transport  tunnel.Transport
	Tunnel     *tunnel.Config
	BackoffMin time.Duration // default 500ms
	BackoffMax time.Duration // cap of the exponential backoff, default 30s
	// ReprobeMin and ReprobeMax bound how often an agent that fell back to
	// TCP (Transport auto) tries QUIC again in the background: the first
	// try after ReprobeMin, then doubling up to ReprobeMax, each with
	// jitter. Defaults 30s and 10m.
	ReprobeMin, ReprobeMax time.Duration
	Logger                 *slog.Logger

	// Identity, if set, is used instead of the one in StateDir, and StateDir
	// may then be empty: no status file is written and a renewed
	// certificate is kept in memory only. The agent simulator in bench/
	// runs thousands of agents in one process this way.
	Identity *Identity
	// LabelsFile holds the labels the node reports about itself (KEY=VALUE
	// lines, see ReadLabels), read at every connect; "" reports none. The
	// hub shows them and never selects the node by them.
	LabelsFile string
	// SSHHostKey is the embedded SSH server's host key file (created if
	// missing). Default StateDir/ssh_host_ed25519_key.
	SSHHostKey string
	// SSHShell is the embedded SSH server's shell (sshserver.Config.Shell):
	// empty means the agent user's login shell, or /bin/sh for a nologin
	// account.
	SSHShell string
	// SourceIP, if set, is the local address the tunnel is dialed from
	// (tunnel.Dialer.LocalIP).
	SourceIP net.IP
	// UDP, if set, carries the QUIC tunnel on this shared socket
	// (tunnel.Dialer.UDP) instead of a socket of its own.
	UDP *tunnel.UDPSocket
	// OnStatus, if set, is called with every status change (connecting,
	// connected, ...), after the status file is written.
	OnStatus func(Status)
	// OnControl, if set, is called with every message the hub sends on the
	// control stream once the agent has acted on it, on the stream's reader
	// (so it must not block). The agent simulator in bench/ times the key
	// pushes of an access change this way.
	OnControl func(*control.Message)
	// Upgrade, if set, is the node-side updater on StateDir: the agent
	// announces it (upgradeproto.CapUpgrade), marks its own upgrade healthy when
	// the hub welcomes it, serves the confirm socket and reports the
	// node's upgrade records.
	Upgrade *upgrade.Node
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.StateDir == "" && c.Identity == nil {
		return errors.New("edge: StateDir is required (--state-dir)")
	}
	if c.SSHTarget == SSHEmbedded && c.SSHHostKey == "" {
		if c.StateDir == "" {
			return errors.New(
				"edge: the embedded SSH server needs a host key file (SSHHostKey) when there is no state dir",
			)
		}
		c.SSHHostKey = filepath.Join(c.StateDir, hostKeyFile)
	}
	if c.SSHTarget == "" {
		c.SSHTarget = "127.0.0.1:22"
	}
	if c.SSHDHostKey == "" {
		c.SSHDHostKey = "/etc/ssh/ssh_host_ed25519_key"
	}
	if c.SSHTarget != SSHEmbedded {
		if _, _, err := net.SplitHostPort(c.SSHTarget); err != nil {
			return fmt.Errorf("edge: --ssh %q: want %q or HOST:PORT of a local sshd", c.SSHTarget, SSHEmbedded)
		}
	}
	for _, p := range c.AllowPorts {
		if p == 0 {
			return errors.New("edge: allowed port 0 is invalid")
		}
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.ReprobeMin <= 0 {
		c.ReprobeMin = 30 * time.Second
	}
	if c.ReprobeMax <= 0 {
		c.ReprobeMax = 10 * time.Minute
	}
	c.ReprobeMax = max(c.ReprobeMax, c.ReprobeMin)
	if c.BackoffMax < c.BackoffMin {
		return fmt.Errorf("edge: backoff cap %s is below the minimum %s", c.BackoffMax, c.BackoffMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Tunnel != nil {
		if err := c.Tunnel.Validate(); err != nil {
			return fmt.Errorf("edge: %w", err)
		}
	}
	return nil
}

// Agent keeps a node connected to its hub.
type Agent struct {
	cfg  Config
	idMu sync.Mutex // guards id.Cert (replaced on renewal) and tickets
	id   *Identity
	// tickets holds the hub's TLS session tickets; replaced on renewal so
	// that the next session presents the new certificate.
	tickets  tls.ClientSessionCache
	log      *slog.Logger
	sshd     *sshserver.Server // nil unless SSHTarget is embedded
	allow    map[uint16]bool
	events   *sshEvents // the embedded server's reports for the hub's audit
	upgrades upgradeReports

	// drains are the sessions a transport move left draining (their live
	// streams go on); Run waits for them.
	drains sync.WaitGroup
	// held are the streams kept across reconnects (resume.go).
	held *uplink.Held

	mu     sync.Mutex // guards the following fields
	state  State      // changed only by setState
	status Status     // what status.json says
}

// ErrRefused means the hub refuses this identity for good (the node was
// revoked or removed, or the identity does not match); re-join is needed.
var ErrRefused = errors.New("hub refused this node")

// Refused reports whether err, returned by Run, means the hub will never
// take this identity again (ErrRefused, ErrRejoinNeeded): retrying cannot
// help, so a supervisor should not restart the agent.
func Refused(err error) bool {
	return errors.Is(err, ErrRefused) || errors.Is(err, ErrRejoinNeeded)
}

// rejoinAdvice says how to bring a node back that the hub refuses for good.
// The hub keeps a revoked node's record, and an expired certificate's
// node is still registered, so its name is free only after `nodes rm`.
func (a *Agent) rejoinAdvice() string {
	here := "join again here"
	if a.cfg.StateDir != "" {
		here = fmt.Sprintf(
			"here, delete %s and start `tether-edge run --join JOIN_STRING` (or `tether-edge join JOIN_STRING`)",
			absStateDir(a.cfg.StateDir))
	}
	return fmt.Sprintf(
		"to bring this node back: on the hub, `tether nodes rm %s` (if it is still listed) "+
			"and `tether token create` for a new join string; %s",
		a.id.Config.Name,
		here,
	)
}

// New loads the identity from the state dir and prepares services.
func New(cfg Config) (*Agent, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	id := cfg.Identity
	if id == nil {
		var err error
		if id, err = LoadIdentity(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	a := &Agent{cfg: cfg, id: id, log: cfg.Logger.With("node", id.Config.Name), allow: map[uint16]bool{},
		held: newHeld()}
	for _, p := range cfg.AllowPorts {
		a.allow[p] = true
	}
	if cfg.SSHTarget == SSHEmbedded {
		// Only the embedded server has events to queue (256 slots).
		a.events = newSSHEvents()
		var err error
		a.sshd, err = sshserver.New(sshserver.Config{
			HostKeyPath: cfg.SSHHostKey,
			Shell:       cfg.SSHShell,
			Logger:      a.log.With("component", "sshd"),
			OnEvent:     a.onSSHEvent,
		})
		if err != nil {
			return nil, err
		}
	}
	a.state = StateConnecting
	a.status = Status{
		Name:        id.Config.Name,
		NodeID:      id.Config.NodeID,
		State:       a.state.statusName(),
		Since:       time.Now().UTC(),
		CertExpires: id.Cert.Leaf.NotAfter,
		PID:         os.Getpid(),
		Version:     Version,
	}
	return a, nil
}

// Run connects and reconnects forever (capped exponential backoff with full
// jitter) until ctx is cancelled (nil), or the hub refuses this node for
// good: then the error is ErrRefused or ErrRejoinNeeded (see Refused) and
// says how to bring the node back.
func (a *Agent) Run(ctx context.Context) error {
	if a.sshd != nil {
		defer a.sshd.Close()
		ectx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { a.sendSSHEvents(ectx) })
		defer wg.Wait()
		defer cancel()
	}
	if a.cfg.Upgrade != nil {
		a.recoverUpgrades()
		uctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { a.serveUpgrades(uctx) })
		defer wg.Wait()
		defer cancel()
	}
	defer a.drains.Wait()
	if a.held == nil { // an Agent made without New (tests)
		a.held = newHeld()
	}
	defer a.held.Run(ctx, "the node's agent is stopping")()
	r := uplink.Retry{
		BackoffMin: a.cfg.BackoffMin, BackoffMax: a.cfg.BackoffMax, RetryAfter: true,
		Before: func() error {
			if err := a.checkExpiry(); err != nil {
				err = fmt.Errorf("%w; %s", err, a.rejoinAdvice())
				a.setState(StateRejoinNeeded, transition{err: err})
				return err
			}
			return nil
		},
		Stop: func(err error) error {
			if errors.Is(err, ErrRefused) {
				err = fmt.Errorf("%w; %s", err, a.rejoinAdvice())
				a.setState(StateRefused, transition{err: err})
				return err
			}
			return nil
		},
		Waiting: func(err error, wait time.Duration) {
			a.log.Warn("hub connection lost; retrying", "err", err, "in", wait.Round(time.Millisecond))
			a.setState(StateBackoff, transition{err: err})
		},
	}
	err := r.Run(ctx, func(ctx context.Context) (bool, error) {
		connected, err := a.runOnce(ctx)
		a.attemptEnded(connected)
		return connected, err
	})
	if err != nil {
		return err
	}
	a.setState(StateStopped, transition{})
	return nil
}
