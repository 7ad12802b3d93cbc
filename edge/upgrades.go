// The agent's part in over-the-air upgrades (edge/upgrade does the work):
// it announces the node-side updater, marks its own upgrade healthy once
// the hub welcomed it, serves the confirm socket, and reports the node's
// upgrade records to a hub that takes them.

package edge

import (
	"context"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// maxReportedUpgrades bounds one report (the upgrade contract's limit).
const maxReportedUpgrades = 64

// upgradeReports carries upgrade records to the connected hub.
type upgradeReports struct {
	mu   sync.Mutex
	send func(*control.Message) error // the current session's, if its hub takes upgrade states
}

// upgradeSupport is the hello's Upgrade for this agent (nil without the updater).
func (a *Agent) upgradeSupport() *upgradeproto.Support {
	u := a.cfg.Upgrade
	// The hub refuses a hello whose Exe is not a clean absolute path: an
	// agent that cannot name itself so connects without the updater.
	if u == nil || !filepath.IsAbs(u.Exe) || filepath.Clean(u.Exe) != u.Exe || len(u.Exe) > 256 {
		return nil
	}
	return &upgradeproto.Support{Exe: u.Exe, Previous: u.PreviousVersion()}
}

// upgradeSession runs after the welcome: an agent upgrade to this version
// waiting for its health check succeeded now; a hub that takes upgrade
// states gets every record, then each change while the session lasts.
func (a *Agent) upgradeSession(s *session, w *control.Welcome) (clear func()) {
	u := a.cfg.Upgrade
	if u == nil {
		return func() {}
	}
	for _, st := range u.MarkHealthy(Version) {
		s.log.Info("agent upgrade succeeded: the hub welcomed this version", "upgrade", st.Name, "version", Version)
	}
	if w == nil || !slices.Contains(w.Capabilities, upgradeproto.HubCapUpgrades) {
		return func() {}
	}
	a.upgrades.mu.Lock()
	a.upgrades.send = s.send
	a.upgrades.mu.Unlock()
	all, err := u.List()
	if err != nil {
		s.log.Warn("upgrade records unreadable", "err", err)
	}
	a.reportUpgrades(all)
	return func() {
		a.upgrades.mu.Lock()
		a.upgrades.send = nil
		a.upgrades.mu.Unlock()
	}
}

// reportUpgrades sends records to the hub if one that takes them is
// connected; otherwise the next welcome's full report carries them.
func (a *Agent) reportUpgrades(states []upgrade.State) {
	if len(states) == 0 {
		return
	}
	if len(states) > maxReportedUpgrades {
		states = states[:maxReportedUpgrades]
	}
	a.upgrades.mu.Lock()
	send := a.upgrades.send
	a.upgrades.mu.Unlock()
	if send == nil {
		return
	}
	if err := send(&control.Message{Type: upgradeproto.TypeState, UpgradeStates: states}); err != nil {
		a.log.Warn("upgrade state not delivered to the hub", "err", err)
	}
}

// recoverUpgrades fails the bundle upgrades a restart interrupted; it runs
// before the first connection, whose welcome then reports them.
func (a *Agent) recoverUpgrades() {
	for _, st := range a.cfg.Upgrade.RecoverBundles() {
		a.log.Warn("bundle upgrade interrupted", "upgrade", st.Name, "reason", st.Reason)
	}
}

// serveUpgrades serves the confirm socket beside the agent until ctx ends.
func (a *Agent) serveUpgrades(ctx context.Context) {
	if err := a.cfg.Upgrade.ServeConfirm(ctx, a.reportUpgrades); err != nil {
		a.log.Error("upgrade confirm socket stopped: `tether-edge confirm` cannot reach this agent", "err", err)
	}
}
