package api

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// Deps is what the API handlers work on.
type Deps struct {
	Store store.Store
	// Door decides who may reach which node (hub/access).
	Door        *access.Door
	CA          *ca.CA
	Conns       *nodeconn.Table
	Metrics     *metrics.Metrics
	Advertise   []string      // this hub's addresses for agents (--advertise, or its listener)
	NodeCertTTL time.Duration // lifetime of issued node certificates
	// IssueNode signs a node certificate chain (leaf first): the hub's own
	// CA, or an external step-ca.
	IssueNode func(
		ctx context.Context, csrDER []byte, id pki.Identity, commonName string, ttl time.Duration,
	) ([]*x509.Certificate, error)
	// NodeCA is the root node certificates chain to (sent to joining agents).
	NodeCA *x509.Certificate
	Logger *slog.Logger
	// ReservedNames are names no node may take (the bastion's host names).
	ReservedNames []string
	// SSHTrust is published at GET /v1/ssh/trust.
	SSHTrust apitype.SSHTrust
	// OperatorsChanged is called after an operator is added or removed so
	// the hub can push new authorized keys to the nodes.
	OperatorsChanged func()
	// NodeRevoked, if set, is called after a node is revoked, with its
	// ID, so the hub replica that holds its tunnel closes it; nil closes
	// the tunnel if this hub holds it.
	NodeRevoked func(nodeID string)
	// Jobs is told when a node is removed (its runs that wait for it
	// end); nil: no job engine.
	Jobs *jobs.Engine
	// Admins decides which admin certificates are accepted (admin.go);
	// nil refuses them all.
	Admins Admins
	// Operators decides which operators' API client certificates the node
	// listing accepts (nodes.go); nil refuses them all.
	Operators Operators
	// Ready backs GET /readyz; nil answers "not ready".
	Ready Readiness
	// Replicas knows the hub replicas sharing the store (replicas.go);
	// nil on a hub that runs alone.
	Replicas Replicas
	// Hubs, if set, are the addresses of every live hub replica sharing
	// the store, this one's first; join strings and new nodes' configs
	// name them. Nil or empty: Advertise.
	Hubs func(ctx context.Context) []string
	// SiteHostCAs, if set, adds the host CAs of the sites below to GET
	// /v1/ssh/trust (site.Trust.HostCAsBelow).
	SiteHostCAs func() []apitype.SiteHostCA
	// Inventory, if set, lists the nodes below this hub's sites as the
	// hub names them ("n7.berlin", with site=SUFFIX): listed by GET
	// /v1/nodes and selectable as job targets, never stored as nodes.
	Inventory func(ctx context.Context) ([]store.Node, error)
	// Features serve their own endpoints beside the core ones here,
	// registered on the same route table (route.Routes).
	Features []route.Feature
}

type handler struct{ Deps }

// hubAddrs are the hub addresses join strings and new nodes' configs name:
// every live replica's on a replica, so the node's agent fails over to any
// of them, else this hub's.
func (h *handler) hubAddrs(ctx context.Context) []string {
	if h.Hubs != nil {
		if hubs := h.Hubs(ctx); len(hubs) > 0 {
			return hubs
		}
	}
	return h.Advertise
}

const maxBody = route.MaxBody

