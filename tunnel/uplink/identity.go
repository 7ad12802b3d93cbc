package uplink

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pki"
)

// NodeConfig is what enrolment yields besides the key and certificates: an
// agent keeps it as node.json, a site hub inside its parent.json.
type NodeConfig struct {
	NodeID   string    `json:"node_id"`
	Name     string    `json:"name"`
	Hubs     []string  `json:"hubs"`
	JoinedAt time.Time `json:"joined_at"`
}

// Identity is an enrolled uplink's credentials at the hub above it.
type Identity struct {
	Config NodeConfig
	Cert   tls.Certificate
	CA     *x509.Certificate   // the hub's pinned root (TLS trust for the hub)
	NodeCA *x509.Certificate   // root the certificate chains to (CA unless an external step-ca issues)
	key    crypto.Signer       // Cert's key, for renewal CSRs
	chain  []*x509.Certificate // Cert parsed; set by Enroll only (for saving)
}

// NewIdentity builds an identity from parts already checked (VerifyIssued):
// chain is the issued certificate chain for key.
func NewIdentity(cfg NodeConfig, key crypto.Signer, chain []*x509.Certificate, ca, nodeCA *x509.Certificate) *Identity {
	der := make([][]byte, len(chain))
	for i, c := range chain {
		der[i] = c.Raw
	}
	return &Identity{Config: cfg, Cert: tls.Certificate{Certificate: der, PrivateKey: key, Leaf: chain[0]},
		CA: ca, NodeCA: nodeCA, key: key, chain: chain}
}

// ParseIdentity builds an identity from its parts in PEM, as they are kept
// on disk (nodeCAPEM may be empty: the node CA is then the hub CA). A
// process that runs many agents without a state dir each (the agent
// simulator in bench/) keeps its identities this way.
func ParseIdentity(cfg NodeConfig, certPEM, keyPEM, caPEM, nodeCAPEM []byte) (*Identity, error) {
	if cfg.NodeID == "" || cfg.Name == "" || len(cfg.Hubs) == 0 {
		return nil, errors.New("node.json is incomplete (node_id, name and hubs are required); re-join")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	cas, err := pki.ParseCerts(caPEM)
	if err != nil {
		return nil, fmt.Errorf("hub CA: %w", err)
	}
	key, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("node key type %T cannot sign", cert.PrivateKey)
	}
	id := &Identity{Config: cfg, Cert: cert, CA: cas[0], NodeCA: cas[0], key: key}
	if len(nodeCAPEM) > 0 {
		ncs, err := pki.ParseCerts(nodeCAPEM)
		if err != nil {
			return nil, fmt.Errorf("node CA: %w", err)
		}
		id.NodeCA = ncs[0]
	}
	return id, nil
}

// KeyPEM is the private key in PEM, the counterpart of ParseIdentity's
// keyPEM.
func (id *Identity) KeyPEM() ([]byte, error) { return pki.EncodeKey(id.key) }

// Key is the identity's private key (renewal CSRs are signed with it).
func (id *Identity) Key() crypto.Signer { return id.key }

// Chain is the issued certificate chain as Enroll received it (nil for an
// identity that was parsed).
func (id *Identity) Chain() []*x509.Certificate { return id.chain }

// VerifyIssued checks a certificate chain the hub issued: it is for key and
// verifies, for client auth, against the node CA (nodeCAPEM, else ca).
func VerifyIssued(certPEM, nodeCAPEM []byte, ca *x509.Certificate, key crypto.Signer) (
	[]*x509.Certificate, *x509.Certificate, error) {
	certs, err := pki.ParseCerts(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("hub sent a bad certificate: %w", err)
	}
	// Node certificates chain to the hub's CA, or to the external CA the
	// hub delegates to (told over the pinned, authenticated channel).
	nodeCA := ca
	if len(nodeCAPEM) > 0 {
		ncs, err := pki.ParseCerts(nodeCAPEM)
		if err != nil {
			return nil, nil, fmt.Errorf("hub sent a bad node CA: %w", err)
		}
		nodeCA = ncs[0]
	}
	if err := verifyClient(certs, nodeCA); err != nil {
		return nil, nil, fmt.Errorf("issued certificate does not verify against the node CA: %w", err)
	}
	if !samePublicKey(certs[0].PublicKey, key.Public()) {
		return nil, nil, errors.New("issued certificate is not for this node's key")
	}
	return certs, nodeCA, nil
}

// VerifyRenewed checks a renewed certificate chain (PEM) from the hub: it
// chains, for client auth, to nodeCA and is for key. It returns the chain
// parsed and as the TLS certificate to present from now on.
func VerifyRenewed(pemChain string, nodeCA *x509.Certificate, key crypto.Signer) (
	[]*x509.Certificate, tls.Certificate, error) {
	certs, err := pki.ParseCerts([]byte(pemChain))
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	if err := verifyClient(certs, nodeCA); err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("renewed certificate does not verify: %w", err)
	}
	if !samePublicKey(certs[0].PublicKey, key.Public()) {
		return nil, tls.Certificate{}, errors.New("renewed certificate is not for this uplink's key")
	}
	der := make([][]byte, len(certs))
	for i, c := range certs {
		der[i] = c.Raw
	}
	return certs, tls.Certificate{Certificate: der, PrivateKey: key, Leaf: certs[0]}, nil
}

// verifyClient checks that certs[0] is a client certificate chaining to
// root through the rest of certs.
func verifyClient(certs []*x509.Certificate, root *x509.Certificate) error {
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err
}

func samePublicKey(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(x crypto.PublicKey) bool }
	ea, ok := a.(equaler)
	return ok && ea.Equal(b)
}
