package control

import (
	"fmt"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// JoinPath is the HTTP endpoint (on the hub's TLS port, ALPN h2/http1.1) that
// exchanges a join token and CSR for a node certificate.
const JoinPath = "/v1/join"

// JoinRequest is POSTed as JSON to JoinPath.
type JoinRequest struct {
	Token string `json:"token"` // ID.SECRET
	Name  string `json:"name"`
	CSR   []byte `json:"csr"` // DER, base64 in JSON
	Facts Facts  `json:"facts"`
	// AgentVersion is informational.
	AgentVersion string `json:"agent_version"`
	// Kind is what joins: JoinNode ("" too) or JoinSite (a site hub). The
	// token must be of the same kind: a node token cannot register a site,
	// nor a site token a node.
	Kind string `json:"kind,omitempty"`
}

// Join kinds.
const (
	JoinNode = "node"
	JoinSite = "site"
)

// JoinResponse carries the node's new identity.
type JoinResponse struct {
	NodeID string   `json:"node_id"`
	Name   string   `json:"name"`
	Cert   string   `json:"cert"`    // PEM chain, leaf first
	CA     string   `json:"ca"`      // PEM, root of the hub's serving chain (the pinned CA)
	NodeCA string   `json:"node_ca"` // PEM, root node certificates chain to (differs with an external step-ca)
	Hubs   []string `json:"hubs"`    // addresses to connect to
}

// ErrorResponse is the JSON body of every API error.
type ErrorResponse struct {
	Error string `json:"error"`
}

// MaxJoinRequest bounds the join request body.
const MaxJoinRequest = 64 << 10

// Validate checks a join request's bounds (the hub checks meaning).
func (r *JoinRequest) Validate() error {
	if r.Token == "" {
		return fmt.Errorf("join: missing token")
	}
	if len(r.CSR) == 0 || len(r.CSR) > 8<<10 {
		return fmt.Errorf("join: csr missing or larger than 8 KiB")
	}
	for field, v := range map[string]string{"token": r.Token, "name": r.Name, "agent_version": r.AgentVersion} {
		if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
			return fmt.Errorf("join: %w", err)
		}
	}
	if r.Kind != "" && r.Kind != JoinNode && r.Kind != JoinSite {
		return fmt.Errorf("join: kind %.32q (want %q or %q)", r.Kind, JoinNode, JoinSite)
	}
	if err := r.Facts.Validate(); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	return nil
}
