package hub

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/kubeone"
)

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
		spec := apitype.KubeOneSpec{Name: name, ControlPlane: []string{cp}, Workers: workersOf(name),
			Kubernetes: "1.30.5"}
		if _, err := c.CreateKubeOne(ctx, spec); err != nil {
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
	_, err := c.KubeOneRun(ctx, "k", "apply", apitype.KubeOneRunRequest{})
	refused("no kubeone binary", err, 409, "--kubeone "+bin+" is not an executable on the hub's machine")
	refused("no kubeone binary", err, 409, "start the hub with --kubeone /path/to/kubeone")

	// KubeOne installed after the hub started: found at the next run.
	script := "#!/bin/sh\necho \"fake kubeone $*\"\nwhile [ ! -e " + gate + " ]; do sleep 0.05; done\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = c.KubeOneRun(ctx, "k2", "apply", apitype.KubeOneRunRequest{})
	refused("member offline", err, 409, "1 of 1 members offline: off (")
	_, err = c.KubeOneRun(ctx, "nope", "apply", apitype.KubeOneRunRequest{})
	refused("no such cluster", err, 404, `no KubeOne cluster named "nope"`)
	_, err = c.KubeOneRun(ctx, "k", "reset", apitype.KubeOneRunRequest{Auto: true})
	refused("reset --auto", err, 400, "--auto is for apply")
	_, err = c.KubeOneRun(ctx, "k", "apply", apitype.KubeOneRunRequest{TimeoutSeconds: 1 << 30})
	refused("timeout", err, 400, "want 1s..")

	j, err := c.KubeOneRun(ctx, "k", "apply", apitype.KubeOneRunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Kind != kubeone.ApplyKind {
		t.Fatalf("job kind %q", j.Kind)
	}
	_, err = c.KubeOneRun(ctx, "k", "reset", apitype.KubeOneRunRequest{})
	refused("a second run", err, 409, "job "+j.ID)
	if cl, _ := s.store.GetKubeOneCluster(ctx, "k"); cl.Status != kubeone.StatusApplying {
		waitFor(t, "the cluster to be applying", func() bool {
			cl, _ := s.store.GetKubeOneCluster(ctx, "k")
			return cl.Status == kubeone.StatusApplying
		})
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the apply to end", func() bool {
		d, err := c.GetJob(ctx, j.ID)
		return err == nil && d.State != apitype.JobRunning
	})
	d, _ := c.GetJob(ctx, j.ID)
	log, err := c.NodeLog(ctx, j.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != "succeeded" || !strings.Contains(string(log), "fake kubeone apply --manifest ") ||
		!strings.Contains(string(log), "--auto-approve") ||
		!strings.Contains(string(log), "[tether] kubeone apply for cluster k (2 members)") {
		t.Fatalf("job %s: %s\n%s", j.ID, d.State, log)
	}
	cl, err := s.store.GetKubeOneCluster(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if cl.Status != kubeone.StatusInstalled || cl.LastApply.Job != j.ID || cl.LastApply.Result != "succeeded" ||
		cl.LastApply.At.IsZero() {
		t.Fatalf("cluster after the apply: %s %+v", cl.Status, cl.LastApply)
	}
}

func workersOf(cluster string) []string {
	if cluster == "k" {
		return []string{"n2"}
	}
	return nil
}
