package hub

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/edge/sshdconf"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel"
)

// withoutKubeOne gives the hub a --kubeone that does not exist, so a
// kubeone on the developer's PATH (whose release decides which Kubernetes
// versions a create takes) changes nothing here.
func withoutKubeOne(t *testing.T) func(*Server) {
	missing := filepath.Join(t.TempDir(), "kubeone")
	return func(s *Server) { s.cfg.KubeOne = missing }
}

// startAgents joins and runs real agents (embedded SSH server, TCP) in
// this process and waits until the hub has them online with an address.
func startAgents(t *testing.T, s *Server, c *apiclient.Client, names ...string) {
	t.Helper()
	for _, name := range names {
		tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), name)
		if _, err := edge.Join(context.Background(), edge.JoinOptions{
			JoinString: tok.JoinString, StateDir: dir, Name: name,
		}); err != nil {
			t.Fatal(err)
		}
		runAgent(t, context.Background(),
			edge.Config{StateDir: dir, SSHTarget: edge.SSHEmbedded, Transport: tunnel.TransportTCP})
	}
	waitFor(t, "agents online", func() bool {
		nodes, err := c.ListNodes(context.Background())
		online := 0
		for _, n := range nodes {
			if n.Online {
				online++
			}
		}
		return err == nil && online == len(names)
	})
	ensureAddresses(t, s)
}

