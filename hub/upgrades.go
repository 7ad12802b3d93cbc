package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/provisioners/runner"
	nodeupgrade "github.com/tether-dev/tether/provisioners/upgrade"
	"github.com/tether-dev/tether/tunnel/control"
)

// The hub's side of over-the-air upgrades: what the rollout controller
// (hub/upgrade) needs from the rest of the hub, and the node reports on
// the control stream.

// upgradeTarget is how the controller reaches a node's updater: through
// its live session's hello (Hello.Upgrade), never a node that merely took
// the name.
func (s *Server) upgradeTarget(nodeID string) (upgrade.Target, string) {
	if why := s.online(nodeID); why != "" {
		return upgrade.Target{}, why
	}
	n, err := s.store.GetNode(context.Background(), nodeID)
	if err != nil {
		return upgrade.Target{}, "not registered"
	}
	// Here, or on the replica holding the tunnel (as it recorded the hello).
	c, ok := s.liveSession(nodeID)
	if !ok {
		return upgrade.Target{}, "offline"
	}
	if c.Upgrade == nil {
		return upgrade.Target{}, "its agent has no node-side updater (an agent older than over-the-air upgrades)"
	}
	dir := c.StateDir
	if dir == "" {
		dir = "/var/lib/tether-edge"
	}
	// The agent is a Linux program; its hello names the architecture.
	return upgrade.Target{NodeID: nodeID, Name: n.Name, Exe: c.Upgrade.Exe, StateDir: dir, OS: "linux", Arch: c.Arch, Version: c.AgentVersion}, ""
}

// recordUpgradeStates hands a node's upgrade records (validated by
// control.Read) to the controller; what it ignores is audited within the
// node's audit limit.
func (s *Server) recordUpgradeStates(ctx context.Context, conn *registry.Conn, states []control.NodeUpgradeState, log *slog.Logger) {
	if s.upgrades == nil {
		return
	}
	ignored, err := s.upgrades.Report(ctx, conn.NodeID, states)
	if err != nil {
		log.Warn("upgrade report not recorded", "err", err)
		return
	}
	for _, st := range states {
		log.Debug("upgrade report", "upgrade", st.Name, "step", st.Step, "reason", st.Reason)
	}
	if len(ignored) > 0 {
		s.auditLimited(conn.Session.RemoteAddr().String(), store.AuditEvent{At: time.Now(), Kind: "upgrade_report", Node: conn.Name, Result: "ignored",
			Detail: strings.Join(ignored, "; ")})
	}
}

// upgradeDriver drives one node through the provisioning runner, as jobs
// do, pushing files from the hub's blob store.
type upgradeDriver struct {
	connect jobs.Connector
	blobs   *jobs.Blobs
}

func (d upgradeDriver) Drive(ctx context.Context, t upgrade.Target, offer control.UpgradeOffer, files []control.UpgradeFile, confirmedBy string, log io.Writer, offered func(control.NodeUpgradeState)) (control.NodeUpgradeState, int64, error) {
	c, err := d.connect(ctx, t.NodeID)
	if err != nil {
		return control.NodeUpgradeState{}, 0, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	n := nodeupgrade.Node{Conn: upgradeConn{c}, Exe: t.Exe, StateDir: t.StateDir}
	st, sent, err := n.Drive(ctx, offer, files, func(h string) (io.ReadCloser, int64, error) {
		f, size, err := d.blobs.Open(h)
		if err != nil {
			return nil, 0, err
		}
		return f, size, nil
	}, confirmedBy, log, offered)
	if errors.Is(err, runner.ErrConnLost) {
		err = fmt.Errorf("%w: %w", upgrade.ErrConnLost, err)
	}
	return st, sent, err
}

func (d upgradeDriver) Status(ctx context.Context, t upgrade.Target, name string) (control.NodeUpgradeState, error) {
	c, err := d.connect(ctx, t.NodeID)
	if err != nil {
		return control.NodeUpgradeState{}, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	n := nodeupgrade.Node{Conn: upgradeConn{c}, Exe: t.Exe, StateDir: t.StateDir}
	l, err := n.Status(ctx, name, io.Discard)
	if err != nil {
		return control.NodeUpgradeState{}, err
	}
	if len(l) != 1 {
		return control.NodeUpgradeState{}, fmt.Errorf("upgrade status %s: %d records", name, len(l))
	}
	return l[0], nil
}

// upgradeConn adapts the jobs' SSH connection to provisioners/upgrade.
type upgradeConn struct{ c jobs.Conn }

func (u upgradeConn) Run(ctx context.Context, line string, script []byte, stdout, stderr io.Writer) (int, error) {
	return u.c.Run(ctx, jobs.Command{Line: line, Script: script}, stdout, stderr)
}

func (u upgradeConn) Upload(ctx context.Context, src io.Reader, size int64, dst string) (string, error) {
	return u.c.Upload(ctx, src, size, dst, os.FileMode(0o600), true)
}
