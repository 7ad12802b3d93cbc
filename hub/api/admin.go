package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/pki"
)

// Admins decides which admin client certificates the API accepts and ends
// all of them at once. The hub implements it over its in-memory operator
// snapshot, so a removed operator's certificate fails at the next request
// without a store read per request.
type Admins interface {
	// Authorize decides whether a TLS client certificate chain (leaf
	// first) may use the admin endpoints now, and names the admin ("local"
	// for the hub machine's identity, else the operator). Refusals wrap
	// ErrAdminRefused and say what to do.
	Authorize(chain []*x509.Certificate) (name string, err error)
	// Revoke refuses every admin certificate issued until now (`tether ca
	// revoke-admin`, by the admin named by, from remote) and returns when
	// newly issued ones start to be accepted.
	Revoke(ctx context.Context, by, remote string) (validFrom time.Time, err error)
}

// ErrAdminRefused is wrapped by Admins.Authorize's refusals.
var ErrAdminRefused = errors.New("admin certificate refused")

// RevokeAdminResponse answers POST /v1/ca/revoke-admin.
type RevokeAdminResponse struct {
	// ValidFrom: admin certificates issued before it are refused.
	ValidFrom time.Time `json:"valid_from"`
}

type adminNameKey struct{}

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
			next(w, r.WithContext(context.WithValue(r.Context(), adminNameKey{}, c.Name)))
			return
		}
		if auth := r.Header.Get("Authorization"); auth != "" && (r.TLS == nil || len(r.TLS.PeerCertificates) == 0) {
			h.refuseToken(w, r, auth)
			return
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, http.StatusUnauthorized, "this endpoint needs an admin client certificate: on the hub machine run the CLI with --data-dir; elsewhere run `tether login` as an operator with the admin role, then pass --hub ADDR")
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
		next(w, r.WithContext(context.WithValue(r.Context(), adminNameKey{}, name)))
	}
}

// adminName is the admin that h.admin let through ("" outside it).
func adminName(r *http.Request) string {
	name, _ := r.Context().Value(adminNameKey{}).(string)
	return name
}

func (h *handler) revokeAdmin(w http.ResponseWriter, r *http.Request) {
	t, err := h.Admins.Revoke(r.Context(), adminName(r), r.RemoteAddr)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "revoke admin certificates: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, RevokeAdminResponse{ValidFrom: t})
}

// RevokeAdmin makes the hub refuse every admin certificate issued until now
// (this client's own included).
func (c *Client) RevokeAdmin(ctx context.Context) (RevokeAdminResponse, error) {
	var out RevokeAdminResponse
	err := c.do(ctx, http.MethodPost, "/v1/ca/revoke-admin", nil, &out)
	return out, err
}

// LoadAdminIdentity reads an admin identity directory (AdminCertFile,
// AdminKeyFile, AdminCAFile). A certificate outside its validity is refused
// here, with what to do, rather than by a TLS alert from the hub.
func LoadAdminIdentity(dir string) (tls.Certificate, *x509.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, AdminCertFile), filepath.Join(dir, AdminKeyFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load admin identity from %s: %w", dir, err)
	}
	now := time.Now()
	switch leaf := cert.Leaf; {
	case now.After(leaf.NotAfter):
		return tls.Certificate{}, nil, fmt.Errorf("admin certificate %s expired at %s (admin certificates are short-lived): "+
			"on the hub machine the running hub keeps DATA_DIR/%s fresh, so check that it runs; elsewhere run `tether login` again",
			filepath.Join(dir, AdminCertFile), leaf.NotAfter.Local().Format(time.RFC3339), AdminDir)
	case now.Before(leaf.NotBefore):
		return tls.Certificate{}, nil, fmt.Errorf("admin certificate %s is not valid before %s: check this machine's clock",
			filepath.Join(dir, AdminCertFile), leaf.NotBefore.Local().Format(time.RFC3339))
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, AdminCAFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load hub CA: %w", err)
	}
	cas, err := pki.ParseCerts(caPEM)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load hub CA %s: %w", filepath.Join(dir, AdminCAFile), err)
	}
	return cert, cas[0], nil
}
