// Package ui is the hub's web console: a small JavaScript app embedded in
// the tether binary, served on the API's port under /ui/.
//
// Nobody signs in with a password. `tether ui`, run with the operator's
// `tether login` identity (or on the hub machine as its local admin), asks
// POST /v1/console/codes for a one-time code valid a minute; the browser
// trades it at /ui/signin for a session cookie (HttpOnly, Secure,
// SameSite=Strict, __Host- prefixed) that lasts hours. Every request
// re-checks the session's operator against the hub's access state, so
// removing the operator, revoking their key or `tether ca revoke-admin` ends
// the session at its next request.
//
// The console serves the API's own endpoints (/ui/api/v1/...) with the
// session's caller in the request context (api.WithConsoleCaller), so it
// grants exactly what the API grants the same person. What the API has no
// endpoint for is here: the paged fleet view (fleet.go), its live updates,
// and the browser terminal (terminal.go), which goes through the one door
// (hub/access) like `ssh -J`. NewHub (hub.go) is the console's hold on a
// running hub: who signs in, whether a session may still act, the shell.
package ui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
)

//go:embed assets
var assets embed.FS

// Defaults of Config.
const (
	DefaultCodeTTL    = time.Minute
	DefaultSessionTTL = 8 * time.Hour
	// CookieName carries the session. The __Host- prefix makes browsers
	// refuse it unless it is Secure, for path / and without a Domain.
	CookieName = "__Host-tether_console"
	// CSRFHeader carries the session's CSRF token on state-changing requests.
	CSRFHeader = "X-CSRF-Token"
)

// ContentSecurityPolicy is sent with every console response: only the
// console's own scripts, styles, images and connections; no framing, no
// inline script, no plugins.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Identity is who asked for a sign-in code, from their TLS client
// certificate.
type Identity struct {
	Operator string // "" for the hub machine's local admin
	KeyTag   string // the operator's key the certificate was issued over
	Admin    bool
}

// Hub is what the console needs from the hub it is part of.
type Hub interface {
	// Identify names the holder of the request's client certificate: an
	// admin certificate or an operator's API certificate, valid now.
	Identify(r *http.Request) (Identity, error)
	// Caller is the caller a stored session acts as now, or why it may no
	// longer act (operator removed, key revoked, admin certificates
	// revoked after it began).
	Caller(s store.ConsoleSession) (access.Caller, error)
	// OpenTerminal opens a shell on a node for the browser terminal.
	OpenTerminal(ctx context.Context, req TerminalRequest) (Shell, error)
}

// Config configures the console.
type Config struct {
	Store store.Store
	Door  *access.Door
	Conns *nodeconn.Table
	Hub   Hub
	// API is the hub's API handler, served to signed-in browsers.
	API http.Handler
	// StaleAfter: a node whose agent has been silent this long on a live
	// session is shown stale (default 45s; the hub passes two keepalive intervals).
	StaleAfter time.Duration
	// FleetCacheTTL bounds how old the node list the fleet view filters
	// may be (liveness is always current); default 3s.
	FleetCacheTTL time.Duration
	CodeTTL       time.Duration
	SessionTTL    time.Duration
	Audit         func(store.AuditEvent)
	Logger        *slog.Logger
	// Upgrades, when true, shows the upgrades page (the hub serves
	// /v1/upgrades).
	Upgrades bool
}

// Console serves /ui/ and /v1/console/.
type Console struct {
	cfg    Config
	static http.Handler
	fleet  *fleet
	mux    *http.ServeMux
}

// New builds the console.
func New(cfg Config) (*Console, error) {
	if cfg.Store == nil || cfg.Door == nil || cfg.Conns == nil || cfg.Hub == nil || cfg.API == nil {
		return nil, errors.New("ui: Store, Door, Conns, Hub and API are required")
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 45 * time.Second
	}
	if cfg.FleetCacheTTL <= 0 {
		cfg.FleetCacheTTL = 3 * time.Second
	}
	if cfg.CodeTTL <= 0 {
		cfg.CodeTTL = DefaultCodeTTL
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Audit == nil {
		cfg.Audit = func(store.AuditEvent) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("ui: embedded assets: %w", err)
	}
	c := &Console{
		cfg:    cfg,
		static: http.StripPrefix("/ui/assets/", http.FileServer(http.FS(sub))),
		mux:    http.NewServeMux(),
	}
	c.fleet = newFleet(cfg)
	c.mux.HandleFunc("POST /v1/console/codes", c.createCode)
	c.mux.HandleFunc("GET /ui/signin", c.signin)
	c.mux.HandleFunc("POST /ui/signout", c.session(c.signout))
	c.mux.HandleFunc("GET /ui/api/me", c.session(c.me))
	c.mux.HandleFunc("GET /ui/api/fleet", c.session(c.fleetPage))
	c.mux.HandleFunc("GET /ui/api/fleet/events", c.session(c.fleetEvents))
	c.mux.HandleFunc("GET /ui/api/fleet/nodes/{name}", c.session(c.nodeDetail))
	c.mux.HandleFunc("GET /ui/api/terminal", c.session(c.terminal))
	c.mux.HandleFunc("/ui/api/v1/", c.session(c.api))
	c.mux.HandleFunc("GET /ui/assets/", c.asset)
	c.mux.HandleFunc("GET /ui/{$}", c.index)
	c.mux.HandleFunc("GET /ui",
		func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusSeeOther) })
	c.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		// Client-side routes (/ui/nodes/N, /ui/jobs/ID …) load the app.
		if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/ui/api/") {
			c.index(w, r)
			return
		}
		writeErr(w, http.StatusNotFound, "no such console endpoint: "+r.Method+" "+r.URL.Path)
	})
	return c, nil
}

