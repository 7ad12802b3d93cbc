package kubeone

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	machine "github.com/tether-dev/tether/provisioners/cluster"
	k1 "github.com/tether-dev/tether/provisioners/kubeone"
)

// Store is the part of the hub's store the clusters use.
type Store interface {
	store.KubeOneStore
	ListNodes(ctx context.Context) ([]store.Node, error)
	ListClusterMembers(ctx context.Context) ([]store.ClusterMember, error)
}

// Live is what only the running hub knows.
type Live interface {
	// Bastion is the hub's SSH endpoint and exactly what it presents (its
	// host certificate's wire form).
	Bastion() (Bastion, error)
	// HostKey is the wire form of what node n's SSH server presents now
	// (its hub-signed host certificate); ok is false while the node is not
	// connected or reported no host key.
	HostKey(n store.Node) (key []byte, ok bool)
}

// SignFunc signs a user certificate (the hub's user CA).
type SignFunc func(pub gossh.PublicKey, keyID string, principals []string,
	ttl time.Duration) (*gossh.Certificate, error)

// Config configures the clusters.
type Config struct {
	Store   Store
	DataDir string // the hub's data dir; keys go to DATA/kubeone/NAME
	Live    Live
	// SignUser issues the cluster's user certificate (sshCertFile), which
	// managed-sshd members need (they accept operators by certificate only).
	SignUser SignFunc
	// CertTTL is the lifetime of a cluster's certificate; default 24h. It is
	// re-issued with every manifest.
	CertTTL time.Duration
	// AccessChanged is called after a change of clusters or members, so the
	// door reloads and the members are sent (or lose) the cluster's key. Nil
	// does nothing.
	AccessChanged func()
	// KubeHealth, if set, fills Status.Kube (the API server's /readyz
	// through the tunnel).
	KubeHealth func(ctx context.Context, c store.KubeOneCluster) *KubeHealth
	// KubeOneRelease, if set, asks the hub's kubeone which release it is
	// (`kubeone version`): a create is refused a Kubernetes version that
	// release does not install. Nil, or a kubeone that cannot be asked,
	// checks against the releases the hub knows only, with a warning.
	KubeOneRelease func(ctx context.Context) (k1.Release, error)
	Now            func() time.Time
	Logger         *slog.Logger
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Store == nil || c.DataDir == "" || c.Live == nil || c.SignUser == nil {
		return errors.New("kubeone: Store, DataDir, Live and SignUser are required")
	}
	// The manifest names the key files; kubeone may run in any directory.
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return fmt.Errorf("kubeone: data dir: %w", err)
	}
	c.DataDir = abs
	if c.CertTTL <= 0 {
		c.CertTTL = 24 * time.Hour
	}
	if c.AccessChanged == nil {
		c.AccessChanged = func() {}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Clusters manages the hub's KubeOne clusters: their records, members and
// identities.
type Clusters struct {
	cfg Config
	// mu serializes changes of clusters: a cluster's key directory is
	// created before its row and removed after it, never under a row of
	// another creation of the same name.
	mu sync.Mutex
}

// NewClusters builds the clusters of a hub.
func NewClusters(cfg Config) (*Clusters, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	return &Clusters{cfg: cfg}, nil
}

// Cluster is a KubeOne cluster as the API shows it: never a private key.
type Cluster struct {
	Name         string   `json:"name"`
	Kubernetes   string   `json:"kubernetes"`
	Login        string   `json:"login"`
	CNI          string   `json:"cni"`
	ControlPlane []string `json:"control_plane"` // node names
	Workers      []string `json:"workers,omitempty"`
	// ManifestExtra is the extra manifest fields (YAML), if any.
	ManifestExtra string `json:"manifest_extra,omitempty"`
	// BastionUser is the cluster identity's bastion login.
	BastionUser string             `json:"bastion_user"`
	PublicKey   string             `json:"public_key"`
	Status      string             `json:"status"`
	LastApply   store.KubeOneApply `json:"last_apply,omitzero"`
	CreatedAt   time.Time          `json:"created_at"`
	UpdatedAt   time.Time          `json:"updated_at"`
	// Warnings are about what was allowed but is unwise (only in the
	// answer to a change).
	Warnings []string `json:"warnings,omitempty"`
}

// View is c as the API shows it.
func View(c store.KubeOneCluster) Cluster {
	v := Cluster{
		Name:        c.Name,
		Kubernetes:  c.Kubernetes,
		Login:       c.Login,
		CNI:         c.CNI,
		BastionUser: access.KubeOneBastionUser(c.Name),
		PublicKey:   c.PublicKey,
		Status:      c.Status,
		LastApply:   c.LastApply,
		CreatedAt:   c.CreatedAt,
		UpdatedAt:   c.UpdatedAt,
	}
	for _, m := range c.Members {
		if m.Role == store.KubeOneControlPlane {
			v.ControlPlane = append(v.ControlPlane, m.Node.Name)
		} else {
			v.Workers = append(v.Workers, m.Node.Name)
		}
	}
	if c.Extra != "" {
		var extra map[string]any
		if json.Unmarshal([]byte(c.Extra), &extra) == nil {
			v.ManifestExtra = marshalYAML(extra)
		}
	}
	return v
}

func newClusterID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// members resolves names against the registered nodes and the other
// clusters.
func (s *Clusters) members(
	ctx context.Context,
	cluster string,
	controlPlane, workers []string,
) ([]store.KubeOneMember, error) {
	nodes, err := s.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]store.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	clusters, err := s.cfg.Store.ListKubeOneClusters(ctx)
	if err != nil {
		return nil, err
	}
	memberOf := map[string]string{}
	for _, c := range clusters {
		for _, m := range c.Members {
			memberOf[m.NodeID] = c.Name
		}
	}
	engines, err := s.cfg.Store.ListClusterMembers(ctx)
	if err != nil {
		return nil, err
	}
	engineOf := map[string]string{}
	for _, m := range engines {
		if m.Desired != string(machine.DesiredInactive) || m.State != string(machine.StateInactive) {
			engineOf[m.NodeID] = m.Engine
		}
	}
	return ResolveMembers(cluster, controlPlane, workers, byName, memberOf, engineOf)
}

