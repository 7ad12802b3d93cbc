package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

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
// are final.
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

// NodeRemovedReason is the error of a run that never started because its
// node was removed from the hub (its state is skipped).
const NodeRemovedReason = "not run: the node was removed from the hub"

// RunFinal reports whether a per-node state is final.
func RunFinal(state string) bool {
	switch state {
	case RunOK, RunFailed, RunSkipped, RunCancelled, RunInterrupted:
		return true
	}
	return false
}

// JobSpec is what a job does on each node. It is stored as given so a
// rerun does exactly the same.
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
	Role           string            `json:"role,omitempty"`         // role of an API-token creator (jobs it may see)
	RerunOf        string            `json:"rerun_of,omitempty"`     // job id this one re-runs
	Cluster        *ClusterStep      `json:"cluster,omitempty"`      // set for cluster install/uninstall jobs
	Upgrade        *UpgradeRun       `json:"upgrade,omitempty"`      // set for the upgrade jobs of a rollout
}

// UpgradeRun is the work of an upgrade job: drive its nodes through one
// over-the-air upgrade (see hub/upgrade).
type UpgradeRun struct {
	Name string `json:"name"`
}

// ClusterStep is the cluster work of a cluster job (see provisioners/cluster).
type ClusterStep struct {
	Action       string `json:"action"` // install | uninstall
	Engine       string `json:"engine"`
	EngineDigest string `json:"engine_digest,omitempty"`
	CachePath    string `json:"cache_path"` // where the node caches the engine's uninstall script
}

// Upload is one file a job copies to each node.
type Upload struct {
	Name   string `json:"name"`   // local name, for display
	SHA256 string `json:"sha256"` // blob in the hub's blob store
	Size   int64  `json:"size"`
	Dest   string `json:"dest"` // absolute path on the node
	Mode   uint32 `json:"mode"`
	// Mkdir creates missing parent directories.
	Mkdir bool `json:"mkdir,omitempty"`
	// IfMissing keeps a file already at Dest (the cluster uninstall cache).
	IfMissing bool `json:"if_missing,omitempty"`
}

// Job is one fan-out of a JobSpec to a set of nodes.
type Job struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"` // run, cluster_install, cluster_uninstall
	Spec       JobSpec   `json:"spec"`
	CreatedBy  string    `json:"created_by"`
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Owner is the hub replica that runs the job ("" on a single hub
	// before replicas); set by the job engine.
	Owner string `json:"owner,omitempty"`
	// Counts by per-node state (filled by GetJob and ListJobs).
	Counts map[string]int `json:"counts"`
	Total  int            `json:"total"`
}

// NodeRef names a job's target: the node's ID is what the run is bound to;
// the name is kept for display (and for addressing the run within its job,
// where names are unique).
type NodeRef struct {
	ID   string
	Name string
}

