package upgrade

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Node runs the node-side verbs on one agent state dir.
type Node struct {
	Dir string // the agent's state dir
	// Version is the version of the executable running this code: the
	// installed version when no agent/current exists yet.
	Version string
	// Exe is the launcher: the executable the updater and the restarted
	// agent are started from (never replaced while it runs).
	Exe    string
	Log    *slog.Logger
	Stderr io.Writer // where bundle scripts' output goes (the hub streams it)
	// ScriptTimeout bounds each bundle script (default 30 minutes).
	ScriptTimeout time.Duration
	Now           func() time.Time
}

func (n *Node) now() time.Time {
	if n.Now != nil {
		return n.Now()
	}
	return time.Now()
}

func (n *Node) log() *slog.Logger {
	if n.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return n.Log
}

func (n *Node) stderr() io.Writer {
	if n.Stderr == nil {
		return io.Discard
	}
	return n.Stderr
}

// ErrRefused: the verb is not allowed for the record as it stands (the
// message says why and what to do).
var ErrRefused = errors.New("refused")

// Offer records an upgrade the hub offers. The same name and digest again
// return the record as it is; another digest under a name whose upgrade
// has not ended is refused. An agent upgrade to the version already
// running ends skipped ("already at V"; the hub's rollout counts it as a
// node already at the target); one to an older version fails unless the
// offer allows downgrades.
func (n *Node) Offer(o upgradeproto.Offer) (*State, error) {
	m, err := o.Verify()
	if err != nil {
		return nil, err
	}
	if o.Kind == upgradeproto.KindAgent {
		if !safeVersionDir(o.Version) {
			return nil, fmt.Errorf("upgrade offer: version %q cannot name an install directory", o.Version)
		}
		// The manifest must be the index's for this node's platform: a
		// binary for another one would only crash-loop.
		ix, err := upgradeproto.ParseArtifactIndex(o.Index)
		if err != nil {
			return nil, err
		}
		d, err := ix.ForPlatform(runtime.GOOS, runtime.GOARCH)
		if err != nil {
			return nil, fmt.Errorf("upgrade offer: %w", err)
		}
		if d.Digest != upgradeproto.DigestOf(o.Manifest) {
			return nil, fmt.Errorf("upgrade offer: the manifest is not the index's for %s/%s (want %s, got %s)", runtime.GOOS,
				runtime.GOARCH, d.Digest, upgradeproto.DigestOf(o.Manifest))
		}
	}
	if err := os.MkdirAll(n.recordDir(o.Name), 0o700); err != nil {
		return nil, err
	}
	l, err := n.lock(o.Name, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if old, err := n.Load(o.Name); err == nil {
		if old.Digest == o.Digest {
			return old, nil
		}
		if !old.Step.Terminal() {
			return nil, fmt.Errorf(
				"%w: upgrade %s is in step %s with digest %s; a different digest (%s) under the same name is refused: "+
					"cancel it first or use another name",
				ErrRefused, o.Name, old.Step, old.Digest, o.Digest)
		}
		// A finished upgrade's name is taken anew: nothing of it stays.
		for _, f := range []string{"incoming", "stage", "switch.json", "offer.json"} {
			os.RemoveAll(filepath.Join(n.recordDir(o.Name), f))
		}
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	running := n.Version
	if o.Kind == upgradeproto.KindAgent {
		running = n.InstalledVersion()
	}
	s := &State{Name: o.Name, Kind: o.Kind, Digest: o.Digest, FromVersion: o.FromVersion, ToVersion: m.Version(),
		Step: upgradeproto.StepPending, UpdatedAt: n.now().UTC()}
	if o.Kind == upgradeproto.KindAgent {
		s.FromVersion = running
	}
	s.History = []upgradeproto.Transition{{Step: upgradeproto.StepPending, At: s.UpdatedAt}}
	if err := writeJSON(filepath.Join(n.recordDir(o.Name), "offer.json"), o); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(upgradeproto.IncomingDir(n.Dir, o.Name), 0o700); err != nil {
		return nil, err
	}
	switch {
	case o.Kind == upgradeproto.KindAgent && running == o.Version:
		err = s.Move(upgradeproto.StepSkipped, "already at "+o.Version, n.now())
	case o.Kind == upgradeproto.KindAgent && !o.AllowDowngrade && isOlder(o.Version, running):
		err = s.Move(upgradeproto.StepFailed,
			fmt.Sprintf("downgrade from %s to %s refused (the upgrade must allow downgrades)", running, o.Version), n.now())
	case o.Kind == upgradeproto.KindAgent && n.Manager().check() != nil:
		// Said before the hub sends the files: nothing could restart the
		// agent on the new version.
		err = s.Move(upgradeproto.StepFailed, n.Manager().check().Error(), n.now())
	case o.RequireConfirmation:
		err = s.Move(upgradeproto.StepAwaitingConfirmation, "", n.now())
	default:
		err = s.Move(upgradeproto.StepDownloading, "", n.now())
	}
	if err != nil {
		return nil, err
	}
	if s.Step.Terminal() {
		os.RemoveAll(upgradeproto.IncomingDir(n.Dir, o.Name))
	}
	n.log().Info("upgrade offered", "name", s.Name, "kind", s.Kind, "to", s.ToVersion, "step", s.Step, "reason", s.Reason)
	return s, n.save(s)
}

// Status is every record (name ""), or the named one.
func (n *Node) Status(name string) ([]State, error) {
	if name == "" {
		l, err := n.List()
		if l == nil {
			l = []State{}
		}
		return l, err
	}
	s, err := n.Load(name)
	if err != nil {
		return nil, err
	}
	return []State{*s}, nil
}

// Cancel ends an upgrade that has not begun installing, and removes its
// files.
func (n *Node) Cancel(name string) (*State, error) {
	s, err := n.update(name, func(s *State) error {
		if !upgradeproto.CanMove(s.Step, upgradeproto.StepCancelled) {
			return fmt.Errorf("%w: upgrade %s is in step %s and can no longer be cancelled", ErrRefused, name, s.Step)
		}
		return n.move(s, upgradeproto.StepCancelled, "cancelled by the hub")
	})
	if err == nil {
		n.removeFiles(name)
	}
	return s, err
}

// Confirm records who confirmed an upgrade waiting for it, and moves it
// on to downloading (the hub then sends the files and applies it).
func (n *Node) Confirm(name, who string) (*State, error) {
	return n.update(name, func(s *State) error {
		if s.Step != upgradeproto.StepAwaitingConfirmation {
			return fmt.Errorf("%w: upgrade %s is in step %s, not awaiting confirmation", ErrRefused, name, s.Step)
		}
		s.ConfirmedBy = who
		return n.move(s, upgradeproto.StepDownloading, "confirmed by "+who)
	})
}

// Waiting are the records awaiting confirmation.
func (n *Node) Waiting() ([]State, error) {
	all, err := n.List()
	var out []State
	for _, s := range all {
		if s.Step == upgradeproto.StepAwaitingConfirmation {
			out = append(out, s)
		}
	}
	return out, err
}

// removeFiles removes what was received and staged for an upgrade.
func (n *Node) removeFiles(name string) {
	os.RemoveAll(upgradeproto.IncomingDir(n.Dir, name))
	os.RemoveAll(n.stageDir(name))
	syncDir(n.recordDir(name))
}

// safeVersionDir: a version usable as a directory name.
func safeVersionDir(v string) bool {
	return v != "" && v != "." && v != ".." && !strings.ContainsAny(v, "/\\") && !strings.HasPrefix(v, ".")
}

// isOlder: a is a version older than b.
func isOlder(a, b string) bool {
	c, ok := upgradeproto.CompareVersions(a, b)
	return ok && c < 0
}
