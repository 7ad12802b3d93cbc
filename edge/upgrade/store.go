// Package upgrade is the node side of over-the-air upgrades: the node's
// per-upgrade records (upgradeproto.NodeState, persisted with atomic
// writes), the verbs the hub calls over SSH (offer, apply, status, cancel),
// verification of every received file before anything runs, bundles
// (install, health and rollback scripts), and the agent's own upgrade:
// versioned install dirs, an atomic switch of the `current` symlink, an
// updater process outside the agent it replaces, and automatic rollback.
//
// Layout under the agent's state dir:
//
//	upgrades/NAME/state.json     the record (upgradeproto.NodeState)
//	upgrades/NAME/offer.json     the offer as received (documents verified against its digest)
//	upgrades/NAME/incoming/HEX   files uploaded by the hub, named by digest
//	upgrades/NAME/stage/         verified copies (what runs or is installed)
//	upgrades/NAME/switch.json    an agent upgrade's switch: previous, deadline, starts
//	upgrades/NAME/lock           held by whoever changes the record
//	upgrades/NAME/watch.lock     held by the running updater (`upgrade watch`)
//	agent/versions/V/tether-edge installed agent versions
//	agent/current, agent/previous symlinks to the running and the last good version
//	agent/manager.json           how the agent is restarted (systemd unit or supervisor pid)
//
// Every file is replaced whole (temp file, fsync, rename, directory fsync),
// so a power cut at any point leaves the old or the new content.
package upgrade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// State is the node's record of one upgrade.
type State = upgradeproto.NodeState

// ErrNotFound: no record of that upgrade on this node.
var ErrNotFound = errors.New("no such upgrade on this node")

// ErrBusy: another process holds the upgrade's lock (an apply running).
var ErrBusy = errors.New("upgrade is busy")

const maxStateFile = 64 << 10

// DecodeState decodes and checks a state file as read from disk: strict
// JSON of bounded size, a valid record, named name (when name is not "").
func DecodeState(b []byte, name string) (*State, error) {
	if len(b) > maxStateFile {
		return nil, fmt.Errorf("upgrade state: %d bytes, max %d", len(b), maxStateFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s State
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("upgrade state: %w", err)
	}
	if dec.More() {
		return nil, errors.New("upgrade state: trailing data after the JSON document")
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("upgrade state: %w", err)
	}
	if name != "" && s.Name != name {
		return nil, fmt.Errorf("upgrade state: record of %q in the directory of %q", s.Name, name)
	}
	return &s, nil
}

func (n *Node) upgradesDir() string          { return filepath.Join(n.Dir, "upgrades") }
func (n *Node) recordDir(name string) string { return filepath.Join(n.upgradesDir(), name) }
func (n *Node) statePath(name string) string { return filepath.Join(n.recordDir(name), "state.json") }
func (n *Node) stageDir(name string) string  { return filepath.Join(n.recordDir(name), "stage") }

// Load reads one record.
func (n *Node) Load(name string) (*State, error) {
	if !upgradeproto.ValidName(name) {
		return nil, fmt.Errorf("upgrade name %q: want a lowercase name (a-z, 0-9, '-', '.')", name)
	}
	b, err := os.ReadFile(n.statePath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (see `tether-edge upgrade status`)", ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	s, err := DecodeState(b, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.statePath(name), err)
	}
	return s, nil
}

// List reads every record, the most recently updated first. A record
// that cannot be read is logged and left out.
func (n *Node) List() ([]State, error) {
	ents, err := os.ReadDir(n.upgradesDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []State
	for _, e := range ents {
		if !e.IsDir() || !upgradeproto.ValidName(e.Name()) {
			continue
		}
		s, err := n.Load(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			n.log().Warn("upgrade record unreadable", "name", e.Name(), "err", err)
			continue
		}
		out = append(out, *s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].UpdatedAt.After(out[j].UpdatedAt) })
	return out, nil
}

func (n *Node) save(s *State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(n.statePath(s.Name), append(b, '\n'), 0o600)
}

// move takes s one step and persists it.
func (n *Node) move(s *State, to upgradeproto.Step, reason string) error {
	if err := s.Move(to, reason, n.now()); err != nil {
		return err
	}
	n.log().Info("upgrade step", "name", s.Name, "step", to, "reason", reason)
	return n.save(s)
}

// flock is an exclusive lock on a file, released by Close (and by the
// kernel when the holder dies, which is what makes it a liveness signal).
type flock struct{ f *os.File }

func lockFile(path string, wait time.Duration) (*flock, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return &flock{f}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, ErrBusy
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (l *flock) Close() { l.f.Close() }

// held reports whether a live process holds the lock at path.
func held(path string) bool {
	l, err := lockFile(path, 0)
	if err != nil {
		return errors.Is(err, ErrBusy)
	}
	l.Close()
	return false
}

// lock takes the record's lock: short changes wait for it a few seconds.
func (n *Node) lock(name string, wait time.Duration) (*flock, error) {
	l, err := lockFile(filepath.Join(n.recordDir(name), "lock"), wait)
	if errors.Is(err, ErrBusy) {
		return nil, fmt.Errorf("%w: %s is being applied by another process; try again when it is done", ErrBusy, name)
	}
	return l, err
}

// update runs f on the record under its lock and saves it when f did.
func (n *Node) update(name string, f func(s *State) error) (*State, error) {
	l, err := n.lock(name, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	s, err := n.Load(name)
	if err != nil {
		return nil, err
	}
	if err := f(s); err != nil {
		return s, err
	}
	return s, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(b) > upgradeproto.MaxArtifactManifest*4 {
		return fmt.Errorf("%s: too large", path)
	}
	return json.Unmarshal(b, v)
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(path, b, 0o600)
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
