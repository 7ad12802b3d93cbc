package sshserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"
)

// hostKeyComment is stored in generated key files so an operator who finds
// the file knows what it is.
const hostKeyComment = "tether edge host key"

// loadOrCreateHostKey returns the host key stored at path, generating and
// persisting an ed25519 key if the file does not exist. Any other problem
// (unreadable, corrupt, passphrase-protected) is an error rather than a
// silent regeneration: a new host key would make every operator's
// known_hosts entry for the node fail.
func loadOrCreateHostKey(path string, log *slog.Logger) (gossh.Signer, error) {
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return createHostKey(path, log)
	case err != nil:
		return nil, fmt.Errorf("sshserver: open host key %s: %w", path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("host key file is accessible by group or others; it should be mode 0600",
			"path", path, "mode", fi.Mode().Perm().String())
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("sshserver: read host key %s: %w", path, err)
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("sshserver: parse host key %s: %w", path, err)
	}
	return signer, nil
}

func createHostKey(path string, log *slog.Logger) (gossh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshserver: generate host key: %w", err)
	}
	block, err := gossh.MarshalPrivateKey(priv, hostKeyComment)
	if err != nil {
		return nil, fmt.Errorf("sshserver: encode host key: %w", err)
	}
	if err := writeFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("sshserver: write host key %s: %w", path, err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshserver: host key signer: %w", err)
	}
	log.Info("generated host key", "path", path, "fingerprint", gossh.FingerprintSHA256(signer.PublicKey()))
	return signer, nil
}

// writeFileAtomic writes data to path so that readers, and a crash at any
// point, see either no file or the complete one: a temp file in the same
// directory is written, synced, renamed over path, and the directory synced
// so the rename itself is durable.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp uses 0600 already; be explicit since this is a secret.
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// Best effort: some filesystems refuse fsync on directories, and the
	// key file itself is already complete.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
