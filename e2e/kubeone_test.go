package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/internal/testenv"
)

// The KubeOne tests run `tether kubeone apply|reset` with real binaries,
// real tunnels (QUIC and TCP), the embedded SSH server and a real OpenSSH
// sshd managed by its agent. The kubeone the hub runs is the stand-in
// built from internal/testenv/kubeonestandin, which does what KubeOne does
// over SSH and nothing else: it parses the generated manifest, dials the
// hub as bastion with the cluster's key verifying bastionHostPublicKey,
// opens direct-tcpip to each publicAddress:22 verifying sshHostPublicKey
// (x/crypto's default host key algorithms and KubeOne's byte comparison),
// runs `hostname -f` and `sudo cat /etc/os-release`, and from each
// control-plane node's connection opens direct-tcpip to the node's own
// kube-apiserver port and GETs /readyz; then it exits 0. The "kube-apiserver"
// of every node is one HTTPS server of the test on 127.0.0.1 (all nodes are
// this machine), with a certificate for "kubernetes" from its own CA, and
// the admin kubeconfig kubeadm would write names that CA.

// apiServer is the nodes' kube-apiserver as the tests see it.
type apiServer struct {
	port   int
	caPEM  []byte
	readyz atomic.Int64 // /readyz requests served

	mu   sync.Mutex
	gate chan struct{} // non-nil: /readyz waits until it is closed
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// kubeadm's serving certificate names "kubernetes" and the node's own
	// addresses, not the address of a local proxy.
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames: []string{"kubernetes", "kubernetes.default"}, IPAddresses: []net.IP{net.ParseIP("10.96.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	a := &apiServer{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	ln, err := tls.Listen("tcp", "127.0.0.1:0",
		&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	a.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		a.mu.Lock()
		gate := a.gate
		a.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		a.readyz.Add(1)
		io.WriteString(w, "ok")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { a.release(); srv.Close() })
	return a
}

// hold makes /readyz wait: an apply stays running until release.
func (a *apiServer) hold() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gate == nil {
		a.gate = make(chan struct{})
	}
}

func (a *apiServer) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gate != nil {
		close(a.gate)
		a.gate = nil
	}
}

// adminConf is the kubeconfig kubeadm writes on control-plane nodes.
func (a *apiServer) adminConf(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin.conf")
	conf := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubernetes
  cluster:
    certificate-authority-data: %s
    server: https://10.0.0.1:6443
contexts:
- name: kubernetes-admin@kubernetes
  context:
    cluster: kubernetes
    user: kubernetes-admin
current-context: kubernetes-admin@kubernetes
users:
- name: kubernetes-admin
  user:
    client-certificate-data: Y2VydA==
    client-key-data: a2V5
`, base64.StdEncoding.EncodeToString(a.caPEM))
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	standinOnce sync.Once
	standinPath string
	standinErr  error
)

// kubeoneStandIn is the stand-in kubeone, built once per test run.
func kubeoneStandIn(t *testing.T) string {
	t.Helper()
	standinOnce.Do(func() { standinPath, standinErr = testenv.BuildKubeOneStandIn(scratch) })
	if standinErr != nil {
		t.Fatal(standinErr)
	}
	return standinPath
}

// kubeoneHub is a hub that runs the stand-in kubeone against api.
func kubeoneHub(t *testing.T, api *apiServer) *hub {
	t.Helper()
	if _, err := exec.LookPath("sudo"); err != nil {
		t.Fatalf("sudo not found: KubeOne (and the stand-in) run commands with sudo; install it (make deps)")
	}
	standin := kubeoneStandIn(t)
	// The hub passes its environment to kubeone: the stand-in finds the
	// test's API server port there.
	t.Setenv(testenv.KubeOneStandInEnv, strconv.Itoa(api.port))
	return startHubIn(t, "", 0, "--kubeone", standin, "--kube-apiserver-port", strconv.Itoa(api.port),
		"--kubeone-admin-conf", api.adminConf(t))
}

// kubeone runs `tether kubeone ARGS` and returns stdout, stderr and the
// exit code.
func (h *hub) kubeone(timeout time.Duration, args ...string) (string, string, int) {
	h.t.Helper()
	return runCmd(h.t, timeout, filepath.Join(binDir, "tether"),
		append(append([]string{"kubeone"}, args...), "--data-dir", h.dataDir)...)
}

func (h *hub) mustKubeOne(args ...string) string {
	h.t.Helper()
	out, errOut, code := h.kubeone(time.Minute, args...)
	if code != 0 {
		h.t.Fatalf("tether kubeone %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

func (h *hub) kubeoneStatus(name string) kubeone.Status {
	h.t.Helper()
	var st kubeone.Status
	if err := json.Unmarshal([]byte(h.mustKubeOne("status", name, "-o", "json")), &st); err != nil {
		h.t.Fatal(err)
	}
	return st
}

// standinRun is what the stand-in's output says about one run.
type standinRun struct {
	pid      int
	manifest string
	setup    map[string]time.Duration // per host: SSH set-up time
	readyz   map[string]bool          // control-plane hosts whose API server answered through the node's connection
}

var (
	standinStart = regexp.MustCompile(`kubeone stand-in pid (\d+) manifest (\S+)`)
	standinSetup = regexp.MustCompile(`INFO \[([^\]]+)\] ssh set-up (?:directly|through bastion \S+) took (\S+)`)
	standinReady = regexp.MustCompile(`INFO \[([^\]]+)\] kube-apiserver /readyz through the node's SSH connection: ok`)
)