// JobNode is one node's run within a job. Log holds the head and the tail
// of the combined output; LogDropped counts the bytes left out between.
type JobNode struct {
	JobID string `json:"job_id"`
	// NodeID is the node the run is bound to; empty for runs recorded before
	// runs were keyed by ID whose node was already gone.
	NodeID     string    `json:"node_id"`
	Node       string    `json:"node"` // the node's name when the job was created
	State      string    `json:"state"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	LogHead    []byte    `json:"-"`
	LogTail    []byte    `json:"-"`
	LogDropped int64     `json:"log_dropped,omitempty"`
	LogBytes   int64     `json:"log_bytes"` // total output bytes seen
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

// JobFilter selects jobs; zero fields do not filter.
type JobFilter struct {
	Role  string // only jobs created under this API-token role
	Limit int    // newest N, default 100
}

// JobStore persists jobs and per-node results.
type JobStore interface {
	// CreateJob stores a job and its nodes (all pending) in one transaction.
	CreateJob(ctx context.Context, j Job, nodes []NodeRef) error
	// FinishJob records a job's final state.
	FinishJob(ctx context.Context, id, state, errMsg string, at time.Time) error
	// UpdateJobNodes writes per-node results in one transaction. A run
	// already final in the store (ended by DeleteNode) is left as it is.
	UpdateJobNodes(ctx context.Context, nodes []JobNode) error
	GetJob(ctx context.Context, id string) (Job, error)
	ListJobs(ctx context.Context, f JobFilter) ([]Job, error)
	// ListJobNodes returns a job's per-node results without their logs.
	ListJobNodes(ctx context.Context, jobID string) ([]JobNode, error)
	// GetJobNode returns one node's result with its log; node is the node's
	// name as recorded in the job.
	GetJobNode(ctx context.Context, jobID, node string) (JobNode, error)
	// MarkJobsAlive records that the hub running these jobs is alive at
	// at (a heartbeat): a job its hub's death interrupts ends at its last
	// mark, not when it is found interrupted.
	MarkJobsAlive(ctx context.Context, ids []string, at time.Time) error
	// InterruptJobs marks every running job, and its live per-node runs,
	// interrupted (called at hub start: no job survives a restart). They
	// end at the job's last MarkJobsAlive (or its creation), at the latest
	// at: the time the hub was down is not part of their durations.
	InterruptJobs(ctx context.Context, at time.Time) (jobs int, err error)
	// InterruptJobsOf does the same to the running jobs of these owners
	// (replica IDs; "" is a job from before replicas): a replica at start
	// interrupts its own.
	InterruptJobsOf(ctx context.Context, owners []string, at time.Time) (jobs int, err error)
	// InterruptOrphanedJobs does the same to the running jobs whose owner
	// replica's lease (ReplicaLeasePrefix+owner) expired more than grace
	// ago: the leader sweeps up after a replica that died. The grace lets
	// a live replica take its lease again after the store was unreachable
	// for everyone (a database restart). Fenced by ctx.
	InterruptOrphanedJobs(ctx context.Context, grace time.Duration, at time.Time) (jobs int, err error)
	// JobBlobDigests lists the blobs every stored job uploads (blob GC).
	JobBlobDigests(ctx context.Context) ([]string, error)
}

// CreateJob implements JobStore.
func (s *DB) CreateJob(ctx context.Context, j Job, nodes []NodeRef) error {
	spec, err := json.Marshal(j.Spec)
	if err != nil {
		return fmt.Errorf("store: job %s: encode spec: %w", j.ID, err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: create job: %w", err)
	}
	defer tx.Rollback()
	if err := s.checkFence(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO jobs
		(id, kind, spec, created_by, role, state, created_at, owner, alive_at) VALUES (?,?,?,?,?,?,?,?,?)`,
		j.ID, j.Kind, string(spec), j.CreatedBy, j.Spec.Role, j.State, unix(j.CreatedAt), j.Owner,
		unix(j.CreatedAt)); err != nil {
		return fmt.Errorf("store: create job %s: %w", j.ID, err)
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO job_nodes (job_id, node_id, node, state) VALUES (?,?,?,?)`)
	if err != nil {
		return fmt.Errorf("store: create job %s: %w", j.ID, err)
	}
	defer stmt.Close()
	for _, n := range nodes {
		if n.ID == "" {
			return fmt.Errorf("store: create job %s: node %q has no ID", j.ID, n.Name)
		}
		if _, err := stmt.ExecContext(ctx, j.ID, n.ID, n.Name, RunPending); err != nil {
			return fmt.Errorf("store: create job %s node %s: %w", j.ID, n.Name, err)
		}
	}
	return tx.Commit()
}

// FinishJob implements JobStore.
func (s *DB) FinishJob(ctx context.Context, id, state, errMsg string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE jobs SET state = ?, error = ?, finished_at = ? WHERE id = ?`, state, errMsg,
		unix(at), id)
	if err != nil {
		return fmt.Errorf("store: finish job %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: job %s: %w", id, ErrNotFound)
	}
	return nil
}

// UpdateJobNodes implements JobStore.
func (s *DB) UpdateJobNodes(ctx context.Context, nodes []JobNode) error {
	if len(nodes) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: update job nodes: %w", err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx,
		`UPDATE job_nodes SET state = ?, exit_code = ?, error = ?, started_at = ?, finished_at = ?,
		log_head = ?, log_tail = ?, log_dropped = ?, log_bytes = ? WHERE job_id = ? AND node_id = ? AND state NOT IN `+
			`(?,?,?,?,?)`)
	if err != nil {
		return fmt.Errorf("store: update job nodes: %w", err)
	}
	defer stmt.Close()
	for _, n := range nodes {
		var code any
		if n.ExitCode != nil {
			code = *n.ExitCode
		}
		if _, err := stmt.ExecContext(ctx, n.State, code, n.Error, unix(n.StartedAt), unix(n.FinishedAt),
			nonNilBytes(n.LogHead), nonNilBytes(n.LogTail), n.LogDropped, n.LogBytes, n.JobID, n.NodeID,
			RunOK, RunFailed, RunSkipped, RunCancelled, RunInterrupted); err != nil {
			return fmt.Errorf("store: update job %s node %s: %w", n.JobID, n.Node, err)
		}
	}
	return tx.Commit()
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

