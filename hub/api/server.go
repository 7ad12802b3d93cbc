package api

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
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

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel/control"
)

// Deps is what the API handlers work on.
type Deps struct {
	Store       store.Store
	CA          *ca.CA
	Registry    *registry.Registry
	Metrics     *metrics.Metrics
	Advertise   []string      // hub addresses put into join strings
	NodeCertTTL time.Duration // lifetime of issued node certificates
	// IssueNode signs a node certificate chain (leaf first): the hub's own
	// CA, or an external step-ca.
	IssueNode func(ctx context.Context, csrDER []byte, id pki.Identity, commonName string, ttl time.Duration) ([]*x509.Certificate, error)
	// NodeCA is the root node certificates chain to (sent to joining agents).
	NodeCA *x509.Certificate
	Logger *slog.Logger
	// ReservedNames are names no node may take (the bastion's host names).
	ReservedNames []string
	// SSHTrust is published at GET /v1/ssh/trust.
	SSHTrust SSHTrust
	// Login serves tether login; nil disables it.
	Login Login
	// OperatorsChanged is called after an operator is added or removed so
	// the hub can push new authorized keys to the nodes.
	OperatorsChanged func()
	// Jobs and Blobs serve the job endpoints; nil disables them.
	Jobs  *jobs.Engine
	Blobs *jobs.Blobs
	// ProvisionLogin is the login the hub's jobs use on a node.
	ProvisionLogin func(store.Node) string
	// Cluster serves the cluster endpoints; nil disables them.
	Cluster Cluster
}

type handler struct{ Deps }

// Login issues SSH user certificates to operators who prove their key.
type Login interface {
	Challenge(ctx context.Context, operator string) (nonce string, expires time.Time, err error)
	Login(ctx context.Context, req LoginRequest, remote string) (LoginResponse, error)
}

// ErrLoginRefused is wrapped by Login errors the client caused.
var ErrLoginRefused = errors.New("login refused")

