package edge

import (
	"errors"
	"log/slog"
	"testing"
	"time"
)

func TestStateNames(t *testing.T) {
	for s, want := range map[State]string{
		StateConnecting: "connecting", StateHandshaking: "handshaking", StateConnected: "connected",
		StateHubSilent: "hub-silent", StateBackoff: "backoff", StateRefused: "refused", StateRejoinNeeded: "rejoin-needed",
		StateStopped: "stopped",
		State(99):    "State(99)",
	} {
		if s.String() != want {
			t.Errorf("State(%d).String() = %q, want %q", int(s), s.String(), want)
		}
	}
}

// The states status.json has always shown stay as they were: the steps of
// one attempt and the wait between attempts are "connecting".
func TestSetStateStatus(t *testing.T) {
	dir := t.TempDir()
	var seen []Status
	a := &Agent{
		cfg:   Config{StateDir: dir, OnStatus: func(st Status) { seen = append(seen, st) }},
		log:   slog.New(slog.DiscardHandler),
		state: StateConnecting,
	}
	lost := errors.New("hub closed the control stream")
	for i, step := range []struct {
		next      State
		t         transition
		prev      State
		published string // status state written, "" for none
		lastError string
		transport string
	}{
		{StateHandshaking, transition{}, StateConnecting, "", "", ""},
		{StateConnected, transition{hub: "hub:7443", transport: "quic"}, StateHandshaking, "connected", "", "quic"},
		{StateBackoff, transition{err: lost}, StateConnected, "connecting", lost.Error(), ""},
		{StateConnecting, transition{}, StateBackoff, "", "", ""},
		{StateHandshaking, transition{}, StateConnecting, "", "", ""},
		{StateConnected, transition{hub: "hub:7443", transport: "tcp"}, StateHandshaking, "connected", "", "tcp"},
		// Refused in the middle of a session (revoked): no longer connected over anything.
		{StateRefused, transition{err: ErrRefused}, StateConnected, "refused", ErrRefused.Error(), ""},
		{StateConnecting, transition{}, StateRefused, "", "", ""}, // a terminal state is never left
	} {
		n := len(seen)
		if prev := a.setState(step.next, step.t); prev != step.prev {
			t.Errorf("step %d: setState(%s) returned %s, want %s", i, step.next, prev, step.prev)
		}
		if step.published == "" {
			if len(seen) != n {
				t.Errorf("step %d: setState(%s) published %+v", i, step.next, seen[n:])
			}
			continue
		}
		if len(seen) != n+1 {
			t.Fatalf("step %d: setState(%s) published %d statuses, want 1", i, step.next, len(seen)-n)
		}
		st := seen[n]
		if st.State != step.published || st.LastError != step.lastError || st.Transport != step.transport {
			t.Errorf("step %d: status %+v, want state %q, last error %q, transport %q", i, st, step.published,
				step.lastError, step.transport)
		}
		file, err := ReadStatus(dir)
		if err != nil || file.State != st.State || !file.Since.Equal(st.Since) {
			t.Errorf("step %d: status file %+v (%v), want %+v", i, file, err, st)
		}
	}
	if a.State() != StateRefused {
		t.Errorf("final state %s, want refused", a.State())
	}
}

// TestHubSilence: only a connected agent goes hub-silent, and only a
// hub-silent one goes back: a silence noticed as its session ended leaves
// the backoff alone.
func TestHubSilence(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), state: StateHandshaking}
	quic := transition{hub: "hub:7443", transport: "quic"}
	a.hubSilence(true, time.Now(), quic)
	if a.State() != StateHandshaking {
		t.Fatalf("hub-silent while handshaking: %s", a.State())
	}
	a.setState(StateConnected, quic)
	a.hubSilence(false, time.Time{}, quic) // not silent: nothing to end
	if a.State() != StateConnected {
		t.Fatalf("state %s, want connected", a.State())
	}
	a.hubSilence(true, time.Now().Add(-time.Minute), quic)
	if a.State() != StateHubSilent || a.status.State != "hub-silent" || a.status.Transport != "quic" {
		t.Fatalf("state %s, status %+v; want hub-silent over quic", a.State(), a.status)
	}
	a.setState(StateBackoff, transition{err: errors.New("nothing heard from the peer for 50s")})
	a.hubSilence(false, time.Time{}, quic)
	if a.State() != StateBackoff || a.status.State != "connecting" {
		t.Fatalf("state %s, status %q after the session ended; want backoff, connecting", a.State(), a.status.State)
	}
}
