package api

import (
	"context"
	"net/http"

	"github.com/tether-dev/tether/hub/access"
)

// The web console (hub/ui) serves the API's own endpoints to signed-in
// browsers: it checks the session cookie and CSRF token, then calls the API
// handler with the session's caller in the request context. The endpoints
// then decide exactly as they do for the CLI, so the console can do
// nothing the same person could not do through the API. Only code in this
// process can put a caller into a context; no header or certificate can.

type consoleCallerKey struct{}

// WithConsoleCaller returns ctx carrying c, a caller the web console has
// authenticated (an operator, with Admin set while they hold the admin
// role, or the hub machine's local admin).
func WithConsoleCaller(ctx context.Context, c access.Caller) context.Context {
	return context.WithValue(ctx, consoleCallerKey{}, c)
}

func consoleCaller(r *http.Request) (access.Caller, bool) {
	c, ok := r.Context().Value(consoleCallerKey{}).(access.Caller)
	return c, ok
}
