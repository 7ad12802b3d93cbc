package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/operator"
	"github.com/tether-dev/tether/hub/service"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/ui"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Adapters that hand the feature packages the small parts of the hub they
// use. A nil uplink (a hub without a parent) is passed on as a nil
// interface: the features test their optional parts against nil.

// setupServices makes the service tunnels (hub/service); Run starts them
// before sessions are accepted.
func (s *Server) setupServices() error {
	cfg := service.TunnelsConfig{Store: s.store, HubID: s.ca.Pin(), Door: s.door, Desired: s.desired,
		Children: s.children, Audit: s.auditLog.Write, Metrics: s.metrics.Registry,
		Logger: s.log.With("component", "services")}
	if s.uplink != nil {
		cfg.Uplink = s.uplink
	}
	var err error
	s.services, err = service.NewTunnels(cfg)
	return err
}

// upgradeTarget is how the upgrade controller reaches a node's updater:
// its live session here, or on the replica holding the tunnel (as it
// recorded the hello).
func (s *Server) upgradeTarget(nodeID string) (upgrade.Target, string) {
	if why := s.provision.Online(nodeID); why != "" {
		return upgrade.Target{}, why
	}
	n, err := s.store.GetNode(context.Background(), nodeID)
	if err != nil {
		return upgrade.Target{}, "not registered"
	}
	c, ok := s.replicas.Session(context.Background(), nodeID)
	if !ok {
		return upgrade.Target{}, "offline"
	}
	return upgrade.TargetOf(nodeID, n.Name, upgrade.Live{StateDir: c.StateDir, AgentVersion: c.AgentVersion,
		Arch: c.Arch, Upgrade: c.Upgrade})
}

// recordUpgradeStates hands a node's upgrade records (validated by
// control.Read) to the controller; what it ignores is audited within the
// node's audit limit.
func (s *Server) recordUpgradeStates(ctx context.Context, conn *nodeconn.Conn, states []upgradeproto.NodeState,
	log *slog.Logger) {
	ignored, err := s.upgrades.Report(ctx, conn.NodeID, states)
	if err != nil {
		log.Warn("upgrade report not recorded", "err", err)
		return
	}
	for _, st := range states {
		log.Debug("upgrade report", "upgrade", st.Name, "step", st.Step, "reason", st.Reason)
	}
	if len(ignored) > 0 {
		s.auditLog.Limited(conn.Session.RemoteAddr().String(), store.AuditEvent{At: time.Now(), Kind: "upgrade_report",
			Node: conn.Name, Result: "ignored", Detail: strings.Join(ignored, "; ")})
	}
}

// setupDesired makes this hub's desired-state sync (hub/desired) and
// hooks it to the site protocol: objects from the parent arrive on the
// uplink (stored before they are acknowledged), and go on to this hub's
// own sites, each sent what it has not acknowledged whenever it connects.
// Kinds (missions, services) register on s.desired before Run starts the
// uplink and accepts sessions.
func (s *Server) setupDesired() error {
	var ancestors func() []string
	if u := s.uplink; u != nil {
		ancestors = u.Ancestors
	}
	var err error
	s.desired, err = desired.New(desired.Config{Store: s.store, HubID: s.ca.Pin(), Ancestors: ancestors,
		Logger: s.log.With("component", "desired")})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	s.desired.SetChildren(desiredChildren{s.children})
	s.children.OnConnect(func(_ context.Context, c site.Child) {
		s.desired.ChildConnected(desired.Child{Name: c.Name, ID: c.HubID})
	})
	s.children.Handle(siteproto.TypeDesiredAck, func(ctx context.Context, c site.Child, m *control.Message) {
		if err := s.desired.HandleAck(ctx, desired.Child{Name: c.Name, ID: c.HubID}, m); err != nil {
			s.log.Error("record desired-state acknowledgements; the site is sent them again", "site", c.Name,
				"err", err)
		}
	})
	if u := s.uplink; u != nil {
		u.Handle(siteproto.TypeDesired, func(ctx context.Context, m *control.Message) {
			if err := s.desired.HandleDesired(ctx, m, u.Send); err != nil {
				s.log.Warn("desired state from the parent", "err", err)
			}
		})
	}
	return nil
}

