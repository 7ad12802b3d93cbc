// Package hub wires the Tether hub: Config, New (state, identity, the
// features that need no listener), Run (serve.go: listeners, job engine,
// API, shutdown) and the adapters that hand each feature package the small
// parts of the hub it uses. Every behaviour lives in the feature package
// named after it; every decision about reaching a node is hub/access's.
package hub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/accesspush"
	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/hub/auditlog"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/identity"
	"github.com/tether-dev/tether/hub/jobs/sshconn"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/leader"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/notify"
	"github.com/tether-dev/tether/hub/operator"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/service"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/stepca"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
)

// Version is set at build time (-ldflags -X).
var Version = "dev"

// Config configures a hub.
type Config struct {
	DataDir   string // state: CA, database, host key, admin identity
	Listen    string // tunnel + API address (UDP and TCP), default :7443
	SSHListen string // bastion address, default :2222
	// Advertise are the addresses agents dial (put into join strings);
	// default: Listen's address if it is not a wildcard.
	Advertise   []string
	NodeCertTTL time.Duration  // default ca.DefaultNodeTTL (24h); agents renew at 2/3
	HostCertTTL time.Duration  // lifetime of SSH host certificates, default 7 days (re-issued at 2/3)
	UserCertTTL time.Duration  // lifetime of operators' SSH user certificates from tether login, default 8h
	NodeSuffix  string         // nodes answer to NAME and NAME.SUFFIX, default "tether"
	SSHNames    []string       // extra host names in the bastion's host certificate
	SSHCiphers  []string       // SSH ciphers the bastion offers operators; empty: chosen per client
	Tunnel      *tunnel.Config // nil means tunnel defaults
	// StepCA, if set, delegates node certificate issuance (join and
	// renewal) to an external step-ca; the hub's own CA still serves TLS
	// and signs SSH certificates.
	StepCA *stepca.Config
	// ProvisionLogin is the login the hub's jobs use on nodes (default
	// "root"); a node's "provision-login" label overrides it.
	ProvisionLogin string
	// MaxUploadBytes bounds one file uploaded for a job (default 1 GiB).
	MaxUploadBytes int64
	// EnginesDir holds extra or overriding cluster engines (directories of
	// install.sh + uninstall.sh); "" means the built-in ones only.
	EnginesDir string
	// KubeOne is the kubeone binary `tether kubeone apply|reset` runs (a
	// path, or a name looked up on PATH at each run); default "kubeone".
	KubeOne string
	// KubeOneAdminConf is where kubeadm writes the cluster-admin kubeconfig
	// on control-plane nodes (`tether kubeone kubeconfig` reads it);
	// default /etc/kubernetes/admin.conf.
	KubeOneAdminConf string
	// KubeAPIServerPort is kube-apiserver's port on control-plane nodes
	// (status /readyz, `tether kubeone proxy`); default 6443.
	KubeAPIServerPort int
	// RegistryCA is a PEM file of extra roots for OCI registries (upgrade
	// artifacts); the system roots otherwise. TLS is always verified.
	RegistryCA string
	// RegistryAuth is a docker-style config.json with registry credentials;
	// "" means $DOCKER_CONFIG/config.json or ~/.docker/config.json if present.
	RegistryAuth string
	// Store is where the durable state lives (store.Open): "" for
	// DATA_DIR/tether.db, a SQLite file (PATH or sqlite:PATH), or a
	// postgres:// URL. Hub replicas share one store.
	Store string
	// PeerListen, if set, makes this hub a replica of the hubs sharing its
	// store: it takes the shared identity from the store, records which
	// node tunnels it holds, and serves and dials peer links on this
	// address (UDP and TCP) to forward streams to the replica holding a
	// node (hub/replica).
	PeerListen string
	// PeerAdvertise is the HOST:PORT other replicas dial for PeerListen;
	// default PeerListen's address, with this machine's name for a
	// wildcard host.
	PeerAdvertise string
	// ReplicaID names this hub among replicas sharing a store; default
	// the ID kept in DATA_DIR/replica-id (made on the first start).
	ReplicaID string
	// LeaseTTL is how long a replica's presence outlives its last
	// heartbeat; default replica.DefaultLeaseTTL.
	LeaseTTL time.Duration
	// LeaderTTL is the life of the leader and replica-liveness leases
	// without renewal (default leader.DefaultTTL): when a replica dies,
	// its role as leader moves within 4/3 of it, and its jobs are marked
	// interrupted within 7/3 of it.
	LeaderTTL time.Duration
	// Site makes this hub a site of a parent hub (hub/site); the zero
	// value is a hub without a parent.
	Site SiteConfig
	// ResumeWindow is how long a stream to a node (a jump, a job's SSH
	// connection, a forward) waits for the node to reconnect after its
	// link went down, then ends; default nodeconn.DefaultResumeWindow,
	// negative: streams end with the session (as for agents that do not
	// keep them).
	ResumeWindow time.Duration
	Logger       *slog.Logger
}

