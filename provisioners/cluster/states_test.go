package cluster

import (
	"errors"
	"strings"
	"testing"
)

// legalEdges is the state machine's diagram (doc.go) written out independently of the package's table,
// so a typo in one of them fails the test.
var legalEdges = map[string]bool{
	"inactive->registering":                true,
	"inactive->deregistering":              true,
	"registering->install_in_progress":     true,
	"install_in_progress->active":          true,
	"install_in_progress->inactive":        true,
	"active->deregistering":                true,
	"deregistering->uninstall_in_progress": true,
	"uninstall_in_progress->inactive":      true,
}

func TestTransitionAllPairs(t *testing.T) {
	if n := len(States()); n != 6 {
		t.Fatalf("States() has %d states, the state machine has 6", n)
	}
	pairs := 0
	for _, from := range States() {
		for _, to := range States() {
			pairs++
			key := string(from) + "->" + string(to)
			t.Run(key, func(t *testing.T) {
				err := Transition(from, to)
				if legalEdges[key] {
					if err != nil {
						t.Fatalf("Transition(%s, %s) = %v, want legal", from, to, err)
					}
					if trig, ok := Trigger(from, to); !ok || trig == "" {
						t.Fatalf("legal edge %s has no cluster agent trigger", key)
					}
					return
				}
				if !errors.Is(err, ErrIllegalTransition) {
					t.Fatalf("Transition(%s, %s) = %v, want ErrIllegalTransition", from, to, err)
				}
				msg := err.Error()
				for _, want := range []string{string(from) + " -> " + string(to), "legal from " + string(from)} {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q does not contain %q", msg, want)
					}
				}
				for _, target := range Targets(from) {
					if !strings.Contains(msg, string(target)) {
						t.Errorf("error %q does not list legal target %s", msg, target)
					}
				}
				if _, ok := Trigger(from, to); ok {
					t.Errorf("illegal edge %s has a trigger", key)
				}
			})
		}
	}
	if pairs != 36 {
		t.Fatalf("checked %d pairs, want 36", pairs)
	}
	if got := len(Edges()); got != len(legalEdges) {
		t.Fatalf("Edges() has %d edges, the state machine has %d", got, len(legalEdges))
	}
}

func TestTransitionUnknownState(t *testing.T) {
	for _, tc := range []struct{ from, to State }{
		{"", StateActive},
		{StateActive, "Active"},
		{"installing", StateActive},
	} {
		err := Transition(tc.from, tc.to)
		if !errors.Is(err, ErrUnknownState) || errors.Is(err, ErrIllegalTransition) {
			t.Errorf("Transition(%q, %q) = %v, want ErrUnknownState", tc.from, tc.to, err)
		}
	}
}

func TestParseState(t *testing.T) {
	for _, s := range States() {
		got, err := ParseState(string(s))
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %q, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "Active", " active", "install-in-progress", "unknown"} {
		_, err := ParseState(bad)
		if !errors.Is(err, ErrUnknownState) {
			t.Errorf("ParseState(%q) = %v, want ErrUnknownState", bad, err)
			continue
		}
		if !strings.Contains(err.Error(), "uninstall_in_progress") {
			t.Errorf("ParseState(%q) error %q does not list the valid states", bad, err)
		}
	}
}

func TestParseDesired(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Desired
		ok   bool
	}{
		{"active", DesiredActive, true},
		{"inactive", DesiredInactive, true},
		{"", "", false},
		{"registering", "", false},
		{"ACTIVE", "", false},
	} {
		got, err := ParseDesired(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseDesired(%q) = %q, %v", tc.in, got, err)
		}
		if !tc.ok && !errors.Is(err, ErrUnknownDesired) {
			t.Errorf("ParseDesired(%q) error %v, want ErrUnknownDesired", tc.in, err)
		}
	}
}

