package onboard

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tether-dev/tether/pki"
)

// DefaultSeedDir is cloud-init's NoCloud seed directory: user-data and
// meta-data there are applied at the next boot.
const DefaultSeedDir = "/var/lib/cloud/seed/nocloud"

// AgentStateDir is the agent's state dir as the hub's cloud-init names it
// (the unit's --state-dir). Files the user-data writes there go to
// --state-dir when onboarding applies them itself.
const AgentStateDir = "/var/lib/tether-edge"

// WriteSeed writes user-data and meta-data into a NoCloud seed dir for the
// next boot; each file atomically, so a crash leaves the old or the new.
func WriteSeed(dir, userData, metaData string) (userPath, metaPath string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("cloud-init seed dir: %w", err)
	}
	userPath, metaPath = filepath.Join(dir, "user-data"), filepath.Join(dir, "meta-data")
	// meta-data first: cloud-init does not take a seed without it, so a
	// crash in between leaves no half seed that boots.
	if err := pki.WriteFileAtomic(metaPath, []byte(metaData), 0o600); err != nil {
		return "", "", err
	}
	if err := pki.WriteFileAtomic(userPath, []byte(userData), 0o600); err != nil {
		return "", "", err
	}
	return userPath, metaPath, nil
}