func (h *handler) loginChallenge(w http.ResponseWriter, r *http.Request) {
	var req LoginChallengeRequest
	if !decode(w, r, &req) {
		return
	}
	if h.Login == nil {
		writeError(w, http.StatusNotFound, "login is not enabled on this hub")
		return
	}
	if err := pki.ValidateName(req.Operator); err != nil {
		writeError(w, http.StatusBadRequest, "operator "+err.Error())
		return
	}
	nonce, exp, err := h.Login.Challenge(r.Context(), req.Operator)
	if errors.Is(err, ErrLoginRefused) {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, LoginChallengeResponse{Nonce: nonce, ExpiresAt: exp})
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	var req LoginRequest
	if !decode(w, r, &req) {
		return
	}
	if h.Login == nil {
		writeError(w, http.StatusNotFound, "login is not enabled on this hub")
		return
	}
	resp, err := h.Login.Login(r.Context(), req, r.RemoteAddr)
	if errors.Is(err, ErrLoginRefused) {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// NewHandler returns the API's http.Handler.
func NewHandler(d Deps) http.Handler {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.OperatorsChanged == nil {
		d.OperatorsChanged = func() {}
	}
	h := &handler{d}
	mux := &routeMux{ServeMux: http.NewServeMux()}
	mux.HandleFunc("POST "+control.JoinPath, h.join)
	mux.HandleFunc("POST /v1/login/challenge", h.loginChallenge)
	mux.HandleFunc("POST /v1/login", h.login)
	mux.HandleFunc("GET /v1/ssh/trust", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, h.SSHTrust) })
	mux.HandleFunc("GET /v1/nodes", h.admin(h.listNodes))
	mux.HandleFunc("DELETE /v1/nodes/{name}", h.admin(h.removeNode))
	mux.HandleFunc("POST /v1/nodes/{name}/revoke", h.admin(h.revokeNode))
	mux.HandleFunc("PUT /v1/roles/{name}", h.admin(h.putRole))
	mux.HandleFunc("GET /v1/roles", h.admin(list(d.Store.ListRoles)))
	mux.HandleFunc("DELETE /v1/roles/{name}", h.admin(h.deleteBy("name", "role named", d.Store.DeleteRole,
		func(r *http.Request, name string) store.AuditEvent {
			return store.AuditEvent{Kind: "role_remove", Remote: r.RemoteAddr, Result: "ok", Detail: name}
		})))
	mux.HandleFunc("GET /v1/audit", h.admin(h.listAudit))
	mux.HandleFunc("POST /v1/tokens", h.admin(h.createToken))
	mux.HandleFunc("GET /v1/tokens", h.admin(list(d.Store.ListTokens)))
	mux.HandleFunc("DELETE /v1/tokens/{id}", h.admin(h.deleteBy("id", "token with id", d.Store.DeleteToken, nil)))
	mux.HandleFunc("POST /v1/operators", h.admin(h.addOperator))
	mux.HandleFunc("GET /v1/operators", h.admin(list(d.Store.ListOperators)))
	mux.HandleFunc("DELETE /v1/operators/{name}", h.admin(h.deleteBy("name", "operator named", d.Store.RemoveOperator,
		func(r *http.Request, name string) store.AuditEvent {
			return store.AuditEvent{Kind: "operator_remove", Operator: name, Remote: r.RemoteAddr, Result: "ok"}
		})))
	mux.HandleFunc("POST /v1/apitokens", h.admin(h.createAPIToken))
	mux.HandleFunc("GET /v1/apitokens", h.admin(list(d.Store.ListAPITokens)))
	mux.HandleFunc("DELETE /v1/apitokens/{id}", h.admin(h.deleteBy("id", "API token with id", d.Store.DeleteAPIToken, nil)))
	mux.HandleFunc("POST /v1/blobs", h.automation(h.putBlob))
	mux.HandleFunc("POST /v1/jobs", h.automation(h.createJob))
	mux.HandleFunc("GET /v1/jobs", h.automation(h.listJobs))
	mux.HandleFunc("GET /v1/jobs/{id}", h.automation(h.getJob))
	mux.HandleFunc("GET /v1/jobs/{id}/events", h.automation(h.jobEvents))
	mux.HandleFunc("GET /v1/jobs/{id}/nodes/{node}/log", h.automation(h.nodeLog))
	mux.HandleFunc("POST /v1/jobs/{id}/cancel", h.automation(h.cancelJob))
	mux.HandleFunc("POST /v1/jobs/{id}/rerun", h.automation(h.rerunJob))
	mux.HandleFunc("GET /v1/cluster", h.admin(h.clusterStatus))
	mux.HandleFunc("PUT /v1/cluster/{node}", h.admin(h.clusterRegister))
	mux.HandleFunc("DELETE /v1/cluster/{node}", h.admin(h.clusterDeregister))
	if d.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// routeMux is a ServeMux that remembers its patterns, so a test can hold
// the OpenAPI document to the routes actually served.
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, f)
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, control.ErrorResponse{Error: msg})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return false
	}
	return true
}