// maxResumeWindow bounds --resume-window: a stream waiting longer holds its
// buffers and the operator's connection for nothing a user would wait for.
const maxResumeWindow = 24 * time.Hour

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.DataDir == "" {
		return errors.New("hub: DataDir is required (--data-dir)")
	}
	if err := store.CheckSpec(c.Store); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	if c.Listen == "" {
		c.Listen = ":7443"
	}
	switch {
	case c.ResumeWindow == 0:
		c.ResumeWindow = nodeconn.DefaultResumeWindow
	case c.ResumeWindow > maxResumeWindow:
		return fmt.Errorf("hub: --resume-window %s: want at most %s (0 turns resuming off)", c.ResumeWindow,
			maxResumeWindow)
	case c.ResumeWindow > 0 && c.ResumeWindow < time.Second:
		return fmt.Errorf("hub: --resume-window %s: want at least 1s (0 turns resuming off)", c.ResumeWindow)
	}
	if c.SSHListen == "" {
		c.SSHListen = ":2222"
	}
	if c.NodeCertTTL <= 0 {
		c.NodeCertTTL = ca.DefaultNodeTTL
	}
	if c.HostCertTTL <= 0 {
		c.HostCertTTL = 7 * 24 * time.Hour
	}
	if c.UserCertTTL <= 0 {
		c.UserCertTTL = 8 * time.Hour
	}
	if c.NodeSuffix == "" {
		c.NodeSuffix = "tether"
	}
	if c.ProvisionLogin == "" {
		c.ProvisionLogin = "root"
	}
	if err := validate.Login(c.ProvisionLogin); err != nil {
		return fmt.Errorf("hub: --provision-login: %w", err)
	}
	if c.KubeOneAdminConf == "" {
		c.KubeOneAdminConf = kubeone.DefaultAdminConf
	}
	if c.KubeAPIServerPort == 0 {
		c.KubeAPIServerPort = kubeone.DefaultAPIServerPort
	}
	if c.KubeAPIServerPort < 1 || c.KubeAPIServerPort > 65535 {
		return fmt.Errorf("hub: --kube-apiserver-port %d: want 1..65535", c.KubeAPIServerPort)
	}
	if c.MaxUploadBytes == 0 {
		c.MaxUploadBytes = 1 << 30
	}
	if c.MaxUploadBytes < 0 {
		return errors.New("hub: max upload size must be positive")
	}
	if err := bastion.CheckCiphers(c.SSHCiphers); err != nil {
		return fmt.Errorf("hub: --ssh-ciphers: %w", err)
	}
	if err := pki.ValidateName(c.NodeSuffix); err != nil {
		return fmt.Errorf("hub: node suffix: %w", err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LeaderTTL == 0 {
		c.LeaderTTL = leader.DefaultTTL
	}
	if c.LeaderTTL < time.Second || c.LeaderTTL > 10*time.Minute {
		return fmt.Errorf("hub: --leader-ttl %s: want 1s..10m", c.LeaderTTL)
	}
	for _, addr := range append([]string{c.Listen, c.SSHListen}, c.Advertise...) {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("hub: address %q: %w (want HOST:PORT)", addr, err)
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("hub: address %q: bad port", addr)
		}
	}
	if c.LeaseTTL < 0 || c.LeaseTTL > 0 && c.LeaseTTL < time.Second {
		return fmt.Errorf("hub: --replica-lease %s: want at least 1s", c.LeaseTTL)
	}
	if c.Tunnel != nil {
		if err := c.Tunnel.Validate(); err != nil {
			return fmt.Errorf("hub: %w", err)
		}
	}
	return nil
}

