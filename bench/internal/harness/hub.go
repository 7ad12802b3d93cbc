package harness

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// Hub is a running `tether hub`.
type Hub struct {
	*Proc
	env     *Env
	DataDir string
	Listen  string // tunnel + API address
	SSH     string // bastion address
	Extra   []string
	http    *http.Client
}

// StartHub starts `tether hub` on loopback with dataDir (created if new) and
// waits until it is serving. extra are more hub flags.
func (e *Env) StartHub(ctx context.Context, dataDir string, extra ...string) (*Hub, error) {
	ports, err := testenv.PickPorts(2)
	if err != nil {
		return nil, err
	}
	h := &Hub{env: e, DataDir: dataDir, Listen: fmt.Sprintf("127.0.0.1:%d", ports[0]),
		SSH: fmt.Sprintf("127.0.0.1:%d", ports[1]), Extra: extra}
	return h, h.start(ctx)
}

// StartHubAt starts a hub on fixed addresses (a restart keeps them, so the
// agents' join strings stay valid).
func (e *Env) StartHubAt(ctx context.Context, dataDir, listen, ssh string, extra ...string) (*Hub, error) {
	h := &Hub{env: e, DataDir: dataDir, Listen: listen, SSH: ssh, Extra: extra}
	return h, h.start(ctx)
}

func (h *Hub) start(ctx context.Context) error {
	args := append([]string{"hub"}, testenv.HubArgs(h.DataDir, h.Listen, h.SSH, "warn", h.Extra...)...)
	bin := filepath.Join(h.env.Bin, "tether")
	if h.env.HubBin != "" {
		// A profiling build (bench/cmd/hubprof) takes the same flags
		// without the subcommand.
		bin, args = h.env.HubBin, args[1:]
	}
	p, err := h.env.Start("hub", bin, args...)
	if err != nil {
		return err
	}
	h.Proc = p
	if err := testenv.WaitHub(ctx, p.Proc, h.DataDir, 60*time.Second); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(h.DataDir, "admin", "ca.crt"))
	if err != nil {
		return fmt.Errorf("harness: hub CA: %w", err)
	}
	pool.AppendCertsFromPEM(ca)
	h.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "hub.tether.internal"}}}
	return nil
}

// Stop stops the hub process running now, SIGKILL after grace. It is
// Hub's own method, not the embedded Proc's, so that `defer hub.Stop(…)`
// stops the process a Restart started, not the one it replaced (which
// would leave the new hub running on the data dir).
func (h *Hub) Stop(grace time.Duration) { h.Proc.Stop(grace) }

// Restart stops the hub (SIGTERM: a graceful shutdown that closes every
// tunnel) and starts it again on the same addresses. It returns when the new
// hub serves; stopped is when the old one had exited.
func (h *Hub) Restart(ctx context.Context) (stopped time.Time, err error) {
	h.Stop(30 * time.Second)
	stopped = time.Now()
	return stopped, h.start(ctx)
}

// Tether runs `tether ARGS... --data-dir DATADIR` and returns its stdout.
func (h *Hub) Tether(ctx context.Context, args ...string) (string, error) {
	// Before a "--", after which everything is the remote command.
	i := slices.Index(args, "--")
	if i < 0 {
		i = len(args)
	}
	full := append(append(slices.Clone(args[:i]), "--data-dir", h.DataDir), args[i:]...)
	return Run(ctx, filepath.Join(h.env.Bin, "tether"), full...)
}

// Token creates a join token with uses and labels.
func (h *Hub) Token(ctx context.Context, uses int, labels ...string) (string, error) {
	args := []string{"token", "create", "--uses", strconv.Itoa(uses), "--ttl", "24h"}
	for _, l := range labels {
		args = append(args, "--label", l)
	}
	out, err := h.Tether(ctx, args...)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// Metrics scrapes the hub's /metrics into name{labels} -> value.
func (h *Hub) Metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+h.Listen+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("harness: scrape hub metrics: %w", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// Connected is the hub's tether_nodes_connected for transport ("quic", "tcp").
func (h *Hub) Connected(ctx context.Context, transport string) (int, error) {
	m, err := h.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return int(m[`tether_nodes_connected{transport="`+transport+`"}`]), nil
}

// Nodes lists the hub's nodes (name -> online).
func (h *Hub) Nodes(ctx context.Context) (map[string]bool, error) {
	out, err := h.Tether(ctx, "nodes", "-o", "json")
	if err != nil {
		return nil, err
	}
	var nodes []struct {
		Name   string `json:"name"`
		Online bool   `json:"online"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		return nil, fmt.Errorf("harness: parse tether nodes: %w", err)
	}
	m := map[string]bool{}
	for _, n := range nodes {
		m[n.Name] = n.Online
	}
	return m, nil
}
