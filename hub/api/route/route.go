// Package route is how a feature serves its part of the hub's HTTP API. A
// feature registers its endpoints on a Routes (Register), wrapping each in
// the authentication it needs (Admin, Automation, Lister), and answers
// failures through Routes.Error with the kinds of apitype, so that the
// API's one error shape and its rules of who may call what hold for every
// feature. It imports no feature, and hub/api imports it: any feature may
// import it without a cycle.
package route

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
)

// Routes is what hub/api hands a feature to register its endpoints on.
type Routes interface {
	// Handle serves pattern ("METHOD /v1/path", as http.ServeMux reads
	// it) with h. Every pattern must be documented in openapi.yaml.
	Handle(pattern string, h http.HandlerFunc)
	// Admin admits the admin identity only: an admin client certificate
	// or the web console's admin session.
	Admin(h http.HandlerFunc) http.HandlerFunc
	// Automation admits the admin and API tokens.
	Automation(h Handler) http.HandlerFunc
	// Lister admits the admin, API tokens and operators' API
	// certificates; the door then limits what each may see.
	Lister(h Handler) http.HandlerFunc
	// Error answers r with err: the status of its kind, Retry-After when
	// it carries one, and its client-facing message. A 500's cause goes to
	// the hub's log, never to the client.
	Error(w http.ResponseWriter, r *http.Request, err error)
}

// Feature is a feature that serves endpoints of the API.
type Feature interface {
	Register(rt Routes)
}

// Func adapts a function to a Feature.
type Func func(rt Routes)

// Register implements Feature.
func (f Func) Register(rt Routes) { f(rt) }

// Handler is an endpoint that is told who called.
type Handler func(w http.ResponseWriter, r *http.Request, c Caller)

// Caller is who made a request that Automation or Lister admitted: the
// admin, an operator's API certificate, or an API token bound to one
// role. What it may do is the door's decision.
type Caller struct {
	access.Caller
	Door *access.Door
}

// MayRun reports whether the caller may run jobs on node n, as the node's
// provisioning login (access.Door.AuthorizeJob). Without a door nothing is
// allowed.
func (c Caller) MayRun(n store.Node) bool {
	return c.Door != nil && c.Door.AuthorizeJob(c.Caller, n) == nil
}

// Sees reports whether the caller may see node n.
func (c Caller) Sees(n store.Node) bool {
	return c.Door != nil && c.Door.AuthorizeList(c.Caller, n) == nil
}

// JobFilterRole is the role whose jobs the caller may see ("" for all).
func (c Caller) JobFilterRole() string {
	if c.Admin {
		return ""
	}
	return c.Role
}

type adminNameKey struct{}

// WithAdminName returns ctx naming the admin that Admin let through.
func WithAdminName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, adminNameKey{}, name)
}

// AdminName is the admin that Admin let through ("local-admin", or the
// operator holding the admin role); "" outside Admin.
func AdminName(r *http.Request) string {
	name, _ := r.Context().Value(adminNameKey{}).(string)
	return name
}

// MaxBody bounds a JSON request body.
const MaxBody = 64 << 10

// JSON answers with v as JSON.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Decode reads r's JSON body (at most max bytes, no unknown fields) into
// v, or answers 400 and returns false.
func Decode(w http.ResponseWriter, r *http.Request, v any, max int64) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, max))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		JSON(w, http.StatusBadRequest, apitype.ErrorResponse{Error: "invalid request body: " + err.Error()})
		return false
	}
	return true
}
