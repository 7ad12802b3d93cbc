package edge

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/tunnel/uplink"
)

// Version is the agent version, set at build time.
var Version = "dev"

// ErrJoinRefused is returned when the hub refused the join (bad, used-up or
// expired token; name taken). Retrying will not help.
var ErrJoinRefused = uplink.ErrJoinRefused

// JoinOptions are the inputs of Join.
type JoinOptions struct {
	JoinString string
	StateDir   string
	Name       string // default: DefaultName()
	Timeout    time.Duration
	// Kind is control.JoinSite when a site hub joins its parent; "" for a
	// node.
	Kind string
}

// Join exchanges a join string for a node identity and stores it in the
// state dir. The key is generated here and never leaves the machine; the hub
// is trusted only if it proves the CA pinned in the join string.
func Join(ctx context.Context, o JoinOptions) (*Identity, error) {
	if _, err := LoadIdentity(o.StateDir); err == nil {
		return nil, fmt.Errorf(
			"%s already holds a node identity; use another --state-dir or delete it to re-join", o.StateDir)
	}
	id, err := Enroll(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := saveIdentity(o.StateDir, id.Config, id.Key(), id.Chain(), id.CA, id.NodeCA); err != nil {
		return nil, fmt.Errorf("join: save identity: %w", err)
	}
	return LoadIdentity(o.StateDir)
}

// Enroll is Join without the state dir (o.StateDir is ignored): it returns
// the new identity and stores nothing. The agent simulator in bench/ enrolls
// thousands of nodes through the real join endpoint this way and keeps their
// identities in one file (see ParseIdentity and Identity.KeyPEM).
func Enroll(ctx context.Context, o JoinOptions) (*Identity, error) {
	if o.Name == "" {
		o.Name = DefaultName()
	}
	return uplink.Enroll(ctx, uplink.EnrollOptions{JoinString: o.JoinString, Name: o.Name, Timeout: o.Timeout,
		Kind: o.Kind, AgentVersion: Version})
}
