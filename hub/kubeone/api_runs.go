package kubeone

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
)

// RunsAPI runs KubeOne for the hub's clusters and reaches their API
// servers through the tunnels (Runs). Errors wrap this package's kinds.
type RunsAPI interface {
	// Start starts `kubeone apply|reset` for the cluster as a job.
	Start(ctx context.Context, cluster string, req apitype.KubeOneRunRequest, by string) (store.Job, error)
	// Kubeconfig is the cluster-admin kubeconfig from the first connected
	// control-plane member, as kubeadm wrote it.
	Kubeconfig(ctx context.Context, cluster string) ([]byte, error)
	// DialAPIServer connects to the cluster's kube-apiserver through the
	// first connected control-plane member.
	DialAPIServer(ctx context.Context, cluster string) (net.Conn, error)
}

func (a *API) runsEnabled(w http.ResponseWriter) bool {
	if a.Runs == nil {
		writeError(w, http.StatusNotFound, "KubeOne runs are not enabled on this hub")
		return false
	}
	return true
}

func (a *API) run(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req apitype.KubeOneRunRequest
		if !decode(w, r, &req) || !a.runsEnabled(w) {
			return
		}
		req.Action = action
		if action == "reset" && req.Auto {
			a.rt.Error(w, r, route.Fail(apitype.ErrInvalid, "--auto is for apply: a reset is started by hand"))
			return
		}
		name := r.PathValue("name")
		j, err := a.Runs.Start(r.Context(), name, req, route.AdminName(r))
		if err != nil {
			a.audit(r, "kubeone_"+action, name, "refused", ": "+err.Error())
			a.rt.Error(w, r, apiErr("start kubeone "+action, err))
			return
		}
		a.audit(r, "kubeone_"+action, name, "ok", fmt.Sprintf(": job %s (auto %v)", j.ID, req.Auto))
		route.JSON(w, http.StatusCreated, jobs.View(j))
	}
}

func (a *API) kubeconfig(w http.ResponseWriter, r *http.Request) {
	if !a.runsEnabled(w) {
		return
	}
	name := r.PathValue("name")
	b, err := a.Runs.Kubeconfig(r.Context(), name)
	if err != nil {
		a.rt.Error(w, r, apiErr("fetch kubeconfig", err))
		return
	}
	// The cluster's admin credential left the hub: say so in the audit.
	a.audit(r, "kubeone_kubeconfig", name, "ok", "")
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b)
}

// proxy relays one connection to the cluster's kube-apiserver: the
// request body is what the client sends, the response body what the API
// server answers, both streamed (HTTP/2, or HTTP/1.1 in full duplex).
func (a *API) proxy(w http.ResponseWriter, r *http.Request) {
	if !a.runsEnabled(w) {
		return
	}
	name := r.PathValue("name")
	conn, err := a.Runs.DialAPIServer(r.Context(), name)
	if err != nil {
		a.rt.Error(w, r, apiErr("reach the API server", err))
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
