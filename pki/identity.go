package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/tether-dev/tether/internal/validate"
)

// Kind says what a certificate identifies.
type Kind string

// The identity kinds. Each certificate carries exactly one tether:// URI SAN
// naming its kind and id; the CN is informational only.
const (
	KindNode  Kind = "node"
	KindAdmin Kind = "admin"
	KindHub   Kind = "hub"
	// KindOperator is an operator's API client identity from `tether
	// login`: it may list the nodes the operator's roles select, nothing
	// else.
	KindOperator Kind = "operator"
	// KindReplica is a hub replica's peer identity: the only certificate
	// another replica's peer listener accepts, and the only one a replica
	// dialing a peer accepts from it. The hub issues it to itself from the
	// shared CA; joins and logins never issue this kind.
	KindReplica Kind = "replica"
)

// Identity is who a Tether certificate belongs to.
type Identity struct {
	Kind Kind
	ID   string // node id, admin name, or hub name
}

// URI returns the SAN that encodes the identity, e.g. tether://node/3f2a….
func (i Identity) URI() *url.URL {
	return &url.URL{Scheme: "tether", Host: string(i.Kind), Path: "/" + i.ID}
}

func (i Identity) String() string { return string(i.Kind) + "/" + i.ID }

// ErrNoIdentity means a certificate carries no (or more than one) Tether identity.
var ErrNoIdentity = errors.New("pki: certificate carries no tether identity")

// IdentityOf extracts the identity from a verified certificate.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != "tether" {
			continue
		}
		id := strings.TrimPrefix(u.Path, "/")
		switch Kind(u.Host) {
		case KindNode, KindAdmin, KindHub, KindOperator, KindReplica:
		default:
			return Identity{}, fmt.Errorf("%w: unknown kind %q", ErrNoIdentity, u.Host)
		}
		if id == "" || strings.Contains(id, "/") {
			return Identity{}, fmt.Errorf("%w: malformed %s", ErrNoIdentity, u)
		}
		found = append(found, Identity{Kind: Kind(u.Host), ID: id})
	}
	if len(found) != 1 {
		return Identity{}, fmt.Errorf("%w (found %d)", ErrNoIdentity, len(found))
	}
	return found[0], nil
}

// ValidateName checks a node or operator name: a DNS label (lowercase letters,
// digits, inner dashes, at most 63 characters), so that NAME.tether is a valid
// host name for ssh and the name can never be mistaken for an IP address.
// It is [validate.NodeName], the rule every part of Tether uses.
func ValidateName(name string) error { return validate.NodeName(name) }
