package bastion

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Door decides who may jump to which node and resolves a node's route
// (hub/access): the bastion knows nothing of routes or roles.
type Door interface {
	Resolve(ctx context.Context, ref access.NodeRef) (store.Node, access.Route, error)
	AuthorizeLogin(user string, key gossh.PublicKey) error
	AuthorizeJumpAs(operator string, key gossh.PublicKey, n store.Node) error
	AuthorizeLiveJump(operator string, key gossh.PublicKey, n store.Node) error
}

// Nodes are the connected nodes, as jumps need them.
type Nodes interface {
	// ReportsLogins says whether the named node's agent reports the
	// outcome of every SSH login (control.CapSSHLoginEvents).
	ReportsLogins(node string) bool
	// ReportingID is the ID of the named node if it is connected here and
	// reports every login's outcome.
	ReportingID(node string) (nodeID string, ok bool)
	// SendAccess sends the named node, if connected here with this ID,
	// its current access.
	SendAccess(node, nodeID string)
}

// JumpsConfig is what jumps use of the hub.
type JumpsConfig struct {
	Door   Door
	Nodes  Nodes
	Audit  func(store.AuditEvent)
	Logger *slog.Logger
}

// Jumps reach nodes for the bastion's operators through the door, audit
// every jump, and end the live jumps an access change no longer allows.
type Jumps struct {
	cfg  JumpsConfig
	live liveJumps
}

// NewJumps returns the jumps of a hub.
func NewJumps(cfg JumpsConfig) *Jumps { return &Jumps{cfg: cfg} }

// Dial is the bastion's Dialer: it resolves the node's route and decides
// whether the operator may jump to it.
func (j *Jumps) Dial(ctx context.Context, req JumpRequest) (tunnel.Stream, error) {
	n, route, err := j.cfg.Door.Resolve(ctx, access.ByName(req.Node))
	if err == nil || errors.Is(err, access.ErrOffline) {
		// Registered before the decision: an access change that lands
		// after the decision read the door finds this jump in the
		// live jumps and ends it. It leaves them when the jump ends.
		toSSH := req.Header.Service == tunnel.ServiceSSH
		j.live.add(req.ID, liveJump{operator: req.Operator, key: req.Key, fingerprint: req.KeyFingerprint,
			nodeID: n.ID, node: n.Name, toSSH: toSSH, stop: req.Stop, withdraw: req.Withdraw},
			toSSH && j.cfg.Nodes.ReportsLogins(n.Name))
		context.AfterFunc(ctx, func() { j.live.remove(req.ID) })
		// Decide before saying anything about reachability: an operator
		// outside the node's roles learns nothing of whether it is online.
		if aerr := j.cfg.Door.AuthorizeJumpAs(req.Operator, req.Key, n); aerr != nil {
			err = aerr
		}
	}
	if err != nil {
		if errors.Is(err, access.ErrDenied) || errors.Is(err, access.ErrRevoked) {
			// The bastion answers "administratively prohibited".
			return nil, fmt.Errorf("%w: %w", ErrDenied, err)
		}
		return nil, err
	}
	return route.Dial(access.WithHop(ctx, access.Hop{Purpose: siteproto.PurposeJump, Operator: req.Operator}), req.Header)
}

// liveJump is one jump under way, as the access re-check needs it.
type liveJump struct {
	operator    string
	key         gossh.PublicKey // key or certificate that authenticated
	fingerprint string
	nodeID      string
	node        string
	toSSH       bool // to the node's SSH server
	stop        func(cause error)
	withdraw    func(cause error, grace time.Duration)
}

// liveJumps are the jumps under way, so that withdrawing
// access (an operator removed, a key revoked, roles narrowed or deleted)
// ends the jumps it no longer allows, and so that a login the node refused
// inside a jump reaches that jump's audit row.
type liveJumps struct {
	mu    sync.Mutex // guards the following fields
	jumps map[uint64]liveJump
	// outcomes holds, per jump that reached the dialer and is not yet
	// audited, how the SSH login inside it went as far as the node said.
	outcomes map[uint64]*loginOutcome
}

