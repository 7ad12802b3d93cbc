package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/store"
)

// The KubeOne endpoints (/v1/kubeone/…) are admin-only: a cluster's
// identity reaches every member as its login (root by default), and its
// manifest names the hub's key files.

// KubeOneMembersRequest is the body of PUT /v1/kubeone/{name}/members.
type KubeOneMembersRequest struct {
	ControlPlane []string `json:"control_plane"`
	Workers      []string `json:"workers,omitempty"`
}

// KubeOneManifest is the answer of GET /v1/kubeone/{name}/manifest.
type KubeOneManifest struct {
	Manifest string `json:"manifest"` // YAML
}

// kubeoneRoutes adds the KubeOne endpoints to mux. Further KubeOne
// endpoints (apply, reset, kubeconfig) register beside these.
func (h *handler) kubeoneRoutes(mux *routeMux) {
	mux.HandleFunc("POST /v1/kubeone", h.admin(h.kubeoneCreate))
	mux.HandleFunc("GET /v1/kubeone", h.admin(h.kubeoneList))
	mux.HandleFunc("GET /v1/kubeone/{name}", h.admin(h.kubeoneGet))
	mux.HandleFunc("DELETE /v1/kubeone/{name}", h.admin(h.kubeoneDelete))
	mux.HandleFunc("PUT /v1/kubeone/{name}/members", h.admin(h.kubeoneMembers))
	mux.HandleFunc("GET /v1/kubeone/{name}/manifest", h.admin(h.kubeoneManifest))
	mux.HandleFunc("GET /v1/kubeone/{name}/status", h.admin(h.kubeoneStatus))
}

// kubeoneEnabled answers 404 when the hub runs without the KubeOne service.
func (h *handler) kubeoneEnabled(w http.ResponseWriter) bool {
	if h.KubeOne == nil {
		writeError(w, http.StatusNotFound, "KubeOne clusters are not enabled on this hub")
		return false
	}
	return true
}

// kubeoneErr maps the service's kinds of failure to the API's, the
// message without the package prefixes.
func kubeoneErr(step string, err error) error {
	for _, k := range []struct{ service, api error }{
		{kubeone.ErrInvalid, ErrInvalid}, {kubeone.ErrNotFound, ErrNotFound}, {kubeone.ErrConflict, ErrConflict},
	} {
		if errors.Is(err, k.service) {
			msg := strings.TrimPrefix(err.Error(), k.service.Error()+": ")
			return fail(k.api, "%s", clean(errors.New(msg)))
		}
	}
	return internal(step, err)
}

func (h *handler) kubeoneAudit(r *http.Request, kind, cluster, result, detail string) {
	h.audit(store.AuditEvent{Kind: kind, Operator: adminName(r), Remote: r.RemoteAddr, Result: result, Detail: "cluster " + cluster + detail})
}

func (h *handler) kubeoneCreate(w http.ResponseWriter, r *http.Request) {
	var spec kubeone.Spec
	if !decode(w, r, &spec) || !h.kubeoneEnabled(w) {
		return
	}
	c, err := h.KubeOne.Create(r.Context(), spec)
	if err != nil {
		h.kubeoneAudit(r, "kubeone_create", spec.Name, "refused", ": "+err.Error())
		h.writeErr(w, r, kubeoneErr("create KubeOne cluster", err))
		return
	}
	h.kubeoneAudit(r, "kubeone_create", c.Name, "ok", membersDetail(c))
	writeJSON(w, http.StatusCreated, c)
}

func membersDetail(c kubeone.Cluster) string {
	d := "; control plane " + strings.Join(c.ControlPlane, ",")
	if len(c.Workers) > 0 {
		d += "; workers " + strings.Join(c.Workers, ",")
	}
	return d + "; kubernetes " + c.Kubernetes
}

func (h *handler) kubeoneList(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneEnabled(w) {
		return
	}
	list(func(ctx context.Context) ([]kubeone.Cluster, error) { return h.KubeOne.List(ctx) })(w, r)
}

