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
	"time"

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
	Uploads           []Upload          `json:"uploads,omitempty"`
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

// Job states. A job is running until every target node reached a final
// state; a hub restart turns a running job into interrupted.
const (
	JobRunning     = store.JobRunning
	JobSucceeded   = store.JobSucceeded
	JobPartial     = store.JobPartial
	JobFailed      = store.JobFailed
	JobCancelled   = store.JobCancelled
	JobInterrupted = store.JobInterrupted
)

// Per-node run states. pending, waiting and running are live; the others
// are final (RunFinal).
const (
	RunPending     = store.RunPending
	RunWaiting     = store.RunWaiting // offline, waiting for the node (--wait-online)
	RunRunning     = store.RunRunning
	RunOK          = store.RunOK
	RunFailed      = store.RunFailed
	RunSkipped     = store.RunSkipped
	RunCancelled   = store.RunCancelled
	RunInterrupted = store.RunInterrupted // the hub stopped while this run was live
)

// RunFinal reports whether a per-node run state is final.
func RunFinal(state string) bool { return store.RunFinal(state) }

// Job is a job as the API shows it: one fan-out of a JobSpec to nodes.
type Job struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"` // run, cluster_install, cluster_uninstall
	Spec       JobSpec   `json:"spec"`
	CreatedBy  string    `json:"created_by"`
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Counts are the job's runs by per-node state; Total is their sum.
	Counts map[string]int `json:"counts"`
	Total  int            `json:"total"`
}

// JobSpec is what a job does on each node, as it was given.
type JobSpec struct {
	Command        string            `json:"command,omitempty"`     // shell command line (sh -c)
	Script         string            `json:"script,omitempty"`      // or: script content, uploaded and run
	ScriptName     string            `json:"script_name,omitempty"` // for display
	Uploads        []Upload          `json:"uploads,omitempty"`     // files copied before the command runs
	Env            map[string]string `json:"env,omitempty"`
	Parallel       int               `json:"parallel"`
	TimeoutSeconds int               `json:"timeout_seconds"`        // per node
	MaxFailures    string            `json:"max_failures,omitempty"` // "N" or "P%"; empty: no limit
	WaitOnlineSecs int               `json:"wait_online_seconds"`    // 0: offline nodes are skipped
	Selector       string            `json:"selector,omitempty"`     // as given, for display
	Role           string            `json:"role,omitempty"`         // role of an API-token creator
	RerunOf        string            `json:"rerun_of,omitempty"`     // job id this one re-runs
	Cluster        *ClusterStep      `json:"cluster,omitempty"`      // set for cluster install/uninstall jobs
}

// ClusterStep is the cluster work of a cluster install/uninstall job.
type ClusterStep struct {
	Action       string `json:"action"` // install | uninstall
	Engine       string `json:"engine"`
	EngineDigest string `json:"engine_digest,omitempty"`
	CachePath    string `json:"cache_path"` // where the node caches the engine's uninstall script
}

// Upload is one file a job copies to each node; the content is a blob
// uploaded before (POST /v1/blobs).
type Upload struct {
	Name   string `json:"name"`   // local name, for display
	SHA256 string `json:"sha256"` // blob in the hub's blob store
	Size   int64  `json:"size"`
	Dest   string `json:"dest"` // absolute path on the node
	Mode   uint32 `json:"mode"`
	// Mkdir and IfMissing are for the hub's own cluster jobs; a job created
	// through the API may not set them.
	Mkdir     bool `json:"mkdir,omitempty"`
	IfMissing bool `json:"if_missing,omitempty"`
}

