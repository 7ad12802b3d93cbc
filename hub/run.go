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
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/idleprocs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/mission"
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
	tuneGC()
	defer idleprocs.Start(s.log.With("component", "sched"))()
	defer s.dirLock.release() // last: the store is closed before another hub may open it
	defer s.store.Close()
	defer s.keepLocalAdminFresh()()
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
	s.verifyNodeCerts(tlsTunnel) // after the clone: HTTP keeps crypto/tls's own check
	resetKey, err := loadOrCreateSecret(filepath.Join(s.cfg.DataDir, resetKeyFile))
	if err != nil {
		return err
	}
	backlog := newFleetBacklog(ctx, s.store.CountNodes, s.reg, s.log)
	defer backlog.wait()
	ln, err := tunnel.Listen(ctx, s.cfg.Listen, tunnel.ListenConfig{
		TunnelTLS: tlsTunnel, HTTPTLS: tlsHTTP, Config: s.cfg.Tunnel, Logger: s.log.With("component", "tunnel"),
		StatelessResetKey: resetKey, Backlog: backlog.waiting,
	})
	if err != nil {
		return fmt.Errorf("--listen %s: %w", s.cfg.Listen, err)
	}
	defer ln.Close()
	s.metrics.RegisterAdmission(func() metrics.Admission {
		a := ln.AdmissionStats()
		return metrics.Admission{RefusedQUIC: a.RefusedQUIC, RefusedTCPHinted: a.RefusedTCPHinted, RefusedTCPPlain: a.RefusedTCPPlain, RatePerSecond: a.AdmitRate,
			HandshakesFailed: a.HandshakesFailed, FailedHeldSeconds: a.HandshakeFailedHeld.Seconds()}
	})
	advertise := advertiseFor(ln.Addr(), s.cfg.Advertise)

	hubNames := bastionNames(s.cfg.SSHListen, advertise, append([]string{bastionAlias(s.cfg.NodeSuffix)}, s.cfg.SSHNames...))
	hostCert, err := s.hostCA.SignHost(s.hostKey.PublicKey(), "tether hub", hubNames, 365*24*time.Hour)
	if err != nil {
		return err
	}
	certSigner, err := gossh.NewCertSigner(hostCert, s.hostKey)
	if err != nil {
		return fmt.Errorf("hub: bastion host certificate: %w", err)
	}
	b, err := bastion.New(bastion.Config{
		Addr: s.cfg.SSHListen, HostSigner: s.hostKey, HostCertSigner: certSigner, NodeSuffix: "." + s.cfg.NodeSuffix, IsSite: s.door.HasSite, Authorize: s.authorizeOperator, Dialer: jumpDialer{door: s.door, live: &s.jumps, reportsLogins: s.reportsLogins},
		Logger: s.log.With("component", "bastion"), Metrics: s.metrics, OnJump: s.auditJump,
		Limiter: s.guard.ssh, OnLoginFailure: s.auditLoginFailure, RateLimited: s.guard.rateLimited.WithLabelValues("ssh"),
		Ciphers: s.cfg.SSHCiphers,
	})
	if err != nil {
		return err
	}
	sshAddr, err := b.Listen()
	if err != nil {
		return fmt.Errorf("--ssh-listen %s: %w", s.cfg.SSHListen, err)
	}

	blobs, err := jobs.NewBlobs(filepath.Join(s.cfg.DataDir, "blobs"), s.cfg.MaxUploadBytes)
	if err != nil {
		return err
	}
	arts, unregisterArts, err := s.newArtifacts(blobs)
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	defer unregisterArts()
	prov, err := newProvisioner(s)
	if err != nil {
		return err
	}
	kruns, err := newKubeoneRuns(ctx, s)
	if err != nil {
		return err
	}
	defer kruns.unregister()
	s.upgrades = upgrade.New(upgrade.Config{Store: s.store, Source: artifactSource{arts}, Driver: upgradeDriver{connect: prov.connect, blobs: blobs},
		Target: s.upgradeTarget, Audit: s.audit, Logger: s.log.With("component", "upgrade")})
	for _, c := range s.upgrades.Collectors() {
		if err := s.metrics.Registry.Register(c); err != nil {
			return fmt.Errorf("hub: upgrade metrics: %w", err)
		}
		defer s.metrics.Registry.Unregister(c)
	}
	local := kruns.kinds()
	local[upgrade.JobKind] = s.upgrades.Local()
	missions, err := s.newMissions(prov.connect) // missions.go
	if err != nil {
		return err
	}
	local[mission.JobKind] = missions.Local()
	engine := jobs.New(ctx, jobs.Config{Store: s.store, Connect: prov.connect, Online: s.online, Resolve: prov.resolve, Blobs: blobs,
		Metrics: s.metrics, Logger: s.log.With("component", "jobs"), Audit: s.audit, Local: local, Owner: s.replicaID})
	defer engine.Close()
	s.upgrades.Attach(engine)
	s.addBlobReferencer(s.upgrades.Referenced)
	if _, err := engine.Recover(ctx); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	// Before the desired-state sync runs: services register their kind on it.
	stopServices, err := s.startServices(ctx)
	if err != nil {
		return err
	}
	defer stopServices()
	stopMissions, err := s.startMissions(ctx, missions, engine)
	if err != nil {
		return err
	}
	defer stopMissions()
	s.cluster = cluster.New(cluster.Config{Store: s.store, Jobs: engine, Blobs: blobs, EnginesDir: s.cfg.EnginesDir,
		Online: s.online, StateDir: s.stateDir, Metrics: s.metrics, Logger: s.log.With("component", "cluster"), Audit: s.audit})
	if _, err := s.cluster.Engines(); err != nil {
		return fmt.Errorf("hub: --engines-dir: %w", err)
	}

	if s.kubeone, err = kubeone.New(kubeone.Config{Store: s.store, DataDir: s.cfg.DataDir,
		Live:     kubeoneLive{s: s, bastionAddr: localAddr(sshAddr), bastionKey: certSigner.PublicKey()},
		SignUser: s.userCA.SignUser, AccessChanged: s.accessChanged, Logger: s.log.With("component", "kubeone"),
		KubeHealth: kruns.KubeHealth, KubeOneRelease: kruns.runner.Version}); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	kruns.attach(s.kubeone, engine)
	// The singletons (controllers, KubeOne recovery, the sweep of a dead
	// replica's jobs) run in the leader's terms (singletons.go).
	stopReplication, err := s.startReplication(ctx, func(ctx context.Context) { s.lead(ctx, kruns) })
	if err != nil {
		return err
	}
	defer stopReplication()
	if err := s.metrics.Registry.Register(s.kubeone.Collector()); err != nil {
		return fmt.Errorf("hub: KubeOne metrics: %w", err)
	}
	defer s.metrics.Registry.Unregister(s.kubeone.Collector())

	var serving atomic.Bool // every listener is up and hub.json written
	httpSrv := &http.Server{
		Handler: s.guardAPI(api.NewHandler(api.Deps{
			Store: s.store, Door: s.door, CA: s.ca, IssueNode: s.issueNode, NodeCA: s.nodeCA, Registry: s.reg, Metrics: s.metrics, Advertise: advertise,
			NodeCertTTL: s.cfg.NodeCertTTL, Logger: s.log.With("component", "api"), OperatorsChanged: s.accessChanged,
			SSHTrust:      s.sshTrustInfo(sshAddr, advertise),
			SiteHostCAs:   s.siteHostCAs,         // sitetrust.go
			Inventory:     s.door.InventoryNodes, // nodes below sites (siteroute.go)
			ReservedNames: hubNames,
			Login:         loginService{s},
			Jobs:          engine,
			Cluster:       clusterAPI{s.cluster, s},
			NodeRevoked:   s.nodeRevoked,
			Upgrades:      s.upgrades,
			KubeOne:       s.kubeone,
			KubeOneRuns:   kruns,
			Blobs:         blobs,
			Admins:        adminService{s},
			Operators:     operatorService{s},
			Ready:         s.readiness(&serving),
			Replicas:      replicaService{s},
			Services:      s.services,
			Sites:         sitesAPI{s},
			Missions:      missionAPI{missions, s.desired},
		})),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}

	if httpSrv.Handler, err = s.withConsole(httpSrv.Handler); err != nil {
		return err
	}

	info := api.HubInfo{API: localAddr(ln.Addr()), SSH: localAddr(sshAddr), PID: os.Getpid()}
	infoJSON, _ := json.Marshal(info)
	infoPath := filepath.Join(s.cfg.DataDir, api.HubInfoFile)
	if err := pki.WriteFileAtomic(infoPath, infoJSON, 0o644); err != nil {
		return err
	}
	defer removeHubInfo(infoPath, info.PID)

	if s.cfg.PeerListen != "" {
		// Before sessions are accepted: each one records its presence.
		stopPeers, err := s.startPeers(ctx, ln.Addr(), sshAddr)
		if err != nil {
			return err
		}
		defer stopPeers()
	}

	defer s.startUplink(ctx)() // a site hub: its session with its parent (sites.go)
	serving.Store(true)
	s.log.Info("hub listening", "tunnel_and_api", ln.Addr().String(), "ssh", sshAddr.String(),
		"advertise", advertise, "ca_pin", "sha256:"+s.ca.Pin(), "version", Version)

	defer s.startBlobGC(ctx, blobs)()
	var wg sync.WaitGroup
	errc := make(chan error, 7)
	wg.Add(7)
	go func() { defer wg.Done(); s.runPusher(ctx); errc <- nil }()
	go func() { defer wg.Done(); s.renewHostCerts(ctx); errc <- nil }()
	go func() { defer wg.Done(); s.sweepPresence(ctx); errc <- nil }()
	go func() { defer wg.Done(); kruns.reapIdle(ctx); errc <- nil }()
	go func() { defer wg.Done(); errc <- ignoreClosed(httpSrv.Serve(ln.HTTPListener())) }()
	go func() { defer wg.Done(); errc <- b.Serve() }()
	go func() { defer wg.Done(); errc <- s.acceptSessions(ctx, ln) }()

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
	for _, c := range s.reg.All() {
		c.Session.Close()
	}
	wg.Wait()
	s.sessions.Wait()
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
	var info api.HubInfo
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
