package apitype

import "time"

// Limits on onboarding credentials.
const (
	MaxOnboardingUses = 100000
	MaxOnboardingTTL  = 365 * 24 * time.Hour
)

// OnboardingCreateRequest is the body of POST /v1/onboarding.
type OnboardingCreateRequest struct {
	Name       string            `json:"name"`
	Role       string            `json:"role"` // access.RoleOnboarder, the only one
	Uses       int               `json:"uses"`
	TTLSeconds int64             `json:"ttl_seconds"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// OnboardingCredential is an onboarding credential as the API shows it
// (never its secret).
type OnboardingCredential struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Role      string            `json:"role"`
	Labels    map[string]string `json:"labels"`
	Uses      int               `json:"uses"`
	UsesLeft  int               `json:"uses_left"`
	ExpiresAt time.Time         `json:"expires_at"`
	CreatedAt time.Time         `json:"created_at"`
	RevokedAt time.Time         `json:"revoked_at,omitzero"`
	// State is "active", or why it can no longer create nodes: "revoked",
	// "expired" or "exhausted".
	State string `json:"state"`
}

// OnboardingCreateResponse answers POST /v1/onboarding; Credential
// (ID.SECRET) is shown this once.
type OnboardingCreateResponse struct {
	OnboardingCredential
	Credential string `json:"credential"`
	CAPin      string `json:"ca_pin"` // the hub CA's fingerprint, to check on site
}

// OSProfileAddRequest is the body of POST /v1/osprofiles.
type OSProfileAddRequest struct {
	Name      string `json:"name"`
	Distro    string `json:"distro"`
	Version   string `json:"version"`
	Family    string `json:"family,omitempty"`
	CloudInit string `json:"cloud_init,omitempty"` // template; "" for the built-in default
}

// OSProfile is an OS profile as the API shows it.
type OSProfile struct {
	Name      string    `json:"name"`
	Distro    string    `json:"distro"`
	Version   string    `json:"version"`
	Family    string    `json:"family,omitempty"`
	CloudInit string    `json:"cloud_init,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// MaxCloudInitTmpl bounds an OS profile's cloud-init template.
const MaxCloudInitTmpl = 256 << 10
