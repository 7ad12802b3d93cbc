// Package apiclient is the Go client of the hub's HTTP API, used by the
// CLI, the e2e tests and the benchmarks: it authenticates with the admin
// identity (mTLS), an operator's API certificate or an API token, and
// speaks the wire types of hub/api/apitype, so it links none of the hub's
// handlers.
package apiclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
)

// Client talks to the hub API with the admin identity.
type Client struct {
	base   string
	http   *http.Client
	stream *http.Client // no overall timeout: event streams last as long as a job
	bearer string       // API token, if the client authenticates with one
}

// ErrHubNotRunning means the local hub info file is missing.
var ErrHubNotRunning = errors.New("no running hub found")

// NewLocalClient builds a client from a hub data dir: the address comes
// from hub.json, the identity from admin/.
func NewLocalClient(dataDir string) (*Client, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, apitype.HubInfoFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf(
			"%w in %s: start it with `tether hub --data-dir %s`, or pass --hub ADDR after `tether login`",
			ErrHubNotRunning,
			dataDir,
			dataDir,
		)
	}
	if err != nil {
		return nil, err
	}
	var info apitype.HubInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dataDir, apitype.HubInfoFile), err)
	}
	if info.PID > 0 {
		// kill(pid, 0): ESRCH means the hub that wrote hub.json is gone
		// (killed without cleanup); EPERM means it runs as another user.
		if err := syscall.Kill(info.PID, 0); errors.Is(err, syscall.ESRCH) {
			return nil, fmt.Errorf(
				"%w: %s names pid %d, which has exited; start the hub with `tether hub --data-dir %s`",
				ErrHubNotRunning,
				filepath.Join(dataDir, apitype.HubInfoFile),
				info.PID,
				dataDir,
			)
		}
	}
	return NewClient(info.API, filepath.Join(dataDir, apitype.AdminDir))
}

// NewClient builds a client for the hub at addr using the admin identity in
// identityDir (admin.crt, admin.key, ca.crt: from `tether login`, or the
// hub's DATA_DIR/admin on the hub machine).
func NewClient(addr, identityDir string) (*Client, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("hub address %q: %w (want HOST:PORT)", addr, err)
	}
	cert, ca, err := LoadAdminIdentity(identityDir)
	if err != nil {
		return nil, err
	}
	return NewClientTLS(addr, pki.ClientTLSConfig(cert, ca)), nil
}

// NewClientTLS builds a client with the given TLS config (for operators
// without an admin identity, e.g. tether login with a pinned CA).
func NewClientTLS(addr string, tc *tls.Config) *Client {
	tc = tc.Clone()
	tc.NextProtos = []string{"h2", "http/1.1"}
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true, TLSHandshakeTimeout: 10 * time.Second}
	return &Client{
		base:   "https://" + addr,
		http:   &http.Client{Transport: tr, Timeout: 60 * time.Second},
		stream: &http.Client{Transport: tr},
	}
}

