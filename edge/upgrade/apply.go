package upgrade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// DefaultScriptTimeout bounds each bundle script unless Node.ScriptTimeout says otherwise.
const DefaultScriptTimeout = 30 * time.Minute

// Apply moves an upgrade on as far as the node can take it now:
// confirmation (confirmedBy, when it waits for one), verification of every
// received file against the manifest's digests, then the install: a
// bundle's scripts run to the end here; an agent upgrade is handed to the
// updater (`upgrade watch`, started outside this process), and Apply
// returns in installing. On an upgrade that is past verification, or has
// ended, Apply returns the record as it is.
func (n *Node) Apply(ctx context.Context, name, confirmedBy string) (*State, error) {
	l, err := n.lock(name, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	s, err := n.Load(name)
	if err != nil {
		return nil, err
	}
	if s.Kind == upgradeproto.KindBundle &&
		(s.Step == upgradeproto.StepInstalling || s.Step == upgradeproto.StepHealthCheck) {
		// This apply holds the lock, so no other runs the scripts: the
		// one that did was cut short (its SSH session ended, a kill).
		return s, n.fail(s, interrupted(s.Step))
	}
	var o upgradeproto.Offer
	if s.Step == upgradeproto.StepAwaitingConfirmation {
		if confirmedBy == "" {
			return s, fmt.Errorf(
				"%w: upgrade %s waits for confirmation: confirm it on the hub (`tether upgrade confirm`) or on the node "+
					"(`tether-edge confirm %s`)", ErrRefused, name, name)
		}
		s.ConfirmedBy = confirmedBy
		if err := n.move(s, upgradeproto.StepDownloading, "confirmed by "+confirmedBy); err != nil {
			return s, err
		}
	}
	if s.Step == upgradeproto.StepDownloading || s.Step == upgradeproto.StepVerifying {
		if err := readJSON(filepath.Join(n.recordDir(name), "offer.json"), &o); err != nil {
			return s, fmt.Errorf("upgrade %s: read its offer: %w", name, err)
		}
	}
	if s.Step == upgradeproto.StepDownloading {
		m, err := o.Verify()
		if err != nil {
			return s, n.fail(s, err.Error())
		}
		for _, f := range m.Files() {
			p := filepath.Join(upgradeproto.IncomingDir(n.Dir, name), upgradeproto.DigestHex(f.Digest))
			if _, err := os.Stat(p); err != nil {
				return s, fmt.Errorf("upgrade %s: file %s (%s) not received yet: upload it to %s", name, f.Name, f.Digest, p)
			}
		}
		if err := n.move(s, upgradeproto.StepVerifying, ""); err != nil {
			return s, err
		}
	}
	if s.Step == upgradeproto.StepVerifying {
		m, err := o.Verify()
		if err != nil {
			return s, n.fail(s, err.Error())
		}
		if reason, err := n.stage(name, m.Files()); err != nil {
			return s, err
		} else if reason != "" {
			n.removeFiles(name)
			return s, n.fail(s, reason)
		}
		os.RemoveAll(upgradeproto.IncomingDir(n.Dir, name))
		if err := n.move(s, upgradeproto.StepInstalling, ""); err != nil {
			return s, err
		}
		if s.Kind == upgradeproto.KindBundle {
			n.runBundle(ctx, s, &o)
			return s, nil
		}
		err = n.installAgent(s, &o)
		if s.Step == upgradeproto.StepFailed {
			n.removeFiles(name)
		}
		return s, err
	}
	return s, nil
}

// fail moves s to failed(reason); the returned error is nil when that
// worked (the failure is in the record, not an error of the verb).
func (n *Node) fail(s *State, reason string) error {
	return n.move(s, upgradeproto.StepFailed, reason)
}

// stage copies each received file into the stage dir, hashing what it
// copies: the copy that matched its digest is the one that runs or is
// installed, so a file changed after the check cannot be. A mismatch
// returns its reason ("digest mismatch (want …, got …)").
func (n *Node) stage(name string, files []upgradeproto.File) (reason string, err error) {
	dir := n.stageDir(name)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for _, f := range files {
		src := filepath.Join(upgradeproto.IncomingDir(n.Dir, name), upgradeproto.DigestHex(f.Digest))
		got, err := copyHashed(src, filepath.Join(dir, f.Name), 0o755)
		if err != nil {
			return "", fmt.Errorf("upgrade %s: stage %s: %w", name, f.Name, err)
		}
		if got != f.Digest {
			return fmt.Sprintf("digest mismatch (want %s, got %s)", f.Digest, got), nil
		}
	}
	syncDir(dir)
	return "", nil
}

// copyHashed copies src to dst (fsynced) and returns the copy's digest.
func copyHashed(src, dst string, mode fs.FileMode) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), io.LimitReader(in, upgradeproto.MaxArtifactFile+1))
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// runBundle runs the staged install script, then the health script if
// there is one; a failing health script runs the rollback script if there
// is one. Every script's output goes to Stderr.
func (n *Node) runBundle(ctx context.Context, s *State, o *upgradeproto.Offer) {
	dir := n.stageDir(s.Name)
	has := func(f string) bool { _, err := os.Stat(filepath.Join(dir, f)); return err == nil }
	if err := n.script(ctx, s, o, upgradeproto.BundleInstall); err != nil {
		_ = n.fail(s, err.Error())
		return
	}
	if !has(upgradeproto.BundleHealth) {
		_ = n.move(s, upgradeproto.StepSucceeded, "")
		return
	}
	if err := n.move(s, upgradeproto.StepHealthCheck, ""); err != nil {
		return
	}
	herr := n.script(ctx, s, o, upgradeproto.BundleHealth)
	if herr == nil {
		_ = n.move(s, upgradeproto.StepSucceeded, "")
		return
	}
	if !has(upgradeproto.BundleRollback) {
		_ = n.fail(s, herr.Error()+" (the bundle has no "+upgradeproto.BundleRollback+")")
		return
	}
	if rerr := n.script(ctx, s, o, upgradeproto.BundleRollback); rerr != nil {
		_ = n.fail(s, herr.Error()+"; "+rerr.Error())
		return
	}
	_ = n.move(s, upgradeproto.StepRolledBack, herr.Error()+"; "+upgradeproto.BundleRollback+" ran")
}

