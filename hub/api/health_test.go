package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

// TestHealthEndpoints: /healthz and /readyz answer without credentials and
// without detail; /readyz is 503 until Ready says yes; /v1/openapi.yaml is
// the embedded document.
func TestHealthEndpoints(t *testing.T) {
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	secret := errors.New("store at /secret/path is locked")
	tests := []struct {
		name, path string
		ready      Readiness
		status     int
		body       string
	}{
		{"healthz", "/healthz", nil, 200, "ok\n"},
		{"readyz without a check", "/readyz", nil, 503, "not ready\n"},
		{"readyz failing", "/readyz", func(context.Context) error { return secret }, 503, "not ready\n"},
		{"readyz ready", "/readyz", func(context.Context) error { return nil }, 200, "ok\n"},
		{"openapi", "/v1/openapi.yaml", nil, 200, string(openAPIDoc)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHandler(Deps{Store: st, Ready: tt.ready})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
			if rec.Code != tt.status || rec.Body.String() != tt.body {
				t.Errorf("GET %s: %d %q, want %d %q", tt.path, rec.Code, rec.Body.String(), tt.status, tt.body)
			}
		})
	}
	if !strings.Contains(string(openAPIDoc), "/readyz:") {
		t.Error("the embedded OpenAPI document does not describe /readyz")
	}
}

// TestSelectorErrorsSayItOnce: a bad selector is reported as the selector
// parser says it, without package prefixes or a repeated "selector".
func TestSelectorErrorsSayItOnce(t *testing.T) {
	_, err := nodeSelector("x in (")
	msg := err.Error()
	for _, bad := range []string{"roles: ", "store: ", "selector: "} {
		if strings.Contains(msg, bad) {
			t.Errorf("error %q contains %q", msg, bad)
		}
	}
	if strings.Count(msg, "selector") != 1 {
		t.Errorf("error %q names the selector %d times, want once", msg, strings.Count(msg, "selector"))
	}
}
