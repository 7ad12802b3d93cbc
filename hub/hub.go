// Package hub wires the Tether hub: the tunnel listener (QUIC + TLS/yamux on
// one port), the node registry, the operators' SSH bastion, the HTTP API and
// the store. Every decision about reaching a node is hub/access's; this
// package connects the parts, one concern per file:
//
//	hub.go        Config, Server, New
//	run.go        Run: listeners, bastion, API, job engine, shutdown
//	identity.go   the hub's keys and CAs, the bastion's host names, SSH trust for clients
//	admin.go      admin client certificates: local identity, login, revoke-admin
//	session.go    a node's tunnel session: authenticate, register, serve, end
//	control.go    the control stream: heartbeats, certificate renewal
//	push.go       what nodes are told about access (keys, trust) and when
//	jump.go       the bastion's login check and dialer, through the door
//	provision.go  the hub's provisioning identity and the job engine's connector
//	login.go      tether login: challenges and user certificates
//	limits.go     per-source rate limits on failed logins and joins
//	apiguard.go   the API middleware that applies them and audits refusals
//	tlsverify.go  tunnel client certificates, verified so refusals are audited
//	audit.go      writing audit events, bounded per source for refusals
//	repeat.go     timers instead of goroutines for per-session periodic work
//	blobs.go      the registry client for upgrade artifacts, blob garbage collection
//	singletons.go replicas: the leader's singletons (fenced), dead replicas' jobs, the change feed
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
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/leader"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/notify"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/stepca"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// Version is set at build time (-ldflags -X).
var Version = "dev"

// Config configures a hub.
type Config struct {
	DataDir     string         // state: CA, database, host key, admin identity
	Listen      string         // tunnel + API address (UDP and TCP), default :7443
	SSHListen   string         // bastion address, default :2222
	Advertise   []string       // addresses agents dial (put into join strings); default: Listen's address if it is not a wildcard
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
	// node (replicas.go).
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
	// Site makes this hub a site of a parent hub (sites.go); the zero
	// value is a hub without a parent.
	Site   SiteConfig
	Logger *slog.Logger
}

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
		c.KubeOneAdminConf = DefaultKubeOneAdminConf
	}
	if c.KubeAPIServerPort == 0 {
		c.KubeAPIServerPort = DefaultKubeAPIServerPort
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
	cfg        Config
	log        *slog.Logger
	store      store.Store
	ca         *ca.CA
	reg        *registry.Registry
	metrics    *metrics.Metrics
	hostKey    gossh.Signer
	hostCA     *ca.SSHCA
	issueNode  func(ctx context.Context, csrDER []byte, id pki.Identity, cn string, ttl time.Duration) ([]*x509.Certificate, error)
	nodeCA     *x509.Certificate // root node certificates chain to
	userCA     *ca.SSHCA
	serving    tls.Certificate
	door       *access.Door  // every decision about reaching a node, and its route
	pushKick   chan struct{} // an access change is waiting to be pushed (push.go)
	challenges challenges    // pending tether login nonces
	jumps      liveJumps     // bastion jumps under way (jump.go)
	sessions   sync.WaitGroup
	cluster    *cluster.Controller // set in Run before sessions are accepted
	upgrades   *upgrade.Controller // set in Run before sessions are accepted
	kubeone    *kubeone.Service    // set in Run before the API serves
	guard      *guards             // rate limits (limits.go) and refusal audits (audit.go)
	admins     admins              // admin certificates: revocation time, local identity (admin.go)
	dirLock    *dataDirLock        // held from New to the end of Run (datadir.go)
	blobRefs   blobRefs            // what blob GC keeps besides jobs' uploads (blobs.go)
	replicaID  string              // this hub among replicas on one store (replicas.go)
	peers      *replica.Peers      // set in Run before sessions are accepted, with Config.PeerListen
	feed       *notify.Feed        // changes to and from the other replicas; set in Run (singletons.go)
	nudger     notify.Nudger       // wakes this replica's feed at once; nil on SQLite
	repl       *replication        // leases, feed and leadership; set in Run
	services   *serviceHub         // service tunnels (services.go); set in Run before sessions are accepted
	children   *site.Children      // the sites below this hub (sites.go); set in New
	uplink     *site.Uplink        // this hub's session with its parent; nil without one (sites.go)
	// siteServiceRoutes, if set, serves the route streams for service
	// tunnels the parent opens on this site hub's uplink (siteroute.go
	// hands them over).
	siteServiceRoutes func(ctx context.Context, st tunnel.Stream, req *control.RouteRequest)
	desired           *desired.Sync // desired state down the tree of hubs; kinds register on it (missions.go)
	// ancestorTrust is the SSH trust of the hubs above this site hub, as
	// its parent last sent it (nil for a root); siteTrust what was sent to
	// each child (sitetrust.go).
	ancestorTrust atomic.Pointer[access.AncestorTrust]
	siteTrust     siteTrustState
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
	s := &Server{cfg: cfg, log: cfg.Logger, reg: registry.New(), metrics: metrics.New(), pushKick: make(chan struct{}, 1), dirLock: lock}
	s.guard = newGuards(s.metrics.Registry)
	if s.store, err = store.Open(ctx, cfg.Store, cfg.DataDir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.store.Close()
		}
	}()
	s.log.Info("store open", "store", store.Describe(cfg.Store, cfg.DataDir))
	if db, ok := s.store.(*store.DB); ok && db.Backend() == "postgres" {
		// LISTEN/NOTIFY nudges this replica's change feed at once; the
		// periodic re-read stays the truth.
		s.nudger = notify.NewPGNudger(cfg.Store)
	}
	// Every hub has a replica ID: its jobs are stored with it, and it
	// campaigns for the singletons' leadership (singletons.go).
	if s.replicaID, err = replicaID(cfg.DataDir, cfg.ReplicaID); err != nil {
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
	if s.hostKey, err = loadOrCreateHostKey(filepath.Join(cfg.DataDir, hostKeyFile)); err != nil {
		return nil, err
	}
	s.issueNode, s.nodeCA = s.ownCAIssue, s.ca.Certificate()
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
	if s.serving, err = s.ca.IssueHubServer("hub", servingNames(cfg.Listen, cfg.Advertise), 90*24*time.Hour); err != nil {
		return nil, err
	}
	if err := s.writeLocalAdmin(ctx); err != nil {
		return nil, err
	}
	// A replica's restart says nothing of the nodes other replicas hold:
	// presence, not this flag, tells them apart.
	if cfg.PeerListen == "" {
		if err := s.store.MarkAllOffline(ctx); err != nil {
			return nil, err
		}
	}
	if s.door, err = access.New(ctx, access.Config{Store: s.store, Registry: s.reg, UserCAs: s.userCA.TrustedKeys,
		ProvisionLogin: cfg.ProvisionLogin, Metrics: s.metrics, Logger: s.log.With("component", "access")}); err != nil {
		return nil, err
	}
	if err := s.startAdmins(ctx); err != nil {
		return nil, err
	}
	if err := s.setupSites(ctx); err != nil {
		return nil, err
	}
	if err := s.setupDesired(); err != nil {
		return nil, err
	}
	s.setupSiteRoutes()
	return s, nil
}

// CAPin is the pin joining agents check.
func (s *Server) CAPin() string { return s.ca.Pin() }
