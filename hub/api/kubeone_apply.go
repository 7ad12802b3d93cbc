package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/hub/store"
)

// KubeOneRuns runs KubeOne for the hub's clusters and reaches their API
// servers through the tunnels (the hub's kubeone_apply.go). Errors wrap
// the kubeone package's kinds (kubeoneErr maps them).
type KubeOneRuns interface {
	// Start starts `kubeone apply|reset` for the cluster as a job.
	Start(ctx context.Context, cluster string, req KubeOneRunRequest, by string) (store.Job, error)
	// Kubeconfig is the cluster-admin kubeconfig from the first connected
	// control-plane member, as kubeadm wrote it.
	Kubeconfig(ctx context.Context, cluster string) ([]byte, error)
	// DialAPIServer connects to the cluster's kube-apiserver through the
	// first connected control-plane member.
	DialAPIServer(ctx context.Context, cluster string) (net.Conn, error)
}

// KubeOneRunRequest is the body of POST /v1/kubeone/{name}/apply and
// /reset (Action is filled from the path).
type KubeOneRunRequest struct {
	Action string `json:"-"`
	// Auto starts the run once every member's tunnel is up, instead of
	// refusing while one is not (apply only).
	Auto           bool `json:"auto,omitempty"`
	TimeoutSeconds int  `json:"timeout_seconds,omitempty"` // default 3600
}

// kubeoneApplyRoutes adds the endpoints that run KubeOne and reach a
// cluster's API server. All are admin-only: a run acts as the cluster's
// identity on every member, and the kubeconfig is the cluster's admin.
func (h *handler) kubeoneApplyRoutes(mux *routeMux) {
	mux.HandleFunc("POST /v1/kubeone/{name}/apply", h.admin(h.kubeoneRun("apply")))
	mux.HandleFunc("POST /v1/kubeone/{name}/reset", h.admin(h.kubeoneRun("reset")))
	mux.HandleFunc("GET /v1/kubeone/{name}/kubeconfig", h.admin(h.kubeoneKubeconfig))
	mux.HandleFunc("POST /v1/kubeone/{name}/proxy", h.admin(h.kubeoneProxy))
}

func (h *handler) kubeoneRunsEnabled(w http.ResponseWriter) bool {
	if h.KubeOneRuns == nil || h.Jobs == nil {
		writeError(w, http.StatusNotFound, "KubeOne runs are not enabled on this hub")
		return false
	}
	return true
}

func (h *handler) kubeoneRun(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req KubeOneRunRequest
		if !decode(w, r, &req) || !h.kubeoneRunsEnabled(w) {
			return
		}
		req.Action = action
		if action == "reset" && req.Auto {
			h.writeErr(w, r, fail(ErrInvalid, "--auto is for apply: a reset is started by hand"))
			return
		}
		name := r.PathValue("name")
		j, err := h.KubeOneRuns.Start(r.Context(), name, req, adminName(r))
		if err != nil {
			h.kubeoneAudit(r, "kubeone_"+action, name, "refused", ": "+err.Error())
			h.writeErr(w, r, kubeoneErr("start kubeone "+action, err))
			return
		}
		h.kubeoneAudit(r, "kubeone_"+action, name, "ok", fmt.Sprintf(": job %s (auto %v)", j.ID, req.Auto))
		writeJSON(w, http.StatusCreated, jobFrom(j))
	}
}

func (h *handler) kubeoneKubeconfig(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneRunsEnabled(w) {
		return
	}
	name := r.PathValue("name")
	b, err := h.KubeOneRuns.Kubeconfig(r.Context(), name)
	if err != nil {
		h.writeErr(w, r, kubeoneErr("fetch kubeconfig", err))
		return
	}
	// The cluster's admin credential left the hub: say so in the audit.
	h.kubeoneAudit(r, "kubeone_kubeconfig", name, "ok", "")
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b)
}