// NewTokenClient builds a client that authenticates with an API token
// (`tether apitoken create`); caFile holds the hub CA certificate (PEM)
// the hub's TLS certificate is verified against.
func NewTokenClient(addr, caFile, token string) (*Client, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("hub address %q: %w (want HOST:PORT)", addr, err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("load hub CA: %w", err)
	}
	cas, err := pki.ParseCerts(caPEM)
	if err != nil {
		return nil, fmt.Errorf("load hub CA %s: %w", caFile, err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	c := NewClientTLS(addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: pki.HubServerName})
	c.bearer = strings.TrimSpace(token)
	return c, nil
}

// LocalHub returns the API address of the hub running on dataDir.
func LocalHub(dataDir string) (apitype.HubInfo, error) {
	var info apitype.HubInfo
	b, err := os.ReadFile(filepath.Join(dataDir, apitype.HubInfoFile))
	if errors.Is(err, os.ErrNotExist) {
		return info, fmt.Errorf(
			"%w in %s: start it with `tether hub --data-dir %s`",
			ErrHubNotRunning,
			dataDir,
			dataDir,
		)
	}
	if err != nil {
		return info, err
	}
	return info, json.Unmarshal(b, &info)
}

// LoginChallenge asks for a nonce to sign.
func (c *Client) LoginChallenge(ctx context.Context, operator string) (apitype.LoginChallengeResponse, error) {
	var out apitype.LoginChallengeResponse
	return out, c.do(
		ctx,
		http.MethodPost,
		"/v1/login/challenge",
		apitype.LoginChallengeRequest{Operator: operator},
		&out,
	)
}

// Login exchanges the signed nonce for a user certificate.
func (c *Client) Login(ctx context.Context, req apitype.LoginRequest) (apitype.LoginResponse, error) {
	var out apitype.LoginResponse
	return out, c.do(ctx, http.MethodPost, "/v1/login", req, &out)
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	c.authorize(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("hub API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return apiError(resp, b)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return nil
}

func (c *Client) authorize(req *http.Request) {
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
}

func apiError(resp *http.Response, body []byte) error {
	var e apitype.ErrorResponse
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		e.Error = fmt.Sprintf("hub answered %s", resp.Status)
	}
	return &apitype.Error{Status: resp.StatusCode, Message: e.Error}
}

// CreateToken creates a join token.
func (c *Client) CreateToken(ctx context.Context, req apitype.TokenCreateRequest) (apitype.TokenCreateResponse, error) {
	var out apitype.TokenCreateResponse
	return out, c.do(ctx, http.MethodPost, "/v1/tokens", req, &out)
}

// ListTokens lists join tokens.
func (c *Client) ListTokens(ctx context.Context) ([]apitype.Token, error) {
	var out []apitype.Token
	return out, c.do(ctx, http.MethodGet, "/v1/tokens", nil, &out)
}

// DeleteToken revokes a join token.
func (c *Client) DeleteToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// SSHTrust fetches the SSH CA keys and bastion address.
func (c *Client) SSHTrust(ctx context.Context) (apitype.SSHTrust, error) {
	var out apitype.SSHTrust
	return out, c.do(ctx, http.MethodGet, "/v1/ssh/trust", nil, &out)
}

// ListNodes lists nodes.
func (c *Client) ListNodes(ctx context.Context) ([]apitype.Node, error) {
	var out []apitype.Node
	return out, c.do(ctx, http.MethodGet, "/v1/nodes", nil, &out)
}

// RemoveNode deletes a node and closes its tunnel.
func (c *Client) RemoveNode(ctx context.Context, name string) (apitype.Node, error) {
	var out apitype.Node
	return out, c.do(ctx, http.MethodDelete, "/v1/nodes/"+url.PathEscape(name), nil, &out)
}

// RevokeNode revokes a node: its tunnel closes and it can never reconnect.
func (c *Client) RevokeNode(ctx context.Context, name string) (apitype.Node, error) {
	var out apitype.Node
	return out, c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/revoke", nil, &out)
}

// PutRole creates or replaces a role.
func (c *Client) PutRole(ctx context.Context, name string, req apitype.RolePutRequest) (apitype.Role, error) {
	var out apitype.Role
	return out, c.do(ctx, http.MethodPut, "/v1/roles/"+url.PathEscape(name), req, &out)
}

// ListRoles lists roles.
func (c *Client) ListRoles(ctx context.Context) ([]apitype.Role, error) {
	var out []apitype.Role
	return out, c.do(ctx, http.MethodGet, "/v1/roles", nil, &out)
}

// DeleteRole deletes a role.
func (c *Client) DeleteRole(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/roles/"+url.PathEscape(name), nil, nil)
}

// AuditQuery filters ListAudit.
type AuditQuery struct {
	Node, Operator string
	Since          time.Time
	Limit          int
}

// ListAudit reads the audit log.
func (c *Client) ListAudit(ctx context.Context, q AuditQuery) ([]apitype.AuditEvent, error) {
	v := url.Values{}
	if q.Node != "" {
		v.Set("node", q.Node)
	}
	if q.Operator != "" {
		v.Set("operator", q.Operator)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var out []apitype.AuditEvent
	return out, c.do(ctx, http.MethodGet, "/v1/audit?"+v.Encode(), nil, &out)
}

// AddOperator registers an operator key.
func (c *Client) AddOperator(ctx context.Context, req apitype.OperatorAddRequest) (apitype.Operator, error) {
	var out apitype.Operator
	return out, c.do(ctx, http.MethodPost, "/v1/operators", req, &out)
}

// ListOperators lists operators.
func (c *Client) ListOperators(ctx context.Context) ([]apitype.Operator, error) {
	var out []apitype.Operator
	return out, c.do(ctx, http.MethodGet, "/v1/operators", nil, &out)
}

// RemoveOperator deletes an operator.
func (c *Client) RemoveOperator(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/operators/"+url.PathEscape(name), nil, nil)
}

// AddOperatorKey registers one more key for an operator.
func (c *Client) AddOperatorKey(
	ctx context.Context,
	name string,
	req apitype.OperatorKeyAddRequest,
) (apitype.Operator, error) {
	var out apitype.Operator
	return out, c.do(ctx, http.MethodPost, "/v1/operators/"+url.PathEscape(name)+"/keys", req, &out)
}

// RemoveOperatorKey revokes one of an operator's keys, by fingerprint
// (SHA256:…).
func (c *Client) RemoveOperatorKey(ctx context.Context, name, fingerprint string) error {
	return c.do(
		ctx,
		http.MethodDelete,
		"/v1/operators/"+url.PathEscape(name)+"/keys/"+url.PathEscape(fingerprint),
		nil,
		nil,
	)
}

// EditOperator replaces an operator's roles.
func (c *Client) EditOperator(
	ctx context.Context,
	name string,
	req apitype.OperatorEditRequest,
) (apitype.Operator, error) {
	var out apitype.Operator
	return out, c.do(ctx, http.MethodPatch, "/v1/operators/"+url.PathEscape(name), req, &out)
}