func TestDecideEveryPair(t *testing.T) {
	const (
		a = DesiredActive
		i = DesiredInactive
	)
	for _, tc := range []struct {
		cur              State
		desired          Desired
		action           Action
		success, failure State
		done, dereg      bool
	}{
		{StateInactive, a, ActionRegister, StateRegistering, StateInactive, false, false},
		{StateInactive, i, ActionNone, StateInactive, StateInactive, true, false},
		// Crash in registering: continue to install whatever is desired.
		{StateRegistering, a, ActionNone, StateInstallInProgress, StateInstallInProgress, false, false},
		{StateRegistering, i, ActionNone, StateInstallInProgress, StateInstallInProgress, false, true},
		// Crash in install_in_progress: re-run install; a deregister waits for its end.
		{StateInstallInProgress, a, ActionInstall, StateActive, StateInactive, false, false},
		{StateInstallInProgress, i, ActionInstall, StateActive, StateInactive, false, true},
		{StateActive, a, ActionNone, StateActive, StateActive, true, false},
		{StateActive, i, ActionNone, StateDeregistering, StateDeregistering, false, false},
		// Crash in deregistering: continue to uninstall.
		{StateDeregistering, a, ActionNone, StateUninstallInProgress, StateUninstallInProgress, false, false},
		{StateDeregistering, i, ActionNone, StateUninstallInProgress, StateUninstallInProgress, false, false},
		// Crash in uninstall_in_progress: re-run uninstall; inactive either way.
		{StateUninstallInProgress, a, ActionUninstall, StateInactive, StateInactive, false, false},
		{StateUninstallInProgress, i, ActionUninstall, StateInactive, StateInactive, false, false},
	} {
		t.Run(string(tc.cur)+"/"+string(tc.desired), func(t *testing.T) {
			step, err := Decide(tc.cur, tc.desired)
			if err != nil {
				t.Fatal(err)
			}
			want := Step{From: tc.cur, Action: tc.action, Success: tc.success, Failure: tc.failure, Deregister: tc.dereg}
			if step != want {
				t.Fatalf("Decide = %+v, want %+v", step, want)
			}
			if step.Done() != tc.done {
				t.Fatalf("Done() = %v, want %v", step.Done(), tc.done)
			}
			// Every move a step makes is a path of legal edges, each with a cluster agent
			// trigger and a reason; staying put is never presented as a transition.
			for _, o := range []Outcome{Succeeded, Failed} {
				path := step.Path(o)
				if len(path) == 0 {
					if step.Next(o) != step.From || step.Trigger(o) != "" {
						t.Errorf("outcome %s stays in %s but moves to %s with trigger %q", o, step.From, step.Next(o), step.Trigger(o))
					}
					continue
				}
				if step.Next(o) != path[len(path)-1] {
					t.Errorf("outcome %s: Next %s, path %v", o, step.Next(o), path)
				}
				from := step.From
				for _, to := range path {
					if err := Transition(from, to); err != nil {
						t.Errorf("outcome %s: %v", o, err)
					}
					if step.Reason(from, to, o, true) == "" || step.Reason(from, to, o, false) == "" {
						t.Errorf("outcome %s: no reason for %s -> %s", o, from, to)
					}
					from = to
				}
				if step.Trigger(o) == "" {
					t.Errorf("outcome %s: no trigger for %s -> %v", o, step.From, path)
				}
			}
		})
	}
}

func TestDecideRejectsUnknown(t *testing.T) {
	if _, err := Decide("bogus", DesiredActive); !errors.Is(err, ErrUnknownState) {
		t.Errorf("Decide(bogus) = %v, want ErrUnknownState", err)
	}
	if _, err := Decide(StateActive, "on"); !errors.Is(err, ErrUnknownDesired) {
		t.Errorf("Decide(active, on) = %v, want ErrUnknownDesired", err)
	}
	if _, err := Request("bogus", DesiredActive); !errors.Is(err, ErrUnknownState) {
		t.Errorf("Request(bogus) = %v, want ErrUnknownState", err)
	}
	if _, err := Request(StateActive, ""); !errors.Is(err, ErrUnknownDesired) {
		t.Errorf("Request(active, \"\") = %v, want ErrUnknownDesired", err)
	}
}

