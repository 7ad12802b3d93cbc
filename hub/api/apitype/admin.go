package apitype

import "time"

// RevokeAdminResponse answers POST /v1/ca/revoke-admin.
type RevokeAdminResponse struct {
	// ValidFrom: admin certificates issued before it are refused.
	ValidFrom time.Time `json:"valid_from"`
}

// APITokenPrefix starts every API token, so leaked tokens are easy to spot
// (and to grep for in logs).
const APITokenPrefix = "tapi_"

// APITokenCreateRequest is the body of POST /v1/apitokens.
type APITokenCreateRequest struct {
	Role        string `json:"role"`
	Description string `json:"description,omitempty"`
	TTLSeconds  int64  `json:"ttl_seconds,omitempty"` // 0: no expiry
}

// APITokenCreateResponse answers POST /v1/apitokens; Token is shown once.
type APITokenCreateResponse struct {
	APIToken
	Token string `json:"token"`
}

// MaxAPITokenTTL bounds API token lifetimes.
const MaxAPITokenTTL = 366 * 24 * time.Hour

// ConsoleCodeResponse answers POST /v1/console/codes (served by the web
// console, hub/ui).
type ConsoleCodeResponse struct {
	Code      string    `json:"code"`
	URL       string    `json:"url"` // https://HOST/ui/signin?code=…
	ExpiresAt time.Time `json:"expires_at"`
	Operator  string    `json:"operator,omitempty"` // "" for the hub machine's local admin
}

// Files the hub leaves in its data dir for local admin commands.
const (
	AdminDir      = "admin"
	AdminCertFile = "admin.crt"
	AdminKeyFile  = "admin.key"
	AdminCAFile   = "ca.crt"
	HubInfoFile   = "hub.json"
)

// HubInfo is written by a running hub so local CLI commands find it.
type HubInfo struct {
	API string `json:"api"` // host:port of the TLS API
	SSH string `json:"ssh"` // host:port of the bastion
	PID int    `json:"pid"`
}
