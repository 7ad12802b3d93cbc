// Package artifacts reads and writes Tether's upgrade artifacts in OCI
// registries, with oras-go.
//
// An agent artifact is an OCI image index (artifactType
// upgradeproto.ArtifactTypeAgent) of per-platform manifests, each with one binary
// layer; a bundle is one manifest (upgradeproto.ArtifactTypeBundle) of titled
// file layers. The hub resolves a reference once, when an upgrade is
// created, to a Pinned artifact: the digest and the verified documents.
// From then on everything is fetched by digest, so a tag moved in the
// registry changes nothing, and every byte is checked against its digest
// before it lands in the hub's content-addressed blob store, from which the
// hub pushes to the nodes. Nodes never talk to the registry.
//
// TLS verification is always on (extra roots with Config.CAFile);
// credentials come from a docker-style config.json. StartBlobGC empties the
// blob store of what no job or upgrade references (blobgc.go).
package artifacts

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/errcode"

	digest "github.com/opencontainers/go-digest"

	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Errors callers branch on.
var (
	// ErrDigestMismatch: bytes from the registry do not hash to the digest
	// that names them. Nothing of them is kept.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrNotFound: the registry has no such repository, tag or digest.
	ErrNotFound = errors.New("artifacts: not found in the registry")
	// ErrUnauthorized: the registry refused the credentials (or wants some).
	ErrUnauthorized = errors.New("artifacts: the registry refused access")
	// ErrTLS: the registry's certificate is not trusted.
	ErrTLS = errors.New("artifacts: registry TLS certificate not trusted")
	// ErrBadArtifact: the registry holds something that is not a Tether
	// artifact (or not a valid one).
	ErrBadArtifact = errors.New("artifacts: not a Tether artifact")
)

// Config configures a Client.
type Config struct {
	// CAFile holds extra PEM roots for registries (the system roots are
	// used otherwise). TLS verification is always on: there is no way to
	// turn it off.
	CAFile string
	// AuthFile is a docker-style config.json with credentials; "" means
	// $DOCKER_CONFIG/config.json or ~/.docker/config.json when present.
	AuthFile string
	// Blobs receives fetched blobs (hex SHA-256 names); Fetch needs it.
	Blobs *blobs.Store
	Log   *slog.Logger
	// Timeout bounds one registry request's wait for response headers
	// (default 30s); bodies are bounded by the caller's context.
	Timeout time.Duration
}

// Client talks to registries.
type Client struct {
	cfg      Config
	http     *http.Client
	cache    auth.Cache
	creds    credentials.Store
	credFrom string // where credentials come from, for messages
	fetched  atomic.Int64
	bytes    prometheus.Counter

	mu       sync.Mutex               // guards inflight
	inflight map[string]chan struct{} // blob digest -> closed when its fetch ended
}

// New makes a client; it reads the CA and credentials files now, so a bad
// file is an error at start, not at the first upgrade.
func New(cfg Config) (*Client, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("artifacts: --registry-ca: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("artifacts: --registry-ca %s: no PEM certificate in it", cfg.CAFile)
		}
	}
	c := &Client{cfg: cfg, cache: auth.NewCache(), inflight: map[string]chan struct{}{},
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_upgrade_registry_bytes_total",
			Help: "Bytes read from OCI registries (manifests and blobs) for upgrades."})}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	tr.ResponseHeaderTimeout = cfg.Timeout
	c.http = &http.Client{Transport: countingTransport{next: tr, c: c}}

	authFile := cfg.AuthFile
	if authFile == "" {
		authFile = defaultDockerConfig()
	} else if _, err := os.Stat(authFile); err != nil {
		return nil, fmt.Errorf("artifacts: --registry-auth: %w", err)
	}
	if authFile == "" {
		c.creds, c.credFrom = credentials.NewMemoryStore(), "no credentials (no --registry-auth, no docker config)"
	} else {
		st, err := credentials.NewStore(authFile, credentials.StoreOptions{})
		if err != nil {
			return nil, fmt.Errorf("artifacts: registry credentials %s: %w", authFile, err)
		}
		c.creds, c.credFrom = st, "credentials from "+authFile
	}
	return c, nil
}

