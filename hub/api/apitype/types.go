// Package apitype holds the wire types of the hub's HTTP API: the request
// and response bodies, their limits and the error kinds, shared by the
// handlers (hub/api and the features that register routes there) and the
// client (hub/api/apiclient). It imports nothing of the hub, so a client,
// a test or a feature can depend on the contract without the handlers.
package apitype

import (
	"time"
)

// TokenCreateRequest is the body of POST /v1/tokens.
type TokenCreateRequest struct {
	TTLSeconds int64             `json:"ttl_seconds"`
	Uses       int               `json:"uses"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Kind is "node" (default) or "site": a site token registers only
	// site hubs (tether hub --parent), a node token only nodes.
	Kind string `json:"kind,omitempty"`
}

// TokenCreateResponse answers POST /v1/tokens.
type TokenCreateResponse struct {
	ID         string    `json:"id"`
	JoinString string    `json:"join_string"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// OperatorAddRequest is the body of POST /v1/operators.
type OperatorAddRequest struct {
	Name      string `json:"name"`
	PublicKey string `json:"public_key"`
	// PublicKeys are further keys of the operator, one authorized_keys line
	// each; any of them logs in.
	PublicKeys []string `json:"public_keys,omitempty"`
	Roles      []string `json:"roles,omitempty"` // default ["all"]
}

// OperatorKeyAddRequest is the body of POST /v1/operators/{name}/keys.
type OperatorKeyAddRequest struct {
	PublicKey string `json:"public_key"`
}

// OperatorEditRequest is the body of PATCH /v1/operators/{name}.
type OperatorEditRequest struct {
	Roles []string `json:"roles"` // replaces the operator's roles; at least one
}

// RolePutRequest is the body of PUT /v1/roles/{name}.
type RolePutRequest struct {
	Nodes  string   `json:"nodes"`
	Logins []string `json:"logins"`
	// Forwarding allows port forwarding (ssh -L/-R on the nodes' loopback)
	// to the role's logins; absent means allowed.
	Forwarding *bool `json:"forwarding,omitempty"`
	// Confirm lets the role confirm upgrades waiting on the nodes it
	// selects (default: not).
	Confirm bool `json:"confirm,omitempty"`
	// Services are the role's service-tunnel permissions on the nodes it
	// selects: "expose", "connect" (default: none).
	Services []string `json:"services,omitempty"`
}

// SSHTrust answers GET /v1/ssh/trust (no authentication: public keys only).
type SSHTrust struct {
	Bastion      string   `json:"bastion"`       // host:port operators jump through
	BastionAlias string   `json:"bastion_alias"` // host name in the bastion's certificate for ssh config
	NodeSuffix   string   `json:"node_suffix"`   // nodes answer to NAME.SUFFIX
	HostCAs      []string `json:"host_cas"`      // trust for @cert-authority (current first)
	UserCAs      []string `json:"user_cas"`      // TrustedUserCAKeys for nodes' sshd
	// Sites are the host CAs of the site hubs below (their whole
	// subtree), each trusted for names below its site only.
	Sites []SiteHostCA `json:"sites,omitempty"`
}

// SiteHostCA is a site hub's SSH host CA as a hub above names it: valid
// for host certificates of NAME.Suffix only.
type SiteHostCA struct {
	Suffix  string   `json:"suffix"` // "berlin", "sub.berlin"
	HostCAs []string `json:"host_cas"`
}

// Limits on admin inputs.
const (
	MaxTokenTTL  = 365 * 24 * time.Hour
	MaxTokenUses = 100000
)

// LoginChallengeRequest is the body of POST /v1/login/challenge.
type LoginChallengeRequest struct {
	Operator string `json:"operator"`
}

// LoginChallengeResponse carries the nonce to sign.
type LoginChallengeResponse struct {
	Nonce     string    `json:"nonce"`
	ExpiresAt time.Time `json:"expires_at"`
}

// LoginRequest is the body of POST /v1/login: the nonce signed with the
// operator's registered key over operator.LoginPayload(operator, nonce).
type LoginRequest struct {
	Operator        string `json:"operator"`
	Nonce           string `json:"nonce"`
	SignatureFormat string `json:"signature_format"`
	Signature       []byte `json:"signature"`
	// AdminCSR (DER), if set, asks for an admin client certificate, given
	// only to operators holding the admin role; the signature is then over
	// operator.AdminLoginPayload, which binds it.
	AdminCSR []byte `json:"admin_csr,omitempty"`
	// PublicKey (authorized_keys format) names which of the operator's
	// keys signed, so the hub checks one signature whatever the number of
	// keys (and a login takes the same time for every name). Without it
	// the hub tries each of the operator's keys.
	PublicKey string `json:"public_key,omitempty"`
}

// LoginResponse carries the user certificate.
type LoginResponse struct {
	Certificate string    `json:"certificate"` // authorized_keys format
	ValidBefore time.Time `json:"valid_before"`
	Principals  []string  `json:"principals"`
	// AdminCert is the admin client certificate chain (PEM, leaf first)
	// for AdminCSR, if the operator holds the admin role.
	AdminCert string `json:"admin_cert,omitempty"`
	// APICert is, for an operator without the admin role, an API client
	// certificate chain (PEM, leaf first) for AdminCSR that lists the
	// nodes the operator's roles select and does nothing else.
	APICert string `json:"api_cert,omitempty"`
}