// desiredChildren adapts hub/site's Children to hub/desired.
type desiredChildren struct{ c *site.Children }

func (d desiredChildren) Connected() []desired.Child {
	var out []desired.Child
	for _, c := range d.c.List() {
		if c.Connected && c.HubID != "" {
			out = append(out, desired.Child{Name: c.Name, ID: c.HubID})
		}
	}
	return out
}

func (d desiredChildren) Send(ctx context.Context, name string, m *control.Message) error {
	return d.c.Send(ctx, name, m)
}

// newMissions makes the mission manager (hub/mission); its job kind is
// attached in startMissions.
func (s *Server) newMissions(connect jobs.Connector) (*mission.Manager, error) {
	var up mission.Uplink
	if s.uplink != nil {
		up = s.uplink
	}
	return mission.AtHub(mission.Config{Store: s.store, HubID: s.ca.Pin(), Connect: connect, Online: s.provision.Online,
		Sites:  func() []mission.SiteView { return missionSites(s.children) },
		Logger: s.log.With("component", "missions"), Audit: s.auditLog.Write}, s.desired, up)
}

// missionSites is the sites below a hub as missions read their state.
func missionSites(sites *site.Children) []mission.SiteView {
	children := sites.List()
	out := make([]mission.SiteView, 0, len(children))
	for _, c := range children {
		out = append(out, mission.SiteView{Name: c.Name, Connected: c.Connected, Stale: c.Stale, StaleFor: c.StaleFor,
			LastHeartbeat: c.LastHeartbeat, Status: c.Status})
	}
	return out
}

// startMissions runs the mission manager and the desired-state sender
// until the returned stop is called.
func (s *Server) startMissions(ctx context.Context, m *mission.Manager, engine *jobs.Engine) (stop func(), err error) {
	stopManager, err := m.Start(ctx, engine)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.desired.Run(ctx) })
	return func() { cancel(); wg.Wait(); stopManager() }, nil
}

// setupUpgrades makes the upgrade controller (hub/upgrade) and the
// registry client it pins and fetches artifacts with (--registry-ca,
// --registry-auth); Run attaches the job engine that runs its drives.
func (s *Server) setupUpgrades() error {
	arts, err := artifacts.New(artifacts.Config{CAFile: s.cfg.RegistryCA, AuthFile: s.cfg.RegistryAuth,
		Blobs: s.blobs, Log: s.log.With("component", "artifacts")})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	s.upgrades = upgrade.New(upgrade.Config{
		Store:  s.store,
		Source: upgrade.RegistrySource{Client: arts},
		Driver: upgrade.SSHDriver{Connect: s.provision.Connect, Blobs: s.blobs},
		Target: s.upgradeTarget,
		Audit:  s.auditLog.Write,
		Logger: s.log.With("component", "upgrade"),
	})
	s.blobRefs.Add(s.upgrades.Referenced)
	for _, c := range append(s.upgrades.Collectors(), arts.Collector()) {
		if err := s.metrics.Registry.Register(c); err != nil {
			return fmt.Errorf("hub: upgrade metrics: %w", err)
		}
		s.runMetrics = append(s.runMetrics, c)
	}
	return nil
}

// startBlobGC collects blobs no job (the store) nor referencer keeps
// until ctx ends; the returned func waits for it to stop.
func (s *Server) startBlobGC(ctx context.Context, store *blobs.Store) (wait func()) {
	refs := func() []blobs.Referencer {
		return append([]blobs.Referencer{s.store.JobBlobDigests}, s.blobRefs.All()...)
	}
	return artifacts.StartBlobGC(ctx, store, refs, s.log)
}