func parseStandin(t *testing.T, out string) standinRun {
	t.Helper()
	r := standinRun{setup: map[string]time.Duration{}, readyz: map[string]bool{}}
	m := standinStart.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no stand-in kubeone start line in:\n%s", out)
	}
	r.pid, _ = strconv.Atoi(m[1])
	r.manifest = m[2]
	for _, m := range standinSetup.FindAllStringSubmatch(out, -1) {
		d, err := time.ParseDuration(m[2])
		if err != nil {
			t.Fatalf("set-up time %q: %v", m[2], err)
		}
		r.setup[m[1]] = d
	}
	for _, m := range standinReady.FindAllStringSubmatch(out, -1) {
		r.readyz[m[1]] = true
	}
	return r
}

// jobLog is the output of a KubeOne job so far: its one run, named after
// the cluster, as the hub stored it.
func (h *hub) jobLog(id, cluster string) string {
	h.t.Helper()
	return h.cli("jobs", "logs", id, "--node", cluster)
}

func gone(path string) bool {
	_, err := os.Stat(path)
	return os.IsNotExist(err)
}

// TestKubeOneApply applies a cluster of four members — control plane on
// the embedded server over QUIC, the embedded server over TCP and a real
// sshd the agent manages, a worker over TCP — through the hub, and checks
// what the run did and left: every host reached with its pinned host key,
// every control-plane API server reached through its node's connection,
// the private directory gone, the status, the kubeconfig and the proxy.
func TestKubeOneApply(t *testing.T) {
	api := startAPIServer(t)
	h := kubeoneHub(t, api)
	join := h.token("--uses", "4")
	sd := startSSHD(t)
	startAgent(t, join, "kq", "--ssh", "embedded", "--transport", "quic")
	startAgent(t, join, "kt", "--ssh", "embedded", "--transport", "tcp")
	startAgent(t, join, "ks", append(sd.managedArgs(), "--transport", "quic")...)
	startAgent(t, join, "kw", "--ssh", "embedded", "--transport", "tcp")
	for _, n := range []struct{ name, transport string }{{"kq", "quic"}, {"kt", "tcp"}, {"ks", "quic"}, {"kw", "tcp"}} {
		h.waitOnline(n.name, n.transport)
	}
	h.mustKubeOne("create", "edge1", "--control-plane", "kq,kt,ks", "--workers", "kw", "--kubernetes", "1.30.5",
		"--login", loginUser)

	out, errOut, code := h.kubeone(2*time.Minute, "apply", "edge1", "--follow")
	if code != 0 {
		t.Fatalf("kubeone apply: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	run := parseStandin(t, out)
	for _, n := range []string{"kq", "kt", "ks", "kw"} {
		if _, ok := run.setup[n]; !ok {
			t.Errorf("kubeone did not reach %s through the bastion:\n%s", n, out)
		}
		if !strings.Contains(out, "["+n+"] hostname: ") || !strings.Contains(out, "["+n+"] operating system: ") {
			t.Errorf("kubeone did not run hostname -f and sudo cat /etc/os-release on %s:\n%s", n, out)
		}
	}
	for _, n := range []string{"kq", "kt", "ks"} {
		if !run.readyz[n] {
			t.Errorf("kubeone did not reach %s's API server through the node's connection:\n%s", n, out)
		}
	}
	if run.readyz["kw"] {
		t.Errorf("kubeone probed the API server of a worker")
	}
	if strings.Contains(out+errOut, "no host key pinned") {
		t.Errorf("the manifest left a host key unpinned:\n%s%s", out, errOut)
	}
	if !gone(filepath.Dir(run.manifest)) || !gone(run.manifest) {
		t.Errorf("the run's private directory %s (manifest, key) is still there", filepath.Dir(run.manifest))
	}
	if entries, _ := os.ReadDir(filepath.Join(h.dataDir, "kubeone-runs")); len(entries) != 0 {
		t.Errorf("run directories left: %v", entries)
	}
	if testenv.ProcessAlive(run.pid) {
		t.Errorf("kubeone (pid %d) still runs after its job", run.pid)
	}

	st := h.kubeoneStatus("edge1")
	if st.LastApply == nil || st.LastApply.Result != "succeeded" || st.Status != "installed" {
		t.Fatalf("status after apply: %+v", st)
	}
	if st.MembersUp != 4 {
		t.Errorf("members up %d, want 4: %+v", st.MembersUp, st.Members)
	}
	if st.Kube == nil || !st.Kube.Ready || st.Kube.Detail != "ok" {
		t.Fatalf("API server health through the tunnel: %+v", st.Kube)
	}

	// kubeconfig + proxy: the API server on a local port, through the hub,
	// verified against the cluster's CA by the name in its certificate.
	proxyPort := freePort(t)
	proxyAddr := fmt.Sprintf("127.0.0.1:%d", proxyPort)
	kc := h.mustKubeOne("kubeconfig", "edge1", "--proxy", proxyAddr)
	if !strings.Contains(kc, "server: https://"+proxyAddr) || !strings.Contains(kc, "tls-server-name: kubernetes") ||
		!strings.Contains(kc, base64.StdEncoding.EncodeToString(api.caPEM)) {
		t.Fatalf("kubeconfig not pointed at the proxy, or without the cluster CA:\n%s", kc)
	}
	start(t, "kubeone-proxy", filepath.Join(binDir, "tether"), "kubeone", "proxy", "edge1", "--listen", proxyAddr,
		"--data-dir", h.dataDir)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(api.caPEM)
	client := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes"}}}
	before := api.readyz.Load()
	body := waitForState(t, "the API server through tether kubeone proxy", 20*time.Second, func() string {
		resp, err := client.Get("https://" + proxyAddr + "/readyz")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}, func(s string) bool { return s == "ok" })
	if body != "ok" || api.readyz.Load() <= before {
		t.Fatalf("proxy: %q", body)
	}

	metrics := h.metrics(t)
	for _, want := range []string{`tether_kubeone_runs_total{action="apply",result="succeeded"} 1`,
		`tether_kubeone_apiserver_checks_total{result="ready"}`,
		`tether_kubeone_proxy_connections_total{result="ok"}`, "tether_kubeone_run_duration_seconds_count"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// The SSH set-up of an apply, through the hub (bastion handshake,
	// direct-tcpip through the tunnel, node handshake) against KubeOne
	// going straight to the same sshd.
	direct := measureDirect(t, sd, 5)
	via := []time.Duration{run.setup["ks"]}
	for range 4 {
		out, errOut, code := h.kubeone(2*time.Minute, "apply", "edge1")
		if code != 0 {
			t.Fatalf("kubeone apply again: exit %d\n%s\n%s", code, out, errOut)
		}
		via = append(via, parseStandin(t, out).setup["ks"])
	}
	solo := measureThroughHub(t, h, "edge1", "ks", 5)
	t.Logf("KubeOne SSH set-up to the managed-sshd node: through the hub (bastion + QUIC tunnel) median %s %v "+
		"with the 3 other hosts at once, %s %v alone; direct to its sshd median %s %v",
		median(via), via, median(solo), solo, median(direct), direct)
}

// measureThroughHub runs the stand-in n times with the cluster's manifest
// cut down to one host, through the hub, and returns its SSH set-up times.
func measureThroughHub(t *testing.T, h *hub, cluster, host string, n int) []time.Duration {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(h.mustKubeOne("manifest", cluster)), &doc); err != nil {
		t.Fatal(err)
	}
	var keep []any
	for _, group := range []string{"controlPlane", "staticWorkers"} {
		g, _ := doc[group].(map[string]any)
		hosts, _ := g["hosts"].([]any)
		for _, hst := range hosts {
			if hst.(map[string]any)["publicAddress"] == host {
				keep = append(keep, hst)
			}
		}
	}
	if len(keep) != 1 {
		t.Fatalf("manifest of %s has no host %s", cluster, host)
	}
	doc["controlPlane"] = map[string]any{"hosts": keep}
	delete(doc, "staticWorkers")
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(t.TempDir(), "solo.yaml")
	os.WriteFile(manifest, b, 0o600)
	standin := kubeoneStandIn(t)
	var out []time.Duration
	for range n {
		o, errOut, code := runCmd(t, time.Minute, standin, "reset", "--manifest", manifest, "--auto-approve")
		if code != 0 {
			t.Fatalf("stand-in kubeone through the hub to %s: exit %d\n%s\n%s", host, code, o, errOut)
		}
		out = append(out, parseStandin(t, o).setup[host])
	}
	return out
}

// measureDirect runs the stand-in n times against sd directly (no bastion,
// the operator key sd authorizes) and returns its SSH set-up times.
func measureDirect(t *testing.T, sd *sshd, n int) []time.Duration {
	t.Helper()
	standin := kubeoneStandIn(t)
	manifest := filepath.Join(t.TempDir(), "direct.yaml")
	os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: kubeone.k8c.io/v1beta2
kind: KubeOneCluster
name: direct
versions: {kubernetes: 1.30.5}
controlPlane:
  hosts:
  - publicAddress: 127.0.0.1
    sshPort: %d
    sshUsername: %s
    sshPrivateKeyFile: %s
    sshHostPublicKey: %s
`, sd.port, loginUser, opKey, base64.StdEncoding.EncodeToString(presentedHostKey(t, sd.Addr)))), 0o600)
	var out []time.Duration
	for range n {
		o, errOut, code := runCmd(t, time.Minute, standin, "reset", "--manifest", manifest, "--auto-approve")
		if code != 0 {
			t.Fatalf("stand-in kubeone direct: exit %d\n%s\n%s", code, o, errOut)
		}
		out = append(out, parseStandin(t, o).setup["127.0.0.1"])
	}
	return out
}

// presentedHostKey is what the sshd at addr presents to a client with
// x/crypto's default algorithms (its host certificate, once managed).
func presentedHostKey(t *testing.T, addr string) []byte {
	t.Helper()
	var got []byte
	cfg := &gossh.ClientConfig{User: "probe", HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error {
		got = key.Marshal()
		return fmt.Errorf("probe done")
	}, Timeout: 10 * time.Second}
	conn, err := gossh.Dial("tcp", addr, cfg)
	if err == nil {
		conn.Close()
	}
	if got == nil {
		t.Fatalf("no host key from %s: %v", addr, err)
	}
	return got
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// TestKubeOneWaitsForMembers: apply is refused while a member's tunnel is
// down and names it; with --auto the job waits and starts when the last
// member connects; a second run of the cluster is refused meanwhile.
func TestKubeOneWaitsForMembers(t *testing.T) {
	api := startAPIServer(t)
	h := kubeoneHub(t, api)
	join := h.token("--uses", "3")
	startAgent(t, join, "wa", "--ssh", "embedded", "--transport", "quic")
	startAgent(t, join, "wb", "--ssh", "embedded", "--transport", "tcp")
	late, lateState := startAgent(t, join, "wc", "--ssh", "embedded", "--transport", "tcp")
	for _, n := range []string{"wa", "wb", "wc"} {
		h.waitOnline(n, "")
	}
	// The hub asks its kubeone (the stand-in answers `kubeone version` as
	// KubeOne 1.8.1, which installs 1.27 to 1.30) what it can install.
	_, errOut, code := h.kubeone(time.Minute, "create", "site", "--control-plane", "wa", "--workers", "wb,wc",
		"--kubernetes", "1.34.1", "--login", loginUser)
	if code == 0 || !strings.Contains(errOut, "cannot be installed by the hub's kubeone 1.8.1 (") ||
		!strings.Contains(errOut, "which installs 1.27 to 1.30") ||
		!strings.Contains(errOut, "install KubeOne 1.12 to 1.14") {
		t.Fatalf("create with a Kubernetes the hub's kubeone does not install: exit %d: %s", code, errOut)
	}
	h.mustKubeOne("create", "site", "--control-plane", "wa", "--workers", "wb,wc", "--kubernetes", "1.29.8",
		"--login", loginUser)
	late.Stop(syscall.SIGTERM, stopWait)
	waitFor(t, "wc offline", 30*time.Second, func() bool { return !h.nodes()["wc"].Online })

	out, errOut, code := h.kubeone(time.Minute, "apply", "site")
	if code != 2 || !strings.Contains(errOut, "wc (offline") || !strings.Contains(errOut, "1 of 3 members offline") {
		t.Fatalf("apply with wc offline: exit %d, want 2 naming wc\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if jobs := h.cli("jobs"); strings.Contains(jobs, "kubeone_apply") {
		t.Fatalf("a refused apply left a job:\n%s", jobs)
	}

	id := strings.TrimSpace(h.mustKubeOne("apply", "site", "--auto", "--detach"))
	waitFor(t, "the auto apply to wait for wc", 30*time.Second, func() bool {
		j := h.job(id)
		return j.State == "running" && j.Counts["waiting"] == 1
	})
	if _, errOut, code := h.kubeone(time.Minute, "apply", "site"); code != 2 || !strings.Contains(errOut, "job "+id) {
		t.Fatalf("second apply while one waits: exit %d, want 2 naming job %s: %s", code, id, errOut)
	}
	if api.readyz.Load() != 0 {
		t.Fatal("kubeone ran before every member was connected")
	}
	startAgent2(t, lateState, "wc")
	waitFor(t, "the auto apply to finish", time.Minute, func() bool { return h.job(id).State != "running" })
	j := h.job(id)
	if j.State != "succeeded" {
		t.Fatalf("auto apply: %+v\n%s", j, h.jobLog(id, "site"))
	}
	run := parseStandin(t, h.jobLog(id, "site"))
	if len(run.setup) != 3 || !run.readyz["wa"] {
		t.Fatalf("auto apply reached %v (readyz %v)", run.setup, run.readyz)
	}
}

// startAgent2 restarts a node's agent from its state dir (no join).
func startAgent2(t *testing.T, stateDir, name string) *proc {
	t.Helper()
	args := testenv.AgentArgs("", stateDir, "", "--ssh", "embedded", "--transport", "tcp", "--backoff-max", "2s",
		"--log-level", "debug")
	return start(t, "agent-"+name+"-again", filepath.Join(binDir, "tether-edge"), args...)
}

// TestKubeOneCancelAndRestart: cancelling an apply kills kubeone and
// removes its directory; a hub killed during an apply marks it
// interrupted at its next start (kubeone died with it, its directory is
// removed), and an apply afterwards works.
func TestKubeOneCancelAndRestart(t *testing.T) {
	api := startAPIServer(t)
	h := kubeoneHub(t, api)
	join := h.token("--uses", "3")
	for _, n := range []string{"ca", "cb", "cc"} {
		startAgent(t, join, n, "--ssh", "embedded", "--transport", "quic")
	}
	for _, n := range []string{"ca", "cb", "cc"} {
		h.waitOnline(n, "")
	}
	h.mustKubeOne("create", "hold", "--control-plane", "ca,cb,cc", "--kubernetes", "1.30.5", "--login", loginUser)

	// The API servers do not answer: kubeone waits for them.
	api.hold()
	id := strings.TrimSpace(h.mustKubeOne("apply", "hold", "--detach"))
	run := waitForRunning(t, h, id)
	h.cli("jobs", "cancel", id)
	j := h.job(id)
	if j.State != "cancelled" || j.Nodes[0].State != "cancelled" {
		t.Fatalf("cancelled apply: %+v", j)
	}
	waitFor(t, "kubeone killed", 10*time.Second, func() bool { return !testenv.ProcessAlive(run.pid) })
	if !gone(filepath.Dir(run.manifest)) {
		t.Fatalf("the cancelled run's directory %s is still there", filepath.Dir(run.manifest))
	}
	if st := h.kubeoneStatus("hold"); st.LastApply == nil || st.LastApply.Job != id || st.LastApply.Result != "cancelled" {
		t.Fatalf("status after cancel: %+v", st.LastApply)
	}

	id = strings.TrimSpace(h.mustKubeOne("apply", "hold", "--detach"))
	run = waitForRunning(t, h, id)
	time.Sleep(2500 * time.Millisecond) // the hub marks the job alive meanwhile
	killed := time.Now()
	h.p.Stop(syscall.SIGKILL, stopWait)
	waitFor(t, "kubeone to die with its hub", 10*time.Second, func() bool { return !testenv.ProcessAlive(run.pid) })
	api.release()
	time.Sleep(3 * time.Second) // the hub is down
	h.start()
	if j := h.job(id); j.State != "interrupted" || j.Nodes[0].State != "interrupted" {
		t.Fatalf("apply across a hub kill: %+v", j)
	}
	// The interrupted run ended when the hub last said it was alive (every
	// 2 s), before it was killed: the downtime is not in its duration.
	var shown struct {
		FinishedAt time.Time `json:"finished_at"`
		Nodes      []struct {
			StartedAt  time.Time `json:"started_at"`
			FinishedAt time.Time `json:"finished_at"`
		} `json:"nodes"`
	}
	shownJSON := h.cli("jobs", "show", id, "-o", "json")
	if err := json.Unmarshal([]byte(shownJSON), &shown); err != nil || len(shown.Nodes) != 1 {
		t.Fatalf("jobs show %s: %v", id, err)
	}
	if r := shown.Nodes[0]; r.FinishedAt.After(killed) || r.FinishedAt.Before(killed.Add(-2500*time.Millisecond)) ||
		shown.FinishedAt.After(killed) || !r.FinishedAt.After(r.StartedAt) {
		t.Fatalf("the interrupted run reads %s to %s (job ended %s); the hub was killed at %s and down 3 s",
			r.StartedAt, r.FinishedAt, shown.FinishedAt, killed)
	}
	if !gone(filepath.Dir(run.manifest)) {
		t.Fatalf("the killed run's directory %s (it holds the cluster key) survived the restart", filepath.Dir(run.manifest))
	}
	if st := h.kubeoneStatus("hold"); st.LastApply == nil || st.LastApply.Result != "interrupted" {
		t.Fatalf("status after the restart: %+v", st.LastApply)
	}
	for _, n := range []string{"ca", "cb", "cc"} {
		h.waitOnline(n, "")
	}
	// The members' host certificates are new (they reconnected), as is the
	// bastion's: the rerun's manifest pins those.
	out, errOut, code := h.kubeone(2*time.Minute, "apply", "hold")
	if code != 0 {
		t.Fatalf("apply after the restart: exit %d\n%s\n%s", code, out, errOut)
	}
	if st := h.kubeoneStatus("hold"); st.LastApply.Result != "succeeded" || st.Kube == nil || !st.Kube.Ready {
		t.Fatalf("status after the rerun: %+v %+v", st.LastApply, st.Kube)
	}
	// A KubeOne job is run again with `tether kubeone apply` (a fresh
	// manifest), not replayed.
	if _, errOut, code := runCmd(t, time.Minute, filepath.Join(binDir, "tether"), "jobs", "rerun", id,
		"--data-dir", h.dataDir); code == 0 ||
		!strings.Contains(errOut, "tether kubeone apply") {
		t.Fatalf("jobs rerun of a KubeOne job: exit %d: %s", code, errOut)
	}

	// reset: the same run, kubeone reset; no API server probe.
	before := api.readyz.Load()
	out, errOut, code = h.kubeone(2*time.Minute, "reset", "hold")
	if code != 0 {
		t.Fatalf("reset: exit %d\n%s\n%s", code, out, errOut)
	}
	run = parseStandin(t, out)
	if len(run.setup) != 3 || len(run.readyz) != 0 || api.readyz.Load() != before ||
		!strings.Contains(out, "INFO reset cluster") {
		t.Fatalf("reset reached %v, probed %v:\n%s", run.setup, run.readyz, out)
	}
	if st := h.kubeoneStatus("hold"); st.Status != "reset" || st.LastApply.Result != "succeeded" || st.Kube != nil {
		t.Fatalf("status after reset: %s %+v %+v", st.Status, st.LastApply, st.Kube)
	}
}

// waitForRunning waits until the stand-in of job id has started and
// returns what it said.
func waitForRunning(t *testing.T, h *hub, id string) standinRun {
	t.Helper()
	var log string
	waitFor(t, "kubeone of job "+id+" to wait for the API servers", 30*time.Second, func() bool {
		log = h.jobLog(id, "hold")
		return strings.Count(log, "operating system:") == 3 && h.job(id).State == "running"
	})
	return parseStandin(t, log)
}

// TestKubeOneKeyScope: a cluster's key reaches its members only — not
// through the bastion, and not on the node itself — and a member removed
// from the cluster loses it at once.
func TestKubeOneKeyScope(t *testing.T) {
	api := startAPIServer(t)
	h := kubeoneHub(t, api)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--uses", "3")
	for _, n := range []string{"sa1", "sa2", "sb1"} {
		startAgent(t, join, n, "--ssh", "embedded", "--transport", "tcp")
	}
	for _, n := range []string{"sa1", "sa2", "sb1"} {
		h.waitOnline(n, "")
	}
	h.mustKubeOne("create", "ca", "--control-plane", "sa1", "--workers", "sa2", "--kubernetes", "1.30.5",
		"--login", loginUser)
	h.mustKubeOne("create", "cb", "--control-plane", "sb1", "--kubernetes", "1.30.5", "--login", loginUser)
	h.mustKubeOne("manifest", "ca") // issues ca's certificate file
	keyA := readSigner(t, kubeone.PrivateKeyPath(h.dataDir, "ca"))
	certA := readCertSigner(t, keyA, kubeone.CertPath(h.dataDir, "ca"))
	for _, auth := range []struct {
		name   string
		signer gossh.Signer
	}{{"key", keyA}, {"certificate", certA}} {
		t.Run(auth.name, func(t *testing.T) {
			// Through the bastion as cluster ca: its members yes, cb's no.
			if err := bastionJump(t, h, "kubeone-ca", auth.signer, "sa2"); err != nil {
				t.Fatalf("cluster ca's identity to its member sa2 through the bastion: %v", err)
			}
			if err := bastionJump(t, h, "kubeone-ca", auth.signer, "sb1"); err == nil {
				t.Fatal("cluster ca's identity reached sb1 (cluster cb) through the bastion")
			}
			// On the node: alice may jump anywhere; the node itself
			// accepts ca's identity on ca's members only.
			if err := nodeLogin(t, h, auth.signer, "sa2"); err != nil {
				t.Fatalf("sa2 refused cluster ca's identity: %v", err)
			}
			if err := nodeLogin(t, h, auth.signer, "sb1"); err == nil {
				t.Fatal("sb1 (cluster cb) accepted cluster ca's identity")
			}
		})
	}

	// The cluster's key forwards to the member's own loopback (what KubeOne
	// needs) and nowhere else.
	err := nodeSession(t, h, keyA, "sa2", func(c *gossh.Client) {
		conn, err := c.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", api.port))
		if err != nil {
			t.Errorf("cluster ca's key to sa2's loopback: %v", err)
		} else {
			conn.Close()
		}
		if conn, err := c.Dial("tcp", "192.0.2.1:6443"); err == nil {
			conn.Close()
			t.Error("cluster ca's key forwarded from sa2 to another host")
		} else if !strings.Contains(err.Error(), "not the node's loopback") {
			t.Errorf("forwarding off the node: %v, want a refusal naming the loopback", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}

	// KubeOne with ca's key and a manifest naming cb's node fails closed.
	manifestB := h.mustKubeOne("manifest", "cb")
	manifestB = strings.ReplaceAll(manifestB, "bastionUser: kubeone-cb", "bastionUser: kubeone-ca")
	manifestB = strings.ReplaceAll(manifestB, kubeone.PrivateKeyPath(h.dataDir, "cb"),
		kubeone.PrivateKeyPath(h.dataDir, "ca"))
	manifestB = strings.ReplaceAll(manifestB, kubeone.CertPath(h.dataDir, "cb"), kubeone.CertPath(h.dataDir, "ca"))
	path := filepath.Join(t.TempDir(), "cross.yaml")
	os.WriteFile(path, []byte(manifestB), 0o600)
	if out, errOut, code := runCmd(
		t, time.Minute, kubeoneStandIn(t), "apply", "--manifest", path, "--auto-approve",
	); code == 0 {
		t.Fatalf("kubeone with cluster ca's key reached cluster cb's node:\n%s\n%s", out, errOut)
	}

	// sa2 leaves cluster ca: it loses the key at once.
	h.mustKubeOne("members", "ca", "--control-plane", "sa1")
	waitFor(t, "sa2 to refuse cluster ca's key", 20*time.Second,
		func() bool { return nodeLogin(t, h, keyA, "sa2") != nil })
	if err := bastionJump(t, h, "kubeone-ca", keyA, "sa2"); err == nil {
		t.Fatal("the bastion still lets cluster ca's identity to its former member sa2")
	}
	if err := nodeLogin(t, h, keyA, "sa1"); err != nil {
		t.Fatalf("sa1, still a member, refused cluster ca's key: %v", err)
	}
}

func readSigner(t *testing.T, path string) gossh.Signer {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readCertSigner(t *testing.T, key gossh.Signer, path string) gossh.Signer {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k, _, _, _, err := gossh.ParseAuthorizedKey(b)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.NewCertSigner(k.(*gossh.Certificate), key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bastionJump logs in to the bastion as user with signer and asks for a
// channel to node:22; it returns why that failed, or nil.
func bastionJump(t *testing.T, h *hub, user string, signer gossh.Signer, node string) error {
	t.Helper()
	c, err := gossh.Dial("tcp", h.sshAddr(),
		&gossh.ClientConfig{User: user, Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
			HostKeyCallback: gossh.FixedHostKey(h.hostPublicKey()), HostKeyAlgorithms: []string{gossh.KeyAlgoED25519},
			Timeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("bastion login as %s: %w", user, err)
	}
	defer c.Close()
	conn, err := c.Dial("tcp", node+":22")
	if err != nil {
		return err
	}
	conn.Close()
	return nil
}

// nodeLogin reaches node through the bastion as alice (who may jump
// anywhere) and logs in to the node with signer: the node's own decision.
func nodeLogin(t *testing.T, h *hub, signer gossh.Signer, node string) error {
	t.Helper()
	return nodeSession(t, h, signer, node, nil)
}

// nodeSession is nodeLogin that, once logged in, hands the node's client
// to use.
func nodeSession(t *testing.T, h *hub, signer gossh.Signer, node string, use func(*gossh.Client)) error {
	t.Helper()
	op := readSigner(t, opKey)
	c, err := gossh.Dial("tcp", h.sshAddr(),
		&gossh.ClientConfig{User: "alice", Auth: []gossh.AuthMethod{gossh.PublicKeys(op)},
			HostKeyCallback: gossh.FixedHostKey(h.hostPublicKey()), HostKeyAlgorithms: []string{gossh.KeyAlgoED25519},
			Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("alice to the bastion: %v", err)
	}
	defer c.Close()
	conn, err := c.Dial("tcp", node+":22")
	if err != nil {
		t.Fatalf("alice's jump to %s: %v", node, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// This hop is about the node's decision on the client's key; the host
	// is verified by the runs above (pinned) and the jump tests.
	cc, chans, reqs, err := gossh.NewClientConn(conn, node,
		&gossh.ClientConfig{User: loginUser, Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
			HostKeyCallback: gossh.InsecureIgnoreHostKey()}) //nolint:gosec // see above
	if err != nil {
		return err
	}
	client := gossh.NewClient(cc, chans, reqs)
	defer client.Close()
	if use != nil {
		use(client)
	}
	return nil
}

// TestKubeOneManagedSSHDWithoutForwarding: an agent managing an sshd that
// refuses port forwarding warns at start, and an apply over that node
// fails where KubeOne would (its channel to the node's API server is
// refused), not silently.
func TestKubeOneManagedSSHDWithoutForwarding(t *testing.T) {
	api := startAPIServer(t)
	h := kubeoneHub(t, api)
	sd := startSSHD(t, "AllowTcpForwarding no")
	agent, _ := startAgent(t, h.token(), "nofwd", sd.managedArgs()...)
	if err := agent.WaitLog("the local sshd refuses port forwarding", 1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(agent.Log(), "AllowTcpForwarding no") {
		t.Errorf("the warning does not name the setting:\n%s", agent.Log())
	}
	h.waitOnline("nofwd", "")
	h.mustKubeOne("create", "nf", "--control-plane", "nofwd", "--kubernetes", "1.30.5", "--login", loginUser)
	out, errOut, code := h.kubeone(2*time.Minute, "apply", "nf")
	if code != 1 || !strings.Contains(out+errOut, "kube-apiserver 127.0.0.1:") ||
		!strings.Contains(out, "[nofwd] hostname: ") {
		t.Fatalf("apply over a node refusing forwarding: exit %d, want 1 after reaching it and failing on its API "+
			"server\n%s\n%s", code, out, errOut)
	}
	if st := h.kubeoneStatus("nf"); st.Status != "apply_failed" || st.LastApply == nil || st.LastApply.Result != "failed" {
		t.Fatalf("status: %s %+v", st.Status, st.LastApply)
	}
}
