package apitype

import "time"

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
	JobRunning     = "running"
	JobSucceeded   = "succeeded"
	JobPartial     = "partial" // no run failed, but some nodes were skipped (offline)
	JobFailed      = "failed"
	JobCancelled   = "cancelled"
	JobInterrupted = "interrupted"
)

// Per-node run states. pending, waiting and running are live; the others
// are final (RunFinal).
const (
	RunPending     = "pending"
	RunWaiting     = "waiting" // offline, waiting for the node (--wait-online)
	RunRunning     = "running"
	RunOK          = "ok"
	RunFailed      = "failed"
	RunSkipped     = "skipped"
	RunCancelled   = "cancelled"
	RunInterrupted = "interrupted" // the hub stopped while this run was live
)

// RunFinal reports whether a per-node run state is final.
func RunFinal(state string) bool {
	switch state {
	case RunOK, RunFailed, RunSkipped, RunCancelled, RunInterrupted:
		return true
	}
	return false
}

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
