package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
)

// A tree of hubs for the site-hub tests and benchmarks: a root, a region
// hub joined to it as a site, and site hubs joined to the region, each
// with agents of its own. Every hub listens behind a fault proxy
// (faultproxy.Link, TCP and UDP on one port) and advertises the proxy, so
// everything that dials a hub — its child sites' uplinks and its own
// agents — goes through that hub's link: Link.Down on the root's link cuts
// the region's uplink, on the region's cuts the sites' uplinks.
//
// The hubs are the real `tether hub --parent JOIN --site NAME` processes,
// the agents real `tether-edge run` processes with the embedded SSH server
// (/bin/sh as the shell), transports alternating QUIC and TCP.

// TreeConfig describes a tree for BuildTree and StartTree.
type TreeConfig struct {
	// Bin holds tether and tether-edge.
	Bin string
	// Dir holds data dirs, state dirs and logs.
	Dir string
	// Sites are the site hubs under the region (under the root with
	// NoRegion); default berlin, munich.
	Sites []string
	// AgentsPerSite agents join every site hub, named n1..nK (default 3;
	// -1 for none). The same names on every site: n1.berlin and n1.munich
	// are different nodes.
	AgentsPerSite int
	// RegionAgents agents, r1..rK, join the region hub itself.
	RegionAgents int
	// HubArgs are extra `tether hub` flags for every hub, AgentArgs extra
	// `tether-edge run` flags for every agent.
	HubArgs, AgentArgs []string
	// LogLevel of every process (default debug).
	LogLevel string
	// NoRegion puts the sites straight under the root (a two-level tree).
	NoRegion bool
	// NoLinks leaves the fault proxies out: every hub advertises its own
	// port (benchmarks, which must not measure the proxies).
	NoLinks bool
	// Labels gives the labels (KEY=VALUE) of the i-th agent (from 1) a
	// tree start puts on hub h; nil: none.
	Labels func(h *TreeHub, i int) []string
}

func (c *TreeConfig) setDefaults() error {
	if c.Bin == "" || c.Dir == "" {
		return errors.New("testenv: TreeConfig needs Bin and Dir")
	}
	if len(c.Sites) == 0 {
		c.Sites = []string{"berlin", "munich"}
	}
	if c.AgentsPerSite == 0 {
		c.AgentsPerSite = 3
	}
	c.AgentsPerSite = max(c.AgentsPerSite, 0)
	if c.LogLevel == "" {
		c.LogLevel = "debug"
	}
	return nil
}

// TreeHub is one hub of a tree.
type TreeHub struct {
	// Name is the site name ("region", "berlin"); the root's is "root".
	Name string
	// Path is the name the root knows the hub by ("berlin.region"); the
	// root's is "".
	Path    string
	DataDir string
	// Listen is the hub's own tunnel and API port; Link is the fault proxy
	// in front of it, whose address the hub advertises (nil with NoLinks).
	Listen string
	SSH    string
	Link   *faultproxy.Link
	Parent *TreeHub

	tree *Tree
	args []string // `tether hub` arguments, for restarts

	mu   sync.Mutex // guards proc
	proc *Proc
}

// TreeAgent is one agent of a tree.
type TreeAgent struct {
	// Name is the node's own name ("n1"); Hub is the hub it joined.
	Name      string
	Hub       *TreeHub
	Transport string
	StateDir  string
	Proc      *Proc
}

// Path is the node's name as the root knows it ("n1.berlin.region").
func (a *TreeAgent) Path() string { return JoinPath(a.Name, a.Hub.Path) }

// JoinPath appends a site path to a name ("" is the root: nothing).
func JoinPath(name, sitePath string) string {
	if sitePath == "" {
		return name
	}
	return name + "." + sitePath
}

// Tree is a running tree of hubs.
type Tree struct {
	Cfg    TreeConfig
	Root   *TreeHub
	Region *TreeHub // nil with NoRegion
	// Sites by name, and all hubs root first (parents before children).
	Sites map[string]*TreeHub
	Hubs  []*TreeHub

	mu     sync.Mutex // guards agents
	agents []*TreeAgent
}