// JobNode is one node's run within a job (its log is served apart).
type JobNode struct {
	JobID string `json:"job_id"`
	// NodeID is the node the run is bound to: a machine that joins later
	// under the same name is another node. Empty for runs recorded before
	// runs were bound to IDs whose node was already gone.
	NodeID     string    `json:"node_id,omitempty"`
	Node       string    `json:"node"` // the node's name when the job was created
	State      string    `json:"state"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	LogDropped int64     `json:"log_dropped,omitempty"` // output bytes left out between the log's head and tail
	LogBytes   int64     `json:"log_bytes"`             // total output bytes seen
}

// Duration is how long the run took (so far, if it is still running).
func (n JobNode) Duration(now time.Time) time.Duration {
	switch {
	case n.StartedAt.IsZero():
		return 0
	case n.FinishedAt.IsZero():
		return now.Sub(n.StartedAt)
	}
	return n.FinishedAt.Sub(n.StartedAt)
}

// JobDetail answers GET /v1/jobs/{id}.
type JobDetail struct {
	Job
	Nodes []JobNode `json:"nodes"`
}

// JobEvent is one line of GET /v1/jobs/{id}/events.
type JobEvent struct {
	Type     string `json:"type"` // node (state change), output, job (final), error
	Node     string `json:"node,omitempty"`
	State    string `json:"state,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Error    string `json:"error,omitempty"`
	Stream   string `json:"stream,omitempty"` // stdout | stderr | hub (the hub's own notes) | log (replayed)
	Data     []byte `json:"data,omitempty"`
	Dropped  int64  `json:"dropped,omitempty"` // log bytes left out of a replayed log
	Job      *Job   `json:"job,omitempty"`
}

// BlobResponse answers POST /v1/blobs.
type BlobResponse struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

func jobFrom(j store.Job) Job {
	return Job{ID: j.ID, Kind: j.Kind, Spec: jobSpecFrom(j.Spec), CreatedBy: j.CreatedBy, State: j.State, Error: j.Error,
		CreatedAt: j.CreatedAt, FinishedAt: j.FinishedAt, Counts: j.Counts, Total: j.Total}
}

func jobSpecFrom(s store.JobSpec) JobSpec {
	out := JobSpec{Command: s.Command, Script: s.Script, ScriptName: s.ScriptName, Env: s.Env, Parallel: s.Parallel,
		TimeoutSeconds: s.TimeoutSeconds, MaxFailures: s.MaxFailures, WaitOnlineSecs: s.WaitOnlineSecs, Selector: s.Selector,
		Role: s.Role, RerunOf: s.RerunOf}
	for _, u := range s.Uploads {
		out.Uploads = append(out.Uploads, Upload(u))
	}
	if s.Cluster != nil {
		c := ClusterStep(*s.Cluster)
		out.Cluster = &c
	}
	return out
}

func jobNodeFrom(n store.JobNode) JobNode {
	return JobNode{JobID: n.JobID, NodeID: n.NodeID, Node: n.Node, State: n.State, ExitCode: n.ExitCode, Error: n.Error,
		StartedAt: n.StartedAt, FinishedAt: n.FinishedAt, LogDropped: n.LogDropped, LogBytes: n.LogBytes}
}

func jobEventFrom(ev jobs.Event) JobEvent {
	out := JobEvent{Type: ev.Type, Node: ev.Node, State: ev.State, ExitCode: ev.ExitCode, Error: ev.Error,
		Stream: ev.Stream, Data: ev.Data, Dropped: ev.Dropped}
	if ev.Job != nil {
		j := jobFrom(*ev.Job)
		out.Job = &j
	}
	return out
}

func storeUploads(us []Upload) []store.Upload {
	return mapSlice(us, func(u Upload) store.Upload { return store.Upload(u) })
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

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
	h.Logger.Info("blob stored", "sha256", digest, "size", size, "by", c.Name)
	writeJSON(w, http.StatusCreated, BlobResponse{SHA256: digest, Size: size})
}

// resolveTargets turns names or a selector into the nodes the caller may run
// jobs on (sorted by name). The job is bound to those nodes' IDs from here
// on. Revoked nodes are never targets.
func (h *handler) resolveTargets(ctx context.Context, c caller, selector string, names []string) ([]store.NodeRef, error) {
	targets, err := h.selectNodes(ctx, selector, names)
	if err != nil {
		return nil, err
	}
	return h.authorizeTargets(c, targets)
}