const jobColumns = `id, kind, spec, created_by, state, error, created_at, finished_at, owner`

func scanJob(r scanner) (Job, error) {
	var j Job
	var spec string
	var created, finished int64
	if err := r.Scan(&j.ID, &j.Kind, &spec, &j.CreatedBy, &j.State, &j.Error, &created, &finished, &j.Owner); err != nil {
		return Job{}, err
	}
	if err := json.Unmarshal([]byte(spec), &j.Spec); err != nil {
		return Job{}, fmt.Errorf("store: job %s: decode spec: %w", j.ID, err)
	}
	j.CreatedAt, j.FinishedAt = fromUnix(created), fromUnix(finished)
	return j, nil
}

// GetJob implements JobStore.
func (s *DB) GetJob(ctx context.Context, id string) (Job, error) {
	j, err := scanJob(s.db.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Job{}, fmt.Errorf("store: job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("store: get job %s: %w", id, err)
	}
	if err := s.fillCounts(ctx, []*Job{&j}); err != nil {
		return Job{}, err
	}
	return j, nil
}

// ListJobs implements JobStore: newest first.
func (s *DB) ListJobs(ctx context.Context, f JobFilter) ([]Job, error) {
	limit := f.Limit
	if limit <= 0 || limit > 10000 {
		limit = 100
	}
	q, args := `SELECT `+jobColumns+` FROM jobs`, []any{}
	if f.Role != "" {
		q += ` WHERE role = ?`
		args = append(args, f.Role)
	}
	q += ` ORDER BY created_at DESC, id LIMIT ?`
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list jobs: %w", err)
	}
	out := []Job{}
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list jobs: %w", err)
	}
	ptrs := make([]*Job, len(out))
	for i := range out {
		ptrs[i] = &out[i]
	}
	return out, s.fillCounts(ctx, ptrs)
}

