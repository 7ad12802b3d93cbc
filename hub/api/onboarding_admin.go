package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/onboard"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
)

// The admin's side of onboarding: onboarding credentials and OS profiles
// (`tether onboarding`, `tether osprofile`). The endpoint machines use is
// in onboard.go.

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

func credentialFrom(c store.OnboardingCredential) OnboardingCredential {
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	return OnboardingCredential{ID: c.ID, Name: c.Name, Role: c.Role, Labels: c.Labels, Uses: c.Uses, UsesLeft: c.UsesLeft,
		ExpiresAt: c.ExpiresAt, CreatedAt: c.CreatedAt, RevokedAt: c.RevokedAt, State: credentialState(c.Usable(time.Now()))}
}

func credentialState(err error) string {
	if err == nil {
		return "active"
	}
	return reasonOf(err)
}

func osProfileFrom(p store.OSProfile) OSProfile {
	return OSProfile(p)
}

func (h *handler) createOnboarding(w http.ResponseWriter, r *http.Request) {
	var req OnboardingCreateRequest
	if !decode(w, r, &req) {
		return
	}
	if err := pki.ValidateName(req.Name); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "onboarding credential %s", err.Error()))
		return
	}
	if req.Role == "" {
		req.Role = access.RoleOnboarder
	}
	if req.Role != access.RoleOnboarder {
		h.writeErr(w, r, fail(ErrInvalid, "role %q: an onboarding credential carries role %q only (it creates one node per machine and nothing else)", req.Role, access.RoleOnboarder))
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl <= 0 || ttl > MaxOnboardingTTL {
		h.writeErr(w, r, fail(ErrInvalid, "ttl must be between 1s and %s", MaxOnboardingTTL))
		return
	}
	if req.Uses < 1 || req.Uses > MaxOnboardingUses {
		h.writeErr(w, r, fail(ErrInvalid, "uses must be between 1 and %d", MaxOnboardingUses))
		return
	}
	if err := ValidateLabels(req.Labels); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "%s", err.Error()))
		return
	}
	id, secret, err := pki.NewToken()
	if err != nil {
		h.writeErr(w, r, internal("create an onboarding credential", err))
		return
	}
	now := time.Now().UTC()
	c := store.OnboardingCredential{ID: id, Name: req.Name, SecretHash: pki.HashSecret(secret), Role: req.Role, Labels: req.Labels,
		Uses: req.Uses, UsesLeft: req.Uses, ExpiresAt: now.Add(ttl), CreatedAt: now}
	if err := h.Store.CreateOnboardingCredential(r.Context(), c); errors.Is(err, store.ErrNameTaken) {
		h.writeErr(w, r, fail(ErrConflict, "an onboarding credential named %q exists (see `tether onboarding list`); choose another name", req.Name))
		return
	} else if err != nil {
		h.writeErr(w, r, internal("store the onboarding credential", err))
		return
	}
	h.audit(store.AuditEvent{Kind: "onboarding_create", Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("credential %s (%s) role %s: %d use(s) until %s, labels %s", id, req.Name, req.Role, req.Uses, c.ExpiresAt.Format(time.RFC3339), FormatLabels(req.Labels))})
	h.Logger.Info("onboarding credential created", "credential_id", id, "name", req.Name, "uses", req.Uses, "expires", c.ExpiresAt)
	writeJSON(w, http.StatusCreated, OnboardingCreateResponse{OnboardingCredential: credentialFrom(c), Credential: id + "." + secret, CAPin: h.CA.Pin()})
}

func (h *handler) revokeOnboarding(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	c, err := h.Store.RevokeOnboardingCredential(r.Context(), name, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no onboarding credential named %q (see `tether onboarding list`)", name))
		return
	} else if err != nil {
		h.writeErr(w, r, internal("revoke onboarding credential "+name, err))
		return
	}
	h.audit(store.AuditEvent{Kind: "onboarding_revoke", Remote: r.RemoteAddr, Result: "ok", Detail: fmt.Sprintf("credential %s (%s), %d use(s) left", c.ID, c.Name, c.UsesLeft)})
	h.Logger.Info("onboarding credential revoked", "credential_id", c.ID, "name", c.Name)
	writeJSON(w, http.StatusOK, credentialFrom(c))
}

// Bounds on OS profiles.
const (
	maxOSField       = 64
	MaxCloudInitTmpl = 256 << 10
)