// kubeoneProxy relays one connection to the cluster's kube-apiserver: the
// request body is what the client sends, the response body what the API
// server answers, both streamed (HTTP/2, or HTTP/1.1 in full duplex).
func (h *handler) kubeoneProxy(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneRunsEnabled(w) {
		return
	}
	name := r.PathValue("name")
	conn, err := h.KubeOneRuns.DialAPIServer(r.Context(), name)
	if err != nil {
		h.writeErr(w, r, kubeoneErr("reach the API server", err))
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(r.Context(), func() { conn.Close() })
	defer stop()
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex() // HTTP/1.1; HTTP/2 is full duplex anyway
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	up := make(chan struct{})
	go func() {
		defer close(up)
		_, _ = io.Copy(conn, r.Body)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, _ = io.Copy(flushWriter{w: w, rc: rc}, conn)
	conn.Close()
	<-up
}

type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// --- client ---

// KubeOneRun starts `kubeone apply` or `reset` (action) for the cluster.
func (c *Client) KubeOneRun(ctx context.Context, cluster, action string, req KubeOneRunRequest) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodPost, "/v1/kubeone/"+url.PathEscape(cluster)+"/"+url.PathEscape(action), req, &j)
	return j, err
}

// KubeOneKubeconfig fetches the cluster's admin kubeconfig as kubeadm
// wrote it.
func (c *Client) KubeOneKubeconfig(ctx context.Context, cluster string) ([]byte, error) {
	return c.getBytes(ctx, c.http, "/v1/kubeone/"+url.PathEscape(cluster)+"/kubeconfig")
}

// KubeOneProxy serves the cluster's kube-apiserver on ln until ctx ends:
// every connection accepted is relayed through the hub. logf reports
// connections that failed.
func (c *Client) KubeOneProxy(ctx context.Context, cluster string, ln net.Listener, logf func(format string, args ...any)) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	done := make(chan struct{})
	live := 0
	defer func() {
		for range live {
			<-done
		}
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		live++
		go func() {
			defer func() { done <- struct{}{} }()
			if err := c.proxyOne(ctx, cluster, conn); err != nil && ctx.Err() == nil {
				logf("connection from %s: %v", conn.RemoteAddr(), err)
			}
		}()
	}
}

func (c *Client) proxyOne(ctx context.Context, cluster string, local net.Conn) error {
	defer local.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/kubeone/"+url.PathEscape(cluster)+"/proxy", pr)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.authorize(req)
	go func() {
		_, err := io.Copy(pw, local)
		pw.CloseWithError(err)
	}()
	resp, err := c.stream.Do(req)
	if err != nil {
		return fmt.Errorf("hub API %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return apiError(resp, b)
	}
	_, err = io.Copy(local, resp.Body)
	if errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// KubeAPIServerName is the name every kubeadm API server certificate
// carries; a kubeconfig pointed at a local proxy verifies the server
// against it (tls-server-name), since the proxy's address is not in the
// certificate.
const KubeAPIServerName = "kubernetes"

// MaxKubeconfigBytes bounds a kubeconfig RewriteKubeconfig reads.
const MaxKubeconfigBytes = 1 << 20

// RewriteKubeconfig points every cluster of a kubeconfig at server
// (https://HOST:PORT of a `tether kubeone proxy`), keeping its CA and
// credentials, and names the certificate's server name the API server's
// certificate carries.
func RewriteKubeconfig(b []byte, server string) ([]byte, error) {
	if len(b) > MaxKubeconfigBytes {
		return nil, fmt.Errorf("kubeconfig is %d bytes; the limit is %d", len(b), MaxKubeconfigBytes)
	}
	host, port, err := net.SplitHostPort(server)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("proxy address %q: want HOST:PORT", server)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	clusters, _ := doc["clusters"].([]any)
	if len(clusters) == 0 {
		return nil, errors.New("kubeconfig has no clusters")
	}
	for i, e := range clusters {
		entry, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("kubeconfig: clusters[%d] is not a mapping", i)
		}
		cl, ok := entry["cluster"].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("kubeconfig: clusters[%d].cluster is not a mapping", i)
		}
		cl["server"] = "https://" + net.JoinHostPort(host, port)
		if _, set := cl["tls-server-name"]; !set {
			cl["tls-server-name"] = KubeAPIServerName
		}
	}
	return yaml.Marshal(doc)
}