// withConsole serves the web console (hub/ui) on its own paths (it audits
// its own refusals) and apiHandler on every other; the console serves the
// API's endpoints to signed-in browsers through apiHandler too.
func (s *Server) withConsole(apiHandler http.Handler) (http.Handler, error) {
	// Stale: two keepalive intervals unheard (two heartbeats missed, or a
	// transport-liveness agent's pings, at most 1.25 intervals apart and
	// swept every quarter, gone quiet), before the hub gives the session
	// up (live.Deadline) and the node turns offline.
	live := s.nodes.Liveness()
	staleAfter := 2 * live.Every
	if staleAfter >= live.Deadline {
		staleAfter = live.Deadline * 3 / 4
	}
	hub := ui.NewHub(
		ui.HubConfig{Verify: s.ca.Verify, AuthorizeAdmin: s.operators.AuthorizeAdmin, LocalAdmin: operator.LocalAdminID,
			OperatorAdminPrefix: operator.OperatorAdminPrefix, AuthorizeOperator: s.operators.AuthorizeOperator,
			AdminValidFrom: s.operators.AdminValidFrom, Door: s.door, SignUser: s.userCA.SignUser, HostCAs: s.hostCA.TrustedKeys,
			HostCAsFor: s.hostCAsFor, Logger: s.log.With("component", "console")},
	)
	console, err := ui.New(ui.Config{Store: s.store, Door: s.door, Conns: s.conns, Hub: hub, API: apiHandler,
		StaleAfter: staleAfter, Audit: s.auditLog.Write, Logger: s.log.With("component", "console"),
		Upgrades: true})
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ui.Handles(r.URL.Path) {
			console.ServeHTTP(w, r)
			return
		}
		apiHandler.ServeHTTP(w, r)
	}), nil
}

// SiteConfig makes a hub a site of a parent hub (tether hub --parent
// JOIN --site NAME); the zero value is a hub with no parent. Every hub
// takes sites below it.
type SiteConfig struct {
	// ParentJoin is a site join string from the parent (`tether site
	// token create`); needed only until DATA_DIR/parent holds the
	// identity it buys.
	ParentJoin string
	// Name is this site's name at the parent (a DNS label).
	Name string
	// StatusInterval is how often this hub reports its status up, and the
	// beat its own sites are judged by (stale after site.StaleFactor of
	// it); default site.DefaultStatusInterval.
	StatusInterval time.Duration
	// Transport is how the uplink dials (auto: QUIC raced against TCP).
	Transport tunnel.Transport
}

// parentDir holds the site's identity at its parent.
const parentDir = "parent"

// hasParent: this hub is configured, or already joined, as a site.
func (c SiteConfig) hasParent(dataDir string) bool {
	return c.ParentJoin != "" || c.Name != "" || site.Joined(filepath.Join(dataDir, parentDir))
}

// setupSites makes the parent's side (every hub) and, for a site, joins
// the parent once (the identity is kept in DATA_DIR/parent) and prepares
// the uplink; Run keeps it up.
func (s *Server) setupSites(ctx context.Context) error {
	cfg := s.cfg.Site
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = site.DefaultStatusInterval
	}
	if cfg.StatusInterval < 100*time.Millisecond || cfg.StatusInterval > time.Hour {
		return fmt.Errorf("hub: --site-status-interval %s: want 100ms..1h", cfg.StatusInterval)
	}
	s.cfg.Site = cfg
	hubID := s.ca.Pin()
	if cfg.hasParent(s.cfg.DataDir) {
		dir := filepath.Join(s.cfg.DataDir, parentDir)
		if cfg.Name == "" && !site.Joined(dir) {
			return errors.New("hub: --parent needs --site NAME (this hub's name at the parent)")
		}
		joined, err := site.JoinParent(ctx, dir, cfg.ParentJoin, cfg.Name, Version)
		if err != nil {
			return fmt.Errorf("hub: %w", err)
		}
		var hostCAs []string
		for _, k := range s.hostCA.TrustedKeys() {
			hostCAs = append(hostCAs, string(gossh.MarshalAuthorizedKey(k)[:len(gossh.MarshalAuthorizedKey(k))-1]))
		}
		s.uplink, err = site.NewUplink(site.UplinkConfig{
			Dir: dir, HubID: hubID, HostCAs: hostCAs, StatusInterval: cfg.StatusInterval,
			Subtree:      func() []string { return s.children.Subtree() },
			Status:       func(ctx context.Context) (*siteproto.Status, error) { return s.children.Status(ctx, s.store) },
			Inventory:    func(ctx context.Context) ([]siteproto.Node, error) { return s.children.Inventory(ctx, s.store) },
			AgentVersion: Version, Transport: cfg.Transport, Tunnel: s.cfg.Tunnel,
			Logger: s.log,
		})
		if err != nil {
			return fmt.Errorf("hub: %w", err)
		}
		if cfg.Name != "" && s.uplink.Name() != cfg.Name {
			return fmt.Errorf("hub: --site %s, but %s holds this hub's identity as site %q at its parent; "+
				"drop --site or use another --data-dir", cfg.Name, dir, s.uplink.Name())
		}
		if joined {
			s.log.Info("joined the parent hub as a site", "site", s.uplink.Name(), "identity", dir)
		}
	}
	above := func() (string, []string) { return "", nil }
	changed := func() {}
	if u := s.uplink; u != nil {
		above = func() (string, []string) { return u.Path(), u.Ancestors() }
		changed = u.Changed
	}
	var err error
	s.children, err = site.NewChildren(ctx, site.ChildrenConfig{Store: s.store, HubID: hubID, Above: above,
		StaleAfter: site.StaleFactor * cfg.StatusInterval, Audit: s.auditLog.Write, Changed: changed,
		Logger: s.log.With("component", "sites")})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	return nil
}

