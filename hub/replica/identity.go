package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
)

// IdentitySecret is the store secret holding the hub identity all replicas
// present: the files named by ShareIdentity's caller, as one JSON bundle.
const IdentitySecret = "hub-identity"

// ErrIdentityMismatch means a data dir holds a hub identity other than the
// one the shared store holds.
var ErrIdentityMismatch = errors.New("replica: the data dir holds a different hub identity than the shared store")

// identityBundle is the stored form of the identity: file path (relative
// to the data dir) to contents.
type identityBundle struct {
	Version int               `json:"version"`
	Files   map[string][]byte `json:"files"`
}

// ShareIdentity makes dataDir hold the one hub identity of the replica
// set, before the hub loads it from there:
//
//   - the store holds an identity: its files are written into dataDir
//     (files already there must be equal: a replica never swaps identity
//     silently, and a restart never rotates anything);
//   - the store holds none: this replica's identity (the one in dataDir,
//     completed by create, or a fresh one made by create in a scratch dir)
//     is offered with PutSecretIfAbsent, and whichever replica's offer
//     the store kept is written, so replicas starting together end with
//     one identity.
//
// create makes the identity files in a directory, keeping any that exist.
func ShareIdentity(
	ctx context.Context, st store.ReplicaStore, dataDir string, files []string, create func(dir string) error,
) error {
	stored, err := st.GetSecret(ctx, IdentitySecret)
	if errors.Is(err, store.ErrNotFound) {
		stored, err = offerIdentity(ctx, st, dataDir, files, create)
	}
	if err != nil {
		return fmt.Errorf("replica: shared hub identity: %w", err)
	}
	var b identityBundle
	if err := json.Unmarshal(stored, &b); err != nil || b.Version != 1 {
		return fmt.Errorf("replica: the store's hub identity (secret %q) is unreadable: %v", IdentitySecret, err)
	}
	for _, f := range files {
		if _, ok := b.Files[f]; !ok {
			return fmt.Errorf("replica: the store's hub identity lacks %s", f)
		}
	}
	var missing []string
	for _, f := range files {
		cur, err := os.ReadFile(filepath.Join(dataDir, f))
		switch {
		case errors.Is(err, os.ErrNotExist):
			missing = append(missing, f)
		case err != nil:
			return fmt.Errorf("replica: %w", err)
		case !bytes.Equal(cur, b.Files[f]):
			return fmt.Errorf("%w: %s differs; move this data dir's identity files away (%s) to take the shared one, "+
				"or point this hub at its own store",
				ErrIdentityMismatch, filepath.Join(dataDir, f), filepath.Join(dataDir, "ca"))
		}
	}
	for _, f := range missing {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dataDir, f)), 0o700); err != nil {
			return fmt.Errorf("replica: %w", err)
		}
		if err := pki.WriteFileAtomic(filepath.Join(dataDir, f), b.Files[f], fileMode(f)); err != nil {
			return fmt.Errorf("replica: write the shared identity: %w", err)
		}
	}
	return nil
}

// fileMode keeps public halves readable, as the hub writes them.
func fileMode(f string) os.FileMode {
	if filepath.Ext(f) == ".pub" || filepath.Ext(f) == ".crt" {
		return 0o644
	}
	return 0o600
}

// offerIdentity offers this replica's identity and returns the stored one.
func offerIdentity(
	ctx context.Context, st store.ReplicaStore, dataDir string, files []string, create func(dir string) error,
) ([]byte, error) {
	dir := dataDir
	if !slices.ContainsFunc(files,
		func(f string) bool { _, err := os.Stat(filepath.Join(dataDir, f)); return err == nil }) {
		// A fresh replica makes its offer aside: if another replica's offer
		// wins, nothing of this one's was ever in the data dir.
		tmp, err := os.MkdirTemp(dataDir, ".identity-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	if err := create(dir); err != nil {
		return nil, err
	}
	b := identityBundle{Version: 1, Files: map[string][]byte{}}
	for _, f := range files {
		v, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("read identity file: %w", err)
		}
		b.Files[f] = v
	}
	raw, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	return st.PutSecretIfAbsent(ctx, IdentitySecret, raw)
}
