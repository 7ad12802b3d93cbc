package kubeone

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	k1 "github.com/tether-dev/tether/provisioners/kubeone"
	"github.com/tether-dev/tether/tunnel"
)

// KubeOne runs through the hub: `tether kubeone apply|reset` are jobs of
// the kinds below, which the hub runs itself (jobs.Local): one run per job,
// named after the cluster and bound to its ID, whose process is the
// kubeone binary (provisioners/kubeone) reaching the members through the
// hub's own bastion. The hub's own connections to a cluster's API server
// (kubeconfig, /readyz, proxy) use the cluster's identity over SSH to the
// first control-plane member and a direct-tcpip channel to its loopback,
// as KubeOne does.

// Job kinds of KubeOne runs.
const (
	ApplyKind = "kubeone_apply"
	ResetKind = "kubeone_reset"
)

// Cluster statuses the runs set (StatusCreated is the first).
const (
	StatusApplying    = "applying"
	StatusInstalled   = "installed"
	StatusApplyFailed = "apply_failed"
	StatusResetting   = "resetting"
	StatusReset       = "reset"
	StatusResetFailed = "reset_failed"
)

// Defaults of KubeOne runs and connections.
const (
	// DefaultRunTimeout bounds one apply or reset (KubeOne installs
	// take minutes, pulling images over slow site links longer).
	DefaultRunTimeout = time.Hour
	// DefaultAdminConf is where kubeadm writes the cluster-admin
	// kubeconfig on control-plane nodes.
	DefaultAdminConf = "/etc/kubernetes/admin.conf"
	// DefaultAPIServerPort is kube-apiserver's port on the nodes.
	DefaultAPIServerPort = APIServerPort
	// kubeHealthTimeout bounds the /readyz check of a status request.
	kubeHealthTimeout = 5 * time.Second
	// kubeConnIdle closes a cached SSH connection to a member unused this
	// long.
	kubeConnIdle = 2 * time.Minute
)

// RunsConfig is what a hub's KubeOne runs work with.
type RunsConfig struct {
	Store interface {
		ListKubeOneClusters(ctx context.Context) ([]store.KubeOneCluster, error)
		GetJob(ctx context.Context, id string) (store.Job, error)
	}
	// DataDir holds the runs' private directories (DATA_DIR/kubeone-runs).
	DataDir string
	// Binary is the kubeone binary (a path, or a name looked up on PATH
	// at each run).
	Binary string
	// AdminConf is where kubeadm writes the cluster-admin kubeconfig on
	// control-plane nodes (default DefaultAdminConf); APIServerPort is
	// kube-apiserver's port there (default DefaultAPIServerPort).
	AdminConf     string
	APIServerPort int
	// Door resolves a member to its route: every decision about reaching
	// a node is the door's (access.Door).
	Door interface {
		Resolve(ctx context.Context, ref access.NodeRef) (store.Node, access.Route, error)
	}
	// Online reports "" when the node with this ID has a live tunnel.
	Online func(nodeID string) string
	// HostKey is the host key node n presents now (Live.HostKey).
	HostKey func(n store.Node) ([]byte, bool)
	// HostCAs are the hub's SSH host CA keys members are verified by.
	HostCAs func() []gossh.PublicKey
	// HoldOnce takes the fleet-wide lease of a cluster (by ID) for the
	// life of one run, so replicas sharing the store run one at a time;
	// store.ErrLeaseHeld if another holds it.
	HoldOnce func(clusterID string) (release func(), err error)
	// Metrics, if set, registers the runs' metrics (Unregister takes them
	// off).
	Metrics prometheus.Registerer
	Logger  *slog.Logger
}

// Runs starts and runs a hub's KubeOne jobs and serves its connections to
// clusters' API servers.
type Runs struct {
	cfg      RunsConfig
	hubCtx   context.Context // ends when the hub shuts down
	clusters *Clusters
	engine   *jobs.Engine
	runner   *k1.Runner
	log      *slog.Logger
	metrics  runMetrics

	mu     sync.Mutex        // guards the fields below
	active map[string]string // cluster ID -> its live job
	conns  map[string]*kubeConn
	// retired are replaced connections still carrying API server
	// connections; reapIdle closes them once they carry none.
	retired []*kubeConn
	cas     map[string]*x509.CertPool // cluster ID -> its API server CA (from admin.conf)
}