// Handles reports whether path belongs to the console.
func Handles(path string) bool {
	return path == "/ui" || strings.HasPrefix(path, "/ui/") || strings.HasPrefix(path, "/v1/console/")
}

func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/ui/assets/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	b, err := assets.ReadFile("assets/index.html")
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "console assets missing from this build")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b)
}

func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	// Assets are embedded in the binary: they change only with it.
	w.Header().Set("Cache-Control", "private, max-age=3600")
	c.static.ServeHTTP(w, r)
}

// --- sign-in -----------------------------------------------------------

func (c *Console) createCode(w http.ResponseWriter, r *http.Request) {
	id, err := c.cfg.Hub.Identify(r)
	if err != nil {
		c.cfg.Audit(store.AuditEvent{Kind: "console_code", Remote: r.RemoteAddr, Result: "refused", Detail: err.Error()})
		writeErr(w, http.StatusForbidden, "console sign-in code refused: "+err.Error())
		return
	}
	code, hash := newSecret()
	now := time.Now()
	cc := store.ConsoleCode{
		Hash:      hash,
		Operator:  id.Operator,
		KeyTag:    id.KeyTag,
		Admin:     id.Admin,
		CreatedAt: now,
		ExpiresAt: now.Add(c.cfg.CodeTTL),
	}
	if err := c.cfg.Store.CreateConsoleCode(r.Context(), cc); err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	c.cfg.Audit(store.AuditEvent{Kind: "console_code", Operator: whoOf(id.Operator), Remote: r.RemoteAddr, Result: "ok",
		Detail: "one-time console sign-in code until " + cc.ExpiresAt.UTC().Format(time.RFC3339)})
	writeJSON(w, http.StatusCreated, apitype.ConsoleCodeResponse{
		Code:      code,
		URL:       "https://" + r.Host + "/ui/signin?code=" + code,
		ExpiresAt: cc.ExpiresAt,
		Operator:  id.Operator,
	})
}

func whoOf(operator string) string {
	if operator == "" {
		return "local-admin"
	}
	return operator
}

// signin trades a one-time code for a session. A code works once: it is
// deleted as it is read, valid or not.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	code := r.URL.Query().Get("code")
	refuse := func(why string) {
		c.cfg.Audit(store.AuditEvent{Kind: "console_signin", Remote: r.RemoteAddr, Result: "refused", Detail: why})
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, "<!doctype html><title>Tether console</title><h1>Sign-in refused</h1><p>%s</p>"+
			"<p>Run <code>tether ui</code> again for a new link.</p>", html.EscapeString(why))
	}
	if code == "" || len(code) > 100 {
		refuse("This sign-in link has no valid code.")
		return
	}
	cc, err := c.cfg.Store.TakeConsoleCode(r.Context(), hashOf(code), time.Now())
	switch {
	case errors.Is(err, store.ErrNotFound):
		refuse("This sign-in link was already used or is unknown: each link signs in once.")
		return
	case errors.Is(err, store.ErrExpired):
		refuse("This sign-in link has expired: links are valid for a minute.")
		return
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	now := time.Now()
	cookie, hash := newSecret()
	csrf, _ := newSecret()
	sess := store.ConsoleSession{
		Hash:      hash,
		Operator:  cc.Operator,
		KeyTag:    cc.KeyTag,
		Admin:     cc.Admin,
		CSRF:      csrf,
		CreatedAt: now,
		ExpiresAt: now.Add(c.cfg.SessionTTL),
	}
	if _, err := c.cfg.Hub.Caller(sess); err != nil {
		refuse("The operator may no longer sign in: " + err.Error())
		return
	}
	if err := c.cfg.Store.CreateConsoleSession(r.Context(), sess); err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	_ = c.cfg.Store.PruneConsole(r.Context(), now)
	c.cfg.Audit(store.AuditEvent{Kind: "console_signin", Operator: whoOf(cc.Operator), Remote: r.RemoteAddr, Result: "ok",
		Detail: "console session until " + sess.ExpiresAt.UTC().Format(time.RFC3339)})
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: cookie, Path: "/", HttpOnly: true, Secure: true,
		SameSite: http.SameSiteStrictMode, Expires: sess.ExpiresAt, MaxAge: int(c.cfg.SessionTTL / time.Second)})
	// Redirect, so the code leaves the address bar and the history.
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, s *signedIn) {
	_ = c.cfg.Store.DeleteConsoleSession(r.Context(), s.sess.Hash)
	c.cfg.Audit(store.AuditEvent{
		Kind:     "console_signout",
		Operator: whoOf(s.sess.Operator),
		Remote:   r.RemoteAddr,
		Result:   "ok",
	})
	http.SetCookie(w, &http.Cookie{
		Name:     CookieName,
		Value:    "",
		Path:     "/",
		HttpOnly: true,
		Secure:   true,
		SameSite: http.SameSiteStrictMode,
		MaxAge:   -1,
	})
	w.WriteHeader(http.StatusNoContent)
}

