package edge

import (
	"encoding/json"
	"path/filepath"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// The agent dials its hubs (a.id.Config.Hubs, read by the connect loop
// only) in an order it keeps: the hub it was last connected to first, so a
// blip of the link brings it back there (and its resumable streams with
// it); after a hub answered the dial but the handshake failed, the next
// hub first, so a replica that is up but cannot admit it is not the first
// one asked every time. uplink.Dial moves on to the next address within
// uplink.DialStagger when one does not answer, so a replica that died
// costs the agent that long at most.

// attemptEnded orders the hubs for the next attempt; connected says
// whether the one that just ended was welcomed (on the hub its status
// names).
func (a *Agent) attemptEnded(connected bool) {
	a.mu.Lock()
	hub, state := a.status.Hub, a.state
	a.mu.Unlock()
	switch {
	case connected:
		a.id.Config.Hubs = uplink.Prefer(a.id.Config.Hubs, hub)
	case state == StateHandshaking:
		a.id.Config.Hubs = uplink.Rotate(a.id.Config.Hubs)
	}
}

// learnHubs adds the hub addresses a welcome announces (the live replicas
// sharing the hub's store) to the ones the agent dials, and keeps them in
// node.json, so a replica added after the node joined is one to fail over
// to, after a restart too.
func (a *Agent) learnHubs(w *control.Welcome) {
	if w == nil {
		return
	}
	hubs, changed := uplink.MergeHubs(a.id.Config.Hubs, w.Hubs)
	if !changed {
		return
	}
	a.log.Info("hub addresses learned from the hub", "hubs", hubs)
	a.id.Config.Hubs = hubs
	if a.cfg.StateDir == "" {
		return
	}
	b, err := json.MarshalIndent(a.id.Config, "", "  ")
	if err == nil {
		err = pki.WriteFileAtomic(filepath.Join(a.cfg.StateDir, configFile), b, 0o600)
	}
	if err != nil {
		a.log.Warn("hub addresses not kept in node.json; they are used until the agent restarts", "err", err)
	}
}