// kubeConn is a cached SSH connection to a cluster's control-plane member
// with the cluster's identity.
type kubeConn struct {
	nodeID string
	client *gossh.Client
	// guarded by Runs.mu:
	lastUsed time.Time
	channels int // API server connections open through it (proxy, /readyz)
}

type runMetrics struct {
	runs        *prometheus.CounterVec   // action, result
	runDuration *prometheus.HistogramVec // action
	apiChecks   *prometheus.CounterVec   // result: ready|not_ready|error
	proxyConns  *prometheus.CounterVec   // result: ok|error
	running     prometheus.Gauge
}

func newRunMetrics() runMetrics {
	m := runMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_kubeone_runs_total",
			Help: "KubeOne runs (apply, reset) the hub finished, by action and result " +
				"(succeeded, failed, cancelled, interrupted).",
		}, []string{"action", "result"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_kubeone_run_duration_seconds",
			Help:    "Wall time of a kubeone process the hub ran, by action.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"action"}),
		apiChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_kubeone_apiserver_checks_total",
			Help: "GET /readyz of a cluster's API server through its tunnel, by result " +
				"(ready, not_ready, error).",
		}, []string{"result"}),
		proxyConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_kubeone_proxy_connections_total",
			Help: "Connections to a cluster's API server the hub relayed for `tether kubeone proxy`, " +
				"by result (ok, error).",
		}, []string{"result"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_kubeone_runs_running",
			Help: "KubeOne processes the hub runs now.",
		}),
	}
	return m
}

func (m runMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.runs, m.runDuration, m.apiChecks, m.proxyConns, m.running}
}

// Unregister takes the runs' metrics off the hub's registry (a hub's Run
// registers them anew).
func (r *Runs) Unregister() {
	if r.cfg.Metrics == nil {
		return
	}
	for _, c := range r.metrics.collectors() {
		r.cfg.Metrics.Unregister(c)
	}
}

// NewRuns prepares the runs of a hub serving until ctx ends; Attach gives
// them the clusters and the engine once those exist (the engine runs the
// kinds, the clusters ask for the API server's health).
func NewRuns(ctx context.Context, cfg RunsConfig) (*Runs, error) {
	if cfg.AdminConf == "" {
		cfg.AdminConf = DefaultAdminConf
	}
	if cfg.APIServerPort == 0 {
		cfg.APIServerPort = DefaultAPIServerPort
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	workDir := filepath.Join(cfg.DataDir, "kubeone-runs")
	if n, err := k1.CleanStale(workDir); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	} else if n > 0 {
		log.Warn("removed the private directories of KubeOne runs the previous hub process left", "runs", n)
	}
	runner, err := k1.New(k1.Config{Binary: cfg.Binary, WorkDir: workDir, Logger: log})
	if err != nil {
		return nil, err
	}
	m := newRunMetrics()
	if cfg.Metrics != nil {
		for _, c := range m.collectors() {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("hub: KubeOne run metrics: %w", err)
			}
		}
	}
	return &Runs{cfg: cfg, hubCtx: ctx, runner: runner, log: log, metrics: m,
		active: map[string]string{}, conns: map[string]*kubeConn{}, cas: map[string]*x509.CertPool{}}, nil
}

// Kinds are the job kinds the runs implement, for jobs.Config.Local.
func (r *Runs) Kinds() map[string]jobs.Local {
	return map[string]jobs.Local{ApplyKind: r, ResetKind: r}
}

// Attach completes the runs; call it before the engine starts a job or the
// API serves.
func (r *Runs) Attach(clusters *Clusters, engine *jobs.Engine) {
	r.clusters, r.engine = clusters, engine
}

