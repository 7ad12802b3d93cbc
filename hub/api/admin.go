package api

import (
	"crypto/x509"
	"net/http"

	"github.com/tether-dev/tether/hub/api/route"
)

// Admins decides which admin client certificates the API accepts
// (hub/operator). It decides over the hub's in-memory operator snapshot, so
// a removed operator's certificate fails at the next request without a
// store read per request.
type Admins interface {
	// Authorize decides whether a TLS client certificate chain (leaf
	// first) may use the admin endpoints now, and names the admin ("local"
	// for the hub machine's identity, else the operator). Refusals wrap
	// ErrAdminRefused and say what to do.
	Authorize(chain []*x509.Certificate) (name string, err error)
}

// ErrAdminRefused is wrapped by Admins.Authorize's refusals.
var ErrAdminRefused = route.ErrAdminRefused

// admin wraps handlers that need an admin client certificate. Which ones
// pass is the hub's decision (Deps.Admins; nil refuses all): the
// certificate must chain to the hub's own CA, be short-lived, issued after
// the last `tether ca revoke-admin`, and be the hub machine's local identity
// or belong to an operator who still holds the admin role.
func (h *handler) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c, ok := consoleCaller(r); ok {
			if !c.Admin {
				h.writeErr(w, r, fail(ErrRefused, "%s may not %s %s: that needs the admin role", c.Name, r.Method, r.URL.Path))
				return
			}
			next(w, r.WithContext(route.WithAdminName(r.Context(), c.Name)))
			return
		}
		if auth := r.Header.Get("Authorization"); auth != "" && (r.TLS == nil || len(r.TLS.PeerCertificates) == 0) {
			h.refuseToken(w, r, auth)
			return
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, http.StatusUnauthorized,
				"this endpoint needs an admin client certificate: on the hub machine run the CLI with --data-dir; "+
					"elsewhere run `tether login` as an operator with the admin role, then pass --hub ADDR")
			return
		}
		if h.Admins == nil {
			writeError(w, http.StatusForbidden, "admin endpoints are disabled on this hub")
			return
		}
		name, err := h.Admins.Authorize(r.TLS.PeerCertificates)
		if err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return
		}
		next(w, r.WithContext(route.WithAdminName(r.Context(), name)))
	}
}

// adminName is the admin that h.admin let through ("" outside it).
func adminName(r *http.Request) string { return route.AdminName(r) }
