package site

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// Files of the parent identity, in the directory given to JoinParent and
// UplinkConfig.Dir (DATA_DIR/parent; 0700, keys 0600).
const (
	parentFile = "parent.json"
	keyFile    = "site.key"
	certFile   = "site.crt"
	caFile     = "parent_ca.crt"
	nodeCAFile = "parent_node_ca.crt"
	seqFile    = "status_seq"
)

// ErrNotJoined: the directory holds no parent identity yet.
var ErrNotJoined = errors.New("site: this hub has not joined a parent hub")

// parentConfig is what parent.json holds.
type parentConfig struct {
	uplink.NodeConfig
	// Path and Ancestors are from the parent's last welcome.
	Path      string   `json:"path,omitempty"`
	Ancestors []string `json:"ancestors,omitempty"`
}

// identity is the site's credentials at its parent.
type identity struct {
	dir string

	mu  sync.Mutex // guards the following fields
	cfg parentConfig
	id  *uplink.Identity
}

// Joined reports whether dir holds a parent identity.
func Joined(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, parentFile))
	return err == nil
}

// JoinParent joins the parent hub named by joinString as site name, with a
// site token, and stores the identity in dir; version is this hub's, sent
// in the join request. A dir that already holds one is kept as it is (a
// restart needs no token): joined is false then.
func JoinParent(ctx context.Context, dir, joinString, name, version string) (joined bool, err error) {
	if Joined(dir) {
		return false, nil
	}
	if joinString == "" {
		return false, fmt.Errorf(
			"%w (no %s in %s): start it with --parent JOIN_STRING (from `tether site token create` on the parent)",
			ErrNotJoined, parentFile, dir)
	}
	if err := siteproto.ValidLabel("site name", name); err != nil {
		return false, fmt.Errorf("site: --site: %w", err)
	}
	id, err := uplink.Enroll(ctx, uplink.EnrollOptions{JoinString: joinString, Name: name, Kind: control.JoinSite,
		AgentVersion: version})
	if err != nil {
		if errors.Is(err, uplink.ErrJoinRefused) {
			return false, fmt.Errorf("site: the parent hub refused this site hub: %w", err)
		}
		return false, fmt.Errorf("site: join the parent hub: %w", err)
	}
	keyPEM, err := id.KeyPEM()
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("site: parent dir: %w", err)
	}
	cfgJSON, _ := json.MarshalIndent(parentConfig{NodeConfig: id.Config}, "", "  ")
	chain := make([]*x509.Certificate, 0, len(id.Cert.Certificate))
	for _, der := range id.Cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return false, fmt.Errorf("site: issued certificate: %w", err)
		}
		chain = append(chain, c)
	}
	// parent.json last: a crash mid-join leaves "not joined".
	for _, f := range []struct {
		name string
		data []byte
	}{
		{keyFile, keyPEM},
		{certFile, pki.EncodeCerts(chain...)},
		{caFile, pki.EncodeCerts(id.CA)},
		{nodeCAFile, pki.EncodeCerts(id.NodeCA)},
		{parentFile, cfgJSON},
	} {
		if err := pki.WriteFileAtomic(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return false, fmt.Errorf("site: save parent identity: %w", err)
		}
	}
	return true, nil
}

// loadIdentity reads the parent identity from dir.
func loadIdentity(dir string) (*identity, error) {
	b, err := os.ReadFile(filepath.Join(dir, parentFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w (no %s in %s): start it with --parent JOIN_STRING", ErrNotJoined, parentFile, dir)
	}
	if err != nil {
		return nil, err
	}
	var cfg parentConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("site: read %s: %w", filepath.Join(dir, parentFile), err)
	}
	var files [4][]byte
	for i, name := range []string{certFile, keyFile, caFile, nodeCAFile} {
		if files[i], err = os.ReadFile(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("site: load parent identity: %w", err)
		}
	}
	id, err := uplink.ParseIdentity(cfg.NodeConfig, files[0], files[1], files[2], files[3])
	if err != nil {
		return nil, fmt.Errorf("site: load parent identity from %s: %w", dir, err)
	}
	return &identity{dir: dir, cfg: cfg, id: id}, nil
}

func (i *identity) cert() tls.Certificate {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.id.Cert
}

func (i *identity) snapshot() parentConfig {
	i.mu.Lock()
	defer i.mu.Unlock()
	c := i.cfg
	c.Ancestors = append([]string(nil), c.Ancestors...)
	return c
}

// setPlace records the parent's welcome (path and ancestors), kept for a
// restart while the parent is unreachable.
func (i *identity) setPlace(path string, ancestors []string) error {
	i.mu.Lock()
	if i.cfg.Path == path && strings.Join(i.cfg.Ancestors, ",") == strings.Join(ancestors, ",") {
		i.mu.Unlock()
		return nil
	}
	i.cfg.Path, i.cfg.Ancestors = path, append([]string(nil), ancestors...)
	b, _ := json.MarshalIndent(i.cfg, "", "  ")
	i.mu.Unlock()
	return pki.WriteFileAtomic(filepath.Join(i.dir, parentFile), b, 0o600)
}

// renewed checks and stores a renewed certificate: it chains to the
// parent's node CA and is for this site's key.
func (i *identity) renewed(pemChain string) (*x509.Certificate, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	certs, cert, err := uplink.VerifyRenewed(pemChain, i.id.NodeCA, i.id.Key())
	if err != nil {
		return nil, err
	}
	if err := pki.WriteFileAtomic(filepath.Join(i.dir, certFile), pki.EncodeCerts(certs...), 0o600); err != nil {
		return nil, err
	}
	i.id.Cert = cert
	return certs[0], nil
}

// seqBlock is how many status sequence numbers are reserved per write of
// the sequence file: a restart skips at most this many, and never reuses one.
const seqBlock = 1000

// seqs hands out status sequence numbers that grow across restarts.
type seqs struct {
	path     string
	mu       sync.Mutex // guards next and reserved
	next     uint64
	reserved uint64 // numbers below this are on disk as used
}

func loadSeqs(dir string) (*seqs, error) {
	s := &seqs{path: filepath.Join(dir, seqFile)}
	b, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("site: %s: %w", s.path, err)
		}
		s.next, s.reserved = n, n
	}
	return s, nil
}

// take returns the next sequence number (from 1).
func (s *seqs) take() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	if s.next >= s.reserved {
		r := s.next + seqBlock
		if err := pki.WriteFileAtomic(s.path, []byte(strconv.FormatUint(r, 10)+"\n"), 0o600); err != nil {
			s.next--
			return 0, fmt.Errorf("site: reserve status sequence numbers: %w", err)
		}
		s.reserved = r
	}
	return s.next, nil
}