func (h *handler) kubeoneGet(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneEnabled(w) {
		return
	}
	c, err := h.KubeOne.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		h.writeErr(w, r, kubeoneErr("read KubeOne cluster", err))
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (h *handler) kubeoneDelete(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneEnabled(w) {
		return
	}
	name := r.PathValue("name")
	c, err := h.KubeOne.Delete(r.Context(), name)
	if err != nil {
		h.writeErr(w, r, kubeoneErr("delete KubeOne cluster", err))
		return
	}
	h.kubeoneAudit(r, "kubeone_delete", name, "ok", membersDetail(c))
	writeJSON(w, http.StatusOK, c)
}

func (h *handler) kubeoneMembers(w http.ResponseWriter, r *http.Request) {
	var req KubeOneMembersRequest
	if !decode(w, r, &req) || !h.kubeoneEnabled(w) {
		return
	}
	name := r.PathValue("name")
	c, err := h.KubeOne.SetMembers(r.Context(), name, req.ControlPlane, req.Workers)
	if err != nil {
		h.kubeoneAudit(r, "kubeone_members", name, "refused", ": "+err.Error())
		h.writeErr(w, r, kubeoneErr("change KubeOne cluster members", err))
		return
	}
	h.kubeoneAudit(r, "kubeone_members", name, "ok", membersDetail(c))
	writeJSON(w, http.StatusOK, c)
}

// kubeoneManifest renders the manifest; ?bastion=HOST[:PORT] names the
// bastion as KubeOne run elsewhere reaches it.
func (h *handler) kubeoneManifest(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneEnabled(w) {
		return
	}
	var o kubeone.ManifestOptions
	if b := r.URL.Query().Get("bastion"); b != "" {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			host, port = b, ""
		}
		p, perr := strconv.Atoi(port)
		if host == "" || strings.ContainsAny(host, " \t\n/@") || (port != "" && (perr != nil || p <= 0 || p > 65535)) {
			h.writeErr(w, r, fail(ErrInvalid, "bastion %.80q: want HOST or HOST:PORT", b))
			return
		}
		o.BastionHost, o.BastionPort = host, p
	}
	m, err := h.KubeOne.Manifest(r.Context(), r.PathValue("name"), o)
	if err != nil {
		h.writeErr(w, r, kubeoneErr("render KubeOne manifest", err))
		return
	}
	writeJSON(w, http.StatusOK, KubeOneManifest{Manifest: string(m)})
}

func (h *handler) kubeoneStatus(w http.ResponseWriter, r *http.Request) {
	if !h.kubeoneEnabled(w) {
		return
	}
	st, err := h.KubeOne.Status(r.Context(), r.PathValue("name"))
	if err != nil {
		h.writeErr(w, r, kubeoneErr("read KubeOne cluster status", err))
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// CreateKubeOne creates a KubeOne cluster.
func (c *Client) CreateKubeOne(ctx context.Context, spec kubeone.Spec) (kubeone.Cluster, error) {
	var out kubeone.Cluster
	return out, c.do(ctx, http.MethodPost, "/v1/kubeone", spec, &out)
}

// ListKubeOne lists KubeOne clusters.
func (c *Client) ListKubeOne(ctx context.Context) ([]kubeone.Cluster, error) {
	var out []kubeone.Cluster
	return out, c.do(ctx, http.MethodGet, "/v1/kubeone", nil, &out)
}

// GetKubeOne returns one KubeOne cluster.
func (c *Client) GetKubeOne(ctx context.Context, name string) (kubeone.Cluster, error) {
	var out kubeone.Cluster
	return out, c.do(ctx, http.MethodGet, "/v1/kubeone/"+url.PathEscape(name), nil, &out)
}

// DeleteKubeOne deletes a KubeOne cluster.
func (c *Client) DeleteKubeOne(ctx context.Context, name string) (kubeone.Cluster, error) {
	var out kubeone.Cluster
	return out, c.do(ctx, http.MethodDelete, "/v1/kubeone/"+url.PathEscape(name), nil, &out)
}

// SetKubeOneMembers replaces a KubeOne cluster's members.
func (c *Client) SetKubeOneMembers(ctx context.Context, name string, req KubeOneMembersRequest) (kubeone.Cluster, error) {
	var out kubeone.Cluster
	return out, c.do(ctx, http.MethodPut, "/v1/kubeone/"+url.PathEscape(name)+"/members", req, &out)
}

// KubeOneManifest renders a KubeOne cluster's manifest; bastion (HOST or
// HOST:PORT, "" for the hub's own) is how KubeOne reaches the hub.
func (c *Client) KubeOneManifest(ctx context.Context, name, bastion string) (string, error) {
	path := "/v1/kubeone/" + url.PathEscape(name) + "/manifest"
	if bastion != "" {
		path += "?bastion=" + url.QueryEscape(bastion)
	}
	var out KubeOneManifest
	return out.Manifest, c.do(ctx, http.MethodGet, path, nil, &out)
}

// KubeOneStatus returns a KubeOne cluster's status.
func (c *Client) KubeOneStatus(ctx context.Context, name string) (kubeone.Status, error) {
	var out kubeone.Status
	return out, c.do(ctx, http.MethodGet, "/v1/kubeone/"+url.PathEscape(name)+"/status", nil, &out)
}