// Server is a running hub.
type Server struct {
	cfg       Config
	log       *slog.Logger
	store     store.Store
	ca        *ca.CA
	conns     *nodeconn.Table // nodes' live connections
	metrics   *metrics.Metrics
	hostKey   gossh.Signer
	hostCA    *ca.SSHCA
	issueNode func(ctx context.Context, csrDER []byte, id pki.Identity, cn string,
		ttl time.Duration) ([]*x509.Certificate, error)
	nodeCA    *x509.Certificate // root node certificates chain to
	userCA    *ca.SSHCA
	serving   tls.Certificate
	door      *access.Door          // every decision about reaching a node, and its route
	pusher    *accesspush.Pusher    // what connected nodes are told about access
	jumps     *bastion.Jumps        // bastion jumps under way
	provision *sshconn.Connector    // how jobs reach nodes, as the hub's provisioning identity
	nodes     *nodeconn.Server      // nodes' tunnel sessions, from admission to end
	blobs     *blobs.Store          // jobs' uploads and upgrades' artifacts
	cluster   *cluster.Controller   // its job engine is attached in Run
	upgrades  *upgrade.Controller   // its job engine is attached in Run
	limits    *ratelimit.Limits     // per-source limits of failed attempts
	auditLog  *auditlog.Writer      // the audit log, refusals bounded per source
	operators *operator.Service     // tether login, admin and operator API certificates
	dirLock   *dataDirLock          // held from New to the end of Run (datadir.go)
	blobRefs  artifacts.Referencers // what blob GC keeps besides jobs' uploads
	replicas  *replica.Local        // this hub among the replicas on its store
	repl      *replica.Replication  // leases, the change feed and leadership
	services  *service.Tunnels      // service tunnels; Run starts them before sessions are accepted
	children  *site.Children        // the sites below this hub
	uplink    *site.Uplink          // this hub's session with its parent; nil without one
	desired   *desired.Sync         // desired state down the tree of hubs; kinds register on it
	trust     *site.Trust           // SSH trust down the tree of hubs
	// runMetrics are registered in New and unregistered as Run ends, so
	// the registry shows only what a running hub measures.
	runMetrics []prometheus.Collector
}

