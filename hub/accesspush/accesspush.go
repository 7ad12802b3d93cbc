// Package accesspush tells connected nodes what access allows on them: the
// operator keys their embedded SSH server accepts and their SSH trust (user
// CAs, revoked keys, principals per login, their host certificate), at
// connect and after every access change.
package accesspush

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

// pushWorkers bounds the sends in flight after an access change: enough to
// hide one slow node's write deadline, few enough that 100k nodes do not
// mean 100k goroutines at once.
const pushWorkers = 64

// Door is the part of the access door the pusher reads (hub/access).
type Door interface {
	Snapshot() *access.Snapshot
	Reload(ctx context.Context) (*access.Snapshot, error)
}

// Conns are the nodes connected to this hub.
type Conns interface{ All() []*nodeconn.Conn }

// UserCA is the SSH CA operators' certificates chain to.
type UserCA interface{ TrustedKeys() []gossh.PublicKey }

// HostCA signs nodes' SSH host keys.
type HostCA interface {
	SignHost(pub gossh.PublicKey, keyID string, hostnames []string, ttl time.Duration) (*gossh.Certificate, error)
}

// Config is what the Pusher uses.
type Config struct {
	Door        Door
	Conns       Conns
	UserCA      UserCA
	HostCA      HostCA
	HostCertTTL time.Duration
	// HostPrincipals are the names the host certificate of the node named
	// name is valid for.
	HostPrincipals func(name string) []string
	// WithAncestors adds to a node's trust what the hubs above a site hub
	// grant on it.
	WithAncestors func(t *control.SSHTrust, labels map[string]string)
	// EndWithdrawn ends the live jumps a new snapshot no longer allows.
	EndWithdrawn func(ctx context.Context)
	// AfterRound runs after each push round (the child sites' trust).
	AfterRound func(ctx context.Context)
	// Publish tells the other hub replicas of a change (store.Change*).
	Publish  func(kind, subject string)
	Duration prometheus.Observer    // of a push round
	Pushes   *prometheus.CounterVec // kind: keys|trust, result: sent|error
	Log      *slog.Logger
}

// Pusher pushes access state to the connected nodes.
type Pusher struct {
	cfg  Config
	kick chan struct{} // an access change is waiting to be pushed
}

// New makes a Pusher; Run runs its rounds.
func New(cfg Config) *Pusher { return &Pusher{cfg: cfg, kick: make(chan struct{}, 1)} }

// Kick asks for a round (nodes, then AfterRound).
func (s *Pusher) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Changed makes an operator, role or key-revocation change take
// effect: the door's snapshot is rebuilt at once (three store reads, so
// every decision from now on uses it), live jumps it no longer allows are
// ended, then the pusher brings every connected node up to date in the
// background.
//
// The other hub replicas sharing the store do the same when the change
// feed brings them the change (ApplyChange).
func (s *Pusher) Changed() {
	s.ApplyChange(context.Background())
	s.cfg.Publish(store.ChangeAccess, "")
}

// ApplyChange is Changed's work on this replica's live state.
func (s *Pusher) ApplyChange(ctx context.Context) {
	if _, err := s.cfg.Door.Reload(ctx); err != nil {
		s.cfg.Log.Error("access change not applied", "err", err)
		return
	}
	s.cfg.EndWithdrawn(ctx)
	s.Kick() // if a round is already due, it reads the newest snapshot
}

// Resync is the change feed's periodic full re-read (in case a
// change from another replica was missed). Live jumps are re-checked as
// after any change: they also depend on node rows the snapshot does not
// hold. A push round starts only if the re-read snapshot differs from the
// current one, which every earlier change already pushed: an unchanged
// round still builds and hashes every node's messages, 0.4 s of CPU every
// 30 s at 10,000 idle nodes. It reports whether a round was asked for.
func (s *Pusher) Resync(ctx context.Context) bool {
	before := s.cfg.Door.Snapshot()
	snap, err := s.cfg.Door.Reload(ctx)
	if err != nil {
		s.cfg.Log.Error("access re-read failed", "err", err)
		return false
	}
	s.cfg.EndWithdrawn(ctx)
	if snap.Same(before) {
		return false
	}
	s.Kick()
	return true
}