// loginOutcome is what a node's embedded SSH server reported about the
// login inside one jump.
type loginOutcome struct {
	nodeID, operator string // the jump's
	// await: the node reports every connection's outcome (its hello
	// announced CapSSHLoginEvents) and the jump is to its SSH server.
	await  bool
	known  chan struct{} // closed once the outcome is in
	refuse string        // the refusal's reason; "" if it logged in or failed
}

// outcomeWait bounds how long a jump's audit row waits for the node's
// outcome of its login. It normally came in long before: the node reports
// a login as it accepts or refuses it, and a connection that never logged
// in as soon as the hub closes the stream.
const outcomeWait = 2 * time.Second

func (l *liveJumps) add(id uint64, j liveJump, await bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.jumps == nil {
		l.jumps, l.outcomes = map[uint64]liveJump{}, map[uint64]*loginOutcome{}
	}
	l.jumps[id] = j
	l.outcomes[id] = &loginOutcome{nodeID: j.nodeID, operator: j.operator, await: await, known: make(chan struct{})}
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

// noteOutcome records a login outcome the node reported. A refusal
// (refused != "", operator verified by the caller) marks every jump of
// that operator to the node still waiting; an accepted or failed login
// (refused == "") settles the node's oldest jump still waiting, since the
// node cannot name the jump. Which jump an outcome settles only decides
// how long a row waits; a refusal is put only on its operator's jumps.
func (l *liveJumps) noteOutcome(nodeID, operator, refused string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The outcomes, not the live jumps: a login that failed is reported
	// when the node sees the connection close, after the jump ended.
	var oldest uint64
	for id, o := range l.outcomes {
		if o.nodeID != nodeID || isClosed(o.known) {
			continue
		}
		if refused != "" {
			if o.operator == operator {
				o.refuse = refused
				close(o.known)
			}
			continue
		}
		if oldest == 0 || id < oldest {
			oldest = id
		}
	}
	if oldest != 0 {
		close(l.outcomes[oldest].known)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// refusalOf is the login refusal the node reported inside jump r, or "".
// It waits (outcomeWaitFor) only for a relayed jump whose node reports
// every login's outcome and has not reported this one yet.
func (l *liveJumps) refusalOf(r JumpRecord) string {
	o := l.outcome(r.ID)
	if o == nil {
		return ""
	}
	return l.settle(r.ID, o, outcomeWaitFor(o, r))
}

// outcomeWaitFor is how long the row of jump r may wait for o: only a
// relayed jump ("ok") to a node that reports every login waits.
func outcomeWaitFor(o *loginOutcome, r JumpRecord) time.Duration {
	if o.await && r.Result == "ok" {
		return outcomeWait
	}
	return 0
}

// outcome is jump id's outcome record (nil if it never reached the
// dialer). It stays registered until settle: a failed login's outcome
// comes in after the jump ended and must still find it.
func (l *liveJumps) outcome(id uint64) *loginOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outcomes[id]
}

// settle waits up to wait for o, unregisters it and returns its refusal.
func (l *liveJumps) settle(id uint64, o *loginOutcome, wait time.Duration) string {
	defer func() {
		l.mu.Lock()
		delete(l.outcomes, id)
		l.mu.Unlock()
	}()
	if !isClosed(o.known) && wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-o.known:
		case <-t.C:
		}
	}
	if !isClosed(o.known) {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return o.refuse
}

// goodbyeGrace bounds how long a withdrawn jump to a node's embedded SSH
// server waits for the node to end the session itself, telling the
// operator's client why; nothing the operator sends is relayed meanwhile.
const goodbyeGrace = 2 * time.Second

// EndWithdrawn asks the door, which has just reloaded, about every
// live jump again, and ends those it no longer allows; the bastion then
// records each as "ended: access withdrawn" with the door's reason. A
// jump to the SSH server of a node whose agent serves SSH itself (and
// ends the sessions the new access no longer allows, saying why on their
// stderr) is withdrawn: that node is sent its new access now, and the
// node's goodbye still reaches the operator (goodbyeGrace); any other jump
// (and any jump to a node removed or revoked) is stopped at once. A node
// that can no longer be looked up keeps its jumps (the store may be
// briefly unavailable); a removed or revoked node's jumps end.
func (j *Jumps) EndWithdrawn(ctx context.Context) {
	jumps := j.live.all()
	nodes := map[string]store.Node{}
	pushed := map[string]bool{} // nodes sent their new access by this call
	ended := 0
	for _, lj := range jumps {
		n, ok := nodes[lj.nodeID]
		var err error
		if !ok {
			n, _, err = j.cfg.Door.Resolve(ctx, access.ByID(lj.nodeID))
			switch {
			case err == nil || errors.Is(err, access.ErrOffline):
				nodes[lj.nodeID], err = n, nil
			case errors.Is(err, access.ErrUnknownNode) || errors.Is(err, access.ErrRevoked):
			default:
				j.cfg.Logger.Warn("live jump not re-checked: node lookup failed",
					"operator", lj.operator, "node", lj.node, "err", err)
				continue
			}
		}
		// A node removed or revoked is not trusted to end the session.
		trusted := err == nil
		if err == nil {
			err = j.cfg.Door.AuthorizeLiveJump(lj.operator, lj.key, n)
		}
		if err == nil {
			continue
		}
		ended++
		j.cfg.Logger.Info("ending live jump: access withdrawn",
			"operator", lj.operator, "key", lj.fingerprint, "node", lj.node, "reason", err)
		cause := fmt.Errorf("%w: %w", ErrAccessWithdrawn, err)
		id, ok := j.cfg.Nodes.ReportingID(lj.node)
		if !trusted || !lj.toSSH || lj.withdraw == nil || !ok || id != lj.nodeID {
			lj.stop(cause)
			continue
		}
		if !pushed[id] {
			pushed[id] = true
			j.cfg.Nodes.SendAccess(lj.node, id)
		}
		lj.withdraw(cause, goodbyeGrace)
	}
	if ended > 0 {
		j.cfg.Logger.Info("live jumps re-checked after an access change", "live", len(jumps), "ended", ended)
	}
}

// Audit records a finished jump attempt, under the fingerprint of the
// operator's key (a certificate's serial and key id in the detail). A
// login the node refused inside it makes the row's result "login_refused",
// with the node's reason: the bastion only relays the operator's encrypted
// SSH connection, so the transport alone would read "ok".
func (j *Jumps) Audit(r JumpRecord) {
	if refused := j.live.refusalOf(r); refused != "" {
		r.Result = "login_refused"
		r.Error = refused
	}
	j.cfg.Audit(
		store.AuditEvent{At: r.Start, Kind: "jump", Operator: r.Operator, Node: r.Node, KeyFingerprint: r.KeyFingerprint,
			Remote: r.Remote, Result: r.Result, Detail: joinDetail(r.Header.String(), r.Cert, r.Error), EndedAt: r.End,
			BytesToNode: r.BytesToNode, BytesFromNode: r.BytesFromNode},
	)
}

// Authorize is the bastion's login check, answered by the door.
func (j *Jumps) Authorize(user string, key gossh.PublicKey) bool {
	return j.cfg.Door.AuthorizeLogin(user, key) == nil
}

// NoteOutcome records a login outcome a node reported (liveJumps.noteOutcome).
func (j *Jumps) NoteOutcome(nodeID, operator, refused string) {
	j.live.noteOutcome(nodeID, operator, refused)
}

// joinDetail joins the non-empty parts of an audit event's detail.
func joinDetail(parts ...string) string {
	return strings.Join(slices.DeleteFunc(slices.Clone(parts), func(p string) bool { return p == "" }), "; ")
}