func (s *DB) fillCounts(ctx context.Context, jobs []*Job) error {
	for _, j := range jobs {
		j.Counts, j.Total = map[string]int{}, 0
		rows, err := s.db.QueryContext(ctx, `SELECT state, count(*) FROM job_nodes WHERE job_id = ? GROUP BY state`, j.ID)
		if err != nil {
			return fmt.Errorf("store: job %s counts: %w", j.ID, err)
		}
		for rows.Next() {
			var st string
			var n int
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return err
			}
			j.Counts[st] = n
			j.Total += n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

const jobNodeColumns = `job_id, node_id, node, state, exit_code, error, started_at, finished_at, log_dropped, log_bytes`

func scanJobNode(r scanner, extra ...any) (JobNode, error) {
	var n JobNode
	var code sql.NullInt64
	var started, finished int64
	dest := append([]any{
		&n.JobID, &n.NodeID, &n.Node, &n.State, &code, &n.Error, &started, &finished, &n.LogDropped, &n.LogBytes,
	}, extra...)
	if err := r.Scan(dest...); err != nil {
		return JobNode{}, err
	}
	if code.Valid {
		c := int(code.Int64)
		n.ExitCode = &c
	}
	n.StartedAt, n.FinishedAt = fromUnix(started), fromUnix(finished)
	return n, nil
}

// ListJobNodes implements JobStore.
func (s *DB) ListJobNodes(ctx context.Context, jobID string) ([]JobNode, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+jobNodeColumns+` FROM job_nodes WHERE job_id = ? ORDER BY node`, jobID)
	if err != nil {
		return nil, fmt.Errorf("store: job %s nodes: %w", jobID, err)
	}
	defer rows.Close()
	out := []JobNode{}
	for rows.Next() {
		n, err := scanJobNode(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// GetJobNode implements JobStore.
func (s *DB) GetJobNode(ctx context.Context, jobID, node string) (JobNode, error) {
	var n JobNode
	var head, tail []byte
	n, err := scanJobNode(s.db.QueryRowContext(ctx,
		`SELECT `+jobNodeColumns+
			`, log_head, log_tail FROM job_nodes WHERE job_id = ? AND node = ?`, jobID, node), &head, &tail)
	if errors.Is(err, sql.ErrNoRows) {
		return JobNode{}, fmt.Errorf("store: job %s node %s: %w", jobID, node, ErrNotFound)
	}
	if err != nil {
		return JobNode{}, fmt.Errorf("store: job %s node %s: %w", jobID, node, err)
	}
	n.LogHead, n.LogTail = head, tail
	return n, nil
}

// InterruptJobs implements JobStore.
func (s *DB) InterruptJobs(ctx context.Context, at time.Time) (int, error) {
	return s.interruptJobs(ctx, at, "interrupted by a hub restart", "1 = 1")
}

// InterruptJobsOf implements JobStore.
func (s *DB) InterruptJobsOf(ctx context.Context, owners []string, at time.Time) (int, error) {
	if len(owners) == 0 {
		return 0, nil
	}
	args := make([]any, len(owners))
	for i, o := range owners {
		args[i] = o
	}
	return s.interruptJobs(ctx, at, "interrupted by a hub restart", "owner IN (?"+strings.Repeat(",?", len(owners)-1)+")",
		args...)
}

// InterruptOrphanedJobs implements JobStore. Which replicas are alive is
// read in the same statement, so a job a replica starts right after its
// lease is taken is never taken for an orphan.
func (s *DB) InterruptOrphanedJobs(ctx context.Context, grace time.Duration, at time.Time) (int, error) {
	now, err := s.leaseNow(ctx, s.db)
	if err != nil {
		return 0, fmt.Errorf("store: interrupt jobs of stopped replicas: %w", err)
	}
	return s.interruptJobs(ctx, at, "interrupted: the hub replica running it stopped", `owner != '' AND owner NOT IN
		(SELECT holder FROM leases WHERE name = '`+ReplicaLeasePrefix+`' || holder AND expires_at > ?)`,
		unix(now.Add(-grace)))
}

// markJobsAliveChunk bounds the IDs of one MarkJobsAlive statement.
const markJobsAliveChunk = 500

// MarkJobsAlive implements JobStore.
func (s *DB) MarkJobsAlive(ctx context.Context, ids []string, at time.Time) error {
	for chunk := range slices.Chunk(ids, markJobsAliveChunk) {
		args := make([]any, 0, len(chunk)+2)
		args = append(args, unix(at), JobRunning)
		for _, id := range chunk {
			args = append(args, id)
		}
		q := `UPDATE jobs SET alive_at = ? WHERE state = ? AND id IN (?` + strings.Repeat(",?", len(chunk)-1) + `)`
		if _, err := s.db.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("store: mark %d jobs alive: %w", len(ids), err)
		}
	}
	return nil
}

// interruptedAt is when a running job of table alias j that is being
// interrupted at ? ended: its hub's last sign of life (alive_at), or ?
// for a job without one or one marked after ? (clocks).
const interruptedAt = `CASE WHEN j.alive_at > 0 AND j.alive_at < CAST(? AS BIGINT) THEN j.alive_at
	ELSE CAST(? AS BIGINT) END`

// interruptJobs marks the running jobs that match where (a condition on
// jobs' columns) and their live runs interrupted, fenced by ctx. They end
// at the job's last sign of life, so the downtime is not in a run's
// duration; a run that started after it ends when it started.
func (s *DB) interruptJobs(ctx context.Context, at time.Time, why, where string, args ...any) (int, error) {
	var n int64
	err := s.fencedTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx,
			`UPDATE job_nodes SET state = ?, error = 'the hub stopped while this run was live; rerun with `+
				"`tether jobs rerun`"+`',
		finished_at = CASE WHEN started_at = 0 THEN 0
			ELSE (SELECT CASE WHEN `+interruptedAt+` > job_nodes.started_at THEN `+interruptedAt+`
				ELSE job_nodes.started_at END FROM jobs j WHERE j.id = job_nodes.job_id) END
		WHERE state IN (?,?,?) AND job_id IN (SELECT id FROM jobs WHERE state = ? AND `+where+`)`,
			append([]any{RunInterrupted, unix(at), unix(at), unix(at), unix(at), RunPending, RunWaiting, RunRunning, JobRunning},
				args...)...); err != nil {
			return fmt.Errorf("store: interrupt job nodes: %w", err)
		}
		res, err := tx.ExecContext(ctx, `UPDATE jobs AS j SET state = ?, error = ?, finished_at = `+interruptedAt+
			` WHERE state = ? AND `+where,
			append([]any{JobInterrupted, why, unix(at), unix(at), JobRunning}, args...)...)
		if err != nil {
			return fmt.Errorf("store: interrupt jobs: %w", err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}
