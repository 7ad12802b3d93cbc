// Package edge is the Tether agent: it joins a hub once, then keeps one
// outbound tunnel to it and serves the streams the hub opens (ssh to a local
// sshd or the embedded SSH server, tcp to allow-listed local ports).
//
// The agent links no hub, database or CA-signing code (the import rules in docs/design/layout.md).
package edge

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// Files in the agent's state dir (0700; keys 0600).
const (
	keyFile     = "node.key"
	certFile    = "node.crt"
	caFile      = "ca.crt"
	nodeCAFile  = "node_ca.crt"
	configFile  = "node.json"
	statusFile  = "status.json"
	hostKeyFile = "ssh_host_ed25519_key"
)

// ErrNotJoined means the state dir holds no identity yet.
var ErrNotJoined = errors.New("this node has not joined a hub yet")

// NodeConfig is what join stores besides the key and certificates.
type NodeConfig = uplink.NodeConfig

// Identity is a joined node's credentials.
type Identity = uplink.Identity

// LoadIdentity reads the identity from dir.
func LoadIdentity(dir string) (*Identity, error) {
	cfgBytes, err := os.ReadFile(filepath.Join(dir, configFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf(
			"%w (no %s in %s): run `tether-edge join JOIN_STRING --state-dir %s`", ErrNotJoined, configFile, dir, dir)
	}
	if err != nil {
		return nil, err
	}
	var cfg NodeConfig
	if err := json.Unmarshal(cfgBytes, &cfg); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, configFile), err)
	}
	var files [4][]byte
	for i, name := range []string{certFile, keyFile, caFile, nodeCAFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && (name != nodeCAFile || !errors.Is(err, os.ErrNotExist)) {
			return nil, fmt.Errorf("load node identity from %s: %w", dir, err)
		}
		files[i] = b
	}
	id, err := ParseIdentity(cfg, files[0], files[1], files[2], files[3])
	if err != nil {
		return nil, fmt.Errorf("load node identity from %s: %w", dir, err)
	}
	return id, nil
}

// ParseIdentity builds an identity from its parts in PEM, as LoadIdentity
// reads them from a state dir (nodeCAPEM may be empty: the node CA is then
// the hub CA). A process that runs many agents without a state dir each
// (the agent simulator in bench/) keeps its identities this way.
func ParseIdentity(cfg NodeConfig, certPEM, keyPEM, caPEM, nodeCAPEM []byte) (*Identity, error) {
	return uplink.ParseIdentity(cfg, certPEM, keyPEM, caPEM, nodeCAPEM)
}

// saveIdentity writes a new identity. Every file is written atomically and
// node.json last, so a crash mid-join leaves "not joined" rather than a
// half identity.
func saveIdentity(
	dir string, cfg NodeConfig, key crypto.Signer, chain []*x509.Certificate, ca, nodeCA *x509.Certificate) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return err
	}
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{keyFile, keyPEM, 0o600},
		{certFile, pki.EncodeCerts(chain...), 0o600},
		{caFile, pki.EncodeCerts(ca), 0o600},
		{nodeCAFile, pki.EncodeCerts(nodeCA), 0o600},
		{configFile, cfgJSON, 0o600},
	} {
		if err := pki.WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return err
		}
	}
	return nil
}

// Status is what a running agent reports in status.json for `tether-edge status`.
type Status struct {
	Name      string `json:"name"`
	NodeID    string `json:"node_id"`
	State     string `json:"state"` // State.statusName: connecting|connected|hub-silent|refused|rejoin-needed|stopped
	Hub       string `json:"hub,omitempty"`
	Transport string `json:"transport,omitempty"`
	// TransportWhy says why the tunnel is on its transport when it is not
	// the plain choice: "udp blocked, re-probing", "moved from tcp 12:03".
	TransportWhy string    `json:"transport_why,omitempty"`
	Since        time.Time `json:"since,omitzero"`
	LastError    string    `json:"last_error,omitempty"`
	CertExpires  time.Time `json:"cert_expires"`
	PID          int       `json:"pid"`
	Version      string    `json:"agent_version"`

	// connected is when the session was welcomed: Since again when a
	// hub-silent agent hears its hub again.
	connected time.Time
}

func writeStatus(dir string, st Status) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(filepath.Join(dir, statusFile), b, 0o600)
}

// ReadStatus reads the last status the agent wrote.
func ReadStatus(dir string) (Status, error) {
	var st Status
	b, err := os.ReadFile(filepath.Join(dir, statusFile))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}
