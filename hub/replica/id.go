package replica

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tether-dev/tether/pki"
)

// IDFile is the data-dir file that keeps a replica's generated ID
// across restarts (--replica-id overrides it).
const IDFile = "replica-id"

// LoadID is the configured ID, or the one kept in the data dir (made
// on the first start).
func LoadID(dataDir, configured string) (string, error) {
	if configured != "" {
		return configured, pki.ValidateName(configured)
	}
	path := filepath.Join(dataDir, IDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if err := pki.ValidateName(id); err != nil {
			return "", fmt.Errorf("hub: %s: %w", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("hub: %w", err)
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := "r-" + hex.EncodeToString(r[:])
	if err := pki.WriteFileAtomic(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	return id, nil
}