// New opens the hub's state (creating it the first time).
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("hub: data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	s := &Server{cfg: cfg, log: cfg.Logger, conns: nodeconn.NewTable(), metrics: metrics.New(), dirLock: lock}
	s.limits = ratelimit.NewLimits(s.metrics.Registry)
	if s.store, err = store.Open(ctx, cfg.Store, cfg.DataDir); err != nil {
		return nil, err
	}
	s.auditLog = auditlog.New(
		auditlog.Config{Store: s.store, Log: s.log, Limit: s.limits.Audit, Registry: s.metrics.Registry},
	)
	defer func() {
		if err != nil {
			s.store.Close()
		}
	}()
	s.log.Info("store open", "store", store.Describe(cfg.Store, cfg.DataDir))
	var nudger notify.Nudger
	if db, ok := s.store.(*store.DB); ok && db.Backend() == "postgres" {
		// LISTEN/NOTIFY nudges this replica's change feed at once; the
		// periodic re-read stays the truth.
		nudger = notify.NewPGNudger(cfg.Store)
	}
	// Every hub has a replica ID: its jobs are stored with it, and it
	// campaigns for the singletons' leadership (hub/replica).
	replicaID, err := replica.LoadID(cfg.DataDir, cfg.ReplicaID)
	if err != nil {
		return nil, err
	}
	s.replicas = replica.NewLocal(replicaID, s.store, s.conns)
	if s.repl, err = replica.NewReplication(replica.ReplicationConfig{Store: s.store, ID: replicaID,
		TTL: cfg.LeaderTTL, Nudger: nudger, Registerer: s.metrics.Registry, Apply: replicaApply{s}, Audit: s.auditLog.Write,
		Logger: s.log}); err != nil {
		return nil, err
	}
	if cfg.PeerListen != "" {
		// Before anything is loaded: every replica presents the one
		// identity the store holds.
		if err := replica.ShareIdentity(ctx, s.store, cfg.DataDir, identityFiles, createIdentity); err != nil {
			return nil, err
		}
	}
	if s.ca, err = ca.LoadOrCreate(filepath.Join(cfg.DataDir, "ca"), "Tether"); err != nil {
		return nil, err
	}
	if s.hostKey, err = identity.LoadOrCreateHostKey(filepath.Join(cfg.DataDir, hostKeyFile)); err != nil {
		return nil, err
	}
	s.issueNode, s.nodeCA = identity.OwnCAIssuer(s.ca), s.ca.Certificate()
	if cfg.StepCA != nil {
		iss, err := stepca.New(*cfg.StepCA)
		if err != nil {
			return nil, err
		}
		s.issueNode, s.nodeCA = iss.IssueNode, iss.Root()
	}
	if s.hostCA, err = ca.LoadOrCreateSSH(filepath.Join(cfg.DataDir, "ca"), ca.SSHHostCAFile); err != nil {
		return nil, err
	}
	if s.userCA, err = ca.LoadOrCreateSSH(filepath.Join(cfg.DataDir, "ca"), ca.SSHUserCAFile); err != nil {
		return nil, err
	}
	names := identity.ServingNames(cfg.Listen, cfg.Advertise)
	if s.serving, err = s.ca.IssueHubServer("hub", names, 90*24*time.Hour); err != nil {
		return nil, err
	}
	// A replica's restart says nothing of the nodes other replicas hold:
	// presence, not this flag, tells them apart.
	if cfg.PeerListen == "" {
		if err := s.store.MarkAllOffline(ctx); err != nil {
			return nil, err
		}
	}
	if s.door, err = access.New(ctx, access.Config{Store: s.store, Conns: s.conns, UserCAs: s.userCA.TrustedKeys,
		ProvisionLogin: cfg.ProvisionLogin, Metrics: s.metrics, Logger: s.log.With("component", "access")}); err != nil {
		return nil, err
	}
	if s.provision, err = sshconn.New(sshconn.Config{Door: s.door, SignUser: s.userCA.SignUser,
		HostCAs: s.hostCA.TrustedKeys, HostCAsFor: s.hostCAsFor, Logger: s.log.With("component", "provision")}); err != nil {
		return nil, err
	}
	s.jumps = bastion.NewJumps(bastion.JumpsConfig{Door: s.door, Nodes: jumpNodes{s}, Audit: s.auditLog.Write,
		Logger: s.log})
	s.pusher = accesspush.New(accesspush.Config{Door: s.door, Conns: s.conns, UserCA: s.userCA, HostCA: s.hostCA,
		HostCertTTL: cfg.HostCertTTL, HostPrincipals: s.hostPrincipals, WithAncestors: s.withAncestors,
		EndWithdrawn: s.jumps.EndWithdrawn, AfterRound: s.pushSiteTrust, Publish: s.repl.Publish,
		Duration: s.metrics.AccessPushDuration, Pushes: s.metrics.AccessPushes, Log: s.log})
	s.operators = operator.New(operator.Config{Store: s.store, CA: s.ca, UserCA: s.userCA, Door: s.door, Audit: s.auditLog,
		DataDir: cfg.DataDir, UserCertTTL: cfg.UserCertTTL, RateLimited: s.limits.Refused.WithLabelValues("login"),
		Publish: s.repl.Publish, Log: s.log})
	if err := s.operators.WriteLocalAdmin(ctx); err != nil {
		return nil, err
	}
	if err := s.operators.Start(ctx); err != nil {
		return nil, err
	}
	if err := s.setupSites(ctx); err != nil {
		return nil, err
	}
	if err := s.setupDesired(); err != nil {
		return nil, err
	}
	// Before the site routes: a site serves its parent's service streams.
	if err := s.setupServices(); err != nil {
		return nil, err
	}
	s.setupSiteRoutes()
	if s.blobs, err = blobs.New(filepath.Join(cfg.DataDir, "blobs"), cfg.MaxUploadBytes); err != nil {
		return nil, err
	}
	if err := s.setupUpgrades(); err != nil {
		return nil, err
	}
	s.cluster = cluster.New(cluster.Config{Store: s.store, Blobs: s.blobs, EnginesDir: cfg.EnginesDir,
		Online: s.provision.Online, StateDir: s.replicas.StateDir, Metrics: s.metrics,
		Logger: s.log.With("component", "cluster"), Audit: s.auditLog.Write})
	if s.nodes, err = s.newNodeConns(); err != nil {
		return nil, err
	}
	return s, nil
}

// CAPin is the pin joining agents check.
func (s *Server) CAPin() string { return s.ca.Pin() }