// NewHandler returns the API's http.Handler.
func NewHandler(d Deps) http.Handler {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.OperatorsChanged == nil {
		d.OperatorsChanged = func() {}
	}
	h := &handler{d}
	mux := &routeMux{ServeMux: http.NewServeMux(), h: h}
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.HandleFunc("GET /v1/openapi.yaml", openAPI)
	mux.HandleFunc("POST "+control.JoinPath, h.join)
	mux.HandleFunc("POST "+onboardproto.Path, h.onboard)
	mux.HandleFunc("GET "+onboardproto.CAPath, h.onboardCA)
	mux.HandleFunc("POST /v1/onboarding", h.admin(h.createOnboarding))
	mux.HandleFunc("GET /v1/onboarding",
		h.admin(listAs(h, "onboarding credentials", d.Store.ListOnboardingCredentials, credentialFrom)))
	mux.HandleFunc("POST /v1/onboarding/{name}/revoke", h.admin(h.revokeOnboarding))
	mux.HandleFunc("POST /v1/osprofiles", h.admin(h.addOSProfile))
	mux.HandleFunc("GET /v1/osprofiles", h.admin(listAs(h, "OS profiles", d.Store.ListOSProfiles, osProfileFrom)))
	mux.HandleFunc("DELETE /v1/osprofiles/{name}",
		h.admin(h.deleteBy("name", "OS profile named", d.Store.DeleteOSProfile, false,
			func(r *http.Request, name string) store.AuditEvent {
				return store.AuditEvent{Kind: "osprofile_remove", Remote: r.RemoteAddr, Result: "ok", Detail: name}
			})))
	mux.HandleFunc("GET /v1/ssh/trust", h.sshTrust)
	mux.HandleFunc("GET /v1/nodes", h.lister(h.listNodes))
	mux.HandleFunc("POST /v1/nodes/labels", h.admin(h.labelNodes))
	mux.HandleFunc("DELETE /v1/nodes/{name}", h.admin(h.removeNode))
	mux.HandleFunc("POST /v1/nodes/{name}/revoke", h.admin(h.revokeNode))
	mux.HandleFunc("PUT /v1/roles/{name}", h.admin(h.putRole))
	mux.HandleFunc("GET /v1/roles", h.admin(listAs(h, "roles", d.Store.ListRoles, roleFrom)))
	mux.HandleFunc("DELETE /v1/roles/{name}", h.admin(h.deleteBy("name", "role named", d.Store.DeleteRole, true,
		func(r *http.Request, name string) store.AuditEvent {
			return store.AuditEvent{Kind: "role_remove", Remote: r.RemoteAddr, Result: "ok", Detail: name}
		})))
	mux.HandleFunc("GET /v1/audit", h.admin(h.listAudit))
	mux.HandleFunc("POST /v1/tokens", h.admin(h.createToken))
	mux.HandleFunc("GET /v1/tokens", h.admin(listAs(h, "join tokens", d.Store.ListTokens, tokenFrom)))
	mux.HandleFunc("DELETE /v1/tokens/{id}", h.admin(h.deleteBy("id", "token with id", d.Store.DeleteToken, false,
		func(r *http.Request, id string) store.AuditEvent {
			return store.AuditEvent{Kind: "token_remove", Remote: r.RemoteAddr, Result: "ok", Detail: "join token " + id}
		})))
	mux.HandleFunc("POST /v1/operators", h.admin(h.addOperator))
	mux.HandleFunc("GET /v1/operators", h.admin(listAs(h, "operators", d.Store.ListOperators, operatorFrom)))
	mux.HandleFunc("DELETE /v1/operators/{name}",
		h.admin(h.deleteBy("name", "operator named", d.Store.RemoveOperator, true,
			func(r *http.Request, name string) store.AuditEvent {
				return store.AuditEvent{Kind: "operator_remove", Operator: name, Remote: r.RemoteAddr, Result: "ok"}
			})))
	mux.HandleFunc("PATCH /v1/operators/{name}", h.admin(h.editOperator))
	mux.HandleFunc("POST /v1/operators/{name}/keys", h.admin(h.addOperatorKey))
	mux.HandleFunc("DELETE /v1/operators/{name}/keys/{fingerprint}", h.admin(h.removeOperatorKey))
	mux.HandleFunc("POST /v1/apitokens", h.admin(h.createAPIToken))
	mux.HandleFunc("GET /v1/apitokens", h.admin(listAs(h, "API tokens", d.Store.ListAPITokens, apiTokenFrom)))
	mux.HandleFunc("DELETE /v1/apitokens/{id}",
		h.admin(h.deleteBy("id", "API token with id", d.Store.DeleteAPIToken, false,
			func(r *http.Request, id string) store.AuditEvent {
				return store.AuditEvent{Kind: "apitoken_remove", Remote: r.RemoteAddr, Result: "ok", Detail: "API token " + id}
			})))
	for _, f := range d.Features {
		f.Register(mux)
	}
	if d.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{}).ServeHTTP)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.writeErr(w, r, fail(ErrNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// routeMux is the API's route table: a ServeMux that remembers its
// patterns, so a test can hold the OpenAPI document to the routes actually
// served, and that hands features the API's authentication and error
// answers (route.Routes).
type routeMux struct {
	*http.ServeMux
	h        *handler
	patterns []string
}

var _ route.Routes = (*routeMux)(nil)

// Handle implements route.Routes.
func (m *routeMux) Handle(pattern string, f http.HandlerFunc) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, f)
}