// selectNodes finds the nodes a selector or a list of names targets
// (revoked nodes never); the caller authorizes them.
func (h *handler) selectNodes(ctx context.Context, selector string, names []string) ([]store.Node, error) {
	if (selector == "") == (len(names) == 0) {
		return nil, fail(ErrInvalid, "give the target nodes as names (--nodes n1,n2) or as a label selector (-l site=lab, or -l '*' for all), not both")
	}
	all, err := h.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	// A site hub has a node row here but serves only route streams: a
	// job reaches the nodes below it, never the site itself.
	sites, err := h.Store.ListSites(ctx)
	if err != nil {
		return nil, err
	}
	isSite := make(map[string]bool, len(sites))
	siteNamed := make(map[string]bool, len(sites))
	for _, st := range sites {
		isSite[st.NodeID], siteNamed[st.Name] = true, true
	}
	all = slices.DeleteFunc(all, func(n store.Node) bool { return isSite[n.ID] })
	if all, _, err = h.withInventory(ctx, all); err != nil { // nodes below sites, keyed on their IDs too
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
				return nil, fail(ErrInvalid, "%s", clean(err))
			}
		}
		for _, n := range all {
			if n.RevokedAt.IsZero() && (selector == "*" || sel.Matches(n.Labels)) {
				targets = append(targets, n)
			}
		}
		if len(targets) == 0 {
			return nil, fail(ErrInvalid, "selector %q matches no node (see `tether nodes`)", selector)
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
			case !ok && siteNamed[name]:
				return nil, fail(ErrInvalid, "%q is a site hub, not a node: target the nodes below it (-l site=%s)", name, name)
			case !ok:
				unknown = append(unknown, name)
			case !n.RevokedAt.IsZero():
				return nil, fail(ErrInvalid, "node %q is revoked; it cannot run jobs", name)
			default:
				targets = append(targets, n)
			}
		}
		if len(unknown) > 0 {
			return nil, fail(ErrInvalid, "no such node: %s (see `tether nodes`)", strings.Join(unknown, ", "))
		}
	}
	return targets, nil
}

// rerunTargets are the nodes of a rerun: the same node IDs as the runs
// re-run, never a machine that took a removed node's name since.
func (h *handler) rerunTargets(ctx context.Context, c caller, old store.Job, runs []store.JobNode) ([]store.NodeRef, error) {
	var targets []store.Node
	var removed []string
	for _, r := range runs {
		n, err := h.Store.GetNode(ctx, r.NodeID)
		if errors.Is(err, store.ErrNotFound) && r.NodeID != "" {
			if inv, ok, ierr := h.inventoryNode(ctx, r.NodeID); ierr != nil {
				err = ierr
			} else if ok {
				n, err = inv, nil
			}
		}
		if r.NodeID == "" || errors.Is(err, store.ErrNotFound) {
			removed = append(removed, r.Node)
			continue
		}
		if err != nil {
			return nil, err
		}
		if !n.RevokedAt.IsZero() {
			return nil, fail(ErrInvalid, "node %q is revoked; it cannot run jobs", n.Name)
		}
		targets = append(targets, n)
	}
	if len(removed) > 0 {
		return nil, fail(ErrInvalid, "node %s of job %s was removed from the hub since; a machine now under that name is another node (start a new job with --nodes)", strings.Join(removed, ", "), old.ID)
	}
	return h.authorizeTargets(c, targets)
}

// authorizeTargets keeps the nodes the caller may run jobs on, or refuses
// them all.
func (h *handler) authorizeTargets(c caller, targets []store.Node) ([]store.NodeRef, error) {
	var denied []string
	var out []store.NodeRef
	for _, n := range targets {
		if !c.may(n) {
			denied = append(denied, n.Name)
			continue
		}
		out = append(out, store.NodeRef{ID: n.ID, Name: n.Name})
	}
	if len(denied) > 0 {
		if len(denied) > 5 {
			denied = append(denied[:5], fmt.Sprintf("and %d more", len(denied)-5))
		}
		return nil, fail(ErrRefused, "role %q may not run jobs on %s (the role must select the node and allow its provisioning login)", c.Role, strings.Join(denied, ", "))
	}
	slices.SortFunc(out, func(a, b store.NodeRef) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
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
		Command: req.Command, Script: req.Script, ScriptName: req.ScriptName, Uploads: storeUploads(req.Uploads), Env: req.Env,
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
		h.writeErr(w, r, err)
		return
	}
	targets, err := h.resolveTargets(r.Context(), c, req.Selector, req.Nodes)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	j, err := h.Jobs.Start(r.Context(), store.Job{Kind: "run", Spec: spec, CreatedBy: c.Name}, targets)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, jobFrom(j))
}