// script runs one bundle script with /bin/sh in the stage dir, in its own
// process group (killed whole at the timeout).
func (n *Node) script(ctx context.Context, s *State, o *upgradeproto.Offer, file string) error {
	timeout := n.ScriptTimeout
	if timeout <= 0 {
		timeout = DefaultScriptTimeout
	}
	if file == upgradeproto.BundleHealth && o.HealthTimeoutSeconds > 0 {
		timeout = time.Duration(o.HealthTimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dir := n.stageDir(s.Name)
	cmd := exec.CommandContext(ctx, "/bin/sh", filepath.Join(dir, file))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TETHER_UPGRADE_NAME="+s.Name, "TETHER_UPGRADE_VERSION="+s.ToVersion,
		"TETHER_UPGRADE_FROM_VERSION="+s.FromVersion, "TETHER_UPGRADE_DIR="+dir)
	cmd.Stdout, cmd.Stderr = n.stderr(), n.stderr()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	fmt.Fprintf(n.stderr(), "tether-edge: upgrade %s: running %s\n", s.Name, file)
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%s timed out after %s", file, timeout)
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return fmt.Errorf("%s exited with status %d", file, ee.ExitCode())
	default:
		return fmt.Errorf("%s: %v", file, err)
	}
}

// RecoverBundles fails bundle upgrades a power cut or a kill interrupted
// in installing or health_check (no process holds their lock): whether the
// script finished is unknown, so the node says so instead of guessing.
func (n *Node) RecoverBundles() []State {
	all, _ := n.List()
	var changed []State
	for _, s := range all {
		if s.Kind != upgradeproto.KindBundle ||
			(s.Step != upgradeproto.StepInstalling && s.Step != upgradeproto.StepHealthCheck) {
			continue
		}
		l, err := n.lock(s.Name, 0)
		if err != nil {
			continue
		}
		if cur, err := n.Load(s.Name); err == nil && cur.Step == s.Step {
			if n.fail(cur, interrupted(s.Step)) == nil {
				changed = append(changed, *cur)
			}
		}
		l.Close()
	}
	return changed
}

// interrupted is the reason a bundle cut short in step fails with.
func interrupted(step upgradeproto.Step) string {
	return fmt.Sprintf("interrupted in %s (the node restarted or the apply was killed); the script's outcome is unknown",
		step)
}