// HandleFunc is Handle.
func (m *routeMux) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, f)
}

// Admin implements route.Routes.
func (m *routeMux) Admin(f http.HandlerFunc) http.HandlerFunc { return m.h.admin(f) }

// Automation implements route.Routes.
func (m *routeMux) Automation(f route.Handler) http.HandlerFunc { return m.h.automation(f) }

// Lister implements route.Routes.
func (m *routeMux) Lister(f route.Handler) http.HandlerFunc { return m.h.lister(f) }

// Error implements route.Routes.
func (m *routeMux) Error(w http.ResponseWriter, r *http.Request, err error) { m.h.writeErr(w, r, err) }

func writeJSON(w http.ResponseWriter, status int, v any) { route.JSON(w, status, v) }

func writeError(w http.ResponseWriter, status int, msg string) {
	route.JSON(w, status, apitype.ErrorResponse{Error: msg})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return route.Decode(w, r, v, maxBody)
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (h *handler) removeNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := h.Store.GetNodeByName(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no node named %q", name))
		return
	}
	if err == nil {
		err = h.Store.DeleteNode(r.Context(), n.ID)
	}
	if err != nil {
		h.writeErr(w, r, internal("remove node "+strconv.Quote(name), err))
		return
	}
	if h.Jobs != nil {
		h.Jobs.NodeRemoved(n.ID) // its runs that wait for it end; none passes to a namesake
	}
	if c, ok := h.Conns.Get(name); ok && c.NodeID == n.ID {
		go c.CloseWithNotice("this node was removed from the hub; re-join to come back", true)
	}
	h.audit(store.AuditEvent{Kind: "remove", Node: name, Remote: r.RemoteAddr, Result: "ok", Detail: "node id " + n.ID})
	h.Logger.Info("node removed", "node", name, "id", n.ID)
	writeJSON(w, http.StatusOK, nodeFrom(n))
}