// jobFor loads a job the caller may see; it writes the error reply itself.
func (h *handler) jobFor(w http.ResponseWriter, r *http.Request, c caller) (store.Job, bool) {
	id := r.PathValue("id")
	j, err := h.Store.GetJob(r.Context(), id)
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
	list(func(ctx context.Context) ([]Job, error) {
		jobs, err := h.Store.ListJobs(ctx, f)
		return mapSlice(jobs, jobFrom), err
	})(w, r)
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
	writeJSON(w, http.StatusOK, JobDetail{Job: jobFrom(j), Nodes: mapSlice(nodes, jobNodeFrom)})
}

func (h *handler) cancelJob(w http.ResponseWriter, r *http.Request, c caller) {
	j, ok := h.jobFor(w, r, c)
	if !ok || !h.jobsEnabled(w) {
		return
	}
	if err := h.Jobs.Cancel(j.ID, c.Name); errors.Is(err, jobs.ErrNotRunning) {
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
	writeJSON(w, http.StatusOK, jobFrom(j))
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
	if strings.HasPrefix(old.Kind, "kubeone_") {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("job %s is a %s job; run it again with `tether kubeone %s CLUSTER` (it renders the manifest with the host keys of now)", old.ID, old.Kind, strings.TrimPrefix(old.Kind, "kubeone_")))
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
	var runs []store.JobNode
	for _, n := range nodes {
		if !req.Failed || n.State != store.RunOK {
			runs = append(runs, n)
		}
	}
	if len(runs) == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("job %s has no failed, interrupted, cancelled or skipped nodes to rerun", old.ID))
		return
	}
	spec := old.Spec
	spec.RerunOf, spec.Role = old.ID, c.jobFilterRole()
	if err := jobs.Validate(&spec, h.Blobs); err != nil {
		h.writeErr(w, r, err)
		return
	}
	targets, err := h.rerunTargets(r.Context(), c, old, runs)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	j, err := h.Jobs.Start(r.Context(), store.Job{Kind: old.Kind, Spec: spec, CreatedBy: c.Name}, targets)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, jobFrom(j))
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
		h.writeErr(w, r, err)
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
	// more: another event is already queued. Then the write waits for it:
	// a fan-out's thousands of node events go out in a few frames instead of
	// a frame (and a CLI wake-up) each (bench P6).
	emitMore := func(ev JobEvent, more bool) bool {
		if err := enc.Encode(ev); err != nil {
			return false
		}
		if flusher != nil && !more {
			flusher.Flush()
		}
		return true
	}
	emit := func(ev JobEvent) bool { return emitMore(ev, false) }
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
						emit(JobEvent{Type: "error", Error: "this follower fell behind and was dropped; see `tether jobs show` and `tether jobs logs`"})
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
	nodes, err := h.Store.ListJobNodes(r.Context(), j.ID)
	if err != nil {
		emit(JobEvent{Type: "error", Error: err.Error()})
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
			emit(JobEvent{Type: "error", Error: err.Error()})
			return
		}
		if len(full.LogHead) > 0 {
			emit(JobEvent{Type: "output", Node: n.Node, Stream: "log", Data: full.LogHead})
		}
		if len(full.LogTail) > 0 {
			emit(JobEvent{Type: "output", Node: n.Node, Stream: "log", Data: full.LogTail, Dropped: full.LogDropped})
		}
		emit(JobEvent{Type: "node", Node: n.Node, State: n.State, ExitCode: n.ExitCode, Error: n.Error})
	}
	if !found {
		emit(JobEvent{Type: "error", Error: fmt.Sprintf("job %s has no node %q", j.ID, node)})
		return
	}
	if j, err = h.Store.GetJob(r.Context(), j.ID); err == nil {
		final := jobFrom(j)
		emit(JobEvent{Type: "job", Job: &final})
	}
}
