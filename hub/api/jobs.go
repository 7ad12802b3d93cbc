package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
)

// JobCreateRequest is the body of POST /v1/jobs. Targets are Nodes (names)
// or Selector (labels, as in roles; "*" is every node), not both.
type JobCreateRequest struct {
	Command           string            `json:"command,omitempty"`
	Script            string            `json:"script,omitempty"`
	ScriptName        string            `json:"script_name,omitempty"`
	Uploads           []store.Upload    `json:"uploads,omitempty"`
	Env               map[string]string `json:"env,omitempty"`
	Parallel          int               `json:"parallel,omitempty"`
	TimeoutSeconds    int               `json:"timeout_seconds,omitempty"`
	MaxFailures       string            `json:"max_failures,omitempty"`
	WaitOnlineSeconds int               `json:"wait_online_seconds,omitempty"`
	Selector          string            `json:"selector,omitempty"`
	Nodes             []string          `json:"nodes,omitempty"`
}

// JobRerunRequest is the body of POST /v1/jobs/{id}/rerun.
type JobRerunRequest struct {
	// Failed re-runs only the nodes that did not end ok (failed,
	// interrupted, cancelled, skipped); otherwise every node.
	Failed bool `json:"failed"`
}

// JobDetail answers GET /v1/jobs/{id}.
type JobDetail struct {
	store.Job
	Nodes []store.JobNode `json:"nodes"`
}

// BlobResponse answers POST /v1/blobs.
type BlobResponse struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Job and JobNode as the API shows them.
type (
	Job      = store.Job
	JobNode  = store.JobNode
	JobEvent = jobs.Event
)

func (h *handler) jobsEnabled(w http.ResponseWriter) bool {
	if h.Jobs == nil {
		writeError(w, http.StatusNotFound, "jobs are not enabled on this hub")
		return false
	}
	return true
}

func (h *handler) putBlob(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.jobsEnabled(w) {
		return
	}
	want := r.URL.Query().Get("sha256")
	if want != "" && !jobs.ValidDigest(want) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sha256 %q: want 64 lowercase hex digits", want))
		return
	}
	digest, size, err := h.Blobs.Put(r.Body, want)
	switch {
	case errors.Is(err, jobs.ErrBlobTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.Logger.Info("blob stored", "sha256", digest, "size", size, "by", c.name)
	writeJSON(w, http.StatusCreated, BlobResponse{SHA256: digest, Size: size})
}

// httpError carries a status for handler helpers.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func replyErr(w http.ResponseWriter, err error) {
	var he *httpError
	switch {
	case errors.As(err, &he):
		writeError(w, he.status, he.msg)
	case errors.Is(err, jobs.ErrBadSpec):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// resolveTargets turns names or a selector into node names the caller may
// run jobs on (sorted). Revoked nodes are never targets.
func (h *handler) resolveTargets(ctx context.Context, c caller, selector string, names []string) ([]string, error) {
	if (selector == "") == (len(names) == 0) {
		return nil, &httpError{http.StatusBadRequest, "give the target nodes as names (--nodes n1,n2) or as a label selector (-l site=lab, or -l '*' for all), not both"}
	}
	all, err := h.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]store.Node, len(all))
	for _, n := range all {
		byName[n.Name] = n
	}
	var targets []store.Node
	if selector != "" {
		var sel roles.Selector
		if selector != "*" {
			if sel, err = roles.ParseSelector(selector); err != nil {
				return nil, &httpError{http.StatusBadRequest, "selector: " + err.Error()}
			}
		}
		for _, n := range all {
			if n.RevokedAt.IsZero() && (selector == "*" || sel.Matches(n.Labels)) {
				targets = append(targets, n)
			}
		}
		if len(targets) == 0 {
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("selector %q matches no node (see `tether nodes`)", selector)}
		}
	} else {
		seen := map[string]bool{}
		var unknown []string
		for _, name := range names {
			if seen[name] {
				continue
			}
			seen[name] = true
			n, ok := byName[name]
			switch {
			case !ok:
				unknown = append(unknown, name)
			case !n.RevokedAt.IsZero():
				return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("node %q is revoked; it cannot run jobs", name)}
			default:
				targets = append(targets, n)
			}
		}
		if len(unknown) > 0 {
			return nil, &httpError{http.StatusBadRequest, fmt.Sprintf("no such node: %s (see `tether nodes`)", strings.Join(unknown, ", "))}
		}
	}
	var denied, out []string
	for _, n := range targets {
		if !c.may(n, h.provisionLogin(n)) {
			denied = append(denied, n.Name)
			continue
		}
		out = append(out, n.Name)
	}
	if len(denied) > 0 {
		if len(denied) > 5 {
			denied = append(denied[:5], fmt.Sprintf("and %d more", len(denied)-5))
		}
		return nil, &httpError{http.StatusForbidden, fmt.Sprintf("role %q may not run jobs on %s (the role must select the node and allow its provisioning login)", c.role.Name, strings.Join(denied, ", "))}
	}
	slices.Sort(out)
	return out, nil
}

