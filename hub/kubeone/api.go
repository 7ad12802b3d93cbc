package kubeone

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/store"
)

// API serves the KubeOne endpoints (/v1/kubeone/…). All are admin-only:
// a cluster's identity reaches every member as its login (root by
// default), its manifest names the hub's key files, a run acts as the
// cluster's identity on every member, and the kubeconfig is the cluster's
// admin.
type API struct {
	// Clusters is nil on a hub without KubeOne clusters: their endpoints
	// answer 404.
	Clusters *Clusters
	// Runs runs KubeOne and reaches clusters' API servers; nil: those
	// endpoints answer 404.
	Runs  RunsAPI
	Audit func(store.AuditEvent)

	rt route.Routes
}

// Register implements route.Feature.
func (a *API) Register(rt route.Routes) {
	a.rt = rt
	rt.Handle("POST /v1/kubeone", rt.Admin(a.create))
	rt.Handle("GET /v1/kubeone", rt.Admin(a.list))
	rt.Handle("GET /v1/kubeone/{name}", rt.Admin(a.get))
	rt.Handle("DELETE /v1/kubeone/{name}", rt.Admin(a.delete))
	rt.Handle("PUT /v1/kubeone/{name}/members", rt.Admin(a.members))
	rt.Handle("GET /v1/kubeone/{name}/manifest", rt.Admin(a.manifest))
	rt.Handle("GET /v1/kubeone/{name}/status", rt.Admin(a.status))
	rt.Handle("POST /v1/kubeone/{name}/apply", rt.Admin(a.run("apply")))
	rt.Handle("POST /v1/kubeone/{name}/reset", rt.Admin(a.run("reset")))
	rt.Handle("GET /v1/kubeone/{name}/kubeconfig", rt.Admin(a.kubeconfig))
	rt.Handle("POST /v1/kubeone/{name}/proxy", rt.Admin(a.proxy))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	route.JSON(w, status, apitype.ErrorResponse{Error: msg})
}

// clustersEnabled answers 404 when the hub runs without KubeOne clusters.
func (a *API) clustersEnabled(w http.ResponseWriter) bool {
	if a.Clusters == nil {
		writeError(w, http.StatusNotFound, "KubeOne clusters are not enabled on this hub")
		return false
	}
	return true
}

// apiErr maps the clusters' kinds of failure to the API's, the message
// without the package prefixes.
func apiErr(step string, err error) error {
	for _, k := range []struct{ own, api error }{
		{ErrInvalid, apitype.ErrInvalid}, {ErrNotFound, apitype.ErrNotFound}, {ErrConflict, apitype.ErrConflict},
	} {
		if errors.Is(err, k.own) {
			msg := strings.TrimPrefix(err.Error(), k.own.Error()+": ")
			return route.Fail(k.api, "%s", route.Clean(errors.New(msg)))
		}
	}
	return route.Internal(step, err)
}

func (a *API) audit(r *http.Request, kind, cluster, result, detail string) {
	if a.Audit == nil {
		return
	}
	a.Audit(store.AuditEvent{Kind: kind, Operator: route.AdminName(r), Remote: r.RemoteAddr, Result: result,
		Detail: "cluster " + cluster + detail})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return route.Decode(w, r, v, route.MaxBody)
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	var spec Spec
	if !decode(w, r, &spec) || !a.clustersEnabled(w) {
		return
	}
	c, err := a.Clusters.Create(r.Context(), spec)
	if err != nil {
		a.audit(r, "kubeone_create", spec.Name, "refused", ": "+err.Error())
		a.rt.Error(w, r, apiErr("create KubeOne cluster", err))
		return
	}
	a.audit(r, "kubeone_create", c.Name, "ok", membersDetail(c))
	route.JSON(w, http.StatusCreated, c)
}

func membersDetail(c Cluster) string {
	d := "; control plane " + strings.Join(c.ControlPlane, ",")
	if len(c.Workers) > 0 {
		d += "; workers " + strings.Join(c.Workers, ",")
	}
	return d + "; kubernetes " + c.Kubernetes
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	if !a.clustersEnabled(w) {
		return
	}
	cs, err := a.Clusters.List(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if cs == nil {
		cs = []Cluster{}
	}
	route.JSON(w, http.StatusOK, cs)
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	if !a.clustersEnabled(w) {
		return
	}
	c, err := a.Clusters.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		a.rt.Error(w, r, apiErr("read KubeOne cluster", err))
		return
	}
	route.JSON(w, http.StatusOK, c)
}

func (a *API) delete(w http.ResponseWriter, r *http.Request) {
	if !a.clustersEnabled(w) {
		return
	}
	name := r.PathValue("name")
	c, err := a.Clusters.Delete(r.Context(), name)
	if err != nil {
		a.rt.Error(w, r, apiErr("delete KubeOne cluster", err))
		return
	}
	a.audit(r, "kubeone_delete", name, "ok", membersDetail(c))
	route.JSON(w, http.StatusOK, c)
}

func (a *API) members(w http.ResponseWriter, r *http.Request) {
	var req apitype.KubeOneMembersRequest
	if !decode(w, r, &req) || !a.clustersEnabled(w) {
		return
	}
	name := r.PathValue("name")
	c, err := a.Clusters.SetMembers(r.Context(), name, req.ControlPlane, req.Workers)
	if err != nil {
		a.audit(r, "kubeone_members", name, "refused", ": "+err.Error())
		a.rt.Error(w, r, apiErr("change KubeOne cluster members", err))
		return
	}
	a.audit(r, "kubeone_members", name, "ok", membersDetail(c))
	route.JSON(w, http.StatusOK, c)
}

// manifest renders the manifest; ?bastion=HOST[:PORT] names the
// bastion as KubeOne run elsewhere reaches it.
func (a *API) manifest(w http.ResponseWriter, r *http.Request) {
	if !a.clustersEnabled(w) {
		return
	}
	var o ManifestOptions
	if b := r.URL.Query().Get("bastion"); b != "" {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			host, port = b, ""
		}
		p, perr := strconv.Atoi(port)
		if host == "" || strings.ContainsAny(host, " \t\n/@") || (port != "" && (perr != nil || p <= 0 || p > 65535)) {
			a.rt.Error(w, r, route.Fail(apitype.ErrInvalid, "bastion %.80q: want HOST or HOST:PORT", b))
			return
		}
		o.BastionHost, o.BastionPort = host, p
	}
	m, err := a.Clusters.Manifest(r.Context(), r.PathValue("name"), o)
	if err != nil {
		a.rt.Error(w, r, apiErr("render KubeOne manifest", err))
		return
	}
	route.JSON(w, http.StatusOK, apitype.KubeOneManifest{Manifest: string(m)})
}

func (a *API) status(w http.ResponseWriter, r *http.Request) {
	if !a.clustersEnabled(w) {
		return
	}
	st, err := a.Clusters.Status(r.Context(), r.PathValue("name"))
	if err != nil {
		a.rt.Error(w, r, apiErr("read KubeOne cluster status", err))
		return
	}
	route.JSON(w, http.StatusOK, st)
}