// Recover ends the "running" last run a previous hub process left on its
// clusters with what the job engine recorded for that job (interrupted).
func (r *Runs) Recover(ctx context.Context) {
	cs, err := r.cfg.Store.ListKubeOneClusters(ctx)
	if err != nil {
		r.log.Error("KubeOne clusters at start", "err", err)
		return
	}
	for _, c := range cs {
		if c.LastApply.Job == "" || c.LastApply.Result != store.JobRunning {
			continue
		}
		j, err := r.cfg.Store.GetJob(ctx, c.LastApply.Job)
		if err != nil || j.State == store.JobRunning {
			continue
		}
		status := StatusApplyFailed
		if c.Status == StatusResetting {
			status = StatusResetFailed
		}
		if err := r.clusters.Record(ctx, c, status, store.KubeOneApply{
			Job: j.ID, Result: j.State, At: j.FinishedAt,
		}); err != nil {
			r.log.Error("record the interrupted KubeOne run", "cluster", c.Name, "err", err)
		}
	}
}

func actionOf(kind string) k1.Action {
	if kind == ResetKind {
		return k1.Reset
	}
	return k1.Apply
}

// Start serves the API: it starts `kubeone apply` (or reset)
// for the cluster as a job. Without auto it refuses unless every member's
// tunnel is up; with auto the job waits (up to the timeout) until they
// are. One run per cluster at a time.
func (r *Runs) Start(ctx context.Context, name string, req apitype.KubeOneRunRequest, by string) (store.Job, error) {
	action := k1.Action(req.Action)
	if !action.Valid() {
		return store.Job{}, fmt.Errorf("%w: action %q: want apply or reset", ErrInvalid, req.Action)
	}
	timeout := time.Duration(req.TimeoutSeconds) * time.Second
	if timeout == 0 {
		timeout = DefaultRunTimeout
	}
	if timeout < time.Second || timeout > jobs.MaxTimeout {
		return store.Job{}, fmt.Errorf("%w: timeout %s: want 1s..%s", ErrInvalid, timeout, jobs.MaxTimeout)
	}
	if _, err := r.runner.Binary(); err != nil {
		return store.Job{}, fmt.Errorf("%w: %w", ErrConflict, err)
	}
	c, err := r.clusters.Load(ctx, name)
	if err != nil {
		return store.Job{}, err
	}
	kind := ApplyKind
	if action == k1.Reset {
		kind = ResetKind
	}
	spec := store.JobSpec{Command: "kubeone " + string(action) + " --manifest kubeone.yaml --auto-approve", Parallel: 1,
		TimeoutSeconds: int(timeout / time.Second)}
	if req.Auto {
		// The run waits for the members as a run of tether run
		// --wait-online waits for its node.
		spec.WaitOnlineSecs = int(timeout / time.Second)
	}
	if err := jobs.Validate(&spec, nil); err != nil {
		return store.Job{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if id := r.active[c.ID]; id != "" && r.engine.Running(id) {
		return store.Job{}, fmt.Errorf(
			"%w: a KubeOne run (job %s) is under way for cluster %q; follow it with "+
				"`tether jobs logs %s --follow` or stop it with `tether jobs cancel %s`",
			ErrConflict,
			id,
			c.Name,
			id,
			id,
		)
	}
	if !req.Auto {
		if reason := r.membersReady(c); reason != "" {
			return store.Job{}, fmt.Errorf(
				"%w: not starting kubeone %s for cluster %q: %s; start it when they are connected, "+
					"or pass --auto to start it once they are",
				ErrConflict,
				action,
				c.Name,
				reason,
			)
		}
	}
	// One run per cluster in the whole fleet: replicas sharing the store
	// each take the cluster's lease for the run's life.
	release, err := r.cfg.HoldOnce(c.ID)
	if errors.Is(err, store.ErrLeaseHeld) {
		return store.Job{}, fmt.Errorf(
			"%w: a KubeOne run for cluster %q is under way on another hub replica (%v); follow it with `tether jobs list`",
			ErrConflict,
			c.Name,
			err,
		)
	}
	if err != nil {
		return store.Job{}, err
	}
	j, err := r.engine.Start(
		ctx,
		store.Job{Kind: kind, Spec: spec, CreatedBy: by},
		[]store.NodeRef{{ID: c.ID, Name: c.Name}},
	)
	if err != nil {
		release()
		return store.Job{}, err
	}
	go func() {
		defer release()
		_, _ = r.engine.Wait(r.hubCtx, j.ID)
	}()
	r.active[c.ID] = j.ID
	r.log.Info("KubeOne run started", "cluster", c.Name, "action", action, "job", j.ID, "auto", req.Auto, "by", by)
	return j, nil
}

// membersReady reports "" when every member's tunnel is up and its host
// key known (so the manifest can pin it), else which members are not.
func (r *Runs) membersReady(c store.KubeOneCluster) string {
	var off []string
	for _, m := range c.Members {
		if reason := r.cfg.Online(m.NodeID); reason != "" {
			off = append(off, fmt.Sprintf("%s (%s)", m.Node.Name, reason))
			continue
		}
		if _, ok := r.cfg.HostKey(m.Node); !ok {
			off = append(off, m.Node.Name+" (connected, but its SSH host key is not known yet)")
		}
	}
	if len(off) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d members offline: %s", len(off), len(c.Members), strings.Join(off, ", "))
}

// Ready implements jobs.Local.
func (r *Runs) Ready(_ store.Job, clusterID string) string {
	c, err := r.clusters.LoadByID(context.Background(), clusterID)
	if err != nil {
		return err.Error()
	}
	return r.membersReady(c)
}

// Run implements jobs.Local: it runs kubeone for the cluster and records
// the outcome on the cluster.
func (r *Runs) Run(ctx context.Context, j store.Job, clusterID string, stdout, stderr io.Writer) (int, error) {
	action := actionOf(j.Kind)
	c, err := r.clusters.LoadByID(ctx, clusterID)
	if err != nil {
		return -1, err
	}
	// Members may have gone offline between the readiness check and now:
	// KubeOne would fail on them after minutes; say it now.
	if reason := r.membersReady(c); reason != "" {
		return -1, errors.New(reason)
	}
	// The manifest pins the host certificate the hub issued each member
	// at its connect, and the members were sent the cluster's key when it
	// was created or they joined it; a member installs both a moment after
	// the hub sent them. KubeOne would fail on one that has not yet.
	if err := r.waitPinsPresented(ctx, c); err != nil {
		return -1, err
	}
	running, done := StatusApplying, StatusInstalled
	failed := StatusApplyFailed
	if action == k1.Reset {
		running, done, failed = StatusResetting, StatusReset, StatusResetFailed
	}
	started := time.Now().UTC()
	rec := store.KubeOneApply{Job: j.ID, Result: store.JobRunning, At: started}
	if err := r.clusters.Record(ctx, c, running, rec); err != nil {
		return -1, err
	}
	key, cert, err := r.clusters.RunSecrets(c)
	if err != nil {
		r.finish(c, j, action, failed, store.JobFailed, 0)
		return -1, err
	}
	bin, _ := r.runner.Binary()
	fmt.Fprintf(
		stdout,
		"[tether] kubeone %s for cluster %s (%d members) with %s; bastion: this hub\n",
		action,
		c.Name,
		len(c.Members),
		bin,
	)
	r.metrics.running.Inc()
	res, err := r.runner.Run(ctx, action, k1.Secrets{PrivateKey: key, Certificate: cert},
		func(p k1.Paths) ([]byte, error) {
			return r.clusters.Manifest(ctx, c.Name, ManifestOptions{KeyFile: p.PrivateKey, CertFile: p.Certificate})
		}, stdout, stderr)
	r.metrics.running.Dec()
	r.metrics.runDuration.WithLabelValues(string(action)).Observe(res.Duration.Seconds())
	switch {
	case err != nil && errors.Is(err, k1.ErrStopped) && r.hubCtx.Err() != nil:
		r.finish(c, j, action, failed, store.JobInterrupted, res.Duration)
	case err != nil && errors.Is(err, k1.ErrStopped):
		r.finish(c, j, action, failed, store.JobCancelled, res.Duration)
	case err != nil || res.ExitCode != 0:
		r.finish(c, j, action, failed, store.JobFailed, res.Duration)
	default:
		r.finish(c, j, action, done, store.JobSucceeded, res.Duration)
	}
	if action == k1.Reset || err != nil || res.ExitCode != 0 {
		r.forget(c.ID)
	}
	return res.ExitCode, err
}

// pinWait bounds how long a run waits for its members to be ready for
// KubeOne's connections.
const pinWait = 15 * time.Second

// waitPinsPresented waits until every member does what KubeOne's
// connection will need: present, to a client negotiating host keys as
// KubeOne does, exactly the host key the manifest pins, and accept the
// cluster's certificate for its login. Both are pushed to a node when it
// connects and when the cluster changes, and the node installs them a
// moment later (a managed sshd reloads).
func (r *Runs) waitPinsPresented(ctx context.Context, c store.KubeOneCluster) error {
	signer, err := r.clusters.Signer(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pinWait)
	defer cancel()
	for {
		var mu sync.Mutex
		var notReady []string
		var wg sync.WaitGroup
		for _, m := range c.Members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.checkMember(ctx, c, m, signer); err != nil {
					mu.Lock()
					notReady = append(notReady, m.Node.Name+": "+err.Error())
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(notReady) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			sort.Strings(notReady)
			return fmt.Errorf(
				"not starting kubeone: members not ready for its connections after %s: %s",
				pinWait,
				strings.Join(notReady, "; "),
			)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkMember logs in to member m as KubeOne will: the cluster's login
// and certificate, x/crypto's default host key algorithms (certificates
// first), the host key compared byte for byte with the one the manifest
// pins.
func (r *Runs) checkMember(
	ctx context.Context,
	c store.KubeOneCluster,
	m store.KubeOneMember,
	signer gossh.Signer,
) error {
	want, ok := r.cfg.HostKey(m.Node)
	if !ok {
		return errors.New("its SSH host key is not known")
	}
	n, route, err := r.cfg.Door.Resolve(ctx, access.ByID(m.NodeID))
	if err != nil {
		return err
	}
	raw, err := route.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
	if err != nil {
		return fmt.Errorf("open ssh stream: %w", err)
	}
	defer raw.Close()
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	cc, chans, reqs, err := gossh.NewClientConn(
		raw,
		n.Name,
		&gossh.ClientConfig{User: c.Login, Timeout: 10 * time.Second,
			Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
			HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error {
				if !bytes.Equal(key.Marshal(), want) {
					return errors.New("it presents another host key than the one the hub issued it")
				}
				return nil
			}},
	)
	if err != nil {
		return err
	}
	gossh.NewClient(cc, chans, reqs).Close()
	return nil
}

// finish records the end of a run on the cluster (if it still exists) and
// in the metrics.
func (r *Runs) finish(
	c store.KubeOneCluster,
	j store.Job,
	action k1.Action,
	status, result string,
	took time.Duration,
) {
	r.metrics.runs.WithLabelValues(string(action), result).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.clusters.LoadByID(ctx, c.ID); err != nil {
		return
	}
	rec := store.KubeOneApply{Job: j.ID, Result: result, At: time.Now().UTC()}
	if err := r.clusters.Record(ctx, c, status, rec); err != nil {
		r.log.Error("record the KubeOne run", "cluster", c.Name, "job", j.ID, "err", err)
	}
	r.log.Info("KubeOne run ended", "cluster", c.Name, "action", action, "job", j.ID, "result", result, "took", took)
}

// --- the hub's own connections to a cluster's API server ---

// conn returns an SSH connection, with the cluster's identity, to the
// first control-plane member whose tunnel is up (cached while it works).
func (r *Runs) conn(ctx context.Context, c store.KubeOneCluster) (*kubeConn, string, error) {
	var target *store.KubeOneMember
	for i, m := range c.Members {
		if m.Role == store.KubeOneControlPlane && r.cfg.Online(m.NodeID) == "" {
			target = &c.Members[i]
			break
		}
	}
	if target == nil {
		return nil, "", fmt.Errorf("%w: no control-plane member of cluster %q is connected", ErrConflict, c.Name)
	}
	r.mu.Lock()
	if kc := r.conns[c.ID]; kc != nil && kc.nodeID == target.NodeID {
		kc.lastUsed = time.Now()
		r.mu.Unlock()
		return kc, target.Node.Name, nil
	}
	r.mu.Unlock()
	client, err := r.dial(ctx, c, *target)
	if err != nil {
		return nil, "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if kc := r.conns[c.ID]; kc != nil {
		if kc.nodeID == target.NodeID {
			// Another caller connected meanwhile: share that one.
			client.Close()
			kc.lastUsed = time.Now()
			return kc, target.Node.Name, nil
		}
		// The cached member is no longer the first connected one: new
		// callers go to target; the old connection closes when its last
		// API server connection does.
		r.retireLocked(kc)
	}
	kc := &kubeConn{nodeID: target.NodeID, client: client, lastUsed: time.Now()}
	r.conns[c.ID] = kc
	go func() {
		// Drop the cached connection when it breaks (the member's tunnel
		// closed, the member left the cluster and lost the key).
		_ = client.Wait()
		r.mu.Lock()
		if r.conns[c.ID] == kc {
			delete(r.conns, c.ID)
		}
		r.mu.Unlock()
	}()
	return kc, target.Node.Name, nil
}

// dial opens the SSH connection to member m through its tunnel, verifying
// the member's host certificate against the hub's host CA.
func (r *Runs) dial(ctx context.Context, c store.KubeOneCluster, m store.KubeOneMember) (*gossh.Client, error) {
	signer, err := r.clusters.Signer(c)
	if err != nil {
		return nil, err
	}
	n, route, err := r.cfg.Door.Resolve(ctx, access.ByID(m.NodeID))
	if err != nil {
		return nil, err
	}
	raw, err := route.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
	if err != nil {
		return nil, fmt.Errorf("kubeone: %s: open ssh stream: %w", n.Name, err)
	}
	authorities := r.cfg.HostCAs()
	checker := &gossh.CertChecker{IsHostAuthority: func(auth gossh.PublicKey, _ string) bool {
		return slices.ContainsFunc(
			authorities,
			func(k gossh.PublicKey) bool { return string(k.Marshal()) == string(auth.Marshal()) },
		)
	}}
	cfg := &gossh.ClientConfig{
		User:    c.Login,
		Auth:    []gossh.AuthMethod{gossh.PublicKeys(signer)},
		Timeout: 15 * time.Second,
		HostKeyCallback: func(_ string, remote net.Addr, key gossh.PublicKey) error {
			// The host certificate must name the node (its name is the
			// principal the hub signed it for).
			return checker.CheckHostKey(net.JoinHostPort(n.Name, "22"), remote, key)
		},
		HostKeyAlgorithms: certHostKeyAlgorithms(),
	}
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	cc, chans, reqs, err := gossh.NewClientConn(raw, n.Name, cfg)
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("kubeone: ssh to %s as %s with cluster %s's identity: %w", n.Name, c.Login, c.Name, err)
	}
	return gossh.NewClient(cc, chans, reqs), nil
}

// certHostKeyAlgorithms asks for host certificates only: the hub trusts
// nodes by its host CA, never by a plain key.
func certHostKeyAlgorithms() []string {
	return []string{
		gossh.CertAlgoED25519v01,
		gossh.CertAlgoECDSA256v01,
		gossh.CertAlgoECDSA384v01,
		gossh.CertAlgoECDSA521v01,
		gossh.CertAlgoRSASHA512v01,
		gossh.CertAlgoRSASHA256v01,
	}
}

// retireLocked closes kc now if nothing uses it, else once nothing does;
// r.mu is held.
func (r *Runs) retireLocked(kc *kubeConn) {
	if kc.channels == 0 {
		kc.client.Close()
		return
	}
	r.retired = append(r.retired, kc)
}

// forget drops the cluster's cached connection and API server CA.
func (r *Runs) forget(clusterID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kc := r.conns[clusterID]; kc != nil {
		kc.client.Close()
		delete(r.conns, clusterID)
	}
	delete(r.cas, clusterID)
}

// ReapIdle closes cached connections unused for kubeConnIdle, until ctx
// ends; then it closes them all.
func (r *Runs) ReapIdle(ctx context.Context) {
	t := time.NewTicker(kubeConnIdle / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for id, kc := range r.conns {
				kc.client.Close()
				delete(r.conns, id)
			}
			for _, kc := range r.retired {
				kc.client.Close()
			}
			r.retired = nil
			r.mu.Unlock()
			return
		case <-t.C:
			r.mu.Lock()
			for id, kc := range r.conns {
				if kc.channels == 0 && time.Since(kc.lastUsed) > kubeConnIdle {
					kc.client.Close()
					delete(r.conns, id)
				}
			}
			live := r.retired[:0]
			for _, kc := range r.retired {
				if kc.channels == 0 {
					kc.client.Close()
				} else {
					live = append(live, kc)
				}
			}
			r.retired = live
			r.mu.Unlock()
		}
	}
}

// Kubeconfig serves the API: the cluster-admin kubeconfig
// kubeadm wrote on the first connected control-plane member, read with
// sudo (as KubeOne reads it) through the tunnel.
func (r *Runs) Kubeconfig(ctx context.Context, name string) ([]byte, error) {
	c, err := r.clusters.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	kc, node, err := r.conn(ctx, c)
	if err != nil {
		return nil, err
	}
	sess, err := kc.client.NewSession()
	if err != nil {
		r.forget(c.ID)
		return nil, fmt.Errorf("kubeone: %s: session: %w", node, err)
	}
	defer sess.Close()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	var out, errOut strings.Builder
	sess.Stdout, sess.Stderr = &limitedBuilder{b: &out, n: 1 << 20}, &limitedBuilder{b: &errOut, n: 4096}
	path := r.cfg.AdminConf
	if err := sess.Run("sudo cat " + shellQuote(path)); err != nil {
		return nil, fmt.Errorf(
			"%w: %s: sudo cat %s: %v: %s (has `tether kubeone apply %s` succeeded?)",
			ErrConflict,
			node,
			path,
			err,
			strings.TrimSpace(errOut.String()),
			c.Name,
		)
	}
	b := []byte(out.String())
	if pool, err := kubeconfigCA(b); err == nil {
		r.mu.Lock()
		r.cas[c.ID] = pool
		r.mu.Unlock()
	}
	return b, nil
}

type limitedBuilder struct {
	b *strings.Builder
	n int
}

func (l *limitedBuilder) Write(p []byte) (int, error) {
	if l.b.Len()+len(p) > l.n {
		return 0, fmt.Errorf("output longer than %d bytes", l.n)
	}
	return l.b.Write(p)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// kubeconfigCA is the API server CA of a kubeconfig's first cluster
// (certificate-authority-data).
func kubeconfigCA(b []byte) (*x509.CertPool, error) {
	var kc struct {
		Clusters []struct {
			Cluster struct {
				CAData string `yaml:"certificate-authority-data"`
			} `yaml:"cluster"`
		} `yaml:"clusters"`
	}
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, err
	}
	if len(kc.Clusters) == 0 || kc.Clusters[0].Cluster.CAData == "" {
		return nil, errors.New("kubeconfig names no cluster CA")
	}
	pemData, err := base64.StdEncoding.DecodeString(kc.Clusters[0].Cluster.CAData)
	if err != nil {
		return nil, fmt.Errorf("certificate-authority-data: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("certificate-authority-data holds no certificate")
	}
	return pool, nil
}

// DialAPIServer serves the API: a connection to the cluster's
// kube-apiserver, from the first connected control-plane member's SSH
// connection to its own loopback.
func (r *Runs) DialAPIServer(ctx context.Context, name string) (net.Conn, error) {
	c, err := r.clusters.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	conn, err := r.dialAPI(ctx, c)
	res := "ok"
	if err != nil {
		res = "error"
	}
	r.metrics.proxyConns.WithLabelValues(res).Inc()
	return conn, err
}

func (r *Runs) dialAPI(ctx context.Context, c store.KubeOneCluster) (net.Conn, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.cfg.APIServerPort))
	for attempt := 0; ; attempt++ {
		kc, node, err := r.conn(ctx, c)
		if err != nil {
			return nil, err
		}
		conn, err := kc.client.DialContext(ctx, "tcp", addr)
		if err == nil {
			r.mu.Lock()
			kc.channels++
			r.mu.Unlock()
			return &apiConn{Conn: conn, release: func() {
				r.mu.Lock()
				kc.channels--
				kc.lastUsed = time.Now()
				r.mu.Unlock()
			}}, nil
		}
		var open *gossh.OpenChannelError
		if errors.As(err, &open) || attempt > 0 {
			return nil, fmt.Errorf(
				"%w: %s: kube-apiserver %s through the node's SSH connection: %v",
				ErrConflict,
				node,
				addr,
				err,
			)
		}
		// The cached connection broke: once more on a new one.
		r.forget(c.ID)
	}
}

// KubeHealth is the status's API server check (Config.KubeHealth):
// once an apply succeeded, GET /readyz through the tunnel, verified against
// the cluster's CA from its admin.conf.
func (r *Runs) KubeHealth(ctx context.Context, c store.KubeOneCluster) *KubeHealth {
	if c.Status != StatusInstalled && c.Status != StatusApplying && c.Status != StatusApplyFailed {
		return nil
	}
	if c.Status != StatusInstalled && !r.appliedOnce(ctx, c) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, kubeHealthTimeout)
	defer cancel()
	h := &KubeHealth{CheckedAt: time.Now().UTC()}
	h.Ready, h.Detail = r.readyz(ctx, c)
	res := "not_ready"
	switch {
	case h.Ready:
		res = "ready"
	case strings.HasPrefix(h.Detail, "unreachable: "):
		res = "error"
	}
	r.metrics.apiChecks.WithLabelValues(res).Inc()
	return h
}

// appliedOnce reports whether the cluster's CA is known (an earlier check
// or kubeconfig fetched it): the API server was installed.
func (r *Runs) appliedOnce(_ context.Context, c store.KubeOneCluster) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cas[c.ID] != nil
}