func (h *handler) provisionLogin(n store.Node) string {
	if h.ProvisionLogin == nil {
		return "root"
	}
	return h.ProvisionLogin(n)
}

func (h *handler) createJob(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.jobsEnabled(w) {
		return
	}
	var req JobCreateRequest
	if !decode(w, r, &req) {
		return
	}
	spec := store.JobSpec{
		Command: req.Command, Script: req.Script, ScriptName: req.ScriptName, Uploads: req.Uploads, Env: req.Env,
		Parallel: req.Parallel, TimeoutSeconds: req.TimeoutSeconds, MaxFailures: req.MaxFailures,
		WaitOnlineSecs: req.WaitOnlineSeconds, Selector: req.Selector, Role: c.jobFilterRole(),
	}
	if len(req.ScriptName) > 200 {
		writeError(w, http.StatusBadRequest, "script_name is longer than 200 characters")
		return
	}
	for i, u := range spec.Uploads {
		if u.IfMissing || u.Mkdir {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("upload %d: if_missing and mkdir are for the hub's own cluster jobs", i))
			return
		}
		if len(u.Name) > 200 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("upload %d: name is longer than 200 characters", i))
			return
		}
	}
	if err := jobs.Validate(&spec, h.Blobs); err != nil {
		replyErr(w, err)
		return
	}
	targets, err := h.resolveTargets(r.Context(), c, req.Selector, req.Nodes)
	if err != nil {
		replyErr(w, err)
		return
	}
	j, err := h.Jobs.Start(r.Context(), store.Job{Kind: "run", Spec: spec, CreatedBy: c.name}, targets)
	if err != nil {
		replyErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, j)
}

// jobFor loads a job the caller may see; it writes the error reply itself.
func (h *handler) jobFor(w http.ResponseWriter, r *http.Request, c caller) (store.Job, bool) {
	id := r.PathValue("id")
	j, err := h.Store.GetJob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.admin && j.Spec.Role != c.role.Name) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no job %q (see `tether jobs`)", id))
		return store.Job{}, false
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return store.Job{}, false
	}
	return j, true
}

func (h *handler) listJobs(w http.ResponseWriter, r *http.Request, c caller) {
	f := store.JobFilter{Role: c.jobFilterRole()}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want 1..10000", v))
			return
		}
		f.Limit = n
	}
	list(func(ctx context.Context) ([]store.Job, error) { return h.Store.ListJobs(ctx, f) })(w, r)
}

func (h *handler) getJob(w http.ResponseWriter, r *http.Request, c caller) {
	j, ok := h.jobFor(w, r, c)
	if !ok {
		return
	}
	nodes, err := h.Store.ListJobNodes(r.Context(), j.ID)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, JobDetail{Job: j, Nodes: nodes})
}

func (h *handler) cancelJob(w http.ResponseWriter, r *http.Request, c caller) {
	j, ok := h.jobFor(w, r, c)
	if !ok || !h.jobsEnabled(w) {
		return
	}
	if err := h.Jobs.Cancel(j.ID, c.name); errors.Is(err, jobs.ErrNotRunning) {
		writeError(w, http.StatusConflict, fmt.Sprintf("job %s is not running (it is %s)", j.ID, j.State))
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	j, err := h.Jobs.Wait(r.Context(), j.ID)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, j)
}

