package hub

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/apiguard"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/gctune"
	"github.com/tether-dev/tether/hub/identity"
	"github.com/tether-dev/tether/hub/idleprocs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/service"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
)

func advertiseFor(addr net.Addr, configured []string) []string {
	if len(configured) > 0 {
		return configured
	}
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			return []string{net.JoinHostPort(h, port)}
		}
	}
	return []string{net.JoinHostPort(host, port)}
}

// localAddr turns a wildcard listen address into one local clients can dial.
func localAddr(addr net.Addr) string {
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Run serves until ctx is cancelled, then shuts down gracefully: listeners
// close, tunnels and operator connections end, the store is closed.
func (s *Server) Run(ctx context.Context) error {
	gctune.Start()
	defer idleprocs.Start(s.log.With("component", "sched"))()
	defer s.dirLock.release() // last: the store is closed before another hub may open it
	defer s.store.Close()
	defer s.operators.KeepLocalAdminFresh()()
	defer func() {
		for _, c := range s.runMetrics {
			s.metrics.Registry.Unregister(c)
		}
	}()
	clientCAs := s.ca.Pool()
	clientCAs.AddCert(s.nodeCA)
	tlsTunnel := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{s.serving},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clientCAs,
	}
	tlsHTTP := tlsTunnel.Clone()
	tlsHTTP.ClientAuth = tls.VerifyClientCertIfGiven
	s.nodes.VerifyNodeCerts(tlsTunnel) // after the clone: HTTP keeps crypto/tls's own check
	resetKey, err := identity.LoadOrCreateSecret(filepath.Join(s.cfg.DataDir, resetKeyFile))
	if err != nil {
		return err
	}
	backlog := nodeconn.NewFleetBacklog(ctx, s.store.CountNodes, s.conns, s.log)
	defer backlog.Wait()
	ln, err := tunnel.Listen(ctx, s.cfg.Listen, tunnel.ListenConfig{
		TunnelTLS: tlsTunnel, HTTPTLS: tlsHTTP, Config: s.cfg.Tunnel, Logger: s.log.With("component", "tunnel"),
		StatelessResetKey: resetKey, Backlog: backlog.Waiting, PeersFile: filepath.Join(s.cfg.DataDir, "quic_peers"),
	})
	if err != nil {
		return fmt.Errorf("--listen %s: %w", s.cfg.Listen, err)
	}
	defer ln.Close()
	s.metrics.RegisterAdmission(func() metrics.Admission {
		a := ln.AdmissionStats()
		return metrics.Admission{
			RefusedQUIC:       a.RefusedQUIC,
			RefusedTCPHinted:  a.RefusedTCPHinted,
			RefusedTCPPlain:   a.RefusedTCPPlain,
			RatePerSecond:     a.AdmitRate,
			HandshakesFailed:  a.HandshakesFailed,
			FailedHeldSeconds: a.HandshakeFailedHeld.Seconds(),
		}
	})
	advertise := advertiseFor(ln.Addr(), s.cfg.Advertise)

	hubNames := identity.BastionNames(
		s.cfg.SSHListen,
		advertise,
		append([]string{identity.BastionAliasFor(s.cfg.NodeSuffix)}, s.cfg.SSHNames...),
	)
	hostCert, err := s.hostCA.SignHost(s.hostKey.PublicKey(), "tether hub", hubNames, 365*24*time.Hour)
	if err != nil {
		return err
	}
	certSigner, err := gossh.NewCertSigner(hostCert, s.hostKey)
	if err != nil {
		return fmt.Errorf("hub: bastion host certificate: %w", err)
	}
	b, err := bastion.New(bastion.Config{
		Addr: s.cfg.SSHListen, HostSigner: s.hostKey, HostCertSigner: certSigner, NodeSuffix: "." + s.cfg.NodeSuffix,
		IsSite: s.door.HasSite, Authorize: s.jumps.Authorize, Dialer: s.jumps,
		Logger: s.log.With("component", "bastion"), Metrics: s.metrics, OnJump: s.jumps.Audit,
		Limiter: s.limits.SSH, OnLoginFailure: s.auditLog.LoginFailure, RateLimited: s.limits.Refused.WithLabelValues("ssh"),
		Ciphers: s.cfg.SSHCiphers,
	})
	if err != nil {
		return err
	}
	sshAddr, err := b.Listen()
	if err != nil {
		return fmt.Errorf("--ssh-listen %s: %w", s.cfg.SSHListen, err)
	}

	// KubeOne runs take Run's ctx; they and the clusters (whose bastion
	// address is known only here) are Run's own.
	kruns, err := s.newKubeOneRuns(ctx)
	if err != nil {
		return err
	}
	defer kruns.Unregister()
	local := kruns.Kinds()
	local[upgrade.JobKind] = s.upgrades.Local()
	missions, err := s.newMissions(s.provision.Connect)
	if err != nil {
		return err
	}
	local[mission.JobKind] = missions.Local()
	engine := jobs.New(
		ctx,
		jobs.Config{
			Store:   s.store,
			Connect: s.provision.Connect,
			Online:  s.provision.Online,
			Resolve: s.provision.Resolve,
			Blobs:   s.blobs,
			Metrics: s.metrics,
			Logger:  s.log.With("component", "jobs"),
			Audit:   s.auditLog.Write,
			Local:   local,
			Owner:   s.replicas.ID(),
		},
	)
	defer engine.Close()
	s.upgrades.Attach(engine)
	s.cluster.Attach(engine)
	if _, err := engine.Recover(ctx); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	// Before the desired-state sync runs: it sends what the services'
	// reconcile puts.
	stopServices, err := s.services.Start(ctx)
	if err != nil {
		return err
	}
	defer stopServices()
	stopMissions, err := s.startMissions(ctx, missions, engine)
	if err != nil {
		return err
	}
	defer stopMissions()
	if _, err := s.cluster.Engines(); err != nil {
		return fmt.Errorf("hub: --engines-dir: %w", err)
	}

	kclusters, err := kubeone.NewClusters(kubeone.Config{Store: s.store, DataDir: s.cfg.DataDir,
		Live:     kubeone.HubLive{BastionAddr: localAddr(sshAddr), BastionKey: certSigner.PublicKey(), Conns: s.conns},
		SignUser: s.userCA.SignUser, AccessChanged: s.pusher.Changed, Logger: s.log.With("component", "kubeone"),
		KubeHealth: kruns.KubeHealth, KubeOneRelease: kruns.Release})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	kruns.Attach(kclusters, engine)
	// The singletons (controllers, KubeOne recovery, the sweep of a dead
	// replica's jobs) run in the leader's terms (hub/replica).
	defer s.repl.Start(ctx, func(ctx context.Context) { s.lead(ctx, kruns) })()
	if err := s.metrics.Registry.Register(kclusters.Collector()); err != nil {
		return fmt.Errorf("hub: KubeOne metrics: %w", err)
	}
	defer s.metrics.Registry.Unregister(kclusters.Collector())

	var serving atomic.Bool // every listener is up and hub.json written
	httpSrv := &http.Server{
		Handler: apiguard.New(apiguard.Config{Join: s.limits.Join, RateLimited: s.limits.Refused.WithLabelValues("join"),
			Audit: s.auditLog, Log: s.log}).Wrap(api.NewHandler(api.Deps{
			Store: s.store, Door: s.door, CA: s.ca, IssueNode: s.issueNode, NodeCA: s.nodeCA, Conns: s.conns,
			Metrics: s.metrics, Advertise: advertise, Hubs: s.replicas.JoinHubs,
			NodeCertTTL: s.cfg.NodeCertTTL, Logger: s.log.With("component", "api"), OperatorsChanged: s.pusher.Changed,
			SSHTrust:      identity.SSHTrust(sshAddr, advertise, s.cfg.NodeSuffix, s.hostCA, s.userCA),
			SiteHostCAs:   s.trust.HostCAsBelow,
			Inventory:     s.door.InventoryNodes, // nodes below sites
			ReservedNames: hubNames,
			Jobs:          engine,
			NodeRevoked:   s.nodeRevoked,
			Admins:        s.operators.Admins(),
			Operators:     s.operators.Operators(),
			Ready:         s.readiness(&serving),
			Replicas:      s.replicas,
			Features: []route.Feature{
				s.operators,
				cluster.API{Store: s.store, Control: clusterAPI{s.cluster, s}},
				replica.API{Replicas: s.replicas},
				&kubeone.API{Clusters: kclusters, Runs: kruns, Audit: s.auditLog.Write},
				&mission.API{Missions: mission.Ops{M: missions, D: s.desired}},
				site.API{Children: s.children},
				&service.API{Hub: s.services, Door: s.door, Store: s.store, Audit: s.auditLog.Write},
				&upgrade.API{Rollouts: s.upgrades, Store: s.store, Door: s.door, Audit: s.auditLog.Write,
					Targets: api.Targets{Store: s.store, Inventory: s.door.InventoryNodes}},
				&jobs.API{Engine: engine, Blobs: s.blobs, Store: s.store, Logger: s.log.With("component", "api"),
					Targets: api.Targets{Store: s.store, Inventory: s.door.InventoryNodes}},
			},
		})),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}

	if httpSrv.Handler, err = s.withConsole(httpSrv.Handler); err != nil {
		return err
	}

	info := apitype.HubInfo{API: localAddr(ln.Addr()), SSH: localAddr(sshAddr), PID: os.Getpid()}
	infoJSON, _ := json.Marshal(info)
	infoPath := filepath.Join(s.cfg.DataDir, apitype.HubInfoFile)
	if err := pki.WriteFileAtomic(infoPath, infoJSON, 0o644); err != nil {
		return err
	}
	defer removeHubInfo(infoPath, info.PID)

	if s.cfg.PeerListen != "" {
		// Before sessions are accepted: each one records its presence.
		stopPeers, err := s.startPeers(ctx, ln.Addr(), sshAddr, advertise, ln.Poke)
		if err != nil {
			return err
		}
		defer stopPeers()
	}

	defer s.startUplink(ctx)() // a site hub: its session with its parent
	serving.Store(true)
	s.log.Info("hub listening", "tunnel_and_api", ln.Addr().String(), "ssh", sshAddr.String(),
		"advertise", advertise, "ca_pin", "sha256:"+s.ca.Pin(), "version", Version)

	defer s.startBlobGC(ctx, s.blobs)()
	var wg sync.WaitGroup
	errc := make(chan error, 7)
	wg.Add(7)
	go func() { defer wg.Done(); s.pusher.Run(ctx); errc <- nil }()
	go func() { defer wg.Done(); s.nodes.RenewHostCerts(ctx); errc <- nil }()
	go func() { defer wg.Done(); s.nodes.SweepPresence(ctx); errc <- nil }()
	go func() { defer wg.Done(); kruns.ReapIdle(ctx); errc <- nil }()
	go func() { defer wg.Done(); errc <- ignoreClosed(httpSrv.Serve(ln.HTTPListener())) }()
	go func() { defer wg.Done(); errc <- b.Serve() }()
	go func() { defer wg.Done(); errc <- s.nodes.Serve(ctx, ln) }()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.log.Info("hub shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Jobs first: their followers' streams end with them, so the HTTP
	// server can then drain.
	engine.Close()
	_ = httpSrv.Shutdown(shutCtx)
	_ = b.Close()
	ln.Close()
	for _, c := range s.conns.All() {
		c.Session.Close()
	}
	wg.Wait()
	s.nodes.Wait()
	if runErr != nil && ctx.Err() == nil {
		return runErr
	}
	return nil
}

// readiness backs /readyz: the listeners are up (serving), the CA can
// sign, and the store answers.
func (s *Server) readiness(serving *atomic.Bool) api.Readiness {
	return func(ctx context.Context) error {
		if !serving.Load() {
			return errors.New("listeners are still starting")
		}
		if s.ca == nil || s.ca.Intermediate() == nil {
			return errors.New("the CA is not loaded")
		}
		if _, err := s.store.ListRoles(ctx); err != nil {
			return fmt.Errorf("store: %w", err)
		}
		return nil
	}
}

// removeHubInfo removes hub.json at shutdown if it still names this hub.
func removeHubInfo(path string, pid int) {
	b, err := os.ReadFile(path)
	var info apitype.HubInfo
	if err == nil && json.Unmarshal(b, &info) == nil && info.PID == pid {
		_ = os.Remove(path)
	}
}

func ignoreClosed(err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