// reconcile is the controller loop of the Decide doc comment, with act standing in for
// the SSH work. It returns the final state, the actions run and whether it converged.
func reconcile(t *testing.T, cur State, desired Desired, act func(Action) Outcome) (State, []Action, bool) {
	t.Helper()
	var ran []Action
	for range MaxSteps + 1 {
		step, err := Decide(cur, desired)
		if err != nil {
			t.Fatal(err)
		}
		if step.Done() {
			return cur, ran, true
		}
		o := Succeeded
		if step.Action != ActionNone {
			ran = append(ran, step.Action)
			o = act(step.Action)
		}
		path := step.Path(o)
		if len(path) == 0 {
			return cur, ran, false
		}
		for _, next := range path {
			if err := Transition(cur, next); err != nil {
				t.Fatalf("step %+v: %v", step, err)
			}
			cur = next
		}
	}
	return cur, ran, false
}

func TestReconcileConvergesWithinMaxSteps(t *testing.T) {
	longest := 0
	for _, cur := range States() {
		for _, desired := range []Desired{DesiredActive, DesiredInactive} {
			final, _, ok := reconcile(t, cur, desired, func(Action) Outcome { return Succeeded })
			// Count transitions, not just actions (bounded: a broken table must not hang).
			n := 0
			for s := cur; n <= 2*MaxSteps; n++ {
				step, _ := Decide(s, desired)
				if step.Done() {
					break
				}
				s = step.Next(Succeeded)
			}
			if !ok || n > MaxSteps {
				t.Errorf("%s/%s: converged=%v after %d steps (MaxSteps %d)", cur, desired, ok, n, MaxSteps)
			}
			want := StateInactive
			if desired == DesiredActive {
				want = StateActive
			}
			if final != want {
				t.Errorf("%s/%s: ended in %s, want %s", cur, desired, final, want)
			}
			longest = max(longest, n)
		}
	}
	if longest != MaxSteps {
		t.Errorf("longest path is %d steps, MaxSteps is %d: keep the bound tight", longest, MaxSteps)
	}
}

func TestReconcileFailures(t *testing.T) {
	t.Run("install fails", func(t *testing.T) {
		final, ran, ok := reconcile(t, StateInactive, DesiredActive, func(a Action) Outcome {
			if a == ActionInstall {
				return Failed
			}
			return Succeeded
		})
		// The pass goes round: register, install (fails -> inactive), register, ...
		// and must not converge; the controller backs off.
		if ok {
			t.Fatalf("converged in %s with a failing install", final)
		}
		if len(ran) < 2 || ran[0] != ActionRegister || ran[1] != ActionInstall {
			t.Fatalf("actions %v, want register then install first", ran)
		}
	})
	t.Run("register fails", func(t *testing.T) {
		final, ran, ok := reconcile(t, StateInactive, DesiredActive, func(Action) Outcome { return Failed })
		if ok || final != StateInactive || len(ran) != 1 || ran[0] != ActionRegister {
			t.Fatalf("final %s, actions %v, converged %v; want inactive after one failed register", final, ran, ok)
		}
	})
	t.Run("uninstall fails", func(t *testing.T) {
		final, ran, ok := reconcile(t, StateActive, DesiredInactive, func(Action) Outcome { return Failed })
		if !ok || final != StateInactive || len(ran) != 1 || ran[0] != ActionUninstall {
			t.Fatalf("final %s, actions %v, converged %v; want inactive after one uninstall", final, ran, ok)
		}
	})
	// A deregister during an install is honoured when the install ends, whichever way:
	// the cached uninstall runs after it, and the node ends inactive.
	for _, tc := range []struct {
		from    State
		install Outcome
	}{
		{StateRegistering, Succeeded}, {StateRegistering, Failed},
		{StateInstallInProgress, Succeeded}, {StateInstallInProgress, Failed},
	} {
		t.Run("deregister in "+string(tc.from)+", install "+tc.install.String(), func(t *testing.T) {
			final, ran, ok := reconcile(t, tc.from, DesiredInactive, func(a Action) Outcome {
				if a == ActionInstall {
					return tc.install
				}
				return Succeeded
			})
			if !ok || final != StateInactive || len(ran) != 2 || ran[0] != ActionInstall || ran[1] != ActionUninstall {
				t.Fatalf("final %s, actions %v, converged %v; want install then uninstall, inactive", final, ran, ok)
			}
		})
	}
}

