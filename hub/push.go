package hub

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

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

// pushWorkers bounds the sends in flight after an access change: enough to
// hide one slow node's write deadline, few enough that 100k nodes do not
// mean 100k goroutines at once.
const pushWorkers = 64

// accessChanged makes an operator, role or key-revocation change take
// effect: the door's snapshot is rebuilt at once (three store reads, so
// every decision from now on uses it), live jumps it no longer allows are
// ended, then the pusher brings every connected node up to date in the
// background.
//
// The other hub replicas sharing the store do the same when the change
// feed brings them the change (singletons.go).
func (s *Server) accessChanged() {
	s.applyAccessChange(context.Background())
	s.publish(store.ChangeAccess, "")
}

// applyAccessChange is accessChanged's work on this replica's live state.
func (s *Server) applyAccessChange(ctx context.Context) {
	if _, err := s.door.Reload(ctx); err != nil {
		s.log.Error("access change not applied", "err", err)
		return
	}
	s.endWithdrawnJumps(ctx)
	s.kickPush() // if a round is already due, it reads the newest snapshot
}

// resyncAccess is the change feed's periodic full re-read (in case a
// change from another replica was missed). Live jumps are re-checked as
// after any change: they also depend on node rows the snapshot does not
// hold. A push round starts only if the re-read snapshot differs from the
// current one, which every earlier change already pushed: an unchanged
// round still builds and hashes every node's messages, 0.4 s of CPU every
// 30 s at 10,000 idle nodes. It reports whether a round was asked for.
func (s *Server) resyncAccess(ctx context.Context) bool {
	before := s.door.Snapshot()
	snap, err := s.door.Reload(ctx)
	if err != nil {
		s.log.Error("access re-read failed", "err", err)
		return false
	}
	s.endWithdrawnJumps(ctx)
	if snap.Same(before) {
		return false
	}
	s.kickPush()
	return true
}

// runPusher pushes access state after changes until ctx ends. Changes that
// arrive during a round coalesce into one more round.
func (s *Server) runPusher(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.pushKick:
			s.pushAll(ctx)
			s.pushSiteTrust(ctx) // child sites: sitetrust.go
		}
	}
}

// pushAll sends every connected node what the current snapshot changes for
// it, and nothing to the others. No store reads, no signatures: labels are
// on the connection and host certificates are re-sent as signed at connect
// or renewal.
func (s *Server) pushAll(ctx context.Context) {
	start := time.Now()
	conns := s.reg.All()
	changed := s.pushTo(ctx, conns)
	took := time.Since(start)
	s.metrics.AccessPushDuration.Observe(took.Seconds())
	s.log.Info("access change pushed", "nodes", len(conns), "changed", changed, "took", took.Round(time.Millisecond))
}

// pushTo runs pushAccess for conns on at most pushWorkers goroutines and
// returns how many were sent something.
func (s *Server) pushTo(ctx context.Context, conns []*registry.Conn) int64 {
	memo := &pushMemo{snap: s.door.Snapshot(), byLabels: map[string]nodeAccess{}}
	work := make(chan *registry.Conn)
	var (
		wg      sync.WaitGroup
		changed atomic.Int64
	)
	for range min(pushWorkers, len(conns)) {
		wg.Go(func() {
			for c := range work {
				if s.pushAccess(c, false, memo) {
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

// pushAccess brings one node up to date with the current snapshot: the
// operator keys its embedded server accepts, and its SSH trust (user CAs,
// revoked keys, principals, its host certificate). Unless force, a message
// identical to the last one sent is not sent again. It reports whether
// anything was sent.
//
// Everything is built and sent under the connection's push lock from the
// snapshot current at that moment, so an older state never overtakes a
// newer one on the wire.
func (s *Server) pushAccess(c *registry.Conn, force bool, memo *pushMemo) bool {
	c.PushMu.Lock()
	defer c.PushMu.Unlock()
	snap := s.door.Snapshot()
	a := memo.get(snap, c.Labels).withKubeOne(snap, c.NodeID)
	log := s.log.With("node", c.Name)
	sentAny := false
	send := func(kind string, m *control.Message, last *[32]byte) {
		b, _ := json.Marshal(m) // deterministic: sorted map keys
		sum := sha256.Sum256(b)
		if !force && sum == *last {
			return
		}
		if err := c.Send(m); err != nil {
			s.metrics.AccessPushes.WithLabelValues(kind, "error").Inc()
			log.Info("push to node failed", "kind", kind, "err", err)
			return
		}
		s.metrics.AccessPushes.WithLabelValues(kind, "sent").Inc()
		*last = sum
		sentAny = true
	}
	send("keys", &control.Message{Type: control.TypeAuthorizedKeys, AuthorizedKeys: a.keys}, &c.Pushed.KeysSum)
	trust := &control.SSHTrust{HostCert: c.Pushed.HostCert, RevokedKeys: snap.RevokedKeys(), Principals: a.principals, AnyLogin: a.anyLogin, NoForwarding: a.noForward}
	s.withAncestors(trust, c.Labels) // a site hub: what the hubs above grant here (sitetrust.go)
	for _, k := range s.userCA.TrustedKeys() {
		trust.UserCAs = append(trust.UserCAs, string(gossh.MarshalAuthorizedKey(k)))
	}
	send("trust", &control.Message{Type: control.TypeSSHTrust, SSHTrust: trust}, &c.Pushed.TrustSum)
	return sentAny
}

// certifyHost signs the node's SSH host key (valid for NAME and
// NAME.SUFFIX) and keeps the certificate on the connection for pushAccess.
// It returns the parsed host key, nil if the agent sent none or it was
// unusable.
func (s *Server) certifyHost(c *registry.Conn, log *slog.Logger) gossh.PublicKey {
	if c.HostKey == "" {
		return nil
	}
	k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(c.HostKey))
	if err != nil {
		log.Warn("agent sent an unreadable SSH host key; no host certificate issued", "err", err)
		return nil
	}
	cert, err := s.hostCA.SignHost(k, "node "+c.Name+" "+c.NodeID, s.hostPrincipals(c.Name), s.cfg.HostCertTTL)
	if err != nil {
		log.Warn("sign SSH host certificate", "err", err)
		c.HostCertRenew.Store(time.Now().Add(renewRetry(s.cfg.HostCertTTL)).UnixNano())
		return nil
	}
	c.HostCertRenew.Store(time.Now().Add(s.cfg.HostCertTTL * 2 / 3).UnixNano())
	c.PushMu.Lock()
	c.Pushed.HostCert = string(gossh.MarshalAuthorizedKey(cert))
	c.PushMu.Unlock()
	return k
}