// admin wraps handlers that need an admin client certificate.
func (h *handler) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, http.StatusUnauthorized, "this endpoint needs the admin client certificate (run the CLI with --data-dir on the hub machine, or --hub with --identity)")
			return
		}
		id, err := pki.IdentityOf(r.TLS.PeerCertificates[0])
		if err == nil {
			// Only the hub's own CA issues admin identities, even when an
			// external step-ca is trusted for node certificates.
			_, err = h.CA.Verify(r.TLS.PeerCertificates[0])
		}
		if err != nil || id.Kind != pki.KindAdmin {
			writeError(w, http.StatusForbidden, fmt.Sprintf("certificate %q is not an admin identity", r.TLS.PeerCertificates[0].Subject.CommonName))
			return
		}
		next(w, r)
	}
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (h *handler) join(w http.ResponseWriter, r *http.Request) {
	result := "error"
	defer func() {
		if h.Metrics != nil {
			h.Metrics.Joins.WithLabelValues(result).Inc()
		}
	}()
	var req control.JoinRequest
	if !decode(w, r, &req) {
		result = "bad_request"
		return
	}
	if err := req.Validate(); err != nil {
		result = "bad_request"
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := pki.ValidateName(req.Name); err != nil {
		result = "bad_request"
		writeError(w, http.StatusBadRequest, "node "+err.Error())
		return
	}
	if slices.Contains(h.ReservedNames, req.Name) {
		// A node's host certificate names it; it must never be valid for the
		// bastion's own names.
		result = "bad_request"
		writeError(w, http.StatusBadRequest, fmt.Sprintf("node name %q is reserved (it names the hub); choose another --name", req.Name))
		return
	}
	tokenID, secret, err := pki.SplitToken(req.Token)
	if err != nil {
		result = "refused"
		writeError(w, http.StatusForbidden, "join refused: "+err.Error())
		return
	}
	// Sign before consuming a token use so a bad CSR costs nothing; a
	// certificate whose join is then refused names a node id that never
	// reaches the store, so the hub refuses it at connect.
	if _, err := x509.ParseCertificateRequest(req.CSR); err != nil {
		result = "bad_request"
		writeError(w, http.StatusBadRequest, "join: invalid CSR: "+err.Error())
		return
	}
	nodeID := newID()
	chain, err := h.IssueNode(r.Context(), req.CSR, pki.Identity{Kind: pki.KindNode, ID: nodeID}, req.Name, h.NodeCertTTL)
	if err != nil {
		result = "bad_request"
		writeError(w, http.StatusBadRequest, "join: invalid CSR: "+err.Error())
		return
	}
	cert := chain[0]
	n := store.Node{
		ID: nodeID, Name: req.Name, Hostname: req.Facts.Hostname, OS: req.Facts.OS, Arch: req.Facts.Arch,
		MachineID: req.Facts.MachineID, AgentVersion: req.AgentVersion,
		CertSerial: cert.SerialNumber.Text(16), CertExpires: cert.NotAfter,
	}
	n, err = h.Store.Join(r.Context(), tokenID, func(t store.Token) error {
		if !pki.SecretMatches(t.SecretHash, secret) {
			return store.ErrTokenUnknown
		}
		return nil
	}, n)
	switch {
	case errors.Is(err, store.ErrTokenUnknown), errors.Is(err, store.ErrTokenExpired), errors.Is(err, store.ErrTokenUsedUp):
		result = "refused"
		h.audit(store.AuditEvent{Kind: "join", Node: req.Name, Remote: r.RemoteAddr, Result: "refused", Detail: "token " + tokenID + ": " + err.Error()})
		h.Logger.Info("join refused", "token_id", tokenID, "name", req.Name, "remote", r.RemoteAddr, "reason", err)
		writeError(w, http.StatusForbidden, "join refused: "+err.Error()+"; ask an admin for a new join string (`tether token create`)")
		return
	case errors.Is(err, store.ErrNameTaken):
		result = "conflict"
		writeError(w, http.StatusConflict, fmt.Sprintf("join refused: node name %q is already registered; choose another --name, or remove the old node with `tether nodes rm %s`", req.Name, req.Name))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, "join: "+err.Error())
		return
	}
	result = "ok"
	h.audit(store.AuditEvent{Kind: "join", Node: n.Name, Remote: r.RemoteAddr, Result: "ok", Detail: "node id " + n.ID + ", token " + tokenID})
	h.Logger.Info("node joined", "node", n.Name, "id", n.ID, "token_id", tokenID, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, control.JoinResponse{
		NodeID: n.ID, Name: n.Name,
		Cert: string(pki.EncodeCerts(chain...)), CA: string(pki.EncodeCerts(h.CA.Certificate())),
		NodeCA: string(pki.EncodeCerts(h.NodeCA)),
		Hubs:   h.Advertise,
	})
}

