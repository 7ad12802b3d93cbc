package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/deploy/grafana"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/pki"
)

// TestGrafanaDashboard holds every query of deploy/grafana/tether-hub.json
// (panels and variables) to the /metrics of a real hub that has seen each
// thing the dashboard draws, so that every labelled series exists: nodes
// over QUIC and over TCP, a join with an unknown token, a jump and a
// bastion login with an unknown key, an API request without a credential,
// a job that succeeds and one that fails, and an upgrade whose nodes wait
// for confirmation. A query naming a metric or a
// label the hub does not export fails the test (TestCheckQuery in
// deploy/grafana shows each mistake it catches).
func TestGrafanaDashboard(t *testing.T) {
	d, err := grafana.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(d.CheckLayout()...); err != nil {
		t.Fatal(err)
	}

	// A bundle in a real OCI registry, for an upgrade the nodes wait to
	// confirm: its rollout, its nodes by step and the time they spent in
	// pending are exported while it is live.
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	install := filepath.Join(t.TempDir(), "install.sh")
	testenv.WriteFile(t, install, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	bundle := reg.Ref("tether/graf-bundle:v1")
	if _, err := reg.PushBundle(t.Context(), bundle, "1.0.0", map[string]string{"install.sh": install}); err != nil {
		t.Fatal(err)
	}

	h := startHubIn(t, "", 0, "--registry-ca", reg.CAFile)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--ttl", "10m", "--uses", "2", "--label", "site=lab")
	for _, n := range []struct{ name, transport string }{{"graf-quic", "quic"}, {"graf-tcp", "tcp"}} {
		startAgent(t, join, n.name, "--ssh", "embedded", "--transport", n.transport)
		h.waitOnline(n.name, n.transport)
	}

	// Refusals: a join with an unknown token, a bastion login with an
	// unknown key, an API request without a credential.
	parsed, err := pki.ParseJoinString(join)
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(parsed.Token, ".")
	unknown := strings.Replace(join, id+".", "zzzzzzzz.", 1)
	if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether-edge"), "join", unknown,
		"--name", "graf-refused", "--state-dir", filepath.Join(t.TempDir(), "refused"),
	); code == 0 || !strings.Contains(errOut, "unknown") {
		t.Fatalf("join with an unknown token: exit %d, %q", code, errOut)
	}
	stranger := testenv.NewKeyFile(t, filepath.Join(t.TempDir(), "stranger"))
	if _, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", newSSHClient(t, h).cfg,
		"-o", "IdentityFile="+stranger.Path, "-p", strconv.Itoa(h.sshPort), "mallory@127.0.0.1", "true",
	); code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Fatalf("bastion login with an unknown key: exit %d, %q", code, errOut)
	}
	if code := h.getNoCredential(t, "/v1/nodes"); code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/nodes without a credential: %d, want 401", code)
	}

	// A jump that relays bytes both ways.
	if out, errOut, code := newSSHClient(t, h).run(
		30*time.Second, "graf-quic", "echo", "via-jump",
	); code != 0 || strings.TrimSpace(out) != "via-jump" {
		t.Fatalf("ssh -J: exit %d, out %q, err %q", code, out, errOut)
	}
	// A job that succeeds on both nodes and one that fails on both.
	if _, errOut, code := h.run(60*time.Second, "-l", "site=lab", "--", "true"); code != 0 {
		t.Fatalf("tether run true: exit %d: %s", code, errOut)
	}
	if _, errOut, code := h.run(60*time.Second, "-l", "site=lab", "--", "false"); code == 0 {
		t.Fatalf("tether run false: exit 0: %s", errOut)
	}

	h.cli("upgrade", "create", "graf-up", "--artifact", bundle, "-l", "site=lab", "--require-confirmation")

	// Counters of finished work may land a moment after the CLI returns:
	// scrape until the dashboard checks clean, and show the last scrape's
	// errors if it never does.
	var errs []error
	var ex *grafana.Exports
	if err := testenv.Poll(t.Context(), 20*time.Second, "the dashboard's queries to match /metrics", func() bool {
		ex, err = grafana.ParseExposition(strings.NewReader(h.metrics(t)))
		if err != nil {
			t.Fatal(err)
		}
		errs = grafana.CheckQueries(d, ex)
		return len(errs) == 0
	}); err != nil {
		t.Fatalf("%v: the dashboard's queries do not match the hub's /metrics:\n%v\nexported: %s",
			err, errors.Join(errs...), strings.Join(ex.Names(), " "))
	}

	t.Run("prometheus", func(t *testing.T) { promScrapesReadme(t, h, d) })
}