func (h *handler) createToken(w http.ResponseWriter, r *http.Request) {
	var req apitype.TokenCreateRequest
	if !decode(w, r, &req) {
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl <= 0 || ttl > apitype.MaxTokenTTL {
		h.writeErr(w, r, fail(ErrInvalid, "ttl must be between 1s and %s", apitype.MaxTokenTTL))
		return
	}
	if req.Uses < 1 || req.Uses > apitype.MaxTokenUses {
		h.writeErr(w, r, fail(ErrInvalid, "uses must be between 1 and %d", apitype.MaxTokenUses))
		return
	}
	if err := apitype.ValidateLabels(req.Labels); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "%s", err.Error()))
		return
	}
	switch req.Kind {
	case "", store.TokenNode:
		req.Kind = store.TokenNode
	case store.TokenSite:
	default:
		h.writeErr(w, r, fail(ErrInvalid, "token kind %.32q: want %q or %q", req.Kind, store.TokenNode, store.TokenSite))
		return
	}
	hubs := h.hubAddrs(r.Context())
	if len(hubs) == 0 {
		h.writeErr(w, r, fail(errInternal, "hub has no advertised address; start it with --advertise HOST:PORT"))
		return
	}
	id, secret, err := pki.NewToken()
	if err != nil {
		h.writeErr(w, r, internal("create a join token", err))
		return
	}
	now := time.Now()
	t := store.Token{
		ID:         id,
		SecretHash: pki.HashSecret(secret),
		Labels:     req.Labels,
		UsesLeft:   req.Uses,
		ExpiresAt:  now.Add(ttl),
		CreatedAt:  now,
		Kind:       req.Kind,
	}
	if err := h.Store.CreateToken(r.Context(), t); err != nil {
		h.writeErr(w, r, internal("store the join token", err))
		return
	}
	js := pki.JoinString{Addrs: hubs, Token: id + "." + secret, CAPin: h.CA.Pin()}
	h.audit(store.AuditEvent{Kind: "token_create", Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("%s token %s: %d use(s) until %s, labels %s", req.Kind, id, req.Uses,
			t.ExpiresAt.UTC().Format(time.RFC3339), apitype.FormatLabels(req.Labels))})
	h.Logger.Info("join token created", "token_id", id, "kind", req.Kind, "uses", req.Uses, "expires", t.ExpiresAt)
	writeJSON(w, http.StatusCreated, apitype.TokenCreateResponse{ID: id, JoinString: js.String(), ExpiresAt: t.ExpiresAt})
}

// ParseAuthorizedKey parses exactly one authorized_keys line.
func ParseAuthorizedKey(line string) (gossh.PublicKey, error) {
	key, _, _, rest, err := gossh.ParseAuthorizedKey([]byte(strings.TrimSpace(line)))
	if err != nil {
		return nil, fmt.Errorf("public key: %w (want one line like `ssh-ed25519 AAAA... comment`)", err)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, errors.New(
			"public key: more than one key given; give one key per line (tether operator add --key F --key F2, " +
				"or tether operator key add)")
	}
	if _, ok := key.(*gossh.Certificate); ok {
		return nil, errors.New("public key: a certificate was given; register the plain public key")
	}
	return key, nil
}

func (h *handler) addOperator(w http.ResponseWriter, r *http.Request) {
	var req apitype.OperatorAddRequest
	if !decode(w, r, &req) {
		return
	}
	if err := pki.ValidateName(req.Name); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "operator %s", err.Error()))
		return
	}
	if strings.HasPrefix(req.Name, access.KubeOneUserPrefix) {
		// The bastion users of KubeOne clusters' identities: an operator
		// of that name would share their audit trail.
		h.writeErr(w, r, fail(ErrInvalid,
			"operator name %q: names starting with %q belong to KubeOne clusters' identities; choose another", req.Name,
			access.KubeOneUserPrefix))
		return
	}
	now := time.Now()
	o := store.Operator{Name: req.Name, Roles: req.Roles, CreatedAt: now}
	for _, line := range append([]string{req.PublicKey}, req.PublicKeys...) {
		k, err := operatorKey(line, now)
		if err != nil {
			h.writeErr(w, r, err)
			return
		}
		if slices.ContainsFunc(o.Keys, func(o store.OperatorKey) bool { return o.Fingerprint == k.Fingerprint }) {
			h.writeErr(w, r, fail(ErrInvalid, "key %s is given twice", k.Fingerprint))
			return
		}
		o.Keys = append(o.Keys, k)
	}
	o.PublicKey, o.Fingerprint = o.Keys[0].PublicKey, o.Keys[0].Fingerprint
	if len(o.Roles) == 0 {
		o.Roles = []string{roles.BuiltinAll.Name}
	}
	if !h.checkRoles(w, r, o.Roles) {
		return
	}
	if err := h.Store.AddOperator(r.Context(), o); errors.Is(err, store.ErrNameTaken) {
		h.writeErr(w, r, fail(ErrConflict,
			"operator %q or one of its keys is already registered (see `tether operator list`)", o.Name))
		return
	} else if err != nil {
		h.writeErr(w, r, internal("add operator "+strconv.Quote(o.Name), err))
		return
	}
	h.OperatorsChanged()
	fps := make([]string, 0, len(o.Keys))
	for _, k := range o.Keys {
		fps = append(fps, k.Fingerprint)
	}
	h.audit(store.AuditEvent{
		Kind:           "operator_add",
		Operator:       o.Name,
		KeyFingerprint: strings.Join(fps, ","),
		Remote:         r.RemoteAddr,
		Result:         "ok",
		Detail:         "roles " + strings.Join(o.Roles, ","),
	})
	h.Logger.Info("operator added", "operator", o.Name, "keys", fps, "roles", o.Roles)
	writeJSON(w, http.StatusCreated, operatorFrom(o))
}

