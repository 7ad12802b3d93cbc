package api

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
)

// caller is who made an automation request (route.Caller).
type caller = route.Caller

// automation wraps endpoints automation may use: with the admin client
// certificate, or with `Authorization: Bearer tapi_...` from
// `tether apitoken create`.
func (h *handler) automation(next func(http.ResponseWriter, *http.Request, caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c, ok := consoleCaller(r); ok {
			if !c.Admin {
				h.writeErr(w, r, fail(ErrRefused, "%s may not %s %s: jobs need the admin role or an API token", c.Name, r.Method,
					r.URL.Path))
				return
			}
			c.Name = "admin:" + c.Name
			next(w, r, caller{Caller: c, Door: h.Door})
			return
		}
		if auth := r.Header.Get("Authorization"); auth != "" {
			c, err := h.tokenCaller(r.Context(), auth)
			if err != nil {
				h.audit(store.AuditEvent{
					Kind:   "api_auth",
					Remote: r.RemoteAddr,
					Result: "refused",
					Detail: r.Method + " " + r.URL.Path + ": " + err.Error(),
				})
				h.writeErr(w, r, err)
				return
			}
			next(w, r, c)
			return
		}
		h.admin(func(w http.ResponseWriter, r *http.Request) {
			// Audit names which admin: "admin:local-admin" or "admin:alice".
			next(w, r, caller{Caller: access.Caller{Admin: true, Name: "admin:" + adminName(r)}, Door: h.Door})
		})(w, r)
	}
}

var errBadAPIToken = fail(ErrUnauthenticated,
	"API token refused: unknown, expired or malformed (create one with `tether apitoken create --role ROLE`)")

func (h *handler) tokenCaller(ctx context.Context, auth string) (caller, error) {
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return caller{}, fail(ErrUnauthenticated, "Authorization header: want `Bearer tapi_...`")
	}
	tok, ok = strings.CutPrefix(strings.TrimSpace(tok), apitype.APITokenPrefix)
	if !ok {
		return caller{}, errBadAPIToken
	}
	id, secret, err := pki.SplitToken(tok)
	if err != nil {
		return caller{}, errBadAPIToken
	}
	t, err := h.Store.GetAPIToken(ctx, id)
	if err != nil {
		// Hash anyway so an unknown id costs the same as a wrong secret.
		_ = pki.SecretMatches(make([]byte, 32), secret)
		return caller{}, errBadAPIToken
	}
	if !pki.SecretMatches(t.SecretHash, secret) || (!t.ExpiresAt.IsZero() && time.Now().After(t.ExpiresAt)) {
		return caller{}, errBadAPIToken
	}
	if h.Door == nil {
		return caller{}, fail(ErrUnauthenticated, "API tokens are not served by this hub")
	}
	if _, ok := h.Door.Snapshot().Role(t.Role); !ok {
		return caller{}, fail(ErrUnauthenticated, "API token %s: its role %q no longer exists", id, t.Role)
	}
	return caller{Caller: access.Caller{Role: t.Role, Name: "apitoken:" + id}, Door: h.Door}, nil
}

func (h *handler) createAPIToken(w http.ResponseWriter, r *http.Request) {
	var req apitype.APITokenCreateRequest
	if !decode(w, r, &req) {
		return
	}
	all, err := h.Store.ListRoles(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("read roles", err))
		return
	}
	if !slices.ContainsFunc(all, func(x store.Role) bool { return x.Name == req.Role }) {
		h.writeErr(w, r, fail(ErrInvalid,
			"no role named %q; create it first with `tether role create %s -l SELECTOR --logins LOGINS`",
			req.Role, req.Role))
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl < 0 || ttl > apitype.MaxAPITokenTTL {
		h.writeErr(w, r, fail(ErrInvalid, "ttl must be between 0 (no expiry) and %s", apitype.MaxAPITokenTTL))
		return
	}
	if len(req.Description) > 200 {
		h.writeErr(w, r, fail(ErrInvalid, "description is longer than 200 characters"))
		return
	}
	id, secret, err := pki.NewToken()
	if err != nil {
		h.writeErr(w, r, internal("create an API token", err))
		return
	}
	t := store.APIToken{
		ID:          id,
		SecretHash:  pki.HashSecret(secret),
		Role:        req.Role,
		Description: req.Description,
		CreatedAt:   time.Now().UTC(),
	}
	if ttl > 0 {
		t.ExpiresAt = t.CreatedAt.Add(ttl)
	}
	if err := h.Store.CreateAPIToken(r.Context(), t); err != nil {
		h.writeErr(w, r, internal("store the API token", err))
		return
	}
	h.audit(store.AuditEvent{
		Kind:   "apitoken_create",
		Remote: r.RemoteAddr,
		Result: "ok",
		Detail: "token " + id + " role " + req.Role,
	})
	writeJSON(w, http.StatusCreated, apitype.APITokenCreateResponse{
		APIToken: apiTokenFrom(t), Token: apitype.APITokenPrefix + id + "." + secret,
	})
}

// refuseToken answers an admin-only request made with an API token: 401
// if the token does not authenticate, 403 if it does (it is valid, but
// tokens may not do this).
func (h *handler) refuseToken(w http.ResponseWriter, r *http.Request, auth string) {
	c, err := h.tokenCaller(r.Context(), auth)
	if err == nil {
		err = fail(ErrRefused, "%s may run jobs and list the nodes of role %q, not %s %s: that needs the admin identity",
			c.Name, c.Role, r.Method, r.URL.Path)
	}
	h.audit(store.AuditEvent{
		Kind:   "api_auth",
		Remote: r.RemoteAddr,
		Result: "refused",
		Detail: r.Method + " " + r.URL.Path + ": " + err.Error(),
	})
	h.writeErr(w, r, err)
}