func (h *handler) addOSProfile(w http.ResponseWriter, r *http.Request) {
	var req OSProfileAddRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxCloudInitTmpl+maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "invalid request body: %s", err.Error()))
		return
	}
	if err := validateOSProfile(req); err != nil {
		h.writeErr(w, r, err)
		return
	}
	p := store.OSProfile{Name: req.Name, Distro: req.Distro, Version: req.Version, Family: req.Family, CloudInit: req.CloudInit, CreatedAt: time.Now().UTC()}
	if err := h.Store.AddOSProfile(r.Context(), p); errors.Is(err, store.ErrNameTaken) {
		h.writeErr(w, r, fail(ErrConflict, "an OS profile named %q, or one for %s %s, exists (see `tether osprofile list`; remove it first with `tether osprofile rm`)", req.Name, req.Distro, req.Version))
		return
	} else if err != nil {
		h.writeErr(w, r, internal("store the OS profile", err))
		return
	}
	tmpl := "built-in template"
	if p.CloudInit != "" {
		sum := sha256.Sum256([]byte(p.CloudInit))
		tmpl = "template sha256:" + hex.EncodeToString(sum[:8])
	}
	h.audit(store.AuditEvent{Kind: "osprofile_add", Remote: r.RemoteAddr, Result: "ok", Detail: fmt.Sprintf("%s: %s %s family %q, %s", p.Name, p.Distro, p.Version, p.Family, tmpl)})
	writeJSON(w, http.StatusCreated, osProfileFrom(p))
}

// validateOSProfile checks a profile, and its template by rendering it
// with sample data (onboard.Validate).
func validateOSProfile(req OSProfileAddRequest) error {
	if err := pki.ValidateName(req.Name); err != nil {
		return fail(ErrInvalid, "OS profile %s", err.Error())
	}
	for what, v := range map[string]string{"distro": req.Distro, "version": req.Version, "family": req.Family} {
		if v == "" && what != "family" {
			return fail(ErrInvalid, "OS profile %q: --%s is required (os-release %s)", req.Name, what, map[string]string{"distro": "ID", "version": "VERSION_ID"}[what])
		}
		if len(v) > maxOSField || strings.ContainsFunc(v, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("._-", r))
		}) {
			return fail(ErrInvalid, "OS profile %q: %s %.80q: want what os-release says (lowercase letters, digits, '.', '_', '-'; at most %d)", req.Name, what, v, maxOSField)
		}
	}
	if len(req.CloudInit) > MaxCloudInitTmpl {
		return fail(ErrInvalid, "OS profile %q: cloud-init template larger than %d bytes", req.Name, MaxCloudInitTmpl)
	}
	if req.CloudInit != "" {
		if err := onboard.Validate(req.CloudInit); err != nil {
			return fail(ErrInvalid, "OS profile %q: %s", req.Name, strings.TrimPrefix(err.Error(), "onboard: "))
		}
	}
	return nil
}

// CreateOnboarding creates an onboarding credential.
func (c *Client) CreateOnboarding(ctx context.Context, req OnboardingCreateRequest) (OnboardingCreateResponse, error) {
	var out OnboardingCreateResponse
	return out, c.do(ctx, http.MethodPost, "/v1/onboarding", req, &out)
}

// ListOnboarding lists the onboarding credentials.
func (c *Client) ListOnboarding(ctx context.Context) ([]OnboardingCredential, error) {
	var out []OnboardingCredential
	return out, c.do(ctx, http.MethodGet, "/v1/onboarding", nil, &out)
}

// RevokeOnboarding revokes the onboarding credential named name.
func (c *Client) RevokeOnboarding(ctx context.Context, name string) (OnboardingCredential, error) {
	var out OnboardingCredential
	return out, c.do(ctx, http.MethodPost, "/v1/onboarding/"+url.PathEscape(name)+"/revoke", nil, &out)
}

// AddOSProfile adds an OS profile.
func (c *Client) AddOSProfile(ctx context.Context, req OSProfileAddRequest) (OSProfile, error) {
	var out OSProfile
	return out, c.do(ctx, http.MethodPost, "/v1/osprofiles", req, &out)
}

// ListOSProfiles lists the OS profiles.
func (c *Client) ListOSProfiles(ctx context.Context) ([]OSProfile, error) {
	var out []OSProfile
	return out, c.do(ctx, http.MethodGet, "/v1/osprofiles", nil, &out)
}

// RemoveOSProfile removes the OS profile named name.
func (c *Client) RemoveOSProfile(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/osprofiles/"+url.PathEscape(name), nil, nil)
}
