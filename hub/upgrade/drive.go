package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/provisioners/runner"
	nodeupgrade "github.com/tether-dev/tether/provisioners/upgrade"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Live is what a node's live session said in its hello about its updater.
type Live struct {
	StateDir     string
	AgentVersion string
	Arch         string
	Upgrade      *upgradeproto.Support // nil: an agent without a node-side updater
}

// TargetOf is how the controller reaches the updater of node nodeID (named
// name), from its live session's hello (never a node that merely took the
// name); why says why it cannot be reached.
func TargetOf(nodeID, name string, live Live) (_ Target, why string) {
	if live.Upgrade == nil {
		return Target{}, "its agent has no node-side updater (an agent older than over-the-air upgrades)"
	}
	dir := live.StateDir
	if dir == "" {
		dir = "/var/lib/tether-edge"
	}
	// The agent is a Linux program; its hello names the architecture.
	return Target{NodeID: nodeID, Name: name, Exe: live.Upgrade.Exe, StateDir: dir, OS: "linux", Arch: live.Arch,
		Version: live.AgentVersion}, ""
}

// SSHDriver drives one node through the provisioning runner, as jobs do,
// pushing files from the hub's blob store.
type SSHDriver struct {
	Connect jobs.Connector
	Blobs   *blobs.Store
}

// Drive implements Driver.
func (d SSHDriver) Drive(ctx context.Context, t Target, offer upgradeproto.Offer, files []upgradeproto.File,
	confirmedBy string, log io.Writer, offered func(upgradeproto.NodeState)) (upgradeproto.NodeState, int64, error) {
	c, err := d.Connect(ctx, t.NodeID)
	if err != nil {
		return upgradeproto.NodeState{}, 0, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	n := nodeupgrade.Node{Conn: sshConn{c}, Exe: t.Exe, StateDir: t.StateDir}
	st, sent, err := n.Drive(ctx, offer, files, func(h string) (io.ReadCloser, int64, error) {
		f, size, err := d.Blobs.Open(h)
		if err != nil {
			return nil, 0, err
		}
		return f, size, nil
	}, confirmedBy, log, offered)
	if errors.Is(err, runner.ErrConnLost) {
		err = fmt.Errorf("%w: %w", ErrConnLost, err)
	}
	return st, sent, err
}

// Status implements Driver.
func (d SSHDriver) Status(ctx context.Context, t Target, name string) (upgradeproto.NodeState, error) {
	c, err := d.Connect(ctx, t.NodeID)
	if err != nil {
		return upgradeproto.NodeState{}, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	n := nodeupgrade.Node{Conn: sshConn{c}, Exe: t.Exe, StateDir: t.StateDir}
	l, err := n.Status(ctx, name, io.Discard)
	if err != nil {
		return upgradeproto.NodeState{}, err
	}
	if len(l) != 1 {
		return upgradeproto.NodeState{}, fmt.Errorf("upgrade status %s: %d records", name, len(l))
	}
	return l[0], nil
}

// sshConn adapts the jobs' SSH connection to provisioners/upgrade.
type sshConn struct{ c jobs.Conn }

func (u sshConn) Run(ctx context.Context, line string, script []byte, stdout, stderr io.Writer) (int, error) {
	return u.c.Run(ctx, jobs.Command{Line: line, Script: script}, stdout, stderr)
}

func (u sshConn) Upload(ctx context.Context, src io.Reader, size int64, dst string) (string, error) {
	return u.c.Upload(ctx, src, size, dst, os.FileMode(0o600), true)
}
