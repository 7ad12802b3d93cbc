package hub

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/kubeone"
)

func testCAPEM(t testing.TB) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestKubeconfigCA(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString(testCAPEM(t))
	cases := []struct {
		name, conf, wantErr string
	}{
		{"admin.conf", "clusters:\n- name: k\n  cluster:\n    certificate-authority-data: " + ca + "\n    server: https://10.0.0.1:6443\n", ""},
		{"no clusters", "apiVersion: v1\n", "no cluster CA"},
		{"no CA", "clusters:\n- cluster: {server: https://x}\n", "no cluster CA"},
		{"not base64", "clusters:\n- cluster: {certificate-authority-data: '%%%'}\n", "certificate-authority-data"},
		{"not a certificate", "clusters:\n- cluster: {certificate-authority-data: " + base64.StdEncoding.EncodeToString([]byte("hello")) + "}\n", "no certificate"},
		{"not yaml", "clusters: [", "yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := kubeconfigCA([]byte(tc.conf))
			if tc.wantErr == "" {
				if err != nil || pool == nil {
					t.Fatalf("kubeconfigCA: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// FuzzKubeconfigCA: admin.conf comes from a node, so it is untrusted input
// to the hub; reading its CA never panics.
func FuzzKubeconfigCA(f *testing.F) {
	f.Add([]byte("clusters:\n- cluster:\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString(testCAPEM(f)) + "\n")) // kubeadm's shape
	f.Add([]byte("clusters: [{cluster: {certificate-authority-data: 1}}]"))                                                           // a number
	f.Add([]byte("clusters: 7"))                                                                                                      // wrong type
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = kubeconfigCA(b)
	})
}

// TestKubeOneRuns drives the apply endpoints of an in-process hub with a
// fake kubeone: the refusals a user meets (no binary, a member offline, a
// run under way, bad flags), then a run to its end, recorded on the
// cluster. The real runs (stand-in kubeone, real agents, OpenSSH) are in
// e2e/kubeone_test.go.
func TestKubeOneRuns(t *testing.T) {
	dir := t.TempDir()
	bin, gate := filepath.Join(dir, "kubeone"), filepath.Join(dir, "gate")
	s, c := testHubWith(t, func(s *Server) { s.cfg.KubeOne = bin })
	ctx := context.Background()
	startAgents(t, s, c, "n1", "n2")
	joinNode(t, c, "off") // registered, never connected
	ensureAddresses(t, s)
	for name, cp := range map[string]string{"k": "n1", "k2": "off"} {
		if _, err := c.CreateKubeOne(ctx, kubeone.Spec{Name: name, ControlPlane: []string{cp}, Workers: workersOf(name), Kubernetes: "1.30.5"}); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, err error, status int, says string) {
		t.Helper()
		wantStatus(t, what, err, status)
		if err != nil && !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %q does not say %q", what, err, says)
		}
	}
	_, err := c.KubeOneRun(ctx, "k", "apply", api.KubeOneRunRequest{})
	refused("no kubeone binary", err, 409, "--kubeone "+bin+" is not an executable on the hub's machine")
	refused("no kubeone binary", err, 409, "start the hub with --kubeone /path/to/kubeone")

	// KubeOne installed after the hub started: found at the next run.
	script := "#!/bin/sh\necho \"fake kubeone $*\"\nwhile [ ! -e " + gate + " ]; do sleep 0.05; done\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = c.KubeOneRun(ctx, "k2", "apply", api.KubeOneRunRequest{})
	refused("member offline", err, 409, "1 of 1 members offline: off (")
	_, err = c.KubeOneRun(ctx, "nope", "apply", api.KubeOneRunRequest{})
	refused("no such cluster", err, 404, `no KubeOne cluster named "nope"`)
	_, err = c.KubeOneRun(ctx, "k", "reset", api.KubeOneRunRequest{Auto: true})
	refused("reset --auto", err, 400, "--auto is for apply")
	_, err = c.KubeOneRun(ctx, "k", "apply", api.KubeOneRunRequest{TimeoutSeconds: 1 << 30})
	refused("timeout", err, 400, "want 1s..")

	j, err := c.KubeOneRun(ctx, "k", "apply", api.KubeOneRunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Kind != KubeOneApplyKind {
		t.Fatalf("job kind %q", j.Kind)
	}
	_, err = c.KubeOneRun(ctx, "k", "reset", api.KubeOneRunRequest{})
	refused("a second run", err, 409, "job "+j.ID)
	if cl, _ := s.store.GetKubeOneCluster(ctx, "k"); cl.Status != kubeoneApplying {
		waitFor(t, "the cluster to be applying", func() bool {
			cl, _ := s.store.GetKubeOneCluster(ctx, "k")
			return cl.Status == kubeoneApplying
		})
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the apply to end", func() bool {
		d, err := c.GetJob(ctx, j.ID)
		return err == nil && d.State != api.JobRunning
	})
	d, _ := c.GetJob(ctx, j.ID)
	log, err := c.NodeLog(ctx, j.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != "succeeded" || !strings.Contains(string(log), "fake kubeone apply --manifest ") || !strings.Contains(string(log), "--auto-approve") ||
		!strings.Contains(string(log), "[tether] kubeone apply for cluster k (2 members)") {
		t.Fatalf("job %s: %s\n%s", j.ID, d.State, log)
	}
	cl, err := s.store.GetKubeOneCluster(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if cl.Status != kubeoneInstalled || cl.LastApply.Job != j.ID || cl.LastApply.Result != "succeeded" || cl.LastApply.At.IsZero() {
		t.Fatalf("cluster after the apply: %s %+v", cl.Status, cl.LastApply)
	}
}

func workersOf(cluster string) []string {
	if cluster == "k" {
		return []string{"n2"}
	}
	return nil
}
