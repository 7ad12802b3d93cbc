// Command kubeonestandin is the `kubeone` the end-to-end tests run in place
// of the real KubeOne CLI (whose module the Go module proxy does not serve).
// It does what KubeOne does over SSH, and nothing else:
//
//   - it reads the manifest (kubeone.k8c.io/v1beta2 KubeOneCluster) as
//     KubeOne does: YAML turned into JSON, so sshHostPublicKey and
//     bastionHostPublicKey are base64 of a key's SSH wire format, and
//     KubeOne's host defaults apply (sshUsername root, ports 22, bastionUser
//     = sshUsername);
//   - per host (control plane, then static workers, all in parallel) it dials
//     the bastion with x/crypto/ssh and the host's sshPrivateKeyFile (with
//     sshCertFile, if set, as a certificate), opens a direct-tcpip channel to
//     publicAddress:sshPort through it, and runs the SSH handshake with the
//     node over that channel;
//   - it verifies host keys exactly like KubeOne's pkg/ssh: the client
//     offers x/crypto's default host key algorithms (certificate algorithms
//     first, so a server with a host certificate presents the certificate),
//     and the key the server presents must equal the pinned bytes
//     (bytes.Equal(key.Marshal(), pinned)); an empty pin is not checked,
//     which the stand-in reports on stderr, since KubeOne then silently
//     trusts any key;
//   - it runs `hostname -f` and `sudo cat /etc/os-release` on each host;
//   - apply only: from each control-plane node's SSH connection it opens a
//     direct-tcpip channel to the node's own 127.0.0.1:6443 (kube-apiserver;
//     the port is KUBEONE_STANDIN_APISERVER_PORT when set, so tests need no
//     privileged or shared port) and GETs https://…/readyz over it, as
//     KubeOne's tunnelled HTTP transport does (KubeOne verifies the API
//     server against the cluster CA it generated; the stand-in installs no
//     CA, so it does not verify); it waits for the answer (KubeOne waits
//     for the API server), which lets a test hold an apply running;
//   - `kubeone version` prints what a KubeOne 1.8.1 release binary prints
//     (pkg/cmd/version.go): indented JSON of two k8s.io/apimachinery
//     version.Info, "kubeone" and "machine_controller". KubeOne prints no
//     Kubernetes range there; the release implies it, and the stand-in is
//     that release throughout:
//   - it checks versions.kubernetes as KubeOne 1.8.1's ValidateVersionConfig
//     does on every command that loads the manifest (constraints ">= 1.27"
//     and "<= 1.30", minor-inclusive), refusing anything else with
//     KubeOne's wording;
//   - it exits 0 when every host succeeded, 1 otherwise; 2 for bad usage.
//
// It prints its pid and the manifest path first, so a test can check that a
// cancelled run's process is gone and its private directory removed; and per
// host how long the SSH set-up (bastion handshake, channel, node handshake)
// took, which the e2e tests report as through-the-hub versus direct.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/ssh"
)

// The subset of the v1beta2 API the stand-in reads.
type cluster struct {
	APIVersion    string `json:"apiVersion"`
	Kind          string `json:"kind"`
	Name          string `json:"name"`
	ControlPlane  hosts  `json:"controlPlane"`
	StaticWorkers hosts  `json:"staticWorkers"`
	Versions      struct {
		Kubernetes string `json:"kubernetes"`
	} `json:"versions"`
}

type hosts struct {
	Hosts []host `json:"hosts"`
}

