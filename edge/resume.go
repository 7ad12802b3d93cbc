package edge

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// The agent's streams outlive its session when the hub keeps them too
// (control.HubCapResume): the hub's streams and the service connects the
// agent opens are held by the shared uplink client (uplink.Held), which
// keeps the local side (the connection to sshd or to an allowed port, the
// embedded server's session, a consumer's connection) while the link is
// down and re-attaches every held stream once the agent is welcomed again.

// resumeAgentBudget bounds the bytes the agent keeps unacknowledged for all
// its streams together: what a node's output can have in flight towards a
// hub it cannot reach, before its writes wait.
const resumeAgentBudget = 64 << 20

func newHeld() *uplink.Held { return uplink.NewHeld(resumeAgentBudget) }

// keep is the configuration of the streams of a session welcomed with w:
// resumable if the hub keeps them (HubCapResume), for the window it names;
// nil if not.
func (a *Agent) keep(w *control.Welcome, log *slog.Logger) *resume.Config {
	return a.held.Keep(w, func(down time.Duration) string {
		return fmt.Sprintf("the link to the hub was down for %s; session ended", down.Round(time.Second))
	}, log)
}

// resumeInstance names this process's held streams for the hello ("" for
// an Agent made without New, which holds none).
func (a *Agent) resumeInstance() string {
	if a.held == nil {
		return ""
	}
	return a.held.Instance()
}