// ensureAddresses gives every node an address: a machine without a
// default route reports none, and the manifest needs one per member.
func ensureAddresses(t *testing.T, s *Server) {
	t.Helper()
	nodes, _ := s.store.ListNodes(context.Background())
	for _, n := range nodes {
		if n.Facts.Address == "" {
			f := n.Facts
			f.Address = "192.0.2.1"
			if err := s.store.SetNodeFacts(context.Background(), n.ID, f); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// kubeoneClient is what KubeOne does with a manifest (k8c.io/kubeone
// pkg/ssh): dial the bastion as bastionUser with the cluster's
// certificate, the bastion's host key compared byte for byte with the
// pinned one, then each node through a direct-tcpip channel, its host key
// compared the same way. No HostKeyAlgorithms: x/crypto's defaults, as
// KubeOne.
type kubeoneClient struct {
	bastionAddr, bastionUser, login string
	bastionKey                      []byte
	hostKeys                        map[string][]byte
	signer                          gossh.Signer // the certificate, as KubeOne with sshCertFile
	plain                           gossh.Signer // the key alone
}

func pinned(want []byte) gossh.HostKeyCallback {
	return func(_ string, _ net.Addr, key gossh.PublicKey) error {
		if !bytes.Equal(key.Marshal(), want) {
			return fmt.Errorf("ssh: host key mismatch")
		}
		return nil
	}
}

// parseManifest reads what kubeoneClient needs from a rendered manifest.
func parseManifest(t *testing.T, manifest string) kubeoneClient {
	t.Helper()
	var doc struct {
		ControlPlane  struct{ Hosts []map[string]any } `yaml:"controlPlane"`
		StaticWorkers struct{ Hosts []map[string]any } `yaml:"staticWorkers"`
	}
	if err := yaml.Unmarshal([]byte(manifest), &doc); err != nil {
		t.Fatal(err)
	}
	kc := kubeoneClient{hostKeys: map[string][]byte{}}
	for _, h := range append(doc.ControlPlane.Hosts, doc.StaticWorkers.Hosts...) {
		dec := func(field string) []byte {
			b, err := base64.StdEncoding.DecodeString(h[field].(string))
			if err != nil {
				t.Fatalf("%s: %v", field, err)
			}
			return b
		}
		kc.hostKeys[h["publicAddress"].(string)] = dec("sshHostPublicKey")
		kc.bastionKey = dec("bastionHostPublicKey")
		kc.bastionAddr = net.JoinHostPort(h["bastion"].(string), strconv.Itoa(h["bastionPort"].(int)))
		kc.bastionUser, kc.login = h["bastionUser"].(string), h["sshUsername"].(string)
		kc.signer, kc.plain = certSigner(t, h["sshPrivateKeyFile"].(string), h["sshCertFile"].(string))
	}
	return kc
}

func certSigner(t *testing.T, keyFile, certFile string) (withCert, plain gossh.Signer) {
	t.Helper()
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := gossh.ParsePrivateKey(kb)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(cb)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewCertSigner(pub.(*gossh.Certificate), key)
	if err != nil {
		t.Fatal(err)
	}
	return signer, key
}

// reach logs in to node through the bastion as KubeOne would; nil if the
// node's SSH server accepted the cluster's identity.
func (kc kubeoneClient) reach(node string) error {
	bc, err := gossh.Dial("tcp", kc.bastionAddr, &gossh.ClientConfig{
		User: kc.bastionUser, Auth: []gossh.AuthMethod{gossh.PublicKeys(kc.signer)},
		HostKeyCallback: pinned(kc.bastionKey),
	})
	if err != nil {
		return fmt.Errorf("bastion: %w", err)
	}
	defer bc.Close()
	conn, err := bc.Dial("tcp", net.JoinHostPort(node, "22"))
	if err != nil {
		return fmt.Errorf("jump: %w", err)
	}
	defer conn.Close()
	cb := gossh.InsecureIgnoreHostKey() //nolint:gosec // a node not in this manifest: the login is under test
	if key, ok := kc.hostKeys[node]; ok {
		cb = pinned(key)
	}
	ncc, chans, reqs, err := gossh.NewClientConn(conn, node+":22",
		&gossh.ClientConfig{User: kc.login, Auth: []gossh.AuthMethod{gossh.PublicKeys(kc.signer)}, HostKeyCallback: cb})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	gossh.NewClient(ncc, chans, reqs).Close()
	return nil
}

// viaOperator logs in to node with the cluster's identity, the jump made
// by an operator whose role selects every node: only the node's own
// decision (the keys and principals the hub pushed it) stands between the
// cluster's key and the node.
// It is nil if the node accepted the certificate or the plain key, and
// says which it refused otherwise.
func (kc kubeoneClient) viaOperator(t *testing.T, s *Server, op gossh.Signer, node string) error {
	t.Helper()
	bc := dialBastion(t, s, op)
	defer bc.Close()
	var refused []string
	// The certificate, then the plain key, each on a jump of its own.
	for what, auth := range map[string]gossh.Signer{"certificate": kc.signer, "key": kc.plain} {
		conn, err := bc.Dial("tcp", net.JoinHostPort(node, "22"))
		if err != nil {
			return fmt.Errorf("jump: %w", err)
		}
		ncc, chans, reqs, err := gossh.NewClientConn(conn, node+":22", &gossh.ClientConfig{
			User: kc.login, Auth: []gossh.AuthMethod{gossh.PublicKeys(auth)},
			HostKeyCallback: gossh.InsecureIgnoreHostKey(), //nolint:gosec // the login is under test, not the host
		})
		conn.Close()
		if err != nil {
			refused = append(refused, what)
			continue
		}
		gossh.NewClient(ncc, chans, reqs).Close()
	}
	if len(refused) == 2 {
		return fmt.Errorf("node refused the cluster's key and certificate")
	}
	if len(refused) == 1 {
		return fmt.Errorf("partly: node refused the cluster's %s", refused[0])
	}
	return nil
}

// TestKubeOneIdentityReachesItsMembersOnly: a KubeOne cluster's identity,
// used exactly as KubeOne uses the generated manifest (pinned host keys
// compared byte for byte), reaches each of its members through the hub;
// the bastion refuses it a jump to another cluster's member and to a node
// in no cluster, and those nodes refuse its key and certificate even when
// an operator makes the jump. A member that leaves, and every member when
// the cluster is deleted, stop accepting it.
func TestKubeOneIdentityReachesItsMembersOnly(t *testing.T) {
	s, c := testHubWith(t, withoutKubeOne(t))
	ctx := context.Background()
	startAgents(t, s, c, "n1", "n2", "n3", "n4")
	op := newOperator(t, c)
	login := testenv.LoginName()
	create := func(name string, cp []string, workers ...string) kubeoneClient {
		t.Helper()
		if _, err := c.CreateKubeOne(ctx, apitype.KubeOneSpec{
			Name: name, ControlPlane: cp, Workers: workers, Kubernetes: "1.30.5", Login: login,
		}); err != nil {
			t.Fatal(err)
		}
		m, err := c.KubeOneManifest(ctx, name, "")
		if err != nil {
			t.Fatal(err)
		}
		return parseManifest(t, m)
	}
	a := create("a", []string{"n1"}, "n2")
	b := create("b", []string{"n3"})

	for _, n := range []string{"n1", "n2"} {
		if err := a.reach(n); err != nil {
			t.Fatalf("cluster a's identity does not reach its member %s: %v", n, err)
		}
	}
	if err := b.reach("n3"); err != nil {
		t.Fatalf("cluster b's identity does not reach its member n3: %v", err)
	}
	// The operator's way in works for a member: both the certificate
	// (managed sshd and embedded) and the plain key (embedded) are
	// accepted, so a refusal below is the node's decision.
	if err := a.viaOperator(t, s, op, "n1"); err != nil {
		t.Fatalf("member n1 via an operator's jump: %v", err)
	}
	// Another login on a member is the node's refusal, audited in the
	// identity's name.
	other := a
	other.login = "not-" + login
	other.signer = a.plain
	if err := other.reach("n1"); err == nil {
		t.Fatalf("n1 let cluster a's key in as %s", other.login)
	}
	waitAudit(t, c, "the refused login of a's key", func(e apitype.AuditEvent) bool {
		return e.Kind == "login_refused" && e.Node == "n1" && e.Operator == "kubeone-a"
	})
	for _, tc := range []struct {
		id   kubeoneClient
		who  string
		node string
	}{
		{a, "a", "n3"}, // another cluster's member
		{a, "a", "n4"}, // in no cluster
		{b, "b", "n1"},
	} {
		err := tc.id.reach(tc.node)
		if err == nil || !strings.Contains(err.Error(), "administratively prohibited") {
			t.Errorf("bastion: cluster %s's identity to %s: %v, want a refused jump", tc.who, tc.node, err)
		}
		if err := tc.id.viaOperator(t, s, op, tc.node); err == nil || strings.HasPrefix(err.Error(), "partly") {
			t.Errorf("node %s accepted cluster %s's key or certificate: %v", tc.node, tc.who, err)
		}
	}

	// n2 leaves a: the bastion refuses at once; n2 itself once the push
	// reached it.
	if _, err := c.SetKubeOneMembers(ctx, "a", apitype.KubeOneMembersRequest{ControlPlane: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.reach("n2"); err == nil || !strings.Contains(err.Error(), "administratively prohibited") {
		t.Errorf("bastion: a's identity to n2 after it left: %v", err)
	}
	waitFor(t, "n2 to refuse a's key", func() bool {
		err := a.viaOperator(t, s, op, "n2")
		return err != nil && !strings.HasPrefix(err.Error(), "partly")
	})
	if err := a.reach("n1"); err != nil {
		t.Fatalf("a's identity lost its remaining member n1: %v", err)
	}

	// Deleting a: no login at the bastion, and n1 refuses the key.
	if _, err := c.DeleteKubeOne(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := a.reach("n1"); err == nil || !strings.Contains(err.Error(), "bastion") {
		t.Errorf("a deleted cluster's identity logged in to the bastion: %v", err)
	}
	waitFor(t, "n1 to refuse a deleted cluster's key", func() bool {
		err := a.viaOperator(t, s, op, "n1")
		return err != nil && !strings.HasPrefix(err.Error(), "partly")
	})
	if _, err := os.Stat(kubeone.Dir(s.cfg.DataDir, "a")); !os.IsNotExist(err) {
		t.Errorf("a deleted cluster's key files are still there: %v", err)
	}
	if err := b.reach("n3"); err != nil {
		t.Errorf("cluster b lost its member when a was deleted: %v", err)
	}
}

// TestKubeOneKeyFiles: the private key is 0600 in a 0700 directory of the
// data dir, and no API answer carries it.
func TestKubeOneKeyFiles(t *testing.T) {
	s, c := testHubWith(t, withoutKubeOne(t))
	ctx := context.Background()
	startAgents(t, s, c, "n1")
	cl, err := c.CreateKubeOne(ctx, apitype.KubeOneSpec{Name: "k", ControlPlane: []string{"n1"}, Kubernetes: "1.31.2"})
	if err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{
		kubeone.Dir(s.cfg.DataDir, "k"): 0o700 | os.ModeDir, kubeone.PrivateKeyPath(s.cfg.DataDir, "k"): 0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
		}
	}
	key, err := os.ReadFile(kubeone.PrivateKeyPath(s.cfg.DataDir, "k"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(signer.PublicKey()))); got != cl.PublicKey {
		t.Errorf("public key %q is not the key file's %q", cl.PublicKey, got)
	}
	// The private key's base64 body must appear in no answer.
	body := strings.Join(strings.Split(string(key), "\n")[1:3], "")
	list, _ := c.ListKubeOne(ctx)
	st, _ := c.KubeOneStatus(ctx, "k")
	m, _ := c.KubeOneManifest(ctx, "k", "")
	for what, v := range map[string]any{"create": cl, "list": list, "status": st, "manifest": m} {
		if strings.Contains(fmt.Sprintf("%+v", v), body[:40]) {
			t.Errorf("%s answer carries the private key", what)
		}
	}
}

// TestKubeOneAPI: the KubeOne endpoints answer with the right status and a
// message that names the problem, are for admins only, are audited, and
// status shows each member's tunnel.
func TestKubeOneAPI(t *testing.T) {
	s, c := testHubWith(t, withoutKubeOne(t))
	ctx := context.Background()
	startAgents(t, s, c, "n1", "n2", "n3")
	joinNode(t, c, "off") // registered, never connected
	joinNode(t, c, "eng") // never connected: its engine waits in install_in_progress
	joinNode(t, c, "rev")
	if _, err := c.RevokeNode(ctx, "rev"); err != nil {
		t.Fatal(err)
	}
	spec := func(cp ...string) apitype.KubeOneSpec {
		return apitype.KubeOneSpec{Name: "k", ControlPlane: cp, Kubernetes: "1.30.5"}
	}
	cl, err := c.CreateKubeOne(ctx, spec("n1", "n2"))
	if err != nil {
		t.Fatal(err)
	}
	// This hub has no kubeone: the version is checked against the releases
	// it knows only, which a warning says.
	if len(cl.Warnings) != 2 || !strings.Contains(cl.Warnings[0], "2 control-plane nodes") ||
		!strings.Contains(cl.Warnings[1], "the hub's kubeone could not be asked: kubeone: binary not found: --kubeone ") {
		t.Errorf("warnings %q, want the even control plane's and the missing kubeone's", cl.Warnings)
	}
	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		says   string
	}{
		{"name taken", func() error { _, err := c.CreateKubeOne(ctx, spec("n3")); return err }, 409,
			`a KubeOne cluster named "k" exists`},
		{"member elsewhere", func() error { s := spec("n2"); s.Name = "j"; _, err := c.CreateKubeOne(ctx, s); return err },
			409, `node "n2" is already a member of KubeOne cluster "k"`},
		// One node, one Kubernetes, refused both ways with the owner named.
		{"engine on a KubeOne member", func() error { _, err := c.ClusterRegister(ctx, "n1", "k3s"); return err }, 409,
			`node "n1" is a member of KubeOne cluster "k"`},
		{"KubeOne on a node with an engine", func() error {
			if _, err := c.ClusterRegister(ctx, "eng", "rke2"); err != nil {
				return err
			}
			s := spec("eng")
			s.Name = "j"
			_, err := c.CreateKubeOne(ctx, s)
			return err
		}, 409, `node "eng" has the rke2 engine of ` + "`tether cluster`"},
		{"KubeOne members on a node with an engine", func() error {
			_, err := c.SetKubeOneMembers(ctx, "k",
				apitype.KubeOneMembersRequest{ControlPlane: []string{"n1"}, Workers: []string{"eng"}})
			return err
		}, 409, `node "eng" has the rke2 engine`},
		{"unknown node",
			func() error { s := spec("nope"); s.Name = "j"; _, err := c.CreateKubeOne(ctx, s); return err }, 400,
			`no node named "nope"`},
		{"revoked node",
			func() error { s := spec("rev"); s.Name = "j"; _, err := c.CreateKubeOne(ctx, s); return err }, 400,
			`node "rev" is revoked`},
		{"bad version", func() error {
			s := spec("n3")
			s.Name, s.Kubernetes = "j", "1.20.1"
			_, err := c.CreateKubeOne(ctx, s)
			return err
		}, 400, "KubeOne 1.8 and later install Kubernetes 1.27 to 1.36"},
		{"no such cluster", func() error { _, err := c.KubeOneStatus(ctx, "nope"); return err }, 404,
			`no KubeOne cluster named "nope"`},
		{"operator in the identities' names", func() error {
			pub, _, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			sshPub, err := gossh.NewPublicKey(pub)
			if err != nil {
				return err
			}
			_, err = c.AddOperator(ctx, apitype.OperatorAddRequest{Name: "kubeone-k",
				PublicKey: string(gossh.MarshalAuthorizedKey(sshPub))})
			return err
		}, 400, `names starting with "kubeone-" belong to KubeOne clusters' identities`},
		{"bad bastion", func() error { _, err := c.KubeOneManifest(ctx, "k", "a b:1"); return err }, 400,
			"want HOST or HOST:PORT"},
		{"member offline", func() error {
			if _, err := c.SetKubeOneMembers(ctx, "k", apitype.KubeOneMembersRequest{
				ControlPlane: []string{"n1"}, Workers: []string{"off"},
			}); err != nil {
				return err
			}
			_, err := c.KubeOneManifest(ctx, "k", "")
			return err
		}, 409, `member "off" is not connected`},
	} {
		err := tc.call()
		wantStatus(t, tc.name, err, tc.status)
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.says)
		}
	}

	st, err := c.KubeOneStatus(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if st.MembersUp != 1 || len(st.Members) != 2 || !st.Members[0].Online || st.Members[0].Transport != "tcp" ||
		st.Members[1].Online || st.Members[1].Role != "worker" {
		t.Errorf("status %+v", st)
	}
	if got := kubeoneMembersMetric(t, s, "k"); got != "control-plane/up=1 worker/down=1" {
		t.Errorf("tether_kubeone_members: %s", got)
	}
	m, err := c.KubeOneManifest(ctx, "k", "hub.example.net:2022")
	if err == nil || !strings.Contains(err.Error(), "off") {
		t.Fatalf("manifest with an offline member: %v, %q", err, m)
	}
	if _, err := c.SetKubeOneMembers(ctx, "k", apitype.KubeOneMembersRequest{ControlPlane: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	if m, err = c.KubeOneManifest(ctx, "k", "hub.example.net:2022"); err != nil ||
		!strings.Contains(m, "bastion: hub.example.net\n") || !strings.Contains(m, "bastionPort: 2022\n") {
		t.Errorf("manifest with --bastion: %v\n%s", err, m)
	}

	// Admins only: an operator's API identity is refused.
	aliceKey := addOperator(t, c, "alice", "all")
	alice := operatorClient(t, s, "alice", aliceKey)
	_, err = alice.ListKubeOne(ctx)
	wantStatus(t, "operator lists KubeOne clusters", err, 403)
	_, err = alice.KubeOneManifest(ctx, "k", "")
	wantStatus(t, "operator reads a manifest", err, 403)

	if _, err := c.DeleteKubeOne(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"kubeone_create", "kubeone_members", "kubeone_delete"} {
		waitAudit(t, c, kind, func(e apitype.AuditEvent) bool {
			return e.Kind == kind && e.Result == "ok" && strings.Contains(e.Detail, "cluster k")
		})
	}
	waitAudit(t, c, "refused create",
		func(e apitype.AuditEvent) bool { return e.Kind == "kubeone_create" && e.Result == "refused" })
}

// TestKubeOneManagedSSHD: on a node whose agent manages a real OpenSSH
// sshd (no authorized_keys at all: operators come in by certificate
// only), the cluster's certificate logs in for the cluster's login, sshd
// presents exactly the host certificate the manifest pins (what KubeOne's
// byte comparison needs), and after the cluster is deleted sshd refuses
// the certificate.
func TestKubeOneManagedSSHD(t *testing.T) {
	s, c := testHubWith(t, withoutKubeOne(t))
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sshd_config.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	sshd := testenv.StartSSHD(t, testenv.SSHDConfig{Dir: dir, Include: filepath.Join(dir, "sshd_config.d", "*.conf")})

	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "m1")
	if _, err := edge.Join(ctx, edge.JoinOptions{JoinString: tok.JoinString, StateDir: state, Name: "m1"}); err != nil {
		t.Fatal(err)
	}
	mgr := &edge.SSHDManager{
		Paths: sshdconf.Paths{
			Dir: filepath.Join(dir, "tether"), DropIn: filepath.Join(dir, "sshd_config.d", "50-tether.conf"),
			HostKey: sshd.HostKey.Path,
		},
		SSHDConfig: sshd.Config, Reload: sshdconf.PidFileReloader(sshd.PidFile),
	}
	if err := mgr.Check(); err != nil {
		t.Fatal(err)
	}
	runAgent(t, ctx, edge.Config{StateDir: state, SSHTarget: sshd.Addr, SSHDHostKey: sshd.HostKey.Path,
		ManageSSHD: mgr, Transport: tunnel.TransportTCP})
	waitFor(t, "m1 online", func() bool {
		n, err := s.store.GetNodeByName(ctx, "m1")
		return err == nil && n.Online
	})
	ensureAddresses(t, s)

	if _, err := c.CreateKubeOne(ctx, apitype.KubeOneSpec{
		Name: "m", ControlPlane: []string{"m1"}, Kubernetes: "1.32.1", Login: testenv.LoginName(),
	}); err != nil {
		t.Fatal(err)
	}
	m, err := c.KubeOneManifest(ctx, "m", "")
	if err != nil {
		t.Fatal(err)
	}
	kc := parseManifest(t, m)
	// sshd presents the certificate once the agent installed it and
	// reloaded sshd, and accepts the principal once the push landed.
	var last error
	waitFor(t, "the cluster's certificate to log in to m1's sshd",
		func() bool { last = kc.reach("m1"); return last == nil })
	if k, err := gossh.ParsePublicKey(kc.hostKeys["m1"]); err != nil {
		t.Fatal(err)
	} else if cert, ok := k.(*gossh.Certificate); !ok || cert.CertType != gossh.HostCert {
		t.Errorf("m1's pinned host key is a %s, not a host certificate", k.Type())
	}
	op := newOperator(t, c)
	if err := kc.viaOperator(t, s, op, "m1"); err == nil || err.Error() != "partly: node refused the cluster's key" {
		t.Errorf("m1's sshd (no authorized_keys) via an operator's jump: %v, "+
			"want the certificate accepted and the plain key refused", err)
	}

	if _, err := c.DeleteKubeOne(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "m1's sshd to refuse a deleted cluster's certificate", func() bool {
		err := kc.viaOperator(t, s, op, "m1")
		return err != nil && !strings.HasPrefix(err.Error(), "partly")
	})
}

// kubeoneMembersMetric is cluster's non-zero tether_kubeone_members
// series as "role/tunnel=N", sorted.
func kubeoneMembersMetric(t *testing.T, s *Server, cluster string) string {
	t.Helper()
	mfs, err := s.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "tether_kubeone_members" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["cluster"] == cluster && m.GetGauge().GetValue() > 0 {
				out = append(out, fmt.Sprintf("%s/%s=%g", l["role"], l["tunnel"], m.GetGauge().GetValue()))
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}
