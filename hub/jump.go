package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
		d.live.add(req.ID, liveJump{operator: req.Operator, key: req.Key, fingerprint: req.KeyFingerprint, nodeID: n.ID, node: n.Name, stop: req.Stop})
		context.AfterFunc(ctx, func() { d.live.remove(req.ID) })
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
// ends the jumps it no longer allows, and so that a login the node refused
// inside a jump reaches that jump's audit row.
type liveJumps struct {
	mu    sync.Mutex // guards the following fields
	jumps map[uint64]liveJump
	// refusals holds, per jump that reached a node and is not yet audited,
	// what the node reported refusing inside it.
	refusals map[uint64]*jumpRefusal
}

// jumpRefusal is a login the node's embedded SSH server refused inside a
// jump; set once, then noted is closed.
type jumpRefusal struct {
	noted  chan struct{}
	detail string // guarded by liveJumps.mu until noted is closed
}

func (l *liveJumps) add(id uint64, j liveJump) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.jumps == nil {
		l.jumps, l.refusals = map[uint64]liveJump{}, map[uint64]*jumpRefusal{}
	}
	l.jumps[id] = j
	l.refusals[id] = &jumpRefusal{noted: make(chan struct{})}
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

// noteRefusal records detail on every live jump of operator to the node
// that has not had a refusal noted yet, and reports how many it reached.
func (l *liveJumps) noteRefusal(nodeID, operator, detail string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id, j := range l.jumps {
		r := l.refusals[id]
		if j.nodeID != nodeID || j.operator != operator || r == nil || r.detail != "" {
			continue
		}
		r.detail = detail
		close(r.noted)
		n++
	}
	return n
}

// takeRefusal removes and returns jump id's refusal record (nil if the
// jump never reached the dialer).
func (l *liveJumps) takeRefusal(id uint64) *jumpRefusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.refusals[id]
	delete(l.refusals, id)
	return r
}

// refusalWait is how long the audit of a short jump waits for the node's
// report of a refused login: the node sends it on the control stream as it
// refuses, and the client's disconnect can still overtake it.
const refusalWait = 300 * time.Millisecond

// refusalOf is what the node reported refusing inside jump r, or "".
func (l *liveJumps) refusalOf(r bastion.JumpRecord) string {
	ref := l.takeRefusal(r.ID)
	if ref == nil {
		return ""
	}
	// A refused login ends the SSH connection at once; a jump that lasted
	// longer carried a session, and its refusal (if any) is already in.
	wait := time.Duration(0)
	if r.Result == "ok" && r.End.Sub(r.Start) < 10*time.Second {
		wait = refusalWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ref.noted:
		return ref.detail
	case <-t.C:
		return ""
	}
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

// auditJump records a finished jump attempt. A login the node refused
// inside it makes the row's result "login_refused", with the node's reason:
// the bastion only relays the operator's encrypted SSH connection, so the
// transport alone would read "ok".
func (s *Server) auditJump(r bastion.JumpRecord) {
	if refused := s.jumps.refusalOf(r); refused != "" {
		r.Result = "login_refused"
		r.Error = refused
	}
	s.audit(store.AuditEvent{At: r.Start, Kind: "jump", Operator: r.Operator, Node: r.Node, KeyFingerprint: r.KeyFingerprint,
		Remote: r.Remote, Result: r.Result, Detail: joinDetail(r.Header.String(), r.Error), EndedAt: r.End,
		BytesToNode: r.BytesToNode, BytesFromNode: r.BytesFromNode})
}

// authorizeOperator is the bastion's login check, answered by the door.
func (s *Server) authorizeOperator(user string, key gossh.PublicKey) bool {
	return s.door.AuthorizeLogin(user, key) == nil
}