// Run pushes access state after changes until ctx ends. Changes that
// arrive during a round coalesce into one more round.
func (s *Pusher) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			s.pushAll(ctx)
			s.cfg.AfterRound(ctx)
		}
	}
}

// pushAll sends every connected node what the current snapshot changes for
// it, and nothing to the others. No store reads, no signatures: labels are
// on the connection and host certificates are re-sent as signed at connect
// or renewal.
func (s *Pusher) pushAll(ctx context.Context) {
	start := time.Now()
	conns := s.cfg.Conns.All()
	changed := s.PushTo(ctx, conns)
	took := time.Since(start)
	s.cfg.Duration.Observe(took.Seconds())
	s.cfg.Log.Info(
		"access change pushed",
		"nodes",
		len(conns),
		"changed",
		changed,
		"took",
		took.Round(time.Millisecond),
	)
}

// PushTo runs Push for conns on at most pushWorkers goroutines and
// returns how many were sent something.
func (s *Pusher) PushTo(ctx context.Context, conns []*nodeconn.Conn) int64 {
	memo := &pushMemo{snap: s.cfg.Door.Snapshot(), byLabels: map[string]nodeAccess{}}
	work := make(chan *nodeconn.Conn)
	var (
		wg      sync.WaitGroup
		changed atomic.Int64
	)
	for range min(pushWorkers, len(conns)) {
		wg.Go(func() {
			for c := range work {
				if s.push(c, false, memo) {
					changed.Add(1)
				}
			}
		})
	}
feed:
	for _, c := range conns {
		select {
		case work <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return changed.Load()
}

// nodeAccess is what one node is sent: the keys of its embedded server and
// the certificate principals per login.
type nodeAccess struct {
	keys       []string
	principals map[string][]string
	anyLogin   []string
	noForward  []string // principals whose role refuses port forwarding
}

// pushMemo shares the computation between nodes with identical labels
// within one push round (a fleet has far fewer label sets than nodes).
type pushMemo struct {
	snap     *access.Snapshot
	mu       sync.Mutex // guards byLabels
	byLabels map[string]nodeAccess
}

func accessFor(snap *access.Snapshot, labels map[string]string) nodeAccess {
	a := nodeAccess{keys: snap.KeysFor(labels)}
	a.principals, a.anyLogin = snap.PrincipalsFor(labels)
	a.noForward = snap.NoForwardingFor(labels)
	return a
}

// withKubeOne adds what node nodeID accepts as a member of a KubeOne
// cluster (the cluster's key and certificate principal, for the cluster's
// login). It depends on the node, not its labels, so it is never memoized;
// a's shared slices and map are copied, not changed.
func (a nodeAccess) withKubeOne(snap *access.Snapshot, nodeID string) nodeAccess {
	login, principal, ok := snap.KubeOnePrincipalFor(nodeID)
	if !ok {
		return a
	}
	a.keys = append(slices.Clone(a.keys), snap.KubeOneKeysFor(nodeID)...)
	p := maps.Clone(a.principals)
	if p == nil {
		p = map[string][]string{}
	}
	p[login] = append(slices.Clone(p[login]), principal)
	a.principals = p
	return a
}

func (m *pushMemo) get(snap *access.Snapshot, labels map[string]string) nodeAccess {
	if m == nil || m.snap != snap {
		return accessFor(snap, labels)
	}
	key := labelsKey(labels)
	m.mu.Lock()
	a, ok := m.byLabels[key]
	m.mu.Unlock()
	if !ok {
		a = accessFor(snap, labels)
		m.mu.Lock()
		m.byLabels[key] = a
		m.mu.Unlock()
	}
	return a
}

func labelsKey(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for k, v := range labels {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, "\x00")
}

// push brings one node up to date with the current snapshot: the
// operator keys its embedded server accepts, and its SSH trust (user CAs,
// revoked keys, principals, its host certificate). Unless force, a message
// identical to the last one sent is not sent again. It reports whether
// anything was sent.
//
// Everything is built and sent under the connection's push lock from the
// snapshot current at that moment, so an older state never overtakes a
// newer one on the wire.
func (s *Pusher) push(c *nodeconn.Conn, force bool, memo *pushMemo) bool {
	c.PushMu.Lock()
	defer c.PushMu.Unlock()
	snap := s.cfg.Door.Snapshot()
	a := memo.get(snap, c.Labels).withKubeOne(snap, c.NodeID)
	log := s.cfg.Log.With("node", c.Name)
	sentAny := false
	send := func(kind string, m *control.Message, last *[32]byte) {
		b, _ := json.Marshal(m) // deterministic: sorted map keys
		sum := sha256.Sum256(b)
		if !force && sum == *last {
			return
		}
		if err := c.Send(m); err != nil {
			s.cfg.Pushes.WithLabelValues(kind, "error").Inc()
			log.Info("push to node failed", "kind", kind, "err", err)
			return
		}
		s.cfg.Pushes.WithLabelValues(kind, "sent").Inc()
		*last = sum
		sentAny = true
	}
	send("keys", &control.Message{Type: control.TypeAuthorizedKeys, AuthorizedKeys: a.keys}, &c.Pushed.KeysSum)
	trust := &control.SSHTrust{
		HostCert:     c.Pushed.HostCert,
		RevokedKeys:  snap.RevokedKeys(),
		Principals:   a.principals,
		AnyLogin:     a.anyLogin,
		NoForwarding: a.noForward,
	}
	s.cfg.WithAncestors(trust, c.Labels) // a site hub: what the hubs above grant here
	for _, k := range s.cfg.UserCA.TrustedKeys() {
		trust.UserCAs = append(trust.UserCAs, string(gossh.MarshalAuthorizedKey(k)))
	}
	send("trust", &control.Message{Type: control.TypeSSHTrust, SSHTrust: trust}, &c.Pushed.TrustSum)
	return sentAny
}

// CertifyHost signs the node's SSH host key (valid for NAME and
// NAME.SUFFIX) and keeps the certificate on the connection for Push.
// It returns the parsed host key, nil if the agent sent none or it was
// unusable.
func (s *Pusher) CertifyHost(c *nodeconn.Conn, log *slog.Logger) gossh.PublicKey {
	if c.HostKey == "" {
		return nil
	}
	k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(c.HostKey))
	if err != nil {
		log.Warn("agent sent an unreadable SSH host key; no host certificate issued", "err", err)
		return nil
	}
	cert, err := s.cfg.HostCA.SignHost(k, "node "+c.Name+" "+c.NodeID, s.cfg.HostPrincipals(c.Name), s.cfg.HostCertTTL)
	if err != nil {
		log.Warn("sign SSH host certificate", "err", err)
		c.HostCertRenew.Store(time.Now().Add(nodeconn.RenewRetry(s.cfg.HostCertTTL)).UnixNano())
		return nil
	}
	c.HostCertRenew.Store(time.Now().Add(s.cfg.HostCertTTL * 2 / 3).UnixNano())
	c.PushMu.Lock()
	c.Pushed.HostCert = string(gossh.MarshalAuthorizedKey(cert))
	c.PushMu.Unlock()
	return k
}

// Push brings node c up to date now and reports whether anything was sent;
// with force, even what it was sent before (a node that just connected).
func (s *Pusher) Push(c *nodeconn.Conn, force bool) bool { return s.push(c, force, nil) }
