package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tether-dev/tether/hub/artifacts"
)

// Registry is a real OCI registry (go-containerregistry's registry
// handler: the distribution API, OCI indexes and artifactType kept as
// pushed) served over TLS on 127.0.0.1 with its own test CA. Its blob
// storage is in memory and reachable behind the registry's back: a test
// can tamper a stored blob and count the blob bytes served.
type Registry struct {
	Host   string // 127.0.0.1:PORT
	CAFile string // PEM of the CA that signed the registry's certificate
	// AuthFile is a docker-style config.json with the registry's
	// credentials ("" when the registry wants none).
	AuthFile string
	// Client is an artifacts client that trusts the CA and uses AuthFile:
	// the code `tether artifact push` runs.
	Client *artifacts.Client

	blobs *registryBlobs
	srv   *http.Server
	done  chan struct{}
	reqs  atomic.Int64
}

// RegistryOptions configures a test registry.
type RegistryOptions struct {
	// User and Password, if set, are required (HTTP basic auth).
	User, Password string
}

// StartRegistry starts a registry for the test; Cleanup stops it.
func StartRegistry(t T, opts RegistryOptions) *Registry {
	t.Helper()
	r, err := NewRegistry(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("test registry: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// NewRegistry starts a registry whose CA and credentials files go in dir.
// Close stops it.
func NewRegistry(dir string, opts RegistryOptions) (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	caPEM, cert, err := registryCerts()
	if err != nil {
		ln.Close()
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String(), CAFile: filepath.Join(dir, "registry-ca.pem"),
		blobs: &registryBlobs{m: map[string][]byte{}}, done: make(chan struct{})}
	if err := os.WriteFile(r.CAFile, caPEM, 0o644); err != nil {
		ln.Close()
		return nil, err
	}
	if opts.User != "" {
		r.AuthFile = filepath.Join(dir, "docker-config.json")
		if err := WriteDockerConfig(r.AuthFile, r.Host, opts.User, opts.Password); err != nil {
			ln.Close()
			return nil, err
		}
	}
	var h http.Handler = ggcr.New(ggcr.WithBlobHandler(r.blobs), ggcr.Logger(log.New(io.Discard, "", 0)))
	inner := h
	h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.reqs.Add(1)
		if opts.User != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != opts.User || p != opts.Password {
				w.Header().Set("WWW-Authenticate", `Basic realm="tether test registry"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		inner.ServeHTTP(w, req)
	})
	r.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:  log.New(io.Discard, "", 0)}
	go func() {
		defer close(r.done)
		_ = r.srv.ServeTLS(ln, "", "")
	}()
	if r.Client, err = artifacts.New(artifacts.Config{CAFile: r.CAFile, AuthFile: r.authFileOrEmpty(dir)}); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// authFileOrEmpty gives the client an empty docker config when the
// registry wants no credentials, so the machine's own ~/.docker is never
// read by tests.
func (r *Registry) authFileOrEmpty(dir string) string {
	if r.AuthFile != "" {
		return r.AuthFile
	}
	p := filepath.Join(dir, "docker-config-empty.json")
	if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
		return ""
	}
	return p
}

// Close stops the registry.
func (r *Registry) Close() error {
	err := r.srv.Close()
	<-r.done
	return err
}

// Ref is the oci:// reference of REPO:TAG (or REPO@DIGEST) in this registry.
func (r *Registry) Ref(repoAndTag string) string { return artifacts.Scheme + r.Host + "/" + repoAndTag }

// PushAgent publishes an agent artifact: binaries maps "os/arch" to a file.
func (r *Registry) PushAgent(
	ctx context.Context, ref, version string, binaries map[string]string,
) (artifacts.Pushed, error) {
	var bins []artifacts.AgentBinary
	for p, f := range binaries {
		bins = append(bins, artifacts.AgentBinary{Platform: p, Path: f})
	}
	return r.Client.PushAgent(ctx, ref, version, bins)
}

// PushBundle publishes a bundle; files maps names on the node to files.
func (r *Registry) PushBundle(
	ctx context.Context, ref, version string, files map[string]string,
) (artifacts.Pushed, error) {
	var fs []artifacts.BundleFile
	for n, f := range files {
		fs = append(fs, artifacts.BundleFile{Name: n, Path: f})
	}
	return r.Client.PushBundle(ctx, ref, version, fs)
}

// MoveTag points ref's tag at another artifact of the same repository
// (given by its digest), as a new push under that tag would.
func (r *Registry) MoveTag(ctx context.Context, ref, digest string) error {
	return r.Client.Tag(ctx, ref, digest)
}

// TamperBlob replaces a stored blob's bytes behind the registry's back
// (same length, one bit flipped in each byte of the first 64), the way a
// compromised or rotting store would: the registry keeps serving it under
// its old digest.
func (r *Registry) TamperBlob(digest string) error {
	h, err := v1.NewHash(digest)
	if err != nil {
		return err
	}
	r.blobs.mu.Lock()
	defer r.blobs.mu.Unlock()
	b, ok := r.blobs.m[h.String()]
	if !ok {
		return fmt.Errorf("test registry: no blob %s", digest)
	}
	c := bytes.Clone(b)
	for i := 0; i < len(c) && i < 64; i++ {
		c[i] ^= 0x01
	}
	r.blobs.m[h.String()] = c
	return nil
}

// BlobBytesServed is the number of blob bytes the registry has sent.
func (r *Registry) BlobBytesServed() int64 { return r.blobs.served.Load() }

// BlobsServed is the number of blob downloads the registry has answered.
func (r *Registry) BlobsServed() int64 { return r.blobs.gets.Load() }

// Requests is the number of HTTP requests the registry has received.
func (r *Registry) Requests() int64 { return r.reqs.Load() }

// WriteDockerConfig writes a docker-style config.json with a user and
// password for host.
func WriteDockerConfig(path, host, user, password string) error {
	b, err := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{
		"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}}})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// registryBlobs is the registry's blob storage: in memory, reachable by
// the test, counting what it serves.
type registryBlobs struct {
	mu     sync.Mutex
	m      map[string][]byte
	served atomic.Int64
	gets   atomic.Int64
}

func (s *registryBlobs) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[h.String()]
	if !ok {
		return 0, ggcr.ErrNotFound
	}
	return int64(len(b)), nil
}

func (s *registryBlobs) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[h.String()]
	if !ok {
		return nil, ggcr.ErrNotFound
	}
	s.gets.Add(1)
	return &countingReader{r: bytes.NewReader(b), n: &s.served}, nil
}

func (s *registryBlobs) Put(_ context.Context, _ string, h v1.Hash, rc io.ReadCloser) error {
	defer rc.Close()
	// The registry verifies the digest while this reads.
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[h.String()] = b
	return nil
}

func (s *registryBlobs) Delete(_ context.Context, _ string, h v1.Hash) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[h.String()]; !ok {
		return ggcr.ErrNotFound
	}
	delete(s.m, h.String())
	return nil
}

type countingReader struct {
	r *bytes.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return nil }

// registryCerts makes a CA and a server certificate for 127.0.0.1.
func registryCerts() (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tether test registry CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, cert, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	if len(der) == 0 {
		return nil, cert, errors.New("empty certificate")
	}
	cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), cert, nil
}