// BuildTree starts the tree: the root, the region under it, the sites
// under the region, then the agents; it returns once every hub serves and
// every agent's process runs (not yet connected: see WaitTree). On error
// what was started is stopped.
func BuildTree(ctx context.Context, cfg TreeConfig) (_ *Tree, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	tr := &Tree{Cfg: cfg, Sites: map[string]*TreeHub{}}
	defer func() {
		if err != nil {
			tr.Close()
		}
	}()
	if tr.Root, err = tr.startHub(ctx, "root", nil); err != nil {
		return nil, err
	}
	parent := tr.Root
	if !cfg.NoRegion {
		if tr.Region, err = tr.startHub(ctx, "region", tr.Root); err != nil {
			return nil, err
		}
		parent = tr.Region
	}
	for _, s := range cfg.Sites {
		h, err := tr.startHub(ctx, s, parent)
		if err != nil {
			return nil, err
		}
		tr.Sites[s] = h
	}
	if tr.Region != nil {
		for i := 1; i <= cfg.RegionAgents; i++ {
			if _, err := tr.AddAgent(
				ctx, tr.Region, fmt.Sprintf("r%d", i), AgentTransport(i), cfg.labels(tr.Region, i)...,
			); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range cfg.Sites {
		for i := 1; i <= cfg.AgentsPerSite; i++ {
			if _, err := tr.AddAgent(
				ctx, tr.Sites[s], fmt.Sprintf("n%d", i), AgentTransport(i), cfg.labels(tr.Sites[s], i)...,
			); err != nil {
				return nil, err
			}
		}
	}
	return tr, nil
}

func (c *TreeConfig) labels(h *TreeHub, i int) []string {
	if c.Labels == nil {
		return nil
	}
	return c.Labels(h, i)
}

// AgentTransport alternates transports by agent number: odd QUIC, even TCP.
func AgentTransport(i int) string {
	if i%2 == 1 {
		return "quic"
	}
	return "tcp"
}

// startHub starts the hub name, joined to parent as a site (nil: the
// root).
func (tr *Tree) startHub(ctx context.Context, name string, parent *TreeHub) (*TreeHub, error) {
	ports, err := PickPorts(2)
	if err != nil {
		return nil, err
	}
	port, sshPort := ports[0], ports[1]
	h := &TreeHub{Name: name, Parent: parent, tree: tr, DataDir: filepath.Join(tr.Cfg.Dir, "hub-"+name),
		Listen: fmt.Sprintf("127.0.0.1:%d", port), SSH: fmt.Sprintf("127.0.0.1:%d", sshPort)}
	if parent != nil {
		h.Path = JoinPath(name, parent.Path)
	}
	advertise := h.Listen
	if !tr.Cfg.NoLinks {
		if h.Link, err = faultproxy.NewLink("127.0.0.1:0", h.Listen); err != nil {
			return nil, fmt.Errorf("testenv: fault proxy for hub %s: %w", name, err)
		}
		advertise = h.Link.Addr()
	}
	tr.Hubs = append(tr.Hubs, h)
	extra := append([]string{"--advertise", advertise}, tr.Cfg.HubArgs...)
	if parent != nil {
		join, err := parent.Tether(ctx, "site", "token", "create", "--ttl", "1h")
		if err != nil {
			return nil, fmt.Errorf("testenv: site token for %s at %s: %w", name, parent.Name, err)
		}
		extra = append(extra, "--parent", strings.TrimSpace(join), "--site", name)
	}
	h.args = append([]string{"hub"}, HubArgs(h.DataDir, h.Listen, h.SSH, tr.Cfg.LogLevel, extra...)...)
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// Start starts the hub process (again, after Kill or Stop) with the same
// arguments, and waits until it serves.
func (h *TreeHub) Start(ctx context.Context) error {
	p, err := StartProc("hub-"+h.Name, filepath.Join(h.tree.Cfg.Dir, "hub-"+h.Name+".log"),
		exec.Command(filepath.Join(h.tree.Cfg.Bin, "tether"), h.args...))
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.proc = p
	h.mu.Unlock()
	if err := WaitHub(ctx, p, h.DataDir, 60*time.Second); err != nil {
		return fmt.Errorf("testenv: hub %s: %w", h.Name, err)
	}
	return nil
}

// Proc is the hub's current process.
func (h *TreeHub) Proc() *Proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.proc
}

// Kill ends the hub with SIGKILL (no clean shutdown) and waits.
func (h *TreeHub) Kill() {
	if p := h.Proc(); p != nil {
		p.Kill()
	}
}

// Stop ends the hub with SIGTERM and waits (SIGKILL after 10 s).
func (h *TreeHub) Stop() {
	if p := h.Proc(); p != nil {
		p.Stop(syscall.SIGTERM, 10*time.Second)
	}
}

// Tether runs `tether ARGS --data-dir DATA_DIR` (the hub's local admin
// identity) and returns its standard output; a non-zero exit is an error
// carrying standard error.
func (h *TreeHub) Tether(ctx context.Context, args ...string) (string, error) {
	out, errOut, err := h.run(ctx, args...)
	if err != nil {
		return out, fmt.Errorf(
			"testenv: tether %s at hub %s: %w: %s",
			strings.Join(args, " "), h.Name, err, strings.TrimSpace(errOut),
		)
	}
	return out, nil
}

// run is Tether with standard error apart.
func (h *TreeHub) run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(h.tree.Cfg.Bin, "tether"), h.CLIArgs(args...)...)
	var o, e SyncBuffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// CLIArgs are args with `--data-dir DATA_DIR` added before a "--" (what
// follows it is a remote command's).
func (h *TreeHub) CLIArgs(args ...string) []string {
	i := slices.Index(args, "--")
	if i < 0 {
		i = len(args)
	}
	return slices.Concat(args[:i], []string{"--data-dir", h.DataDir}, args[i:])
}

// AddAgent joins a new agent named name to hub h over transport ("quic"
// or "tcp") with the embedded SSH server and the given labels
// (KEY=VALUE), and starts it.
//
// Its sessions run /bin/sh through a wrapper that exports TETHER_TREE_NODE
// (the node's name at the root, "n1.berlin.region"): every agent runs on
// this one machine as one user, so a script run on many nodes tells them
// apart by it (the embedded server passes no variables of the agent's
// own).
func (tr *Tree) AddAgent(
	ctx context.Context, h *TreeHub, name, transport string, labels ...string,
) (*TreeAgent, error) {
	args := []string{"token", "create", "--ttl", "1h"}
	for _, l := range labels {
		args = append(args, "--label", l)
	}
	join, err := h.Tether(ctx, args...)
	if err != nil {
		return nil, err
	}
	a := &TreeAgent{
		Name:      name,
		Hub:       h,
		Transport: transport,
		StateDir:  filepath.Join(tr.Cfg.Dir, "agent-"+name+"-"+h.Name),
	}
	shell := filepath.Join(tr.Cfg.Dir, "shell-"+name+"-"+h.Name)
	wrapper := fmt.Sprintf("#!/bin/sh\nTETHER_TREE_NODE=%s\nexport TETHER_TREE_NODE\nexec /bin/sh \"$@\"\n", a.Path())
	if err := os.WriteFile(shell, []byte(wrapper), 0o755); err != nil {
		return nil, fmt.Errorf("testenv: shell of agent %s: %w", a.Path(), err)
	}
	run := AgentArgs(strings.TrimSpace(join), a.StateDir, name, append([]string{"--ssh", "embedded", "--shell", shell,
		"--transport", transport, "--backoff-max", "2s", "--log-level", tr.Cfg.LogLevel}, tr.Cfg.AgentArgs...)...)
	logName := "agent-" + JoinPath(name, h.Name)
	if a.Proc, err = StartProc(logName, filepath.Join(tr.Cfg.Dir, logName+".log"),
		exec.Command(filepath.Join(tr.Cfg.Bin, "tether-edge"), run...)); err != nil {
		return nil, err
	}
	tr.mu.Lock()
	tr.agents = append(tr.agents, a)
	tr.mu.Unlock()
	return a, nil
}

// Agents are every agent started so far, in order.
func (tr *Tree) Agents() []*TreeAgent {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]*TreeAgent(nil), tr.agents...)
}