// operatorKey parses one operator key for the store.
func operatorKey(line string, at time.Time) (store.OperatorKey, error) {
	key, err := ParseAuthorizedKey(line)
	if err != nil {
		return store.OperatorKey{}, fail(ErrInvalid, "%s", err.Error())
	}
	return store.OperatorKey{
		PublicKey:   strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key))),
		Fingerprint: gossh.FingerprintSHA256(key),
		AddedAt:     at,
	}, nil
}

// checkRoles answers 400 unless every name is a stored role.
func (h *handler) checkRoles(w http.ResponseWriter, r *http.Request, names []string) bool {
	known, err := h.Store.ListRoles(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("read roles", err))
		return false
	}
	for _, name := range names {
		if !slices.ContainsFunc(known, func(k store.Role) bool { return k.Name == name }) {
			h.writeErr(w, r, fail(ErrInvalid,
				"no role named %q; create it with `tether role create %s -l SELECTOR --logins LOGINS`", name, name))
			return false
		}
	}
	return true
}

// operatorByName answers 404 (or 500) and false unless name is an operator.
func (h *handler) operatorByName(w http.ResponseWriter, r *http.Request, name string) (store.Operator, bool) {
	ops, err := h.Store.ListOperators(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list operators", err))
		return store.Operator{}, false
	}
	i := slices.IndexFunc(ops, func(o store.Operator) bool { return o.Name == name })
	if i < 0 {
		h.writeErr(w, r, fail(ErrNotFound, "no operator named %q", name))
		return store.Operator{}, false
	}
	return ops[i], true
}

// editOperator replaces an operator's roles. Narrowing them ends the
// operator's live jumps to nodes the new roles no longer select.
func (h *handler) editOperator(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req apitype.OperatorEditRequest
	if !decode(w, r, &req) {
		return
	}
	if len(req.Roles) == 0 {
		h.writeErr(w, r, fail(ErrInvalid, "give at least one role (--role); to take all access away, remove the operator"))
		return
	}
	slices.Sort(req.Roles)
	req.Roles = slices.Compact(req.Roles)
	if !h.checkRoles(w, r, req.Roles) {
		return
	}
	before, ok := h.operatorByName(w, r, name)
	if !ok {
		return
	}
	if err := h.Store.SetOperatorRoles(r.Context(), name, req.Roles); errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no operator named %q", name))
		return
	} else if err != nil {
		h.writeErr(w, r, internal("edit operator "+strconv.Quote(name), err))
		return
	}
	h.OperatorsChanged()
	h.audit(store.AuditEvent{Kind: "operator_edit", Operator: name, Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("roles %s (were %s)", strings.Join(req.Roles, ","), strings.Join(before.Roles, ","))})
	h.Logger.Info("operator roles changed", "operator", name, "roles", req.Roles, "were", before.Roles)
	before.Roles = req.Roles
	writeJSON(w, http.StatusOK, operatorFrom(before))
}

