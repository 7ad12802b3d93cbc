package hub

import (
	"context"
	"errors"
	"fmt"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// jumpDialer is how the bastion reaches nodes: through the door, which
// resolves the node's route and decides whether the operator may jump to
// it. The bastion knows nothing of routes or roles.
type jumpDialer struct{ door *access.Door }

func (d jumpDialer) Dial(ctx context.Context, req bastion.JumpRequest) (tunnel.Stream, error) {
	n, route, err := d.door.Resolve(ctx, access.ByName(req.Node))
	if err == nil || errors.Is(err, access.ErrOffline) {
		// Decide before saying anything about reachability: an operator
		// outside the node's roles learns nothing of whether it is online.
		if aerr := d.door.AuthorizeJump(req.Operator, n); aerr != nil {
			err = aerr
		}
	}
	if err != nil {
		if errors.Is(err, access.ErrDenied) || errors.Is(err, access.ErrRevoked) {
			// The bastion answers "administratively prohibited".
			return nil, fmt.Errorf("%w: %w", bastion.ErrDenied, err)
		}
		return nil, err
	}
	return route.Dial(ctx, req.Header)
}

// auditJump records a finished jump attempt.
func (s *Server) auditJump(r bastion.JumpRecord) {
	s.audit(store.AuditEvent{At: r.Start, Kind: "jump", Operator: r.Operator, Node: r.Node, KeyFingerprint: r.KeyFingerprint,
		Remote: r.Remote, Result: r.Result, Detail: joinDetail(r.Header.String(), r.Error), EndedAt: r.End,
		BytesToNode: r.BytesToNode, BytesFromNode: r.BytesFromNode})
}

// authorizeOperator is the bastion's login check, answered by the door.
func (s *Server) authorizeOperator(user string, key gossh.PublicKey) bool {
	return s.door.AuthorizeLogin(user, key) == nil
}