// Reasons say what happened: one alternative of the diagram's label, the one that
// fired, never the label itself; and that a deregister waits for the install.
func TestReasonsSayWhatHappened(t *testing.T) {
	uninstall, _ := Decide(StateUninstallInProgress, DesiredInactive)
	install, _ := Decide(StateInstallInProgress, DesiredInactive)
	deregistering, _ := Decide(StateDeregistering, DesiredInactive)
	for _, tc := range []struct {
		name      string
		step      Step
		from, to  State
		o         Outcome
		cached    bool
		want, not string
	}{
		{"uninstall ok", uninstall, StateUninstallInProgress, StateInactive, Succeeded, true,
			"uninstallation command successful", "failed"},
		{"uninstall failed", uninstall, StateUninstallInProgress, StateInactive, Failed, true,
			"uninstallation command failed", "successful"},
		{"cached", deregistering, StateDeregistering, StateUninstallInProgress, Succeeded, true,
			"uninstall command cached", "RegisterClusterResponse"},
		{"not cached", deregistering, StateDeregistering, StateUninstallInProgress, Succeeded, false,
			"engine catalog", "uninstall command cached"},
		{"install ok, deregister waits", install, StateInstallInProgress, StateActive, Succeeded, true,
			"deregister requested during the install", "failed"},
		{"install failed, deregister waits", install, StateInstallInProgress, StateInactive, Failed, true,
			"installation command failed; the deregister", "successful"},
		{"deregister honoured", install, StateInactive, StateDeregistering, Failed, true,
			"deregister requested during the install, honoured", "||"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.step.Reason(tc.from, tc.to, tc.o, tc.cached)
			if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) || strings.Contains(got, "||") {
				t.Fatalf("Reason = %q, want %q and neither %q nor a diagram label", got, tc.want, tc.not)
			}
		})
	}
	if got := uninstall.Reason(StateActive, StateInactive, Succeeded, true); got != "" {
		t.Fatalf("Reason of a non-edge = %q, want \"\"", got)
	}
}

func TestRequestEveryPair(t *testing.T) {
	for _, cur := range States() {
		for _, desired := range []Desired{DesiredActive, DesiredInactive} {
			got, err := Request(cur, desired)
			if err != nil {
				t.Fatal(err)
			}
			want := cur
			if cur == StateInactive && desired == DesiredInactive {
				want = StateDeregistering
			}
			if got != want {
				t.Errorf("Request(%s, %s) = %s, want %s", cur, desired, got, want)
			}
			if got != cur {
				if err := Transition(cur, got); err != nil {
					t.Errorf("Request(%s, %s): %v", cur, desired, err)
				}
			}
		}
	}
}

// A deregister on an inactive node (say after a failed install) runs uninstall once
// and stays inactive; a second pass does nothing.
func TestDeregisterInactiveRunsUninstallOnce(t *testing.T) {
	cur, err := Request(StateInactive, DesiredInactive)
	if err != nil {
		t.Fatal(err)
	}
	final, ran, ok := reconcile(t, cur, DesiredInactive, func(Action) Outcome { return Succeeded })
	if !ok || final != StateInactive || len(ran) != 1 || ran[0] != ActionUninstall {
		t.Fatalf("final %s, actions %v, converged %v; want one uninstall then inactive", final, ran, ok)
	}
	final, ran, ok = reconcile(t, final, DesiredInactive, func(Action) Outcome { return Succeeded })
	if !ok || final != StateInactive || len(ran) != 0 {
		t.Fatalf("second pass: final %s, actions %v; want nothing", final, ran)
	}
}

func TestOutcomeOf(t *testing.T) {
	if OutcomeOf(nil) != Succeeded || OutcomeOf(errors.New("x")) != Failed {
		t.Fatal("OutcomeOf maps errors wrongly")
	}
	if Succeeded.String() != "succeeded" || Failed.String() != "failed" {
		t.Fatal("Outcome.String")
	}
}
