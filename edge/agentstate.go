package edge

import (
	"fmt"
	"time"
)

// State is where the agent's connection to its hub stands. The agent moves
//
//	connecting -> handshaking -> connected -> backoff -> connecting ...
//	    |              |                        ^
//	    +--------------+------------------------+   (dial or handshake failed)
//
// and ends in refused (the hub refuses this identity for good),
// rejoin-needed (the certificate expired offline) or stopped (Run's context
// ended). Every change goes through Agent.setState. A connected agent on
// QUIC is hub-silent while its hub answers neither the keepalive nor the
// probes after it (nudge), connected again when the hub answers, and in
// backoff once the session ends at the dead-peer timeout.
type State int

// The agent's states.
const (
	StateConnecting   State = iota // dialing the hub's addresses
	StateHandshaking               // tunnel up: hello sent, waiting for the welcome
	StateConnected                 // welcomed: serving the hub's streams
	StateHubSilent                 // connected, but the hub has answered nothing past its keepalive
	StateBackoff                   // the last attempt failed or the session ended; waiting to retry
	StateRefused                   // the hub refused this identity; re-join needed
	StateRejoinNeeded              // the certificate expired while offline
	StateStopped                   // Run returned because its context ended
)

var stateNames = [...]string{
	StateConnecting:   "connecting",
	StateHandshaking:  "handshaking",
	StateConnected:    "connected",
	StateHubSilent:    "hub-silent",
	StateBackoff:      "backoff",
	StateRefused:      "refused",
	StateRejoinNeeded: "rejoin-needed",
	StateStopped:      "stopped",
}

func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// statusName is the state as status.json and `tether-edge status` have
// always named it: one attempt's steps before the welcome, and the wait
// between attempts, are all "connecting" there.
func (s State) statusName() string {
	switch s {
	case StateHandshaking, StateBackoff:
		return StateConnecting.String()
	}
	return s.String()
}

// terminal reports whether Run returns in this state.
func (s State) terminal() bool {
	return s == StateRefused || s == StateRejoinNeeded || s == StateStopped
}

// transition says what accompanies a change of state, for the status.
type transition struct {
	err       error  // why: for backoff, refused and rejoin-needed
	hub       string // the hub's address: for connected and hub-silent
	transport string // the tunnel's transport: for connected and hub-silent
	note      string // why that transport (Status.TransportWhy): for connected and hub-silent
	// since, if set, is when the new state began (the hub's silence began
	// before it was noticed); else now.
	since time.Time
}

// setState moves the agent to next and returns the state it left. It logs
// the change and, when the status `tether-edge status` shows changes (see
// statusName), updates it with t and writes it out. A terminal state is
// never left.
func (a *Agent) setState(next State, t transition) (prev State) {
	a.mu.Lock()
	prev = a.state
	if prev.terminal() {
		a.mu.Unlock()
		return prev
	}
	a.state = next
	now := time.Now().UTC()
	since := now
	if !t.since.IsZero() {
		since = t.since.UTC()
	}
	publish := false
	switch next {
	case StateConnected, StateHubSilent:
		a.status.Hub, a.status.Transport, a.status.TransportWhy, a.status.LastError = t.hub, t.transport, t.note, ""
		publish = true
		// Back from a silence the session is connected since it was
		// welcomed, not since the hub answered again.
		switch {
		case next == StateConnected && prev == StateHubSilent:
			since = a.status.connected
		case next == StateConnected:
			a.status.connected = since
		}
	case StateBackoff:
		a.status.Transport, a.status.TransportWhy, a.status.LastError = "", "", errString(t.err)
		publish = true
	case StateRefused, StateRejoinNeeded:
		a.status.Transport, a.status.TransportWhy, a.status.LastError = "", "", errString(t.err)
		publish = true
	case StateStopped:
		a.status.Transport, a.status.TransportWhy = "", ""
		publish = true
	}
	var st Status
	if publish {
		a.status.State, a.status.Since = next.statusName(), since
		st = a.status
	}
	a.mu.Unlock()

	if prev != next {
		a.log.Debug("agent state", "from", prev, "to", next)
	}
	if publish {
		a.publish(st)
	}
	return prev
}

// hubSilence moves a connected agent to hub-silent (silent: the hub has
// been silent since `since`), or a hub-silent one back to connected, with
// t as for connected; in any other state it does nothing (the session
// ended meanwhile).
func (a *Agent) hubSilence(silent bool, since time.Time, t transition) {
	from, to := StateConnected, StateHubSilent
	if !silent {
		from, to = to, from
	}
	a.mu.Lock()
	ok := a.state == from
	a.mu.Unlock()
	if ok {
		t.since = since
		a.setState(to, t)
	}
}

// updateStatus changes a field of the status that is not the state (the
// certificate's expiry after a renewal) and writes it out.
func (a *Agent) updateStatus(f func(*Status)) {
	a.mu.Lock()
	f(&a.status)
	st := a.status
	a.mu.Unlock()
	a.publish(st)
}

// publish writes st to the status file and hands it to Config.OnStatus.
func (a *Agent) publish(st Status) {
	if a.cfg.StateDir != "" {
		if err := writeStatus(a.cfg.StateDir, st); err != nil {
			a.log.Warn("write status file", "err", err)
		}
	}
	if a.cfg.OnStatus != nil {
		a.cfg.OnStatus(st)
	}
}

// State returns the agent's current state.
func (a *Agent) State() State {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