// startUplink keeps the uplink up (a site hub) until the returned stop is
// called. A refusal for good stops only the uplink: the hub goes on
// serving its own nodes and sites.
func (s *Server) startUplink(ctx context.Context) (stop func()) {
	if s.uplink == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.uplink.Run(ctx) })
	return func() { cancel(); wg.Wait() }
}

// setupSiteRoutes plugs sites into the door and the trust paths: the
// door routes names below child sites; a site serves its parent's route
// streams and keeps its parent's trust for its nodes.
func (s *Server) setupSiteRoutes() {
	hubID := s.ca.Pin()
	s.door.SetSites(site.NewRoutes(s.children, s.store, hubID))
	s.trust = site.NewTrust(site.TrustConfig{HubID: hubID, NodeSuffix: s.cfg.NodeSuffix, Children: s.children,
		Uplink: s.uplink, UserCAs: s.userCA.TrustedKeys, HostCAs: s.hostCA.TrustedKeys,
		ForSite: func(hubID, suffix string, userCAs []string) siteproto.AncestorTrust {
			return s.door.Snapshot().TrustForSite(hubID, suffix, userCAs)
		},
		Changed: func() { s.pusher.Kick() },
		PathChanged: func() {
			for _, c := range s.conns.All() {
				s.pusher.CertifyHost(c, s.log.With("node", c.Name))
			}
			s.pusher.Kick()
		},
		Logger: s.log})
	if s.uplink != nil {
		s.uplink.ServeRoutes(func(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest) {
			site.ServeParentRoute(ctx, st, req, site.ParentRouteConfig{Door: s.door, Services: s.services.ServeFromParent,
				Audit: s.auditLog.Write, Logger: s.log})
		})
	}
}

// The site trust, looked up at each call: the parts made before it in New
// (the pusher, the provisioning connector) take these.

func (s *Server) hostCAsFor(name string) []gossh.PublicKey { return s.trust.HostCAsFor(name) }
func (s *Server) hostPrincipals(name string) []string      { return s.trust.HostPrincipals(name) }
func (s *Server) pushSiteTrust(ctx context.Context)        { s.trust.Push(ctx) }
func (s *Server) withAncestors(t *control.SSHTrust, labels map[string]string) {
	s.trust.WithAncestors(t, labels)
}

// newKubeOneRuns prepares the hub's KubeOne runs (hub/kubeone); Run
// attaches the clusters and the job engine.
func (s *Server) newKubeOneRuns(ctx context.Context) (*kubeone.Runs, error) {
	return kubeone.NewRuns(ctx, kubeone.RunsConfig{Store: s.store, DataDir: s.cfg.DataDir, Binary: s.cfg.KubeOne,
		AdminConf: s.cfg.KubeOneAdminConf, APIServerPort: s.cfg.KubeAPIServerPort, Door: s.door,
		Online:  func(nodeID string) string { return s.provision.Online(nodeID) },
		HostKey: kubeone.HubLive{Conns: s.conns}.HostKey, HostCAs: s.hostCA.TrustedKeys,
		HoldOnce: func(clusterID string) (func(), error) { return s.repl.HoldOnce(kubeoneLeasePrefix + clusterID) },
		Metrics:  s.metrics.Registry, Logger: s.log.With("component", "kubeone")})
}
