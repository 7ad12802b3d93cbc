package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/store"
)

// API serves the job endpoints (/v1/jobs, /v1/blobs) to the admin and to
// API tokens, each job bound to the nodes its caller may run jobs on.
type API struct {
	// Engine runs the jobs; nil: the endpoints that start or stop jobs
	// answer 404.
	Engine *Engine
	Blobs  *blobs.Store
	Store  APIStore
	// Targets finds the nodes a job targets (hub/api.Targets: the hub's
	// own nodes and those below its sites).
	Targets interface {
		Select(ctx context.Context, selector string, names []string) ([]store.Node, error)
		Node(ctx context.Context, id string) (store.Node, error)
	}
	Logger *slog.Logger

	rt route.Routes
}

// APIStore is what the job endpoints read.
type APIStore interface {
	GetJob(ctx context.Context, id string) (store.Job, error)
	ListJobs(ctx context.Context, f store.JobFilter) ([]store.Job, error)
	ListJobNodes(ctx context.Context, jobID string) ([]store.JobNode, error)
	GetJobNode(ctx context.Context, jobID, node string) (store.JobNode, error)
}

// Register implements route.Feature.
func (a *API) Register(rt route.Routes) {
	a.rt = rt
	if a.Logger == nil {
		a.Logger = slog.New(slog.DiscardHandler)
	}
	rt.Handle("POST /v1/blobs", rt.Automation(a.putBlob))
	rt.Handle("POST /v1/jobs", rt.Automation(a.createJob))
	rt.Handle("GET /v1/jobs", rt.Automation(a.listJobs))
	rt.Handle("GET /v1/jobs/{id}", rt.Automation(a.getJob))
	rt.Handle("GET /v1/jobs/{id}/events", rt.Automation(a.jobEvents))
	rt.Handle("GET /v1/jobs/{id}/nodes/{node}/log", rt.Automation(a.nodeLog))
	rt.Handle("POST /v1/jobs/{id}/cancel", rt.Automation(a.cancelJob))
	rt.Handle("POST /v1/jobs/{id}/rerun", rt.Automation(a.rerunJob))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	route.JSON(w, status, apitype.ErrorResponse{Error: msg})
}

// View is j as the API shows it.
func View(j store.Job) apitype.Job {
	return apitype.Job{
		ID:         j.ID,
		Kind:       j.Kind,
		Spec:       jobSpecFrom(j.Spec),
		CreatedBy:  j.CreatedBy,
		State:      j.State,
		Error:      j.Error,
		CreatedAt:  j.CreatedAt,
		FinishedAt: j.FinishedAt,
		Counts:     j.Counts,
		Total:      j.Total,
	}
}

func jobSpecFrom(s store.JobSpec) apitype.JobSpec {
	out := apitype.JobSpec{
		Command:        s.Command,
		Script:         s.Script,
		ScriptName:     s.ScriptName,
		Env:            s.Env,
		Parallel:       s.Parallel,
		TimeoutSeconds: s.TimeoutSeconds,
		MaxFailures:    s.MaxFailures,
		WaitOnlineSecs: s.WaitOnlineSecs,
		Selector:       s.Selector,
		Role:           s.Role,
		RerunOf:        s.RerunOf,
	}
	for _, u := range s.Uploads {
		out.Uploads = append(out.Uploads, apitype.Upload(u))
	}
	if s.Cluster != nil {
		c := apitype.ClusterStep(*s.Cluster)
		out.Cluster = &c
	}
	return out
}

func jobNodeFrom(n store.JobNode) apitype.JobNode {
	return apitype.JobNode{
		JobID:      n.JobID,
		NodeID:     n.NodeID,
		Node:       n.Node,
		State:      n.State,
		ExitCode:   n.ExitCode,
		Error:      n.Error,
		StartedAt:  n.StartedAt,
		FinishedAt: n.FinishedAt,
		LogDropped: n.LogDropped,
		LogBytes:   n.LogBytes,
	}
}

func jobEventFrom(ev Event) apitype.JobEvent {
	out := apitype.JobEvent{Type: ev.Type, Node: ev.Node, State: ev.State, ExitCode: ev.ExitCode, Error: ev.Error,
		Stream: ev.Stream, Data: ev.Data, Dropped: ev.Dropped}
	if ev.Job != nil {
		j := View(*ev.Job)
		out.Job = &j
	}
	return out
}