// Create makes a cluster: checks spec, makes its key pair, stores it, and
// authorizes its key on the members.
func (s *Clusters) Create(ctx context.Context, spec Spec) (Cluster, error) {
	warnings, err := spec.Check()
	if err != nil {
		return Cluster{}, err
	}
	w, err := s.checkRelease(ctx, spec.Kubernetes)
	if err != nil {
		return Cluster{}, err
	}
	warnings = append(warnings, w...)
	extra, _ := ParseExtra(spec.ManifestExtra)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.cfg.Store.GetKubeOneCluster(ctx, spec.Name); err == nil {
		return Cluster{}, fmt.Errorf("%w: a KubeOne cluster named %q exists", ErrConflict, spec.Name)
	} else if !errors.Is(err, store.ErrNotFound) {
		return Cluster{}, err
	}
	members, err := s.members(ctx, spec.Name, spec.ControlPlane, spec.Workers)
	if err != nil {
		return Cluster{}, err
	}
	pub, err := createKey(s.cfg.DataDir, spec.Name)
	if err != nil {
		return Cluster{}, err
	}
	now := s.cfg.Now()
	c := store.KubeOneCluster{
		Name:       spec.Name,
		ID:         newClusterID(),
		Kubernetes: spec.Kubernetes,
		Login:      spec.Login,
		CNI:        spec.CNI,
		PublicKey: strings.TrimSpace(
			string(gossh.MarshalAuthorizedKey(pub)),
		),
		Status:    StatusCreated,
		Members:   members,
		CreatedAt: now,
		UpdatedAt: now,
	}
	if extra != nil {
		b, err := json.Marshal(extra)
		if err != nil {
			_ = removeKey(s.cfg.DataDir, spec.Name)
			return Cluster{}, invalidf("--manifest-extra: %v", err)
		}
		c.Extra = string(b)
	}
	if err := s.cfg.Store.CreateKubeOneCluster(ctx, c); err != nil {
		_ = removeKey(s.cfg.DataDir, spec.Name)
		return Cluster{}, storeErr(err, members)
	}
	s.cfg.AccessChanged()
	s.cfg.Logger.Info("KubeOne cluster created", "cluster", c.Name, "members", len(members), "kubernetes", c.Kubernetes)
	v := View(c)
	v.Warnings = warnings
	return v, nil
}