// defaultDockerConfig is docker's config.json when it exists.
func defaultDockerConfig() string {
	dir := os.Getenv("DOCKER_CONFIG")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".docker")
	}
	p := filepath.Join(dir, "config.json")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Collector exports tether_upgrade_registry_bytes_total.
func (c *Client) Collector() prometheus.Collector { return c.bytes }

// BytesFetched is how many bytes this client has read from registries.
func (c *Client) BytesFetched() int64 { return c.fetched.Load() }

// countingTransport counts response body bytes: what the hub costs the
// registry.
type countingTransport struct {
	next http.RoundTripper
	c    *Client
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, c: t.c}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	c *Client
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.c.fetched.Add(int64(n))
		b.c.bytes.Add(float64(n))
	}
	return n, err
}

// repository is a remote repository for r, with TLS and credentials.
func (c *Client) repository(r Reference) (*remote.Repository, error) {
	repo, err := remote.NewRepository(r.Registry + "/" + r.Repository)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadReference, err)
	}
	repo.PlainHTTP = false
	repo.SkipReferrersGC = true
	repo.Client = &auth.Client{Client: c.http, Cache: c.cache, Credential: credentials.Credential(c.creds)}
	return repo, nil
}

// classify turns a registry error into one callers can branch on, with a
// message that says what to do.
func (c *Client) classify(err error, r Reference, what string) error {
	if err == nil {
		return nil
	}
	var resp *errcode.ErrorResponse
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var certErr *tls.CertificateVerificationError
	switch {
	case errors.Is(err, ErrDigestMismatch), errors.Is(err, ErrBadArtifact):
		return err
	case errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &certErr):
		return fmt.Errorf("%w: %s: %v "+
			"(give the registry's CA with --registry-ca FILE; verification cannot be turned off)", ErrTLS, r.Registry, err)
	case errors.Is(err, auth.ErrBasicCredentialNotFound):
		return fmt.Errorf("%w: %s %s of %s: the registry wants credentials and there are none for it (%s; "+
			"put them in a docker-style config.json given with --registry-auth FILE)",
			ErrUnauthorized, what, r.Repository, r.Registry, c.credFrom)
	case errors.As(err, &resp) && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden):
		return fmt.Errorf("%w: %s %s of %s: HTTP %d with %s "+
			"(check the user and password for %s in --registry-auth FILE, a docker-style config.json)",
			ErrUnauthorized, what, r.Repository, r.Registry, resp.StatusCode, c.credFrom, r.Registry)
	case errors.Is(err, errdef.ErrNotFound), errors.As(err, &resp) && resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %s %s: %v", ErrNotFound, what, r, err)
	}
	return fmt.Errorf("artifacts: %s %s: %w", what, r, err)
}

// Pinned is an artifact resolved once, at upgrade creation: all the hub
// needs later except the blobs. It is JSON-serialisable (the upgrade row
// stores it).
type Pinned struct {
	// Reference is as given: oci://HOST[:PORT]/REPO(:TAG|@sha256:…).
	Reference string `json:"reference"`
	// Digest is pinned: the index's for an agent artifact, the manifest's
	// for a bundle.
	Digest  string            `json:"digest"`
	Kind    upgradeproto.Kind `json:"kind"`
	Version string            `json:"version"`
	// Index is an agent artifact's index.
	Index []byte `json:"index,omitempty"`
	// Manifests: for an agent "linux/amd64" -> its manifest; for a bundle
	// "" -> the manifest.
	Manifests map[string][]byte `json:"manifests"`
}