func (h *handler) addOperatorKey(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req apitype.OperatorKeyAddRequest
	if !decode(w, r, &req) {
		return
	}
	k, err := operatorKey(req.PublicKey, time.Now())
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	switch err := h.Store.AddOperatorKey(r.Context(), name, k); {
	case errors.Is(err, store.ErrNotFound):
		h.writeErr(w, r, fail(ErrNotFound, "no operator named %q", name))
		return
	case errors.Is(err, store.ErrNameTaken):
		h.writeErr(w, r, fail(ErrConflict, "key %s is already registered (see `tether operator list`)", k.Fingerprint))
		return
	case err != nil:
		h.writeErr(w, r, internal("add key to operator "+strconv.Quote(name), err))
		return
	}
	h.OperatorsChanged()
	h.audit(store.AuditEvent{
		Kind:           "operator_key_add",
		Operator:       name,
		KeyFingerprint: k.Fingerprint,
		Remote:         r.RemoteAddr,
		Result:         "ok",
		Detail:         "key " + k.Fingerprint,
	})
	h.Logger.Info("operator key added", "operator", name, "key", k.Fingerprint)
	if o, ok := h.operatorByName(w, r, name); ok {
		writeJSON(w, http.StatusCreated, operatorFrom(o))
	}
}

// removeOperatorKey revokes one key: logins and live jumps with it end,
// and nodes refuse it.
func (h *handler) removeOperatorKey(w http.ResponseWriter, r *http.Request) {
	name, fp := r.PathValue("name"), r.PathValue("fingerprint")
	switch err := h.Store.RemoveOperatorKey(r.Context(), name, fp); {
	case errors.Is(err, store.ErrLastKey):
		h.writeErr(w, r, fail(ErrConflict,
			"key %s is operator %q's only key; add another first (`tether operator key add`) or remove the operator", fp, name))
		return
	case errors.Is(err, store.ErrNotFound):
		h.writeErr(w, r, fail(ErrNotFound, "operator %q has no key %s (see `tether operator list`)", name, fp))
		return
	case err != nil:
		h.writeErr(w, r, internal("remove key of operator "+strconv.Quote(name), err))
		return
	}
	h.OperatorsChanged()
	h.audit(store.AuditEvent{
		Kind:           "operator_key_remove",
		Operator:       name,
		KeyFingerprint: fp,
		Remote:         r.RemoteAddr,
		Result:         "ok",
		Detail:         "key " + fp + " revoked",
	})
	h.Logger.Info("operator key revoked", "operator", name, "key", fp)
	w.WriteHeader(http.StatusNoContent)
}

// listAs serves a store listing as a JSON array of API types.
func listAs[T, W any](
	h *handler, what string, fetch func(context.Context) ([]T, error), conv func(T) W,
) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		items, err := fetch(r.Context())
		if err != nil {
			h.writeErr(w, r, internal("list "+what, err))
			return
		}
		writeJSON(w, http.StatusOK, convertAll(items, conv))
	}
}

// list serves a store listing as a JSON array ([] rather than null).
func list[T any](fetch func(context.Context) ([]T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		items, err := fetch(r.Context())
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		if items == nil {
			items = []T{}
		}
		writeJSON(w, http.StatusOK, items)
	}
}

// deleteBy serves a DELETE of the object named by path value key: 404 with
// "no WHAT X" when missing; on success the removal is audited, and when it
// changes what operators may reach on the nodes (pushAccess), the new
// access is pushed to them.
func (h *handler) deleteBy(
	key,
	what string,
	del func(context.Context, string) error,
	pushAccess bool,
	audit func(*http.Request, string) store.AuditEvent,
) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := r.PathValue(key)
		if err := del(r.Context(), v); errors.Is(err, store.ErrNotFound) {
			h.writeErr(w, r, fail(ErrNotFound, "no %s %q", what, v))
			return
		} else if err != nil {
			h.writeErr(w, r, internal("remove "+what+" "+strconv.Quote(v), err))
			return
		}
		if pushAccess {
			h.OperatorsChanged()
		}
		h.audit(audit(r, v))
		w.WriteHeader(http.StatusNoContent)
	}
}