func (r *Runs) readyz(ctx context.Context, c store.KubeOneCluster) (bool, string) {
	r.mu.Lock()
	pool := r.cas[c.ID]
	r.mu.Unlock()
	if pool == nil {
		if _, err := r.Kubeconfig(ctx, c.Name); err != nil {
			return false, "unreachable: " + err.Error()
		}
		r.mu.Lock()
		pool = r.cas[c.ID]
		r.mu.Unlock()
		if pool == nil {
			return false, "unreachable: the admin kubeconfig names no cluster CA"
		}
	}
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dialAPI(ctx, c) },
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes", MinVersion: tls.VersionTLS12},
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://kubernetes/readyz", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		var unknown x509.UnknownAuthorityError
		if errors.As(err, &unknown) {
			// The cluster was reset and applied again: a new CA.
			r.mu.Lock()
			delete(r.cas, c.ID)
			r.mu.Unlock()
		}
		return false, "unreachable: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	detail := strings.TrimSpace(string(b))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("%s: %s", resp.Status, detail)
	}
	return true, detail
}

// apiConn is a connection to an API server through a cached SSH
// connection, which stays open while any such connection is.
type apiConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *apiConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the channel (the proxy's client finished sending).
func (c *apiConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Release is the KubeOne release of the binary the runs use (for
// Config.KubeOneRelease).
func (r *Runs) Release(ctx context.Context) (k1.Release, error) { return r.runner.Version(ctx) }