// checkRelease checks a Kubernetes version against what the hub's kubeone
// installs. A kubeone the hub cannot ask (none installed yet, a failing
// one) or whose release it does not know (a dev build, a release newer
// than the hub) gets a warning instead: kubeone checks again at apply.
func (s *Clusters) checkRelease(ctx context.Context, version string) ([]string, error) {
	if s.cfg.KubeOneRelease == nil {
		return nil, nil
	}
	known := fmt.Sprintf("Kubernetes %s was checked only against what KubeOne %s and later install (1.%d to 1.%d)",
		version, k1.MinRelease, MinKubernetesMinor, MaxKubernetesMinor)
	rel, err := s.cfg.KubeOneRelease(ctx)
	if err != nil {
		return []string{fmt.Sprintf("%s: the hub's kubeone could not be asked: %v", known, err)}, nil
	}
	if rel.TooOld() {
		return nil, conflictf(
			"the hub's %s is older than KubeOne %s, the first release that takes the SSH certificate "+
				"the hub's manifests give it (sshCertFile): install KubeOne %s or later on the hub's machine",
			rel,
			k1.MinRelease,
			k1.MinRelease,
		)
	}
	lo, hi, ok := rel.KubernetesMinors()
	if !ok {
		return []string{
			fmt.Sprintf("%s: the hub's %s is a release the hub does not know; kubeone checks it itself at apply",
				known, rel),
		}, nil
	}
	minor, _ := kubernetesMinor(version)
	if minor < lo || minor > hi {
		hint := "choose a version in that range"
		if other := k1.ReleasesFor(minor); other != "" {
			hint += fmt.Sprintf(", or install KubeOne %s on the hub's machine (it installs 1.%d)", other, minor)
		}
		return nil, invalidf("Kubernetes %s cannot be installed by the hub's %s, which installs 1.%d to 1.%d: %s",
			version, rel, lo, hi, hint)
	}
	return nil, nil
}

// storeErr turns the store's refusals into this package's kinds; members
// are the ones asked for (their names go into the message).
func storeErr(err error, members []store.KubeOneMember) error {
	if owner, ok := errors.AsType[*store.KubernetesOwnerError](err); ok {
		name := owner.NodeID
		for _, m := range members {
			if m.NodeID == owner.NodeID {
				name = m.Node.Name
			}
		}
		if owner.Engine != "" {
			return fmt.Errorf(
				"%w (desired %s, state %s)",
				engineConflict(name, owner.Engine),
				owner.Desired,
				owner.State,
			)
		}
		return otherClusterConflict(name, owner.KubeOneCluster)
	}
	switch {
	case errors.Is(err, store.ErrInOtherCluster):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, store.ErrNameTaken):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: a member was removed meanwhile: %w", ErrInvalid, err)
	}
	return err
}

// Load returns the stored cluster with its members and their nodes.
func (s *Clusters) Load(ctx context.Context, name string) (store.KubeOneCluster, error) {
	c, err := s.cfg.Store.GetKubeOneCluster(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return store.KubeOneCluster{}, fmt.Errorf(
			"%w: no KubeOne cluster named %q (see `tether kubeone list`)",
			ErrNotFound,
			name,
		)
	}
	return c, err
}

// Get returns one cluster.
func (s *Clusters) Get(ctx context.Context, name string) (Cluster, error) {
	c, err := s.Load(ctx, name)
	if err != nil {
		return Cluster{}, err
	}
	return View(c), nil
}

// List returns every cluster, by name.
func (s *Clusters) List(ctx context.Context) ([]Cluster, error) {
	cs, err := s.cfg.Store.ListKubeOneClusters(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Cluster, 0, len(cs))
	for _, c := range cs {
		out = append(out, View(c))
	}
	return out, nil
}