func storeUploads(us []apitype.Upload) []store.Upload {
	return mapSlice(us, func(u apitype.Upload) store.Upload { return store.Upload(u) })
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func (a *API) jobsEnabled(w http.ResponseWriter) bool {
	if a.Engine == nil {
		writeError(w, http.StatusNotFound, "jobs are not enabled on this hub")
		return false
	}
	return true
}

func (a *API) putBlob(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if !a.jobsEnabled(w) {
		return
	}
	want := r.URL.Query().Get("sha256")
	if want != "" && !blobs.ValidDigest(want) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sha256 %q: want 64 lowercase hex digits", want))
		return
	}
	digest, size, err := a.Blobs.Put(r.Body, want)
	switch {
	case errors.Is(err, blobs.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	a.Logger.Info("blob stored", "sha256", digest, "size", size, "by", c.Name)
	route.JSON(w, http.StatusCreated, apitype.BlobResponse{SHA256: digest, Size: size})
}

// resolveTargets turns names or a selector into the nodes the route.Caller may run
// jobs on (sorted by name). The job is bound to those nodes' IDs from here
// on. Revoked nodes are never targets.
func (a *API) resolveTargets(
	ctx context.Context,
	c route.Caller,
	selector string,
	names []string,
) ([]store.NodeRef, error) {
	targets, err := a.Targets.Select(ctx, selector, names)
	if err != nil {
		return nil, err
	}
	return a.authorizeTargets(c, targets)
}

// rerunTargets are the nodes of a rerun: the same node IDs as the runs
// re-run, never a machine that took a removed node's name since.
func (a *API) rerunTargets(
	ctx context.Context,
	c route.Caller,
	old store.Job,
	runs []store.JobNode,
) ([]store.NodeRef, error) {
	var targets []store.Node
	var removed []string
	for _, r := range runs {
		n, err := a.Targets.Node(ctx, r.NodeID)
		if r.NodeID == "" || errors.Is(err, store.ErrNotFound) {
			removed = append(removed, r.Node)
			continue
		}
		if err != nil {
			return nil, err
		}
		if !n.RevokedAt.IsZero() {
			return nil, route.Fail(apitype.ErrInvalid, "node %q is revoked; it cannot run jobs", n.Name)
		}
		targets = append(targets, n)
	}
	if len(removed) > 0 {
		return nil, route.Fail(
			apitype.ErrInvalid,
			"node %s of job %s was removed from the hub since; a machine now under that name is another node "+
				"(start a new job with --nodes)",
			strings.Join(removed, ", "),
			old.ID,
		)
	}
	return a.authorizeTargets(c, targets)
}

// authorizeTargets keeps the nodes the route.Caller may run jobs on, or refuses
// them all.
func (a *API) authorizeTargets(c route.Caller, targets []store.Node) ([]store.NodeRef, error) {
	var denied []string
	var out []store.NodeRef
	for _, n := range targets {
		if !c.MayRun(n) {
			denied = append(denied, n.Name)
			continue
		}
		out = append(out, store.NodeRef{ID: n.ID, Name: n.Name})
	}
	if len(denied) > 0 {
		if len(denied) > 5 {
			denied = append(denied[:5], fmt.Sprintf("and %d more", len(denied)-5))
		}
		return nil, route.Fail(
			apitype.ErrRefused,
			"role %q may not run jobs on %s (the role must select the node and allow its provisioning login)",
			c.Role,
			strings.Join(denied, ", "),
		)
	}
	slices.SortFunc(out, func(a, b store.NodeRef) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (a *API) createJob(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if !a.jobsEnabled(w) {
		return
	}
	var req apitype.JobCreateRequest
	if !route.Decode(w, r, &req, route.MaxBody) {
		return
	}
	spec := store.JobSpec{
		Command: req.Command, Script: req.Script, ScriptName: req.ScriptName, Uploads: storeUploads(req.Uploads),
		Env: req.Env, Parallel: req.Parallel, TimeoutSeconds: req.TimeoutSeconds, MaxFailures: req.MaxFailures,
		WaitOnlineSecs: req.WaitOnlineSeconds, Selector: req.Selector, Role: c.JobFilterRole(),
	}
	if len(req.ScriptName) > 200 {
		writeError(w, http.StatusBadRequest, "script_name is longer than 200 characters")
		return
	}
	for i, u := range spec.Uploads {
		if u.IfMissing || u.Mkdir {
			writeError(
				w,
				http.StatusBadRequest,
				fmt.Sprintf("upload %d: if_missing and mkdir are for the hub's own cluster jobs", i),
			)
			return
		}
		if len(u.Name) > 200 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("upload %d: name is longer than 200 characters", i))
			return
		}
	}
	if err := Validate(&spec, a.Blobs); err != nil {
		a.rt.Error(w, r, err)
		return
	}
	targets, err := a.resolveTargets(r.Context(), c, req.Selector, req.Nodes)
	if err != nil {
		a.rt.Error(w, r, err)
		return
	}
	j, err := a.Engine.Start(r.Context(), store.Job{Kind: "run", Spec: spec, CreatedBy: c.Name}, targets)
	if err != nil {
		a.rt.Error(w, r, err)
		return
	}
	route.JSON(w, http.StatusCreated, View(j))
}

// jobFor loads a job the route.Caller may see; it writes the error reply itself.
func (a *API) jobFor(w http.ResponseWriter, r *http.Request, c route.Caller) (store.Job, bool) {
	id := r.PathValue("id")
	j, err := a.Store.GetJob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.Admin && j.Spec.Role != c.Role) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no job %q (see `tether jobs`)", id))
		return store.Job{}, false
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return store.Job{}, false
	}
	return j, true
}

