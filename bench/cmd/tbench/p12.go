package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/internal/testenv"
)

// runP12 compares a jump from the root of a tree of hubs to a leaf two
// levels down with a direct jump at the leaf's own site hub, in the same
// run: root → region → berlin (real `tether hub --parent … --site …`
// processes, no fault proxies), one agent (QUIC) on berlin in front of a
// real sshd. Direct: ssh -J through berlin. Through the tree: ssh -J through
// the root to n1.berlin.region, which the root routes to the region and the
// region to berlin. Bulk copy MB/s (best of runs) and `ssh -J node true`
// wall time (median).
func runP12(ctx context.Context, b *bench) error {
	if out, err := exec.Command(filepath.Join(b.bin, "tether"), "site", "--help").CombinedOutput(); err != nil {
		b.report.Note("P12 skipped: `tether site` is not in this build (%s)", strings.TrimSpace(string(out)))
		return nil
	}
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	node, err := env.StartSSHD(ctx, "node-sshd")
	if err != nil {
		return err
	}
	sshConfig, err := env.SSHConfig(ctx)
	if err != nil {
		return err
	}
	dir := env.Path("tree")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tr, err := testenv.BuildTree(ctx,
		testenv.TreeConfig{Bin: b.bin, Dir: dir, Sites: []string{"berlin"}, AgentsPerSite: -1,
			NoLinks: true, LogLevel: "warn", AgentArgs: []string{"--ssh", node.Addr}})
	if err != nil {
		return err
	}
	defer tr.Close()
	berlin := tr.Sites["berlin"]
	if _, err := tr.AddAgent(ctx, berlin, "n1", "quic"); err != nil {
		return err
	}
	// The node's sshd takes the operator's key itself; the operator is
	// added at both hubs, so each bastion lets it jump.
	key, _ := env.OperatorKey(ctx)
	for _, h := range []*testenv.TreeHub{tr.Root, berlin} {
		if _, err := h.Tether(ctx, "operator", "add", "bench", "--key", key+".pub"); err != nil {
			return err
		}
	}
	if err := tr.WaitTree(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("P12: %w\n%s", err, tr.Logs(2000))
	}
	login := harness.Login()
	args := map[string][]string{
		"direct": {"-F", sshConfig, "-J", "bench@" + berlin.SSH, login + "@n1"},
		"tree":   {"-F", sshConfig, "-J", "bench@" + tr.Root.SSH, login + "@n1.berlin.region"},
	}
	// The root learns the region's inventory and trust a moment after the
	// tree shows healthy: the first jump through it is waited for.
	if err := harness.WaitFor(ctx, time.Minute, "a jump from the root to n1.berlin.region", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return exec.CommandContext(cctx, "ssh", append(args["tree"], "true")...).Run() == nil
	}); err != nil {
		return fmt.Errorf("P12: %w\n%s", err, tr.Logs(2000))
	}
	return b.compareJumps(ctx, "P12", args["direct"], args["tree"], "direct at the site hub",
		"root → region → site → leaf")
}