// SetMembers replaces the cluster's members. Nodes that leave lose the
// cluster's key (and its live jumps to them end); nodes that join get it.
func (s *Clusters) SetMembers(ctx context.Context, name string, controlPlane, workers []string) (Cluster, error) {
	warnings, err := CheckMembers(controlPlane, workers)
	if err != nil {
		return Cluster{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.Load(ctx, name); err != nil {
		return Cluster{}, err
	}
	members, err := s.members(ctx, name, controlPlane, workers)
	if err != nil {
		return Cluster{}, err
	}
	if err := s.cfg.Store.SetKubeOneMembers(ctx, name, members, s.cfg.Now()); err != nil {
		return Cluster{}, storeErr(err, members)
	}
	s.cfg.AccessChanged()
	c, err := s.Load(ctx, name)
	if err != nil {
		return Cluster{}, err
	}
	s.cfg.Logger.Info("KubeOne cluster members changed", "cluster", name, "members", len(c.Members))
	v := View(c)
	v.Warnings = warnings
	return v, nil
}

// Delete removes the cluster: its members lose its key at once (and live
// jumps of its identity end), then its key files go. What KubeOne
// installed on the members stays (`tether kubeone reset` first removes it).
func (s *Clusters) Delete(ctx context.Context, name string) (Cluster, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.Load(ctx, name)
	if err != nil {
		return Cluster{}, err
	}
	if err := s.cfg.Store.DeleteKubeOneCluster(ctx, name); err != nil {
		return Cluster{}, err
	}
	s.cfg.AccessChanged()
	if err := removeKey(s.cfg.DataDir, name); err != nil {
		// The key grants nothing any more (the door no longer knows it);
		// the next cluster of this name replaces the files.
		s.cfg.Logger.Warn("KubeOne cluster deleted, its key files not", "cluster", name, "err", err)
	}
	s.cfg.Logger.Info("KubeOne cluster deleted", "cluster", name)
	return View(c), nil
}

// PrivateKeyPath is the cluster's private key file (absolute).
func (s *Clusters) PrivateKeyPath(cluster string) string {
	return PrivateKeyPath(s.cfg.DataDir, cluster)
}

// CertPath is the cluster's certificate file (absolute), re-issued by
// every Manifest.
func (s *Clusters) CertPath(cluster string) string { return CertPath(s.cfg.DataDir, cluster) }

// ManifestOptions adjust a rendered manifest.
type ManifestOptions struct {
	// BastionHost, if set, replaces the bastion's host name in the
	// manifest (for KubeOne run elsewhere than on the hub's host); the host
	// key pinned stays the bastion's.
	BastionHost string
	BastionPort int
	// KeyFile and CertFile, if set, are what sshPrivateKeyFile and
	// sshCertFile name instead of the files in the data dir (a job that
	// copies both into a private directory of its own).
	KeyFile, CertFile string
}

// Manifest renders the cluster's manifest with the host keys presented
// now and re-issues its certificate (CertPath). Every member must be
// connected (ErrConflict names the first that is not).
func (s *Clusters) Manifest(ctx context.Context, name string, o ManifestOptions) ([]byte, error) {
	c, err := s.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	b, err := s.cfg.Live.Bastion()
	if err != nil {
		return nil, err
	}
	if o.BastionHost != "" {
		b.Host = o.BastionHost
	}
	if o.BastionPort > 0 {
		b.Port = o.BastionPort
	}
	keys := map[string][]byte{}
	for _, m := range c.Members {
		if k, ok := s.cfg.Live.HostKey(m.Node); ok {
			keys[m.NodeID] = k
		}
	}
	in := RenderInput{
		Cluster:  c,
		Bastion:  b,
		HostKeys: keys,
		KeyFile:  cmp.Or(o.KeyFile, s.PrivateKeyPath(name)),
		CertFile: cmp.Or(o.CertFile, s.CertPath(name)),
	}
	out, err := Render(in)
	if err != nil {
		return nil, err
	}
	if err := s.issueCert(c); err != nil {
		return nil, err
	}
	return out, nil
}

// issueCert signs the cluster's key as its user certificate: the cluster's
// principal for its login, the key id naming the cluster's ID.
func (s *Clusters) issueCert(c store.KubeOneCluster) error {
	pub, _, _, _, err := gossh.ParseAuthorizedKey([]byte(c.PublicKey))
	if err != nil {
		return fmt.Errorf("kubeone: %s: stored public key: %w", c.Name, err)
	}
	cert, err := s.cfg.SignUser(
		pub,
		access.KubeOneCertKeyIDPrefix+c.ID,
		[]string{access.KubeOnePrincipal(c.ID, c.Login)},
		s.cfg.CertTTL,
	)
	if err != nil {
		return fmt.Errorf("kubeone: %s: sign certificate: %w", c.Name, err)
	}
	return writeCert(s.cfg.DataDir, c.Name, cert)
}
