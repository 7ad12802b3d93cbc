package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/onboard"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
)

// The admin's side of onboarding: onboarding credentials and OS profiles
// (`tether onboarding`, `tether osprofile`). The endpoint machines use is
// in onboard.go.

func credentialFrom(c store.OnboardingCredential) apitype.OnboardingCredential {
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	return apitype.OnboardingCredential{ID: c.ID, Name: c.Name, Role: c.Role, Labels: c.Labels, Uses: c.Uses,
		UsesLeft:  c.UsesLeft,
		ExpiresAt: c.ExpiresAt, CreatedAt: c.CreatedAt, RevokedAt: c.RevokedAt, State: credentialState(c.Usable(time.Now()))}
}

func credentialState(err error) string {
	if err == nil {
		return "active"
	}
	return reasonOf(err)
}

func osProfileFrom(p store.OSProfile) apitype.OSProfile {
	return apitype.OSProfile(p)
}

func (h *handler) createOnboarding(w http.ResponseWriter, r *http.Request) {
	var req apitype.OnboardingCreateRequest
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
		h.writeErr(w, r, fail(ErrInvalid,
			"role %q: an onboarding credential carries role %q only (it creates one node per machine and nothing else)",
			req.Role, access.RoleOnboarder))
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl <= 0 || ttl > apitype.MaxOnboardingTTL {
		h.writeErr(w, r, fail(ErrInvalid, "ttl must be between 1s and %s", apitype.MaxOnboardingTTL))
		return
	}
	if req.Uses < 1 || req.Uses > apitype.MaxOnboardingUses {
		h.writeErr(w, r, fail(ErrInvalid, "uses must be between 1 and %d", apitype.MaxOnboardingUses))
		return
	}
	if err := apitype.ValidateLabels(req.Labels); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "%s", err.Error()))
		return
	}
	id, secret, err := pki.NewToken()
	if err != nil {
		h.writeErr(w, r, internal("create an onboarding credential", err))
		return
	}
	now := time.Now().UTC()
	c := store.OnboardingCredential{ID: id, Name: req.Name, SecretHash: pki.HashSecret(secret), Role: req.Role,
		Labels: req.Labels, Uses: req.Uses, UsesLeft: req.Uses, ExpiresAt: now.Add(ttl), CreatedAt: now}
	if err := h.Store.CreateOnboardingCredential(r.Context(), c); errors.Is(err, store.ErrNameTaken) {
		h.writeErr(w, r, fail(ErrConflict,
			"an onboarding credential named %q exists (see `tether onboarding list`); choose another name", req.Name))
		return
	} else if err != nil {
		h.writeErr(w, r, internal("store the onboarding credential", err))
		return
	}
	h.audit(store.AuditEvent{Kind: "onboarding_create", Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("credential %s (%s) role %s: %d use(s) until %s, labels %s", id, req.Name, req.Role, req.Uses,
			c.ExpiresAt.Format(time.RFC3339), apitype.FormatLabels(req.Labels))})
	h.Logger.Info("onboarding credential created", "credential_id", id, "name", req.Name, "uses", req.Uses, "expires",
		c.ExpiresAt)
	writeJSON(w, http.StatusCreated, apitype.OnboardingCreateResponse{
		OnboardingCredential: credentialFrom(c),
		Credential:           id + "." + secret,
		CAPin:                h.CA.Pin(),
	})
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
	h.audit(store.AuditEvent{
		Kind:   "onboarding_revoke",
		Remote: r.RemoteAddr,
		Result: "ok",
		Detail: fmt.Sprintf("credential %s (%s), %d use(s) left", c.ID, c.Name, c.UsesLeft),
	})
	h.Logger.Info("onboarding credential revoked", "credential_id", c.ID, "name", c.Name)
	writeJSON(w, http.StatusOK, credentialFrom(c))
}

// Bounds on OS profiles.
const maxOSField = 64

func (h *handler) addOSProfile(w http.ResponseWriter, r *http.Request) {
	var req apitype.OSProfileAddRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, apitype.MaxCloudInitTmpl+maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "invalid request body: %s", err.Error()))
		return
	}
	if err := validateOSProfile(req); err != nil {
		h.writeErr(w, r, err)
		return
	}
	p := store.OSProfile{
		Name:      req.Name,
		Distro:    req.Distro,
		Version:   req.Version,
		Family:    req.Family,
		CloudInit: req.CloudInit,
		CreatedAt: time.Now().UTC(),
	}
	if err := h.Store.AddOSProfile(r.Context(), p); errors.Is(err, store.ErrNameTaken) {
		h.writeErr(w, r, fail(ErrConflict,
			"an OS profile named %q, or one for %s %s, exists (see `tether osprofile list`; "+
				"remove it first with `tether osprofile rm`)", req.Name, req.Distro, req.Version))
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
	h.audit(store.AuditEvent{
		Kind:   "osprofile_add",
		Remote: r.RemoteAddr,
		Result: "ok",
		Detail: fmt.Sprintf("%s: %s %s family %q, %s", p.Name, p.Distro, p.Version, p.Family, tmpl),
	})
	writeJSON(w, http.StatusCreated, osProfileFrom(p))
}

// validateOSProfile checks a profile, and its template by rendering it
// with sample data (onboard.Validate).
func validateOSProfile(req apitype.OSProfileAddRequest) error {
	if err := pki.ValidateName(req.Name); err != nil {
		return fail(ErrInvalid, "OS profile %s", err.Error())
	}
	for what, v := range map[string]string{"distro": req.Distro, "version": req.Version, "family": req.Family} {
		if v == "" && what != "family" {
			return fail(ErrInvalid, "OS profile %q: --%s is required (os-release %s)", req.Name, what,
				map[string]string{"distro": "ID", "version": "VERSION_ID"}[what])
		}
		if len(v) > maxOSField || strings.ContainsFunc(v, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("._-", r))
		}) {
			return fail(ErrInvalid,
				"OS profile %q: %s %.80q: want what os-release says (lowercase letters, digits, '.', '_', '-'; at most %d)",
				req.Name, what, v, maxOSField)
		}
	}
	if len(req.CloudInit) > apitype.MaxCloudInitTmpl {
		return fail(ErrInvalid, "OS profile %q: cloud-init template larger than %d bytes", req.Name, apitype.MaxCloudInitTmpl)
	}
	if req.CloudInit != "" {
		if err := onboard.Validate(req.CloudInit); err != nil {
			return fail(ErrInvalid, "OS profile %q: %s", req.Name, strings.TrimPrefix(err.Error(), "onboard: "))
		}
	}
	return nil
}
