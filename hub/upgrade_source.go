package hub

import (
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/upgrade"
)

// upgradeSource is where upgrades' artifacts come from: registries,
// through hub/artifacts. nil until that is wired: creating an upgrade then
// says the hub has no registry access.
func (s *Server) upgradeSource(_ *jobs.Blobs) (upgrade.Source, error) {
	return nil, nil
}
