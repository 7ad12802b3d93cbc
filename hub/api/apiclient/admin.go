package apiclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
)

// RevokeAdmin makes the hub refuse every admin certificate issued until now
// (this client's own included).
func (c *Client) RevokeAdmin(ctx context.Context) (apitype.RevokeAdminResponse, error) {
	var out apitype.RevokeAdminResponse
	err := c.do(ctx, http.MethodPost, "/v1/ca/revoke-admin", nil, &out)
	return out, err
}

// LoadAdminIdentity reads an admin identity directory (AdminCertFile,
// AdminKeyFile, AdminCAFile). A certificate outside its validity is refused
// here, with what to do, rather than by a TLS alert from the hub.
func LoadAdminIdentity(dir string) (tls.Certificate, *x509.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(
		filepath.Join(dir, apitype.AdminCertFile),
		filepath.Join(dir, apitype.AdminKeyFile),
	)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load admin identity from %s: %w", dir, err)
	}
	now := time.Now()
	switch leaf := cert.Leaf; {
	case now.After(leaf.NotAfter):
		return tls.Certificate{}, nil, fmt.Errorf(
			"admin certificate %s expired at %s (admin certificates are short-lived): "+
				"on the hub machine the running hub keeps DATA_DIR/%s fresh, so check that it runs; "+
				"elsewhere run `tether login` again",
			filepath.Join(dir, apitype.AdminCertFile),
			leaf.NotAfter.Local().Format(time.RFC3339),
			apitype.AdminDir,
		)
	case now.Before(leaf.NotBefore):
		return tls.Certificate{}, nil, fmt.Errorf(
			"admin certificate %s is not valid before %s: check this machine's clock",
			filepath.Join(dir, apitype.AdminCertFile),
			leaf.NotBefore.Local().Format(time.RFC3339),
		)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, apitype.AdminCAFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load hub CA: %w", err)
	}
	cas, err := pki.ParseCerts(caPEM)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load hub CA %s: %w", filepath.Join(dir, apitype.AdminCAFile), err)
	}
	return cert, cas[0], nil
}

// ConsoleCode asks the hub for a one-time sign-in code of its web console,
// for whoever this client's identity names (`tether ui`).
func (c *Client) ConsoleCode(ctx context.Context) (apitype.ConsoleCodeResponse, error) {
	var out apitype.ConsoleCodeResponse
	err := c.do(ctx, http.MethodPost, "/v1/console/codes", nil, &out)
	return out, err
}

// ListReplicas returns the hub replicas sharing the store (admin only).
func (c *Client) ListReplicas(ctx context.Context) (apitype.ReplicaList, error) {
	var out apitype.ReplicaList
	return out, c.do(ctx, http.MethodGet, "/v1/replicas", nil, &out)
}

// Sites lists the sites below the hub, nested.
func (c *Client) Sites(ctx context.Context) ([]apitype.Site, error) {
	var out []apitype.Site
	return out, c.do(ctx, http.MethodGet, "/v1/sites", nil, &out)
}