// audit appends e (the store stamps its time); a failure is logged, never
// fatal to the request.
func (h *handler) audit(e store.AuditEvent) {
	if err := h.Store.AppendAudit(context.Background(), e); err != nil {
		h.Logger.Error("audit", "kind", e.Kind, "err", err)
	}
}

func (h *handler) revokeNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := h.Store.GetNodeByName(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no node named %q", name))
		return
	}
	if err == nil {
		err = h.Store.RevokeNode(r.Context(), n.ID, time.Now())
	}
	if err != nil {
		h.writeErr(w, r, internal("revoke node "+strconv.Quote(name), err))
		return
	}
	// Durable first, then the live session: a reconnect is refused from now on.
	if h.NodeRevoked != nil {
		h.NodeRevoked(n.ID)
	} else if c, ok := h.Conns.Get(name); ok && c.NodeID == n.ID {
		go c.CloseWithNotice("this node was revoked on the hub; re-join with a new join string", true)
	}
	h.audit(store.AuditEvent{Kind: "revoke", Node: name, Remote: r.RemoteAddr, Result: "ok", Detail: "node id " + n.ID})
	h.Logger.Info("node revoked", "node", name, "id", n.ID)
	if revoked, err := h.Store.GetNode(r.Context(), n.ID); err == nil {
		n = revoked
	}
	writeJSON(w, http.StatusOK, nodeFrom(n))
}

func (h *handler) putRole(w http.ResponseWriter, r *http.Request) {
	var req apitype.RolePutRequest
	if !decode(w, r, &req) {
		return
	}
	role := roles.Role{Name: r.PathValue("name"), Nodes: req.Nodes, Logins: req.Logins,
		NoForwarding: req.Forwarding != nil && !*req.Forwarding, Confirm: req.Confirm, Services: req.Services}
	if role.Name == access.RoleOnboarder {
		h.writeErr(w, r, fail(ErrInvalid,
			"role name %q is the built-in permission of onboarding credentials; choose another name", role.Name))
		return
	}
	if err := role.Validate(); err != nil {
		h.writeErr(w, r, fail(ErrInvalid, "%s", clean(err)))
		return
	}
	if err := h.Store.PutRole(r.Context(), store.Role(role)); err != nil {
		h.writeErr(w, r, internal("store role "+strconv.Quote(role.Name), err))
		return
	}
	h.OperatorsChanged()
	h.audit(store.AuditEvent{Kind: "role_put", Remote: r.RemoteAddr, Result: "ok",
		Detail: fmt.Sprintf("%s: nodes %q logins %s forwarding %t confirm %t services %s", role.Name, role.Nodes,
			strings.Join(role.Logins, ","), !role.NoForwarding, role.Confirm, strings.Join(role.Services, ","))})
	writeJSON(w, http.StatusOK, roleFrom(store.Role(role)))
}

func (h *handler) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.AuditFilter{Node: q.Get("node"), Operator: q.Get("operator"), Kind: q.Get("kind")}
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				h.writeErr(w, r, fail(ErrInvalid, "%s %q: want RFC 3339 time, e.g. 2026-01-02T15:04:05Z", p.name, v))
				return
			}
			*p.t = t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			h.writeErr(w, r, fail(ErrInvalid, "limit %q: want 1..10000", v))
			return
		}
		f.Limit = n
	}
	events, err := h.Store.ListAudit(r.Context(), f)
	if err != nil {
		h.writeErr(w, r, internal("read the audit log", err))
		return
	}
	writeJSON(w, http.StatusOK, convertAll(events, auditEventFrom))
}
