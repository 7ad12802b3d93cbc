// Package hub wires the Tether hub: the tunnel listener (QUIC + TLS/yamux on
// one port), the node registry, the operators' SSH bastion, the HTTP API and
// the store.
package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/stepca"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
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
	Logger     *slog.Logger
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.DataDir == "" {
		return errors.New("hub: DataDir is required (--data-dir)")
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
	if c.MaxUploadBytes == 0 {
		c.MaxUploadBytes = 1 << 30
	}
	if c.MaxUploadBytes < 0 {
		return errors.New("hub: max upload size must be positive")
	}
	if err := pki.ValidateName(c.NodeSuffix); err != nil {
		return fmt.Errorf("hub: node suffix: %w", err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	for _, addr := range append([]string{c.Listen, c.SSHListen}, c.Advertise...) {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("hub: address %q: %w (want HOST:PORT)", addr, err)
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("hub: address %q: bad port", addr)
		}
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
	sessions   sync.WaitGroup
	cluster    *cluster.Controller // set in Run before sessions are accepted
	guard      *guards             // rate limits and refusal audits (guard.go)
	admins     admins              // admin certificates: revocation time, local identity (admin.go)
}

// New opens the hub's state (creating it the first time).
func New(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("hub: data dir: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, reg: registry.New(), metrics: metrics.New(), pushKick: make(chan struct{}, 1)}
	s.guard = newGuards(s.metrics.Registry)
	var err error
	if s.ca, err = ca.LoadOrCreate(filepath.Join(cfg.DataDir, "ca"), "Tether"); err != nil {
		return nil, err
	}
	if s.hostKey, err = loadOrCreateHostKey(filepath.Join(cfg.DataDir, "ssh_host_ed25519_key")); err != nil {
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
	if s.serving, err = s.ca.IssueHubServer("hub", nil, 90*24*time.Hour); err != nil {
		return nil, err
	}
	if err := s.writeLocalAdmin(ctx); err != nil {
		return nil, err
	}
	if s.store, err = store.OpenSQLite(ctx, filepath.Join(cfg.DataDir, "tether.db")); err != nil {
		return nil, err
	}
	if err := s.store.MarkAllOffline(ctx); err != nil {
		s.store.Close()
		return nil, err
	}
	if s.door, err = access.New(ctx, access.Config{Store: s.store, Registry: s.reg, UserCAs: s.userCA.TrustedKeys,
		ProvisionLogin: cfg.ProvisionLogin, Metrics: s.metrics, Logger: s.log.With("component", "access")}); err != nil {
		s.store.Close()
		return nil, err
	}
	if err := s.startAdmins(ctx); err != nil {
		s.store.Close()
		return nil, err
	}
	return s, nil
}

// CAPin is the pin joining agents check.
func (s *Server) CAPin() string { return s.ca.Pin() }

func loadOrCreateHostKey(path string) (gossh.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		block, err := gossh.MarshalPrivateKey(priv, "tether hub host key")
		if err != nil {
			return nil, err
		}
		if err := pki.WriteFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, fmt.Errorf("hub: host key: %w", err)
		}
		return gossh.NewSignerFromKey(priv)
	}
	if err != nil {
		return nil, fmt.Errorf("hub: host key: %w", err)
	}
	signer, err := gossh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("hub: host key %s: %w", path, err)
	}
	return signer, nil
}

// ownCAIssue signs a node certificate with the hub's own intermediate.
func (s *Server) ownCAIssue(_ context.Context, csrDER []byte, id pki.Identity, cn string, ttl time.Duration) ([]*x509.Certificate, error) {
	cert, err := s.ca.SignCSR(csrDER, id, cn, ttl)
	if err != nil {
		return nil, err
	}
	return []*x509.Certificate{cert, s.ca.Intermediate()}, nil
}

// loadOrCreateSecret returns a 32-byte secret kept in path (0600).
func loadOrCreateSecret(path string) (*[32]byte, error) {
	var key [32]byte
	b, err := os.ReadFile(path)
	switch {
	case err == nil && len(b) == len(key):
		copy(key[:], b)
		return &key, nil
	case err == nil:
		return nil, fmt.Errorf("hub: %s holds %d bytes, want %d; delete it to make a new one", path, len(b), len(key))
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("hub: %w", err)
	}
	if _, err := rand.Read(key[:]); err != nil {
		return nil, err
	}
	if err := pki.WriteFileAtomic(path, key[:], 0o600); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	return &key, nil
}

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
	resetKey, err := loadOrCreateSecret(filepath.Join(s.cfg.DataDir, "quic_reset.key"))
	if err != nil {
		return err
	}
	ln, err := tunnel.Listen(ctx, s.cfg.Listen, tunnel.ListenConfig{
		TunnelTLS: tlsTunnel, HTTPTLS: tlsHTTP, Config: s.cfg.Tunnel, Logger: s.log.With("component", "tunnel"),
		StatelessResetKey: resetKey,
	})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	defer ln.Close()
	advertise := advertiseFor(ln.Addr(), s.cfg.Advertise)

	hubNames := bastionNames(s.cfg.SSHListen, advertise, s.cfg.SSHNames)
	hostCert, err := s.hostCA.SignHost(s.hostKey.PublicKey(), "tether hub", hubNames, 365*24*time.Hour)
	if err != nil {
		return err
	}
	certSigner, err := gossh.NewCertSigner(hostCert, s.hostKey)
	if err != nil {
		return fmt.Errorf("hub: bastion host certificate: %w", err)
	}
	b, err := bastion.New(bastion.Config{
		Addr: s.cfg.SSHListen, HostSigner: s.hostKey, HostCertSigner: certSigner, NodeSuffix: "." + s.cfg.NodeSuffix, Authorize: s.authorizeOperator, Dialer: jumpDialer{s.door},
		Logger: s.log.With("component", "bastion"), Metrics: s.metrics, OnJump: s.auditJump,
		Limiter: s.guard.ssh, OnLoginFailure: s.auditLoginFailure, RateLimited: s.guard.rateLimited.WithLabelValues("ssh"),
	})
	if err != nil {
		return err
	}
	sshAddr, err := b.Listen()
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}

	blobs, err := jobs.NewBlobs(filepath.Join(s.cfg.DataDir, "blobs"), s.cfg.MaxUploadBytes)
	if err != nil {
		return err
	}
	prov, err := newProvisioner(s)
	if err != nil {
		return err
	}
	engine := jobs.New(ctx, jobs.Config{Store: s.store, Connect: prov.connect, Online: s.online, Blobs: blobs,
		Metrics: s.metrics, Logger: s.log.With("component", "jobs"), Audit: s.audit})
	defer engine.Close()
	if _, err := engine.Recover(ctx); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	s.cluster = cluster.New(cluster.Config{Store: s.store, Jobs: engine, Blobs: blobs, EnginesDir: s.cfg.EnginesDir,
		Online: s.online, StateDir: s.stateDir, Metrics: s.metrics, Logger: s.log.With("component", "cluster"), Audit: s.audit})
	if _, err := s.cluster.Engines(); err != nil {
		return fmt.Errorf("hub: --engines-dir: %w", err)
	}

	httpSrv := &http.Server{
		Handler: s.guardAPI(api.NewHandler(api.Deps{
			Store: s.store, Door: s.door, CA: s.ca, IssueNode: s.issueNode, NodeCA: s.nodeCA, Registry: s.reg, Metrics: s.metrics, Advertise: advertise,
			NodeCertTTL: s.cfg.NodeCertTTL, Logger: s.log.With("component", "api"), OperatorsChanged: s.accessChanged,
			SSHTrust:      s.sshTrustInfo(sshAddr, advertise),
			ReservedNames: hubNames,
			Login:         loginService{s},
			Jobs:          engine,
			Cluster:       s.cluster,
			Blobs:         blobs,
			Admins:        adminService{s},
		})),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}

	info := api.HubInfo{API: localAddr(ln.Addr()), SSH: localAddr(sshAddr), PID: os.Getpid()}
	infoJSON, _ := json.Marshal(info)
	infoPath := filepath.Join(s.cfg.DataDir, api.HubInfoFile)
	if err := pki.WriteFileAtomic(infoPath, infoJSON, 0o644); err != nil {
		return err
	}
	defer os.Remove(infoPath)

	s.log.Info("hub listening", "tunnel_and_api", ln.Addr().String(), "ssh", sshAddr.String(),
		"advertise", advertise, "ca_pin", "sha256:"+s.ca.Pin(), "version", Version)

	var wg sync.WaitGroup
	errc := make(chan error, 5)
	wg.Add(5)
	go func() { defer wg.Done(); s.runPusher(ctx); errc <- nil }()
	go func() { defer wg.Done(); errc <- s.cluster.Run(ctx) }()
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

