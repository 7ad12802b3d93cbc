// Reports of the embedded SSH server (refused logins, port forwardings,
// connections closed after a trust change) on their way to the hub's audit.

package edge

import (
	"context"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/tether-dev/tether/edge/sshserver"
	"github.com/tether-dev/tether/tunnel/control"
)

// maxQueuedSSHEvents bounds the reports waiting for a hub session; past it
// new ones are dropped (and logged): a client hammering the node must not
// grow the agent's memory.
const maxQueuedSSHEvents = 256

// maxEventDetail keeps an event's detail within control's notice bound.
const maxEventDetail = 1000

// sshEvents carries the embedded server's events to the connected hub.
type sshEvents struct {
	queue chan control.SSHEvent

	mu   sync.Mutex                   // guards send
	send func(*control.Message) error // the current hub session's, if it takes events
	// wake is signalled when send changes, so the sender retries.
	wake chan struct{}
}

func newSSHEvents() *sshEvents {
	return &sshEvents{queue: make(chan control.SSHEvent, maxQueuedSSHEvents), wake: make(chan struct{}, 1)}
}

// onEvent is the embedded server's Config.OnEvent: it never blocks.
func (a *Agent) onSSHEvent(e sshserver.Event) {
	d := e.Detail
	if len(d) > maxEventDetail {
		d = d[:maxEventDetail]
		for !utf8.ValidString(d) {
			d = d[:len(d)-1]
		}
	}
	ev := control.SSHEvent{Kind: string(e.Kind), Login: e.Login, Operator: e.Operator,
		KeyFingerprint: e.KeyFingerprint, Detail: d}
	select {
	case a.events.queue <- ev:
	default:
		a.log.Debug("ssh event dropped: too many waiting for a hub that takes them", "kind", e.Kind, "login", e.Login)
	}
}

// hubSession runs for each welcomed session: it learns the hub addresses
// the welcome announces (learnHubs), and records the session's send
// function while s is connected to a hub that takes ssh events (its
// welcome lists control.HubCapSSHEvents); the returned func clears it
// when the session ends.
func (a *Agent) hubSession(s *session, w *control.Welcome) (clear func()) {
	a.learnHubs(w)
	if a.sshd == nil || w == nil || !slices.Contains(w.Capabilities, control.HubCapSSHEvents) {
		return func() {}
	}
	set := func(f func(*control.Message) error) {
		a.events.mu.Lock()
		a.events.send = f
		a.events.mu.Unlock()
		select {
		case a.events.wake <- struct{}{}:
		default:
		}
	}
	set(s.send)
	return func() { set(nil) }
}

// sendSSHEvents sends queued events to the hub while one that takes them is
// connected, until ctx ends. Events wait while there is none; a send that
// fails drops the event (the session is ending; the node's log has it).
func (a *Agent) sendSSHEvents(ctx context.Context) {
	for {
		a.events.mu.Lock()
		send := a.events.send
		a.events.mu.Unlock()
		if send == nil {
			select {
			case <-ctx.Done():
				return
			case <-a.events.wake:
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-a.events.wake:
		case ev := <-a.events.queue:
			if err := send(&control.Message{Type: control.TypeSSHEvent, SSHEvent: &ev}); err != nil {
				a.log.Warn("ssh event not delivered to the hub", "kind", ev.Kind, "err", err)
			}
		}
	}
}