// AgentsOf are the agents of hub h.
func (tr *Tree) AgentsOf(h *TreeHub) []*TreeAgent {
	var out []*TreeAgent
	for _, a := range tr.Agents() {
		if a.Hub == h {
			out = append(out, a)
		}
	}
	return out
}

// Close stops every agent, then every hub leaves first, then the links.
func (tr *Tree) Close() {
	var wg sync.WaitGroup
	for _, a := range tr.Agents() {
		wg.Go(func() { a.Proc.Stop(syscall.SIGTERM, 10*time.Second) })
	}
	wg.Wait()
	for i := len(tr.Hubs) - 1; i >= 0; i-- {
		tr.Hubs[i].Stop()
	}
	for _, h := range tr.Hubs {
		if h.Link != nil {
			h.Link.Close()
		}
	}
}

// Logs are the ends of every process's log, for a failure message.
func (tr *Tree) Logs(n int) string {
	var b strings.Builder
	for _, h := range tr.Hubs {
		if p := h.Proc(); p != nil {
			fmt.Fprintf(&b, "---- hub %s log ----\n%s\n", h.Name, p.Tail(n))
		}
	}
	for _, a := range tr.Agents() {
		fmt.Fprintf(&b, "---- agent %s log ----\n%s\n", a.Path(), a.Proc.Tail(n/2))
	}
	return b.String()
}

// StartTree is BuildTree for a test: in the test's temporary directory
// (unless cfg.Dir is set), stopped at cleanup, with the logs shown if the
// test failed.
func StartTree(t T, cfg TreeConfig) *Tree {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	tr, err := BuildTree(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", tr.Logs(6000))
		}
		tr.Close()
	})
	return tr
}
