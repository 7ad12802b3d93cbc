// Package upgrade drives one node through an over-the-air upgrade over
// SSH, through the same runner the jobs use: it calls the node-side
// updater the agent announced (the verbs of the upgrade contract,
// tunnel/upgradeproto), pushes the artifact's files to the node's incoming directory,
// and reads back the node's state.
//
// The node trusts nothing it is sent: it checks the offer against the
// pinned digest and every file against its layer digest before anything
// runs. This package only carries; it never imports the hub.
package upgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Conn is an SSH connection to the node (the hub's runner client behind
// an adapter).
type Conn interface {
	// Run runs a shell command line, or a script when script is not nil,
	// and returns its exit code.
	Run(ctx context.Context, line string, script []byte, stdout, stderr io.Writer) (int, error)
	// Upload copies size bytes from src to dst atomically (creating the
	// parent directories) and returns the SHA-256 hex the node computed.
	Upload(ctx context.Context, src io.Reader, size int64, dst string) (string, error)
}

// Blobs opens a file of the artifact by its hex digest (the hub's blob
// store).
type Blobs func(hexDigest string) (io.ReadCloser, int64, error)

// Node is one node's updater: the executable the agent announced and its
// state directory.
type Node struct {
	Conn     Conn
	Exe      string
	StateDir string
}

// ErrUpdater is a node-side updater that did not answer as the contract
// says (missing, too old, or broken).
var ErrUpdater = errors.New("upgrade: node-side updater failed")

const maxAnswer = 1 << 20

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (n Node) check() error {
	if !strings.HasPrefix(n.Exe, "/") || path.Clean(n.Exe) != n.Exe {
		return fmt.Errorf("%w: the agent announced no clean absolute executable (%q)", ErrUpdater, n.Exe)
	}
	if !strings.HasPrefix(n.StateDir, "/") || path.Clean(n.StateDir) != n.StateDir {
		return fmt.Errorf("%w: the agent announced no clean absolute state directory (%q)", ErrUpdater, n.StateDir)
	}
	return nil
}

// call runs EXE upgrade VERB --state-dir DIR ARGS..., with stdin from a
// here-document when in is not nil, and decodes its JSON answer into out.
// The command's stderr goes to log.
func (n Node) call(ctx context.Context, verb string, args []string, in []byte, out any, log io.Writer) error {
	if err := n.check(); err != nil {
		return err
	}
	line := quote(n.Exe) + " upgrade " + verb + " --state-dir " + quote(n.StateDir)
	for _, a := range args {
		line += " " + quote(a)
	}
	var script []byte
	if in != nil {
		// The offer is one line of JSON (its documents base64), so no line
		// of it can end the here-document early.
		if bytes.ContainsAny(in, "\n\r") {
			return fmt.Errorf("upgrade: %s: the input is not one line", verb)
		}
		script = []byte("#!/bin/sh\nexec " + line + " <<'TETHER_UPGRADE_OFFER'\n" + string(in) + "\nTETHER_UPGRADE_OFFER\n")
		line = ""
	}
	var stdout bytes.Buffer
	var stderr bytes.Buffer
	code, err := n.Conn.Run(ctx, line, script, &limited{w: &stdout, n: maxAnswer},
		io.MultiWriter(log, &limited{w: &stderr, n: 4096}))
	if err != nil {
		return fmt.Errorf("upgrade %s: %w", verb, err)
	}
	if code != 0 && stdout.Len() == 0 {
		return fmt.Errorf("%w: `%s upgrade %s` exited %d: %s", ErrUpdater, n.Exe, verb, code, lastLine(stderr.String()))
	}
	dec := json.NewDecoder(&stdout)
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%w: `%s upgrade %s` (exit %d) answered no state: %v; %s", ErrUpdater, n.Exe, verb, code, err,
			lastLine(stderr.String()))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	k := min(len(p), l.n)
	if k > 0 {
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

func (n Node) state(
	ctx context.Context, verb string, args []string, in []byte, log io.Writer,
) (upgradeproto.NodeState, error) {
	var st upgradeproto.NodeState
	if err := n.call(ctx, verb, args, in, &st, log); err != nil {
		return st, err
	}
	if err := st.Validate(); err != nil {
		return st, fmt.Errorf("%w: `upgrade %s` answered a bad state: %v", ErrUpdater, verb, err)
	}
	return st, nil
}

// Offer hands the node the upgrade (the node checks it against its pinned
// digest and records it).
func (n Node) Offer(ctx context.Context, o upgradeproto.Offer, log io.Writer) (upgradeproto.NodeState, error) {
	b, err := json.Marshal(o)
	if err != nil {
		return upgradeproto.NodeState{}, err
	}
	return n.state(ctx, "offer", nil, b, log)
}

// Push uploads each file to the upgrade's incoming directory on the node,
// named by its digest, and returns the bytes sent. A file the node hashes
// differently from its digest is an error (the node would refuse it).
func (n Node) Push(ctx context.Context, name string, files []upgradeproto.File, open Blobs) (int64, error) {
	if err := n.check(); err != nil {
		return 0, err
	}
	dir := upgradeproto.IncomingDir(n.StateDir, name)
	var sent int64
	done := map[string]bool{}
	for _, f := range files {
		if !upgradeproto.ValidDigest(f.Digest) {
			return sent, fmt.Errorf("upgrade: file %s: digest %q", f.Name, f.Digest)
		}
		h := upgradeproto.DigestHex(f.Digest)
		if done[h] {
			continue
		}
		done[h] = true
		r, size, err := open(h)
		if err != nil {
			return sent, fmt.Errorf("upgrade: file %s (%s): %w", f.Name, f.Digest, err)
		}
		got, err := n.Conn.Upload(ctx, r, size, path.Join(dir, h))
		r.Close()
		if err != nil {
			return sent, fmt.Errorf("upgrade: push %s (%s) to %s: %w", f.Name, f.Digest, dir, err)
		}
		sent += size
		if got != h {
			return sent, fmt.Errorf("upgrade: push %s: digest mismatch (want %s, got sha256:%s)", f.Name, f.Digest, got)
		}
	}
	return sent, nil
}

// Apply has the node verify and install the upgrade (confirmed by by when
// not empty); a bundle's scripts' output goes to log.
func (n Node) Apply(ctx context.Context, name, by string, log io.Writer) (upgradeproto.NodeState, error) {
	args := []string{name}
	if by != "" {
		args = append(args, "--confirmed-by", by)
	}
	return n.state(ctx, "apply", args, nil, log)
}

// Status reads the node's records (of name, or all when name is empty).
func (n Node) Status(ctx context.Context, name string, log io.Writer) ([]upgradeproto.NodeState, error) {
	var args []string
	if name != "" {
		args = []string{name}
	}
	var out []upgradeproto.NodeState
	if err := n.call(ctx, "status", args, nil, &out, log); err != nil {
		return nil, err
	}
	for i := range out {
		if err := out[i].Validate(); err != nil {
			return nil, fmt.Errorf("%w: `upgrade status` answered a bad state: %v", ErrUpdater, err)
		}
	}
	return out, nil
}

// Cancel has the node drop an upgrade it has not installed.
func (n Node) Cancel(ctx context.Context, name string, log io.Writer) (upgradeproto.NodeState, error) {
	return n.state(ctx, "cancel", []string{name}, nil, log)
}

// Drive is one pass over a node: offer, push the files, apply. The
// node's answer at any step that ends or pauses its upgrade is returned
// as is (failed with its reason, awaiting_confirmation); the files are
// pushed before apply even when the node waits for a person, so a
// confirmation on the node can go on without the hub. offered, when not
// nil, is told the node's answer to the offer before the files go.
func (n Node) Drive(
	ctx context.Context,
	o upgradeproto.Offer,
	files []upgradeproto.File,
	open Blobs,
	confirmedBy string,
	log io.Writer,
	offered func(upgradeproto.NodeState),
) (upgradeproto.NodeState, int64, error) {
	st, err := n.Offer(ctx, o, log)
	if err != nil {
		return st, 0, err
	}
	if offered != nil {
		offered(st)
	}
	if st.Step.Terminal() || st.Step == upgradeproto.StepHealthCheck {
		return st, 0, nil // the node had this upgrade already: its word stands
	}
	var sent int64
	if st.Step == upgradeproto.StepPending || st.Step == upgradeproto.StepAwaitingConfirmation ||
		st.Step == upgradeproto.StepDownloading {
		if sent, err = n.Push(ctx, o.Name, files, open); err != nil {
			return st, sent, err
		}
	}
	if st.Step == upgradeproto.StepAwaitingConfirmation && confirmedBy == "" {
		return st, sent, nil
	}
	st, err = n.Apply(ctx, o.Name, confirmedBy, log)
	return st, sent, err
}