// promScrapesReadme runs real Prometheus (the Debian package) with the
// docs' scrape configuration against the hub, and evaluates every panel
// query and the Job variable through its HTTP API: the docs' snippet
// must scrape (https, the hub's CA, no credential), and each query must
// evaluate and return series.
func promScrapesReadme(t *testing.T, h *hub, d *grafana.Dashboard) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (Debian package prometheus; make deps installs it): " +
			"the docs' scrape configuration is not run")
	}
	cfg := readmePromConfig(t)
	for old, repl := range map[string]string{
		"/etc/prometheus/tether-ca.crt": filepath.Join(h.dataDir, "ca", "ca.crt"),
		"hub.example:7443":              h.apiAddr(),
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("the docs' scrape configuration (docs/operations.md) no longer has %q; update this test:\n%s",
				old, cfg)
		}
		cfg = strings.ReplaceAll(cfg, old, repl)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	testenv.WriteFile(t, cfgPath, []byte("global:\n  scrape_interval: 1s\n"+cfg), 0o600)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	start(t, "prometheus", bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)

	api := func(path string, params url.Values, v any) error {
		resp, err := http.Get("http://" + addr + path + "?" + params.Encode())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct {
			Status, Error string
			Data          json.RawMessage
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
		}
		if r.Status != "success" {
			return fmt.Errorf("%s %v: %s", path, params, r.Error)
		}
		return json.Unmarshal(r.Data, v)
	}
	// Three scrapes: enough samples for rate() over a minute.
	var health string
	if err := testenv.Poll(t.Context(), 30*time.Second, "Prometheus to scrape the hub three times", func() bool {
		var targets struct {
			ActiveTargets []struct{ Health, LastError string } `json:"activeTargets"`
		}
		if api("/api/v1/targets", nil, &targets) == nil && len(targets.ActiveTargets) == 1 {
			health = targets.ActiveTargets[0].Health + " " + targets.ActiveTargets[0].LastError
		}
		var v struct{ Result []struct{ Value [2]any } }
		return api("/api/v1/query",
			url.Values{"query": {`count_over_time(up{job="tether"}[1m]) >= 3 and up == 1`}}, &v) == nil && len(v.Result) == 1
	}); err != nil {
		t.Fatalf("%v; the target: %s", err, health)
	}

	var jobs, hubs []string
	if err := api(
		"/api/v1/label/job/values", url.Values{"match[]": {"tether_nodes_connected"}}, &jobs,
	); err != nil || !slices.Contains(jobs, "tether") {
		t.Errorf("the Job variable's values: %v, %v; want tether among them", jobs, err)
	}
	if err := api(
		"/api/v1/label/instance/values", url.Values{"match[]": {`tether_nodes_connected{job=~"tether"}`}}, &hubs,
	); err != nil || !slices.Contains(hubs, h.apiAddr()) {
		t.Errorf("the Hub variable's values: %v, %v; want %s among them", hubs, err, h.apiAddr())
	}
	vars := strings.NewReplacer("$job", "tether", "$instance", ".+", "$__rate_interval", "1m")
	for _, p := range d.AllPanels() {
		for _, tg := range p.Targets {
			var v struct{ Result []json.RawMessage }
			q := vars.Replace(tg.Expr)
			if err := api("/api/v1/query", url.Values{"query": {q}}, &v); err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, tg.RefID, err)
			} else if len(v.Result) == 0 {
				t.Errorf("panel %q query %s: no series for %s", p.Title, tg.RefID, q)
			}
		}
	}
}

// readmePromConfig is the first yaml block after "**Prometheus.**" in the
// "Metrics and dashboards" section of the user guide's operations page.
func readmePromConfig(t *testing.T) string {
	t.Helper()
	const page = "docs/operations.md"
	b, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics and dashboards\n")
	if !ok {
		t.Fatal(page + ` has no "## Metrics and dashboards" heading`)
	}
	_, section, ok = strings.Cut(section, "**Prometheus.**")
	if !ok {
		t.Fatal(page + ` "Metrics and dashboards" has no **Prometheus.** paragraph`)
	}
	_, block, ok := strings.Cut(section, "\n```yaml\n")
	if !ok {
		t.Fatal(page + ": no yaml block after **Prometheus.**")
	}
	block, _, _ = strings.Cut(block, "\n```\n")
	return block + "\n"
}

// getNoCredential is an HTTPS GET of path on the hub's API, trusting the
// hub's CA and presenting no credential; it returns the status.
func (h *hub) getNoCredential(t *testing.T, path string) int {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(h.dataDir, "ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: pki.HubServerName}}}
	resp, err := c.Get("https://" + h.apiAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
