package api

import (
	"context"
	_ "embed"
	"net/http"
)

// openAPIDoc is the API's OpenAPI document, served at GET /v1/openapi.yaml
// (TestOpenAPIMatchesRoutes keeps it true to the routes).
//
//go:embed openapi.yaml
var openAPIDoc []byte

// Readiness says whether the hub can serve: nil when ready. Its error is
// logged, never sent: /readyz is unauthenticated.
type Readiness func(ctx context.Context) error

// healthz answers 200 while the process serves HTTP at all (liveness).
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyz answers 200 when Ready says the hub is ready, else 503 with a
// bare "not ready" (the reason goes to the log only).
func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if h.Ready == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready\n"))
		return
	}
	if err := h.Ready(r.Context()); err != nil {
		h.Logger.Warn("readiness check failed", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

func openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(openAPIDoc)
}