func (h *handler) listNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := h.Store.ListNodes(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	members, err := h.Store.ListClusterMembers(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	cluster := make(map[string]store.ClusterMember, len(members))
	for _, m := range members {
		cluster[m.NodeID] = m
	}
	for i := range nodes {
		// The registry is the truth about liveness; the store may lag.
		c, ok := h.Registry.Get(nodes[i].Name)
		nodes[i].Online = ok && c.NodeID == nodes[i].ID
		if m, ok := cluster[nodes[i].ID]; ok {
			nodes[i].ClusterEngine, nodes[i].ClusterState = m.Engine, m.State
		}
	}
	writeJSON(w, http.StatusOK, nodes)
}

func (h *handler) removeNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := h.Store.GetNodeByName(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no node named %q", name))
		return
	}
	if err == nil {
		err = h.Store.DeleteNode(r.Context(), n.ID)
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if h.Jobs != nil {
		h.Jobs.NodeRemoved(n.ID) // its runs that wait for it end; none passes to a namesake
	}
	if c, ok := h.Registry.Get(name); ok && c.NodeID == n.ID {
		go c.CloseWithNotice("this node was removed from the hub; re-join to come back", true)
	}
	h.audit(store.AuditEvent{Kind: "remove", Node: name, Remote: r.RemoteAddr, Result: "ok", Detail: "node id " + n.ID})
	h.Logger.Info("node removed", "node", name, "id", n.ID)
	writeJSON(w, http.StatusOK, n)
}

func (h *handler) createToken(w http.ResponseWriter, r *http.Request) {
	var req TokenCreateRequest
	if !decode(w, r, &req) {
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl <= 0 || ttl > MaxTokenTTL {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("ttl must be between 1s and %s", MaxTokenTTL))
		return
	}
	if req.Uses < 1 || req.Uses > MaxTokenUses {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("uses must be between 1 and %d", MaxTokenUses))
		return
	}
	if err := ValidateLabels(req.Labels); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(h.Advertise) == 0 {
		writeError(w, http.StatusInternalServerError, "hub has no advertised address; start it with --advertise HOST:PORT")
		return
	}
	id, secret, err := pki.NewToken()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	now := time.Now()
	t := store.Token{ID: id, SecretHash: pki.HashSecret(secret), Labels: req.Labels, UsesLeft: req.Uses, ExpiresAt: now.Add(ttl), CreatedAt: now}
	if err := h.Store.CreateToken(r.Context(), t); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	js := pki.JoinString{Addrs: h.Advertise, Token: id + "." + secret, CAPin: h.CA.Pin()}
	h.Logger.Info("join token created", "token_id", id, "uses", req.Uses, "expires", t.ExpiresAt)
	writeJSON(w, http.StatusCreated, TokenCreateResponse{ID: id, JoinString: js.String(), ExpiresAt: t.ExpiresAt})
}

// ParseAuthorizedKey parses exactly one authorized_keys line.
func ParseAuthorizedKey(line string) (gossh.PublicKey, error) {
	key, _, _, rest, err := gossh.ParseAuthorizedKey([]byte(strings.TrimSpace(line)))
	if err != nil {
		return nil, fmt.Errorf("public key: %w (want one line like `ssh-ed25519 AAAA... comment`)", err)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, errors.New("public key: more than one key given; add one key per operator")
	}
	if _, ok := key.(*gossh.Certificate); ok {
		return nil, errors.New("public key: a certificate was given; register the plain public key")
	}
	return key, nil
}