// host is KubeOne's HostConfig, SSH fields only. []byte fields decode from
// base64 strings, as with KubeOne's YAML-to-JSON decoding.
type host struct {
	PublicAddress        string `json:"publicAddress"`
	PrivateAddress       string `json:"privateAddress"`
	SSHPort              int    `json:"sshPort"`
	SSHUsername          string `json:"sshUsername"`
	SSHPrivateKeyFile    string `json:"sshPrivateKeyFile"`
	SSHCertFile          string `json:"sshCertFile"`
	SSHHostPublicKey     []byte `json:"sshHostPublicKey"`
	SSHAgentSocket       string `json:"sshAgentSocket"`
	Bastion              string `json:"bastion"`
	BastionPort          int    `json:"bastionPort"`
	BastionUser          string `json:"bastionUser"`
	BastionHostPublicKey []byte `json:"bastionHostPublicKey"`

	controlPlane bool
}

// defaults are KubeOne's v1beta2 defaultHostConfig.
func (h *host) defaults() {
	if h.PublicAddress == "" {
		h.PublicAddress = h.PrivateAddress
	}
	if h.PrivateAddress == "" {
		h.PrivateAddress = h.PublicAddress
	}
	if h.SSHUsername == "" {
		h.SSHUsername = "root"
	}
	if h.SSHPort == 0 {
		h.SSHPort = 22
	}
	if h.BastionPort == 0 {
		h.BastionPort = 22
	}
	if h.BastionUser == "" {
		h.BastionUser = h.SSHUsername
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// The KubeOne release the stand-in is, and the Kubernetes minors that
// release's validation accepts (pkg/apis/kubeone/validation at v1.8.1).
const (
	release            = "1.8.1"
	machineController  = "v1.59.1"
	lowerConstraint    = ">= 1.27"
	upperConstraint    = "<= 1.30"
	minMinor, maxMinor = 27, 30
)

// versionInfo is k8s.io/apimachinery's version.Info, which KubeOne's
// `version` prints.
type versionInfo struct {
	Major        string `json:"major"`
	Minor        string `json:"minor"`
	GitVersion   string `json:"gitVersion"`
	GitCommit    string `json:"gitCommit"`
	GitTreeState string `json:"gitTreeState"`
	BuildDate    string `json:"buildDate"`
	GoVersion    string `json:"goVersion"`
	Compiler     string `json:"compiler"`
	Platform     string `json:"platform"`
}

// version prints `kubeone version` as KubeOne's pkg/cmd/version.go does.
func version(args []string, stdout, stderr io.Writer) int {
	if len(args) != 0 {
		// cobra.ExactArgs(0)
		fmt.Fprintf(stderr, "Error: accepts 0 arg(s), received %d\n", len(args))
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(struct {
		KubeOne           versionInfo `json:"kubeone"`
		MachineController versionInfo `json:"machine_controller"`
	}{
		KubeOne: versionInfo{Major: "1", Minor: "8", GitVersion: release, GitCommit: "none", BuildDate: "unknown",
			GoVersion: runtime.Version(), Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH},
		MachineController: versionInfo{Major: "1", Minor: "59", GitVersion: machineController, Platform: "linux/amd64"},
	})
	return 0
}

// semverish is what KubeOne's semver parser takes: an optional "v", and
// a minor and patch that may be left out.
var semverish = regexp.MustCompile(`^v?(\d+)(?:\.(\d+))?(?:\.\d+)?(?:[-+][0-9A-Za-z.-]+)?$`)

// checkKubernetes is KubeOne's ValidateVersionConfig: a semver without a
// leading "v", within the release's constraints (minor-inclusive, as
// Masterminds/semver reads "<= 1.30").
func checkKubernetes(v string) error {
	field := fmt.Sprintf("versions.kubernetes: Invalid value: %q", v)
	m := semverish.FindStringSubmatch(v)
	if m == nil {
		return fmt.Errorf("%s: .versions.kubernetes is not a semver string", field)
	}
	if strings.HasPrefix(v, "v") {
		return fmt.Errorf("%s: .versions.kubernetes can't start with a leading 'v'", field)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	switch {
	case major < 1 || major == 1 && minor < minMinor:
		return fmt.Errorf("%s: kubernetes version does not satisfy version constraint '%s': %s is less than %s. "+
			"You need to use an older KubeOne version to upgrade your cluster to a supported version. "+
			"Please refer to the Compatibility section of docs for more details.",
			field, lowerConstraint, v, strings.TrimPrefix(lowerConstraint, ">= "))
	case major > 1 || minor > maxMinor:
		return fmt.Errorf("%s: kubernetes version does not satisfy version constraint '%s': %s is greater than %s. "+
			"This version is not yet supported. Please refer to the Compatibility section of docs for more details.",
			field, upperConstraint, v, strings.TrimPrefix(upperConstraint, "<= "))
	}
	return nil
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "version" {
		return version(args[1:], stdout, stderr)
	}
	if len(args) == 0 || (args[0] != "apply" && args[0] != "reset") {
		fmt.Fprintln(stderr, "usage: kubeone apply|reset --manifest FILE [--auto-approve] [--verbose] | kubeone version")
		return 2
	}
	cmd := args[0]
	fs := flag.NewFlagSet("kubeone "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var manifest string
	var approve, verbose bool
	fs.StringVar(&manifest, "manifest", "kubeone.yaml", "path to the KubeOneCluster manifest")
	fs.StringVar(&manifest, "m", "kubeone.yaml", "shorthand for --manifest")
	fs.BoolVar(&approve, "auto-approve", false, "do not ask for confirmation")
	fs.BoolVar(&approve, "y", false, "shorthand for --auto-approve")
	fs.BoolVar(&verbose, "verbose", false, "verbose output")
	fs.BoolVar(&verbose, "v", false, "shorthand for --verbose")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if !approve {
		fmt.Fprintln(stderr, "kubeone: refusing to run without --auto-approve (no terminal to confirm on)")
		return 2
	}
	fmt.Fprintf(stdout, "kubeone stand-in pid %d manifest %s\n", os.Getpid(), manifest)
	c, err := load(manifest)
	if err != nil {
		fmt.Fprintf(stderr, "kubeone: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	apiPort := 6443
	if v := os.Getenv("KUBEONE_STANDIN_APISERVER_PORT"); v != "" {
		if apiPort, err = strconv.Atoi(v); err != nil || apiPort < 1 || apiPort > 65535 {
			fmt.Fprintf(stderr, "kubeone: KUBEONE_STANDIN_APISERVER_PORT %q: want a port\n", v)
			return 2
		}
	}
	all := append(append([]host(nil), c.ControlPlane.Hosts...), c.StaticWorkers.Hosts...)
	for i := range c.ControlPlane.Hosts {
		all[i].controlPlane = true
	}
	fmt.Fprintf(stdout, "INFO %s cluster %q (Kubernetes %s): %d hosts\n", cmd, c.Name, c.Versions.Kubernetes, len(all))
	out := &lockedWriter{w: stdout}
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = doHost(ctx, cmd, all[i], apiPort, out)
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			fmt.Fprintf(stderr, "ERROR [%s] %v\n", all[i].PublicAddress, err)
		}
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "kubeone: %s failed on %d of %d hosts\n", cmd, failed, len(all))
		return 1
	}
	fmt.Fprintf(stdout, "INFO %s done on %d hosts\n", cmd, len(all))
	return 0
}

// load reads the manifest as KubeOne does: YAML to JSON, then JSON into
// the API types.
func load(path string) (cluster, error) {
	var c cluster
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read manifest: %w", err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return c, fmt.Errorf("manifest %s: %w", path, err)
	}
	j, err := json.Marshal(doc)
	if err != nil {
		return c, fmt.Errorf("manifest %s: %w", path, err)
	}
	if err := json.Unmarshal(j, &c); err != nil {
		return c, fmt.Errorf("manifest %s: %w", path, err)
	}
	if c.APIVersion != "kubeone.k8c.io/v1beta2" || c.Kind != "KubeOneCluster" {
		return c, fmt.Errorf(
			"manifest %s: apiVersion %q kind %q: want kubeone.k8c.io/v1beta2 KubeOneCluster",
			path, c.APIVersion, c.Kind,
		)
	}
	if err := checkKubernetes(c.Versions.Kubernetes); err != nil {
		return c, fmt.Errorf("manifest %s: %w", path, err)
	}
	if len(c.ControlPlane.Hosts) == 0 {
		return c, fmt.Errorf("manifest %s: no control-plane hosts", path)
	}
	for _, hs := range []*hosts{&c.ControlPlane, &c.StaticWorkers} {
		for i := range hs.Hosts {
			h := &hs.Hosts[i]
			h.defaults()
			if h.PublicAddress == "" {
				return c, fmt.Errorf("manifest %s: a host has no publicAddress", path)
			}
			if h.SSHPrivateKeyFile == "" {
				return c, fmt.Errorf("manifest %s: host %s: the stand-in needs sshPrivateKeyFile", path, h.PublicAddress)
			}
		}
	}
	return c, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}

// doHost is one host's part of the run.
func doHost(ctx context.Context, cmd string, h host, apiPort int, out *lockedWriter) error {
	name := h.PublicAddress
	start := time.Now()
	client, closeAll, err := connect(ctx, h)
	if err != nil {
		return err
	}
	defer closeAll()
	via := "directly"
	if h.Bastion != "" {
		via = "through bastion " + net.JoinHostPort(h.Bastion, strconv.Itoa(h.BastionPort))
	}
	out.printf("INFO [%s] ssh set-up %s took %s\n", name, via, time.Since(start).Round(time.Microsecond))
	hostname, err := execute(ctx, client, "hostname -f")
	if err != nil {
		return err
	}
	out.printf("INFO [%s] hostname: %s\n", name, strings.TrimSpace(hostname))
	osRelease, err := execute(ctx, client, "sudo cat /etc/os-release")
	if err != nil {
		return err
	}
	out.printf("INFO [%s] operating system: %s\n", name, osID(osRelease))
	if cmd != "apply" || !h.controlPlane {
		return nil
	}
	body, err := readyz(ctx, client, apiPort)
	if err != nil {
		return err
	}
	out.printf("INFO [%s] kube-apiserver /readyz through the node's SSH connection: %s\n", name, body)
	return nil
}

// connect opens the SSH client to the node, through the bastion if one is
// set, as KubeOne's pkg/ssh NewConnection does.
func connect(ctx context.Context, h host) (*ssh.Client, func(), error) {
	auth, err := authMethods(h)
	if err != nil {
		return nil, nil, err
	}
	nodeCfg := &ssh.ClientConfig{User: h.SSHUsername, Auth: auth, Timeout: 10 * time.Second,
		HostKeyCallback: pinned("node "+h.PublicAddress, h.SSHHostPublicKey)}
	node := net.JoinHostPort(h.PublicAddress, strconv.Itoa(h.SSHPort))
	if h.Bastion == "" {
		c, err := dial(ctx, node, nodeCfg)
		if err != nil {
			return nil, nil, fmt.Errorf("ssh to %s: %w", node, err)
		}
		return c, func() { c.Close() }, nil
	}
	bastionCfg := &ssh.ClientConfig{User: h.BastionUser, Auth: auth, Timeout: 10 * time.Second,
		HostKeyCallback: pinned("bastion "+h.Bastion, h.BastionHostPublicKey)}
	bastion := net.JoinHostPort(h.Bastion, strconv.Itoa(h.BastionPort))
	bc, err := dial(ctx, bastion, bastionCfg)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh to bastion %s: %w", bastion, err)
	}
	conn, err := bc.Dial("tcp", node)
	if err != nil {
		bc.Close()
		return nil, nil, fmt.Errorf("dial %s through bastion %s: %w", node, bastion, err)
	}
	ncc, chans, reqs, err := ssh.NewClientConn(conn, node, nodeCfg)
	if err != nil {
		bc.Close()
		return nil, nil, fmt.Errorf("ssh to %s through bastion %s: %w", node, bastion, err)
	}
	c := ssh.NewClient(ncc, chans, reqs)
	return c, func() { c.Close(); bc.Close() }, nil
}

func dial(ctx context.Context, addr string, cfg *ssh.ClientConfig) (*ssh.Client, error) {
	d := net.Dialer{Timeout: cfg.Timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	ncc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ssh.NewClient(ncc, chans, reqs), nil
}

// authMethods is the host's key, as a certificate when sshCertFile is set.
// The bastion gets the same methods, as in KubeOne without a dedicated
// bastion key.
func authMethods(h host) ([]ssh.AuthMethod, error) {
	pem, err := os.ReadFile(h.SSHPrivateKeyFile)
	if err != nil {
		return nil, fmt.Errorf("reading SSH private key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, fmt.Errorf("SSH key %s could not be parsed: %w", h.SSHPrivateKeyFile, err)
	}
	if h.SSHCertFile == "" {
		return []ssh.AuthMethod{ssh.PublicKeys(signer)}, nil
	}
	b, err := os.ReadFile(h.SSHCertFile)
	if err != nil {
		return nil, fmt.Errorf("reading SSH certificate: %w", err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		return nil, fmt.Errorf("SSH certificate %s could not be parsed: %w", h.SSHCertFile, err)
	}
	cert, ok := k.(*ssh.Certificate)
	if !ok {
		return nil, fmt.Errorf("%s is not an SSH certificate", h.SSHCertFile)
	}
	cs, err := ssh.NewCertSigner(cert, signer)
	if err != nil {
		return nil, fmt.Errorf("SSH certificate %s: %w", h.SSHCertFile, err)
	}
	return []ssh.AuthMethod{ssh.PublicKeys(cs)}, nil
}

// pinned is KubeOne's host key check: the presented key's wire encoding
// must equal the pinned bytes. Nothing pinned accepts any key, as KubeOne
// does (ssh.InsecureIgnoreHostKey); the stand-in says so on stderr.
func pinned(what string, want []byte) ssh.HostKeyCallback {
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		if len(want) == 0 {
			fmt.Fprintf(
				os.Stderr, "WARN %s: no host key pinned; accepting %s %s\n", what, key.Type(), ssh.FingerprintSHA256(key),
			)
			return nil
		}
		if !bytes.Equal(key.Marshal(), want) {
			return fmt.Errorf("ssh: host key mismatch: %s presented %s %s", what, key.Type(), ssh.FingerprintSHA256(key))
		}
		return nil
	}
}

// execute runs cmd in a session, as KubeOne's Exec: the output, or an
// error naming the exit status and stderr.
func execute(ctx context.Context, c *ssh.Client, cmd string) (string, error) {
	s, err := c.NewSession()
	if err != nil {
		return "", fmt.Errorf("%s: new session: %w", cmd, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	var o, e bytes.Buffer
	s.Stdout, s.Stderr = &o, &e
	if err := s.Run(cmd); err != nil {
		return "", fmt.Errorf("%s: %w: %s", cmd, err, strings.TrimSpace(e.String()))
	}
	return o.String(), nil
}

// osID is the ID= line of an os-release file.
func osID(osRelease string) string {
	sc := bufio.NewScanner(strings.NewReader(osRelease))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ID="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "unknown"
}

// readyz GETs /readyz from the node's own loopback through a direct-tcpip
// channel of the node's SSH connection.
func readyz(ctx context.Context, c *ssh.Client, port int) (string, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return c.Dial("tcp", addr)
		},
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // see the package doc
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/readyz", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", fmt.Errorf("kube-apiserver %s through the node's SSH connection: %w", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("kube-apiserver %s /readyz: %s: %s", addr, resp.Status, bytes.TrimSpace(b))
	}
	return string(bytes.TrimSpace(b)), nil
}