func (a *API) listJobs(w http.ResponseWriter, r *http.Request, c route.Caller) {
	f := store.JobFilter{Role: c.JobFilterRole()}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want 1..10000", v))
			return
		}
		f.Limit = n
	}
	js, err := a.Store.ListJobs(r.Context(), f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	route.JSON(w, http.StatusOK, mapSlice(js, View))
}

func (a *API) getJob(w http.ResponseWriter, r *http.Request, c route.Caller) {
	j, ok := a.jobFor(w, r, c)
	if !ok {
		return
	}
	nodes, err := a.Store.ListJobNodes(r.Context(), j.ID)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	route.JSON(w, http.StatusOK, apitype.JobDetail{Job: View(j), Nodes: mapSlice(nodes, jobNodeFrom)})
}

func (a *API) cancelJob(w http.ResponseWriter, r *http.Request, c route.Caller) {
	j, ok := a.jobFor(w, r, c)
	if !ok || !a.jobsEnabled(w) {
		return
	}
	if err := a.Engine.Cancel(j.ID, c.Name); errors.Is(err, ErrNotRunning) {
		writeError(w, http.StatusConflict, fmt.Sprintf("job %s is not running (it is %s)", j.ID, j.State))
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	j, err := a.Engine.Wait(r.Context(), j.ID)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	route.JSON(w, http.StatusOK, View(j))
}

func (a *API) rerunJob(w http.ResponseWriter, r *http.Request, c route.Caller) {
	var req apitype.JobRerunRequest
	if !route.Decode(w, r, &req, route.MaxBody) {
		return
	}
	old, ok := a.jobFor(w, r, c)
	if !ok || !a.jobsEnabled(w) {
		return
	}
	if strings.HasPrefix(old.Kind, "kubeone_") {
		writeError(
			w,
			http.StatusBadRequest,
			fmt.Sprintf(
				"job %s is a %s job; run it again with `tether kubeone %s CLUSTER` "+
					"(it renders the manifest with the host keys of now)",
				old.ID,
				old.Kind,
				strings.TrimPrefix(old.Kind, "kubeone_"),
			),
		)
		return
	}
	if old.Kind != "run" {
		writeError(
			w,
			http.StatusBadRequest,
			fmt.Sprintf(
				"job %s is a %s job, driven by the cluster state machine; use `tether cluster register|deregister` instead",
				old.ID,
				old.Kind,
			),
		)
		return
	}
	if old.State == store.JobRunning {
		writeError(
			w,
			http.StatusConflict,
			fmt.Sprintf("job %s is still running; wait for it or cancel it first", old.ID),
		)
		return
	}
	nodes, err := a.Store.ListJobNodes(r.Context(), old.ID)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	var runs []store.JobNode
	for _, n := range nodes {
		if !req.Failed || n.State != store.RunOK {
			runs = append(runs, n)
		}
	}
	if len(runs) == 0 {
		writeError(
			w,
			http.StatusBadRequest,
			fmt.Sprintf("job %s has no failed, interrupted, cancelled or skipped nodes to rerun", old.ID),
		)
		return
	}
	spec := old.Spec
	spec.RerunOf, spec.Role = old.ID, c.JobFilterRole()
	if err := Validate(&spec, a.Blobs); err != nil {
		a.rt.Error(w, r, err)
		return
	}
	targets, err := a.rerunTargets(r.Context(), c, old, runs)
	if err != nil {
		a.rt.Error(w, r, err)
		return
	}
	j, err := a.Engine.Start(r.Context(), store.Job{Kind: old.Kind, Spec: spec, CreatedBy: c.Name}, targets)
	if err != nil {
		a.rt.Error(w, r, err)
		return
	}
	route.JSON(w, http.StatusCreated, View(j))
}

// nodeLog serves one node's stored log as text: the head, a marker for the
// bytes left out, and the tail.
func (a *API) nodeLog(w http.ResponseWriter, r *http.Request, c route.Caller) {
	j, ok := a.jobFor(w, r, c)
	if !ok {
		return
	}
	n, err := a.Store.GetJobNode(r.Context(), j.ID, r.PathValue("node"))
	if err != nil {
		a.rt.Error(w, r, err)
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
func (a *API) jobEvents(w http.ResponseWriter, r *http.Request, c route.Caller) {
	j, ok := a.jobFor(w, r, c)
	if !ok || !a.jobsEnabled(w) {
		return
	}
	node := r.URL.Query().Get("node")
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	// more: another event is already queued. Then the write waits for it:
	// a fan-out's thousands of node events go out in a few frames instead of
	// a frame (and a CLI wake-up) each (bench P6).
	emitMore := func(ev apitype.JobEvent, more bool) bool {
		if err := enc.Encode(ev); err != nil {
			return false
		}
		if flusher != nil && !more {
			flusher.Flush()
		}
		return true
	}
	emit := func(ev apitype.JobEvent) bool { return emitMore(ev, false) }
	sub, err := a.Engine.Subscribe(j.ID, node)
	if err != nil && !errors.Is(err, ErrNotRunning) {
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
						emit(
							apitype.JobEvent{
								Type:  "error",
								Error: "this follower fell behind and was dropped; see `tether jobs show` and `tether jobs logs`",
							},
						)
					}
					return
				}
				if !emitMore(jobEventFrom(ev), len(sub.C) > 0) {
					return
				}
			case <-r.Context().Done():
				return
			}
		}
	}
	// Finished: replay from the store.
	nodes, err := a.Store.ListJobNodes(r.Context(), j.ID)
	if err != nil {
		emit(apitype.JobEvent{Type: "error", Error: err.Error()})
		return
	}
	found := node == ""
	for _, n := range nodes {
		if node != "" && n.Node != node {
			continue
		}
		found = true
		full, err := a.Store.GetJobNode(r.Context(), j.ID, n.Node)
		if err != nil {
			emit(apitype.JobEvent{Type: "error", Error: err.Error()})
			return
		}
		if len(full.LogHead) > 0 {
			emit(apitype.JobEvent{Type: "output", Node: n.Node, Stream: "log", Data: full.LogHead})
		}
		if len(full.LogTail) > 0 {
			emit(
				apitype.JobEvent{
					Type:    "output",
					Node:    n.Node,
					Stream:  "log",
					Data:    full.LogTail,
					Dropped: full.LogDropped,
				},
			)
		}
		emit(apitype.JobEvent{Type: "node", Node: n.Node, State: n.State, ExitCode: n.ExitCode, Error: n.Error})
	}
	if !found {
		emit(apitype.JobEvent{Type: "error", Error: fmt.Sprintf("job %s has no node %q", j.ID, node)})
		return
	}
	if j, err = a.Store.GetJob(r.Context(), j.ID); err == nil {
		final := View(j)
		emit(apitype.JobEvent{Type: "job", Job: &final})
	}
}