// Platforms are the "os/arch" an agent artifact has (none for a bundle).
func (p Pinned) Platforms() []string {
	var out []string
	for k := range p.Manifests {
		if k != "" {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// Resolve pins ref: a tag is resolved to a digest (once; this is the only
// time a tag is read), a digest reference is used as given. The index and
// manifests are fetched by digest, verified and checked as Tether
// artifacts.
func (c *Client) Resolve(ctx context.Context, ref string) (Pinned, error) {
	r, err := ParseReference(ref)
	if err != nil {
		return Pinned{}, err
	}
	repo, err := c.repository(r)
	if err != nil {
		return Pinned{}, err
	}
	var desc ocispec.Descriptor
	if r.Digest != "" {
		desc, err = repo.Resolve(ctx, r.Digest)
		// Only the media type and size are the registry's word; the digest
		// is the caller's.
		desc.Digest = digest.Digest(r.Digest)
	} else {
		desc, err = repo.Resolve(ctx, r.Tag)
	}
	if err != nil {
		return Pinned{}, c.classify(err, r, "resolve")
	}
	if !upgradeproto.ValidDigest(desc.Digest.String()) {
		return Pinned{}, fmt.Errorf("%w: %s resolves to %.80q, not a sha256 digest", ErrBadArtifact, r, desc.Digest)
	}
	p := Pinned{Reference: ref, Digest: desc.Digest.String(), Manifests: map[string][]byte{}}
	doc, err := c.fetchDoc(ctx, repo, r, desc)
	if err != nil {
		return Pinned{}, err
	}
	switch desc.MediaType {
	case upgradeproto.MediaTypeOCIIndex:
		if err := c.resolveAgent(ctx, repo, r, doc, &p); err != nil {
			return Pinned{}, err
		}
	case upgradeproto.MediaTypeOCIManifest:
		m, err := upgradeproto.ParseArtifactManifest(doc)
		if err != nil {
			return Pinned{}, fmt.Errorf("%w: %s: %v", ErrBadArtifact, r, err)
		}
		if m.Kind() != upgradeproto.KindBundle {
			return Pinned{}, fmt.Errorf("%w: %s is a single agent manifest; an agent artifact is an index of "+
				"per-platform manifests (push it with `tether artifact push agent`)", ErrBadArtifact, r)
		}
		p.Kind, p.Version, p.Manifests[""] = upgradeproto.KindBundle, m.Version(), doc
	default:
		return Pinned{}, fmt.Errorf("%w: %s has media type %.80q, want %s (agent) or %s (bundle)", ErrBadArtifact, r,
			desc.MediaType, upgradeproto.MediaTypeOCIIndex, upgradeproto.MediaTypeOCIManifest)
	}
	c.cfg.Log.Info("artifact pinned", "reference", ref, "digest", p.Digest, "kind", p.Kind, "version", p.Version,
		"platforms", p.Platforms())
	return p, nil
}

func (c *Client) resolveAgent(ctx context.Context, repo *remote.Repository, r Reference, doc []byte, p *Pinned) error {
	ix, err := upgradeproto.ParseArtifactIndex(doc)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadArtifact, r, err)
	}
	p.Kind, p.Index = upgradeproto.KindAgent, doc
	for _, d := range ix.Manifests {
		if d.MediaType != upgradeproto.MediaTypeOCIManifest {
			return fmt.Errorf("%w: %s: index entry %s has media type %.80q, want %s", ErrBadArtifact, r, d.Digest,
				d.MediaType, upgradeproto.MediaTypeOCIManifest)
		}
		m, err := c.fetchDoc(ctx, repo, r,
			ocispec.Descriptor{MediaType: d.MediaType, Digest: digest.Digest(d.Digest), Size: d.Size})
		if err != nil {
			return err
		}
		pm, err := upgradeproto.ParseArtifactManifest(m)
		if err != nil {
			return fmt.Errorf("%w: %s: manifest for %s/%s: %v", ErrBadArtifact, r, d.Platform.OS, d.Platform.Architecture, err)
		}
		if pm.Kind() != upgradeproto.KindAgent {
			return fmt.Errorf("%w: %s: manifest for %s/%s is not an agent manifest", ErrBadArtifact, r, d.Platform.OS,
				d.Platform.Architecture)
		}
		if p.Version == "" {
			p.Version = pm.Version()
		} else if p.Version != pm.Version() {
			return fmt.Errorf("%w: %s: platforms disagree on the version (%s, %s)", ErrBadArtifact, r, p.Version, pm.Version())
		}
		p.Manifests[d.Platform.OS+"/"+d.Platform.Architecture] = m
	}
	if v := ix.Annotations[upgradeproto.AnnotationVersion]; v != "" && v != p.Version {
		return fmt.Errorf("%w: %s: the index says version %s, its manifests %s", ErrBadArtifact, r, v, p.Version)
	}
	return nil
}

// fetchDoc fetches a manifest or index by digest, bounded and verified.
func (c *Client) fetchDoc(
	ctx context.Context, repo *remote.Repository, r Reference, desc ocispec.Descriptor,
) ([]byte, error) {
	if desc.Size < 0 || desc.Size > upgradeproto.MaxArtifactManifest {
		return nil, fmt.Errorf("%w: %s: document %s of %d bytes (max %d)", ErrBadArtifact, r, desc.Digest, desc.Size,
			upgradeproto.MaxArtifactManifest)
	}
	b, err := content.FetchAll(ctx, repo, desc)
	if errors.Is(err, content.ErrMismatchedDigest) || errors.Is(err, content.ErrTrailingData) {
		return nil, fmt.Errorf("%w (want %s) for a document of %s: %v", ErrDigestMismatch, desc.Digest, r, err)
	}
	if err != nil {
		return nil, c.classify(err, r, "fetch")
	}
	if got := upgradeproto.DigestOf(b); got != desc.Digest.String() {
		return nil, fmt.Errorf("%w (want %s, got %s) for a document of %s", ErrDigestMismatch, desc.Digest, got, r)
	}
	return b, nil
}

// Fetch puts every layer blob of the pinned artifact's platforms ("os/arch";
// ignored for bundles; none means all) into the blob store, verified. Blobs
// held already are skipped, so a rollout to any number of nodes reads each
// blob from the registry once. A blob that does not hash to its digest is
// not stored; the error wraps ErrDigestMismatch.
func (c *Client) Fetch(ctx context.Context, p Pinned, platforms []string) error {
	if c.cfg.Blobs == nil {
		return errors.New("artifacts: Fetch needs Config.Blobs")
	}
	r, err := ParseReference(p.Reference)
	if err != nil {
		return err
	}
	r = r.Pinned(p.Digest)
	repo, err := c.repository(r)
	if err != nil {
		return err
	}
	var manifests [][]byte
	switch p.Kind {
	case upgradeproto.KindBundle:
		manifests = append(manifests, p.Manifests[""])
	case upgradeproto.KindAgent:
		if len(platforms) == 0 {
			platforms = p.Platforms()
		}
		for _, pl := range platforms {
			goos, goarch, _ := strings.Cut(pl, "/")
			_, m, _, err := p.ForPlatform(goos, goarch)
			if err != nil {
				return err
			}
			manifests = append(manifests, m)
		}
	default:
		return fmt.Errorf("%w: pinned artifact of kind %q", ErrBadArtifact, p.Kind)
	}
	seen := map[string]bool{}
	for _, mb := range manifests {
		m, err := upgradeproto.ParseArtifactManifest(mb)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBadArtifact, r, err)
		}
		for _, l := range m.Layers {
			if seen[l.Digest] {
				continue
			}
			seen[l.Digest] = true
			if err := c.fetchOnce(ctx, repo, r, l); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetchOnce fetches a blob the store does not hold, once however many
// rollouts ask for it at the same time: the others wait for the first and
// then find it stored (or try themselves if it failed).
func (c *Client) fetchOnce(
	ctx context.Context, repo *remote.Repository, r Reference, l upgradeproto.OCIDescriptor,
) error {
	for {
		if c.cfg.Blobs.Has(upgradeproto.DigestHex(l.Digest)) {
			return nil
		}
		c.mu.Lock()
		wait, busy := c.inflight[l.Digest]
		if !busy {
			done := make(chan struct{})
			c.inflight[l.Digest] = done
			c.mu.Unlock()
			err := c.fetchBlob(ctx, repo, r, l)
			c.mu.Lock()
			delete(c.inflight, l.Digest)
			c.mu.Unlock()
			close(done)
			return err
		}
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Client) fetchBlob(
	ctx context.Context, repo *remote.Repository, r Reference, l upgradeproto.OCIDescriptor,
) error {
	start := time.Now()
	rc, err := repo.Blobs().Fetch(ctx,
		ocispec.Descriptor{MediaType: l.MediaType, Digest: digest.Digest(l.Digest), Size: l.Size})
	if err != nil {
		return c.classify(err, r, "fetch blob "+l.Digest+" of")
	}
	defer rc.Close()
	h := sha256.New()
	// One byte past the size is enough to tell a longer blob; its hash
	// will not match either.
	_, n, err := c.cfg.Blobs.Put(io.TeeReader(io.LimitReader(rc, l.Size+1), h), upgradeproto.DigestHex(l.Digest))
	if errors.Is(err, blobs.ErrDigestMismatch) {
		got := "sha256:" + hex.EncodeToString(h.Sum(nil))
		c.cfg.Log.Warn("registry blob does not match its digest; not stored",
			"reference", r.String(), "want", l.Digest, "got", got)
		return fmt.Errorf("%w (want %s, got %s) for a blob of %s", ErrDigestMismatch, l.Digest, got, r)
	}
	if err != nil {
		return c.classify(err, r, "fetch blob "+l.Digest+" of")
	}
	c.cfg.Log.Debug("blob fetched", "digest", l.Digest, "bytes", n, "took", time.Since(start))
	return nil
}

// ForPlatform is what a node of GOOS goos and GOARCH goarch gets: the index
// (agent artifacts), its manifest and the files that manifest names. For a
// bundle goos and goarch are ignored.
func (p Pinned) ForPlatform(goos, goarch string) (index, manifest []byte, files []upgradeproto.File, err error) {
	key := ""
	if p.Kind == upgradeproto.KindAgent {
		key = goos + "/" + goarch
	}
	m, ok := p.Manifests[key]
	if !ok {
		return nil, nil, nil, fmt.Errorf("%w: %s has no agent for %s (it has %s)", ErrNotFound, p.Reference, key,
			strings.Join(p.Platforms(), ", "))
	}
	if p.Kind == upgradeproto.KindAgent {
		if upgradeproto.DigestOf(p.Index) != p.Digest {
			return nil, nil, nil, fmt.Errorf("%w (want %s, got %s) for the stored index of %s", ErrDigestMismatch,
				p.Digest, upgradeproto.DigestOf(p.Index), p.Reference)
		}
		ix, err := upgradeproto.ParseArtifactIndex(p.Index)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: %s: %v", ErrBadArtifact, p.Reference, err)
		}
		d, err := ix.ForPlatform(goos, goarch)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: %s: %v", ErrNotFound, p.Reference, err)
		}
		if got := upgradeproto.DigestOf(m); got != d.Digest {
			return nil, nil, nil, fmt.Errorf("%w (want %s, got %s) for the stored %s manifest of %s", ErrDigestMismatch,
				d.Digest, got, key, p.Reference)
		}
	} else if upgradeproto.DigestOf(m) != p.Digest {
		return nil, nil, nil, fmt.Errorf("%w (want %s, got %s) for the stored manifest of %s", ErrDigestMismatch,
			p.Digest, upgradeproto.DigestOf(m), p.Reference)
	}
	pm, err := upgradeproto.ParseArtifactManifest(m)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %s: %v", ErrBadArtifact, p.Reference, err)
	}
	return p.Index, m, pm.Files(), nil
}