// bastionNames are the host names the bastion's host certificate is valid
// for: the SSH listen host (unless a wildcard), the advertised hosts, this
// machine's name, the "tether-hub" alias `tether config ssh` uses, and any
// configured extras.
func bastionNames(sshListen string, advertise, extra []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	add(BastionAlias)
	if host, _, err := net.SplitHostPort(sshListen); err == nil {
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			add(host)
		}
	}
	for _, a := range advertise {
		if host, _, err := net.SplitHostPort(a); err == nil {
			add(host)
		}
	}
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	for _, h := range extra {
		add(h)
	}
	return out
}

// BastionAlias is the host alias `tether config ssh` gives the bastion.
const BastionAlias = "tether-hub"

// sshTrustInfo is what GET /v1/ssh/trust publishes: CA keys and where the
// bastion is, everything `tether config ssh` needs.
func (s *Server) sshTrustInfo(sshAddr net.Addr, advertise []string) api.SSHTrust {
	host, port, _ := net.SplitHostPort(sshAddr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if len(advertise) > 0 {
			host, _, _ = net.SplitHostPort(advertise[0])
		}
	}
	t := api.SSHTrust{Bastion: net.JoinHostPort(host, port), BastionAlias: BastionAlias, NodeSuffix: s.cfg.NodeSuffix}
	for _, k := range s.hostCA.TrustedKeys() {
		t.HostCAs = append(t.HostCAs, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))))
	}
	for _, k := range s.userCA.TrustedKeys() {
		t.UserCAs = append(t.UserCAs, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))))
	}
	return t
}

// authorizeOperator is the bastion's login check, answered by the door.
func (s *Server) authorizeOperator(user string, key gossh.PublicKey) bool {
	return s.door.AuthorizeLogin(user, key) == nil
}

// loginService adapts the hub's login methods to api.Login.
type loginService struct{ s *Server }

func (l loginService) Challenge(ctx context.Context, operator, remote string) (string, time.Time, error) {
	return l.s.loginChallenge(ctx, operator, remote)
}

func (l loginService) Login(ctx context.Context, req api.LoginRequest, remote string) (api.LoginResponse, error) {
	return l.s.login(ctx, req, remote)
}

func ignoreClosed(err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