// Me answers GET /ui/api/me.
type Me struct {
	Operator string `json:"operator"`
	Admin    bool   `json:"admin"`
	CSRF     string `json:"csrf"`
	Expires  string `json:"expires"`
	Upgrades bool   `json:"upgrades"`
}

func (c *Console) me(w http.ResponseWriter, r *http.Request, s *signedIn) {
	writeJSON(w, http.StatusOK, Me{Operator: whoOf(s.sess.Operator), Admin: s.caller.Admin, CSRF: s.sess.CSRF,
		Expires: s.sess.ExpiresAt.UTC().Format(time.RFC3339), Upgrades: c.cfg.Upgrades})
}

// signedIn is a request's session and the caller it acts as.
type signedIn struct {
	sess   store.ConsoleSession
	caller access.Caller
}

// session wraps handlers for signed-in browsers: a valid session cookie,
// a caller the hub still accepts, and on every state-changing request the
// session's CSRF token and a same-origin Origin.
func (c *Console) session(next func(http.ResponseWriter, *http.Request, *signedIn)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, err := c.signedIn(r)
		if err != nil {
			writeErr(w, http.StatusUnauthorized, err.Error())
			return
		}
		if stateChanging(r.Method) {
			if err := checkCSRF(r, s.sess.CSRF); err != nil {
				c.cfg.Audit(store.AuditEvent{Kind: "console_csrf", Operator: whoOf(s.sess.Operator), Remote: r.RemoteAddr,
					Result: "refused", Detail: r.Method + " " + r.URL.Path + ": " + err.Error()})
				writeErr(w, http.StatusForbidden, err.Error())
				return
			}
		}
		next(w, r, s)
	}
}

func (c *Console) signedIn(r *http.Request) (*signedIn, error) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" {
		return nil, errors.New("not signed in: run `tether ui` for a sign-in link")
	}
	sess, err := c.cfg.Store.GetConsoleSession(r.Context(), hashOf(ck.Value), time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return nil, errors.New("console session ended or unknown: run `tether ui` for a new sign-in link")
	}
	if err != nil {
		return nil, err
	}
	caller, err := c.cfg.Hub.Caller(sess)
	if err != nil {
		return nil, fmt.Errorf("console session refused: %w", err)
	}
	return &signedIn{sess: sess, caller: caller}, nil
}

func stateChanging(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// checkCSRF: the session's token in the X-CSRF-Token header (a page of
// another site can neither read the token nor set the header on a
// cross-site request), and an Origin, when the browser sends one, of this
// host.
func checkCSRF(r *http.Request, token string) error {
	got := r.Header.Get(CSRFHeader)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
		return fmt.Errorf("CSRF token missing or wrong (%s header): reload the console", CSRFHeader)
	}
	if o := r.Header.Get("Origin"); o != "" && o != "https://"+r.Host {
		return fmt.Errorf("request from origin %q refused: the console only accepts its own pages' requests", o)
	}
	return nil
}

// apiPrefixes are the API endpoints the console serves; everything else
// of the API (joins, logins, tokens, operators) stays CLI-only.
var apiPrefixes = []string{"/v1/nodes", "/v1/jobs", "/v1/audit", "/v1/upgrades"}

func (c *Console) api(w http.ResponseWriter, r *http.Request, s *signedIn) {
	path := strings.TrimPrefix(r.URL.Path, "/ui/api")
	ok := false
	for _, p := range apiPrefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			ok = true
		}
	}
	if !ok {
		writeErr(w, http.StatusNotFound, "the console does not serve "+path)
		return
	}
	r2 := r.Clone(api.WithConsoleCaller(r.Context(), s.caller))
	r2.URL.Path, r2.URL.RawPath = path, ""
	c.cfg.API.ServeHTTP(w, r2)
}

// newSecret returns a random URL-safe secret and its hash as stored.
func newSecret() (secret, hash string) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	secret = base64.RawURLEncoding.EncodeToString(b)
	return secret, hashOf(secret)
}

func hashOf(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
