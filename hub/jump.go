package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// jumpDialer is how the bastion reaches nodes: through the door, which
// resolves the node's route and decides whether the operator may jump to
// it. The bastion knows nothing of routes or roles.
type jumpDialer struct {
	door *access.Door
	live *liveJumps
}

func (d jumpDialer) Dial(ctx context.Context, req bastion.JumpRequest) (tunnel.Stream, error) {
	n, route, err := d.door.Resolve(ctx, access.ByName(req.Node))
	if err == nil || errors.Is(err, access.ErrOffline) {
		// Registered before the decision: an access change that lands
		// after the decision read the door finds this jump in the
		// registry and ends it. It leaves the registry when the jump ends.
		id := d.live.add(liveJump{operator: req.Operator, key: req.Key, fingerprint: req.KeyFingerprint, nodeID: n.ID, node: n.Name, stop: req.Stop})
		context.AfterFunc(ctx, func() { d.live.remove(id) })
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

// liveJump is one jump under way, as the access re-check needs it.
type liveJump struct {
	operator    string
	key         gossh.PublicKey // key or certificate that authenticated
	fingerprint string
	nodeID      string
	node        string
	stop        func(cause error)
}

// liveJumps is the hub's registry of jumps under way, so that withdrawing
// access (an operator removed, a key revoked, roles narrowed or deleted)
// ends the jumps it no longer allows.
type liveJumps struct {
	mu    sync.Mutex // guards the following fields
	next  uint64
	jumps map[uint64]liveJump
}

func (l *liveJumps) add(j liveJump) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.jumps == nil {
		l.jumps = map[uint64]liveJump{}
	}
	l.next++
	l.jumps[l.next] = j
	return l.next
}

func (l *liveJumps) remove(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.jumps, id)
}

func (l *liveJumps) all() []liveJump {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]liveJump, 0, len(l.jumps))
	for _, j := range l.jumps {
		out = append(out, j)
	}
	return out
}

// endWithdrawnJumps asks the door, which has just reloaded, about every
// live jump again, and stops those it no longer allows; the bastion then
// records each as "ended: access withdrawn" with the door's reason. A
// node that can no longer be looked up keeps its jumps (the store may be
// briefly unavailable); a removed or revoked node's jumps end.
func (s *Server) endWithdrawnJumps(ctx context.Context) {
	jumps := s.jumps.all()
	nodes := map[string]store.Node{}
	ended := 0
	for _, j := range jumps {
		n, ok := nodes[j.nodeID]
		var err error
		if !ok {
			n, _, err = s.door.Resolve(ctx, access.ByID(j.nodeID))
			switch {
			case err == nil || errors.Is(err, access.ErrOffline):
				nodes[j.nodeID], err = n, nil
			case errors.Is(err, access.ErrUnknownNode) || errors.Is(err, access.ErrRevoked):
			default:
				s.log.Warn("live jump not re-checked: node lookup failed", "operator", j.operator, "node", j.node, "err", err)
				continue
			}
		}
		if err == nil {
			err = s.door.AuthorizeLiveJump(j.operator, j.key, n)
		}
		if err == nil {
			continue
		}
		ended++
		s.log.Info("ending live jump: access withdrawn", "operator", j.operator, "key", j.fingerprint, "node", j.node, "reason", err)
		j.stop(fmt.Errorf("%w: %w", bastion.ErrAccessWithdrawn, err))
	}
	if ended > 0 {
		s.log.Info("live jumps re-checked after an access change", "live", len(jumps), "ended", ended)
	}
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