func (h *handler) rerunJob(w http.ResponseWriter, r *http.Request, c caller) {
	var req JobRerunRequest
	if !decode(w, r, &req) {
		return
	}
	old, ok := h.jobFor(w, r, c)
	if !ok || !h.jobsEnabled(w) {
		return
	}
	if old.Kind != "run" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("job %s is a %s job, driven by the cluster state machine; use `tether cluster register|deregister` instead", old.ID, old.Kind))
		return
	}
	if old.State == store.JobRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("job %s is still running; wait for it or cancel it first", old.ID))
		return
	}
	nodes, err := h.Store.ListJobNodes(r.Context(), old.ID)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	var names []string
	for _, n := range nodes {
		if !req.Failed || n.State != store.RunOK {
			names = append(names, n.Node)
		}
	}
	if len(names) == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("job %s has no failed, interrupted, cancelled or skipped nodes to rerun", old.ID))
		return
	}
	spec := old.Spec
	spec.RerunOf, spec.Role = old.ID, c.jobFilterRole()
	if err := jobs.Validate(&spec, h.Blobs); err != nil {
		replyErr(w, err)
		return
	}
	targets, err := h.resolveTargets(r.Context(), c, "", names)
	if err != nil {
		replyErr(w, err)
		return
	}
	j, err := h.Jobs.Start(r.Context(), store.Job{Kind: old.Kind, Spec: spec, CreatedBy: c.name}, targets)
	if err != nil {
		replyErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, j)
}

// nodeLog serves one node's stored log as text: the head, a marker for the
// bytes left out, and the tail.
func (h *handler) nodeLog(w http.ResponseWriter, r *http.Request, c caller) {
	j, ok := h.jobFor(w, r, c)
	if !ok {
		return
	}
	n, err := h.Store.GetJobNode(r.Context(), j.ID, r.PathValue("node"))
	if err != nil {
		replyErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write(n.LogHead)
	if n.LogDropped > 0 {
		fmt.Fprintf(w, "\n[tether: %d bytes of output omitted]\n", n.LogDropped)
	}
	w.Write(n.LogTail)
}

// jobEvents streams a job as newline-delimited JSON events until it ends:
// first each node's state and output so far, then live events, then a final
// "job" event. A finished job is replayed from the store.
func (h *handler) jobEvents(w http.ResponseWriter, r *http.Request, c caller) {
	j, ok := h.jobFor(w, r, c)
	if !ok || !h.jobsEnabled(w) {
		return
	}
	node := r.URL.Query().Get("node")
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	emit := func(ev jobs.Event) bool {
		if err := enc.Encode(ev); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	sub, err := h.Jobs.Subscribe(j.ID, node)
	if err != nil && !errors.Is(err, jobs.ErrNotRunning) {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	if err == nil {
		defer sub.Close()
		for {
			select {
			case ev, ok := <-sub.C:
				if !ok {
					if sub.Lagged() {
						emit(jobs.Event{Type: "error", Error: "this follower fell behind and was dropped; see `tether jobs show` and `tether jobs logs`"})
					}
					return
				}
				if !emit(ev) {
					return
				}
			case <-r.Context().Done():
				return
			}
		}
	}
	// Finished: replay from the store.
	nodes, err := h.Store.ListJobNodes(r.Context(), j.ID)
	if err != nil {
		emit(jobs.Event{Type: "error", Error: err.Error()})
		return
	}
	found := node == ""
	for _, n := range nodes {
		if node != "" && n.Node != node {
			continue
		}
		found = true
		full, err := h.Store.GetJobNode(r.Context(), j.ID, n.Node)
		if err != nil {
			emit(jobs.Event{Type: "error", Error: err.Error()})
			return
		}
		if len(full.LogHead) > 0 {
			emit(jobs.Event{Type: "output", Node: n.Node, Stream: "log", Data: full.LogHead})
		}
		if len(full.LogTail) > 0 {
			emit(jobs.Event{Type: "output", Node: n.Node, Stream: "log", Data: full.LogTail, Dropped: full.LogDropped})
		}
		emit(jobs.Event{Type: "node", Node: n.Node, State: n.State, ExitCode: n.ExitCode, Error: n.Error})
	}
	if !found {
		emit(jobs.Event{Type: "error", Error: fmt.Sprintf("job %s has no node %q", j.ID, node)})
		return
	}
	if j, err = h.Store.GetJob(r.Context(), j.ID); err == nil {
		emit(jobs.Event{Type: "job", Job: &j})
	}
}