func (h *handler) addOperator(w http.ResponseWriter, r *http.Request) {
	var req OperatorAddRequest
	if !decode(w, r, &req) {
		return
	}
	if err := pki.ValidateName(req.Name); err != nil {
		writeError(w, http.StatusBadRequest, "operator "+err.Error())
		return
	}
	key, err := ParseAuthorizedKey(req.PublicKey)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(req.Roles) == 0 {
		req.Roles = []string{roles.BuiltinAll.Name}
	}
	known, err := h.Store.ListRoles(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	for _, name := range req.Roles {
		if !slices.ContainsFunc(known, func(k store.Role) bool { return k.Name == name }) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("no role named %q; create it with `tether role create %s --nodes SELECTOR --logins LOGINS`", name, name))
			return
		}
	}
	o := store.Operator{Name: req.Name, PublicKey: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key))),
		Fingerprint: gossh.FingerprintSHA256(key), Roles: req.Roles, CreatedAt: time.Now()}
	if err := h.Store.AddOperator(r.Context(), o); errors.Is(err, store.ErrNameTaken) {
		writeError(w, http.StatusConflict, fmt.Sprintf("operator %q or key %s is already registered", o.Name, o.Fingerprint))
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	h.OperatorsChanged()
	h.audit(store.AuditEvent{Kind: "operator_add", Operator: o.Name, KeyFingerprint: o.Fingerprint, Remote: r.RemoteAddr, Result: "ok", Detail: "roles " + strings.Join(o.Roles, ",")})
	h.Logger.Info("operator added", "operator", o.Name, "key", o.Fingerprint, "roles", o.Roles)
	writeJSON(w, http.StatusCreated, o)
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
// "no WHAT X" when missing; on success, access changes are pushed (token
// deletes change no access, so an audit func of nil also skips the push).
func (h *handler) deleteBy(key, what string, del func(context.Context, string) error, audit func(*http.Request, string) store.AuditEvent) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := r.PathValue(key)
		if err := del(r.Context(), v); errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("no %s %q", what, v))
			return
		} else if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		if audit != nil {
			h.OperatorsChanged()
			h.audit(audit(r, v))
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

func (h *handler) audit(e store.AuditEvent) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if err := h.Store.AppendAudit(context.Background(), e); err != nil {
		h.Logger.Error("audit", "kind", e.Kind, "err", err)
	}
}

func (h *handler) revokeNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := h.Store.GetNodeByName(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no node named %q", name))
		return
	}
	if err == nil {
		err = h.Store.RevokeNode(r.Context(), n.ID, time.Now())
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// Durable first, then the live session: a reconnect is refused from now on.
	if c, ok := h.Registry.Get(name); ok && c.NodeID == n.ID {
		go c.CloseWithNotice("this node was revoked on the hub; re-join with a new join string", true)
	}
	h.audit(store.AuditEvent{Kind: "revoke", Node: name, Remote: r.RemoteAddr, Result: "ok", Detail: "node id " + n.ID})
	h.Logger.Info("node revoked", "node", name, "id", n.ID)
	n, _ = h.Store.GetNode(r.Context(), n.ID)
	writeJSON(w, http.StatusOK, n)
}

func (h *handler) putRole(w http.ResponseWriter, r *http.Request) {
	var req RolePutRequest
	if !decode(w, r, &req) {
		return
	}
	role := roles.Role{Name: r.PathValue("name"), Nodes: req.Nodes, Logins: req.Logins}
	if err := role.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.Store.PutRole(r.Context(), store.Role(role)); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	h.OperatorsChanged()
	h.audit(store.AuditEvent{Kind: "role_put", Remote: r.RemoteAddr, Result: "ok", Detail: fmt.Sprintf("%s: nodes %q logins %s", role.Name, role.Nodes, strings.Join(role.Logins, ","))})
	writeJSON(w, http.StatusOK, role)
}

func (h *handler) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.AuditFilter{Node: q.Get("node"), Operator: q.Get("operator")}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("since %q: want RFC 3339 time, e.g. 2026-01-02T15:04:05Z", v))
			return
		}
		f.Since = t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want 1..10000", v))
			return
		}
		f.Limit = n
	}
	events, err := h.Store.ListAudit(r.Context(), f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, events)
}
