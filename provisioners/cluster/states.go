package cluster

import (
	"errors"
	"fmt"
	"strings"
)

// State is where a node is in the cluster-agent state machine (inactive → registering →
// install_in_progress → active → deregistering → uninstall_in_progress). The string
// values are the cluster agent's names and are what the store persists.
type State string

const (
	StateInactive            State = "inactive"
	StateRegistering         State = "registering"
	StateInstallInProgress   State = "install_in_progress"
	StateActive              State = "active"
	StateDeregistering       State = "deregistering"
	StateUninstallInProgress State = "uninstall_in_progress"
)

// States lists every state in the order of the state machine's diagram (doc.go).
func States() []State {
	return []State{
		StateInactive, StateRegistering, StateInstallInProgress,
		StateActive, StateDeregistering, StateUninstallInProgress,
	}
}

// Valid reports whether s is one of the six states.
func (s State) Valid() bool {
	switch s {
	case StateInactive, StateRegistering, StateInstallInProgress,
		StateActive, StateDeregistering, StateUninstallInProgress:
		return true
	}
	return false
}

// Desired is what an operator asked for: the cluster agent's register (active) or deregister
// (inactive) carried by UpdateClusterStatusResponse.
type Desired string

const (
	DesiredActive   Desired = "active"
	DesiredInactive Desired = "inactive"
)

// Valid reports whether d is active or inactive.
func (d Desired) Valid() bool { return d == DesiredActive || d == DesiredInactive }

var (
	// ErrIllegalTransition: the state machine has no edge between the two states.
	ErrIllegalTransition = errors.New("illegal cluster state transition")
	// ErrUnknownState: a string is not one of the six states.
	ErrUnknownState = errors.New("unknown cluster state")
	// ErrUnknownDesired: a desired state is neither active nor inactive.
	ErrUnknownDesired = errors.New("unknown desired cluster state")
)

// Edge is one legal transition of the cluster-agent state machine.
type Edge struct {
	From, To State
	// Trigger is the cluster agent's name for what fires the edge, for logs and audit events.
	Trigger string
}

// edges is the one table of legal transitions: exactly the diagram in doc.go.
var edges = []Edge{
	{StateInactive, StateRegistering, "UpdateClusterStatusResponse(register)"},
	{StateInactive, StateDeregistering, "UpdateClusterStatusResponse(deregister)"},
	{StateRegistering, StateInstallInProgress, "RegisterClusterResponse(success)"},
	{StateInstallInProgress, StateActive, "installation command successful"},
	{StateInstallInProgress, StateInactive, "installation command failed"},
	{StateActive, StateDeregistering, "UpdateClusterStatusResponse(deregister)"},
	{StateDeregistering, StateUninstallInProgress, "uninstall command cached || RegisterClusterResponse(success)"},
	{StateUninstallInProgress, StateInactive, "uninstallation command successful || failed"},
}

// Edges returns the table of legal transitions, in the diagram's order.
func Edges() []Edge { return append([]Edge(nil), edges...) }

// Targets returns the states reachable from from in one legal transition.
func Targets(from State) []State {
	var out []State
	for _, e := range edges {
		if e.From == from {
			out = append(out, e.To)
		}
	}
	return out
}

// Trigger returns the cluster agent's trigger name for the edge from -> to, and false when
// there is no such edge.
func Trigger(from, to State) (string, bool) {
	for _, e := range edges {
		if e.From == from && e.To == to {
			return e.Trigger, true
		}
	}
	return "", false
}

// Transition checks that from -> to is an edge of the cluster-agent state machine. It returns
// an error wrapping ErrUnknownState for a state that is not one of the six, and
// ErrIllegalTransition (naming both states and the legal targets) for a missing edge,
// including from == to: staying in a state is not a transition and must not be
// persisted as one.
func Transition(from, to State) error {
	for _, s := range []State{from, to} {
		if !s.Valid() {
			return fmt.Errorf("cluster: transition %q -> %q: %w %q (one of %s)",
				from, to, ErrUnknownState, s, joinStates(States()))
		}
	}
	if _, ok := Trigger(from, to); ok {
		return nil
	}
	return fmt.Errorf("cluster: %w %s -> %s (legal from %s: %s)",
		ErrIllegalTransition, from, to, from, joinStates(Targets(from)))
}

// ParseState parses a persisted or user-supplied state name.
func ParseState(s string) (State, error) {
	st := State(s)
	if !st.Valid() {
		return "", fmt.Errorf("cluster: %w %q (want one of %s)", ErrUnknownState, s, joinStates(States()))
	}
	return st, nil
}

// ParseDesired parses a desired state: "active" or "inactive".
func ParseDesired(s string) (Desired, error) {
	d := Desired(s)
	if !d.Valid() {
		return "", fmt.Errorf("cluster: %w %q (want %s or %s)", ErrUnknownDesired, s, DesiredActive, DesiredInactive)
	}
	return d, nil
}

func joinStates(ss []State) string {
	if len(ss) == 0 {
		return "none"
	}
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ", ")
}

// Action is the work a controller does on a node in its current state before it
// moves the node on.
type Action string

const (
	// ActionNone: nothing to run; move straight to Step.Success (or stay, when the
	// step is Done).
	ActionNone Action = "none"
	// ActionRegister: accept the register request (the cluster agent's
	// UpdateClusterStatusResponse(register)): check that the node's engine resolves in
	// the catalog. On failure the node stays inactive and the controller reports the
	// error and retries later, so a node never sits in registering waiting for an engine
	// that does not exist (the state machine has no edge out of registering but forward).
	ActionRegister Action = "register"
	// ActionInstall: load the engine definition afresh, remember its uninstall.sh and
	// Digest with the node (the cluster agent's cache(uninstall_script)) and run install.sh.
	ActionInstall Action = "install"
	// ActionUninstall: run the uninstall.sh remembered at install, or the catalog's
	// current one when none was remembered.
	ActionUninstall Action = "uninstall"
)

// Outcome is how the action of a Step ended.
type Outcome int

const (
	Succeeded Outcome = iota
	Failed
)

func (o Outcome) String() string {
	if o == Failed {
		return "failed"
	}
	return "succeeded"
}

// OutcomeOf maps an action's error to its Outcome.
func OutcomeOf(err error) Outcome {
	if err != nil {
		return Failed
	}
	return Succeeded
}

// Step is one turn of the reconcile loop: the action to run in From and where the node
// goes afterwards.
type Step struct {
	From   State
	Action Action
	// Success is the next state when the action succeeds (or right away for ActionNone).
	Success State
	// Failure is the next state when the action fails. It equals From when the step is
	// retried in place (a failed register leaves the node inactive).
	Failure State
	// Deregister marks a step taken while the operator's deregister waits for an install
	// to end (the state machine has no edge that cancels one): whichever way the install
	// ends, the uninstall script cached at its start runs next. A successful install
	// goes on through active -> deregistering; a failed one lands in inactive and takes
	// inactive -> deregistering at once (see Path), so what it left behind is removed.
	Deregister bool
}

// Done reports whether the node has reached the desired state: no action and no move.
func (s Step) Done() bool { return s.Action == ActionNone && s.Success == s.From }

// Next returns the state after the step's action ended with o: the last state of
// Path(o), or From when the node stays (the controller then persists nothing but the
// error).
func (s Step) Next(o Outcome) State {
	if p := s.Path(o); len(p) > 0 {
		return p[len(p)-1]
	}
	return s.From
}

// Path returns the states the node passes through, in order, after the step's action
// ended with o: none when it stays in From, else one legal transition per state. A failed
// install with a deregister waiting passes through inactive to deregistering; the
// controller persists the last state in one write, so a crash between the two edges
// cannot drop the deregister (Decide leaves an inactive node alone while inactive is
// desired).
func (s Step) Path(o Outcome) []State {
	next := s.Success
	if o == Failed {
		next = s.Failure
	}
	switch {
	case next == s.From:
		return nil
	case s.Deregister && s.From == StateInstallInProgress && next == StateInactive:
		return []State{StateInactive, StateDeregistering}
	}
	return []State{next}
}

// Trigger returns the cluster agent's trigger of the last edge the step takes for
// outcome o, as the state machine's diagram labels it, or "" when the step stays in
// From. Reason says what happened.
func (s Step) Trigger(o Outcome) string {
	p := s.Path(o)
	if len(p) == 0 {
		return ""
	}
	from := s.From
	if len(p) > 1 {
		from = p[len(p)-2]
	}
	t, _ := Trigger(from, p[len(p)-1])
	return t
}

// Reason says what fired the edge from -> to of this step's Path(o): of the cluster
// agent's trigger, the alternative that happened, and whether an operator's deregister
// waits for the install. cached tells whether the node holds an uninstall script
// cached at install (else the engine catalog's current one runs). It returns "" for a
// pair that is not an edge.
func (s Step) Reason(from, to State, o Outcome, cached bool) string {
	const waits = "; the deregister requested during the install runs the cached uninstall next"
	switch {
	case from == StateInactive && to == StateRegistering:
		return "register requested (UpdateClusterStatusResponse(register))"
	case from == StateInactive && to == StateDeregistering && s.Deregister:
		return "deregister requested during the install, honoured now that it ended " +
			"(UpdateClusterStatusResponse(deregister))"
	case from == StateInactive && to == StateDeregistering, from == StateActive && to == StateDeregistering:
		return "deregister requested (UpdateClusterStatusResponse(deregister))"
	case from == StateRegistering && to == StateInstallInProgress && s.Deregister:
		return "registration accepted (RegisterClusterResponse(success)); " +
			"the deregister requested meanwhile waits for the install to end"
	case from == StateRegistering && to == StateInstallInProgress:
		return "registration accepted (RegisterClusterResponse(success))"
	case from == StateInstallInProgress && to == StateActive && s.Deregister:
		return "installation command successful" + waits
	case from == StateInstallInProgress && to == StateActive:
		return "installation command successful"
	case from == StateInstallInProgress && to == StateInactive && s.Deregister:
		return "installation command failed" + waits
	case from == StateInstallInProgress && to == StateInactive:
		return "installation command failed"
	case from == StateDeregistering && to == StateUninstallInProgress && cached:
		return "uninstall command cached at install"
	case from == StateDeregistering && to == StateUninstallInProgress:
		return "uninstall command from the engine catalog (RegisterClusterResponse(success)): " +
			"none was cached at install"
	case from == StateUninstallInProgress && to == StateInactive && o == Failed:
		return "uninstallation command failed"
	case from == StateUninstallInProgress && to == StateInactive:
		return "uninstallation command successful"
	}
	return ""
}

// MaxSteps bounds a reconcile pass: when every action succeeds, Decide reaches a Done
// step from any (state, desired) pair within MaxSteps steps (the longest path is a
// register arriving while deregistering: deregistering, uninstall_in_progress, inactive,
// registering, install_in_progress, active). A pass that takes more steps has gone round
// a failed install and should stop and back off.
const MaxSteps = 5

// Decide says what the reconcile loop does next for a node in current whose operator
// wants desired. The controller is:
//
//	for i := 0; i < MaxSteps; i++ {
//		step, err := Decide(cur, desired)      // load happened before the loop
//		if err != nil || step.Done() { break }
//		actErr := act(ctx, step.Action)       // none, register, install, uninstall
//		path := step.Path(OutcomeOf(actErr))  // usually one state, see Path
//		if len(path) == 0 { break }            // failed register: retry later
//		for each edge of cur, path...: if err := Transition(a, b); err != nil { break }
//		next := path[len(path)-1]
//		persist(next); cur = next
//	}
//
// Every state has a step whatever the desired state, so a hub that restarts resumes any
// persisted state; states in the middle of an install or uninstall finish it first,
// because the state machine has no edge that cancels one. A deregister is honoured in
// every state: one that arrives during an install runs the uninstall cached at the
// install's start once the install ended, whether it succeeded or failed.
func Decide(current State, desired Desired) (Step, error) {
	if !current.Valid() {
		return Step{}, fmt.Errorf("cluster: decide: %w %q (want one of %s)", ErrUnknownState, current, joinStates(States()))
	}
	if !desired.Valid() {
		return Step{}, fmt.Errorf(
			"cluster: decide: %w %q (want %s or %s)",
			ErrUnknownDesired, desired, DesiredActive, DesiredInactive,
		)
	}
	stay := Step{From: current, Action: ActionNone, Success: current, Failure: current}
	switch current {
	case StateInactive:
		if desired == DesiredInactive {
			// Converged. A deregister request on an inactive node moves it to
			// deregistering through Request; Decide never does, or the clean-up
			// would run forever.
			return stay, nil
		}
		// Cluster agent: inactive -> registering on UpdateClusterStatusResponse(register).
		// Also the retry after a failed install (install_in_progress -> inactive):
		// the controller spaces these retries.
		return Step{From: current, Action: ActionRegister, Success: StateRegistering, Failure: StateInactive}, nil
	case StateRegistering:
		// Cluster agent: registering -> install_in_progress on RegisterClusterResponse(success).
		// The hub is its own cluster manager and settled the registration on the way
		// in, so this edge fires at once; after a crash it just continues. There is no
		// edge back, so a deregister arriving now waits for the install.
		return Step{From: current, Action: ActionNone, Success: StateInstallInProgress, Failure: StateInstallInProgress,
			Deregister: desired == DesiredInactive}, nil
	case StateInstallInProgress:
		// Cluster agent: cache(uninstall_script), execute(install_script); -> active when the
		// installation command succeeds, -> inactive when it fails. After a crash the
		// install is re-run: scripts are idempotent. A deregister that arrived meanwhile
		// runs the cached uninstall when the install ends, either way (Step.Deregister).
		return Step{From: current, Action: ActionInstall, Success: StateActive, Failure: StateInactive,
			Deregister: desired == DesiredInactive}, nil
	case StateActive:
		if desired == DesiredActive {
			return stay, nil
		}
		// Cluster agent: active -> deregistering on UpdateClusterStatusResponse(deregister).
		return Step{From: current, Action: ActionNone, Success: StateDeregistering, Failure: StateDeregistering}, nil
	case StateDeregistering:
		// Cluster agent: deregistering -> uninstall_in_progress on "uninstall command cached ||
		// RegisterClusterResponse(success)": the hub always has the uninstall script at
		// hand (remembered at install, else the catalog's), so this fires at once and a
		// crash here just continues.
		return Step{
			From:    current,
			Action:  ActionNone,
			Success: StateUninstallInProgress,
			Failure: StateUninstallInProgress,
		}, nil
	default: // StateUninstallInProgress
		// Cluster agent: execute(uninstall_script); -> inactive whether it succeeded or failed.
		// After a crash the uninstall is re-run: scripts are idempotent.
		return Step{From: current, Action: ActionUninstall, Success: StateInactive, Failure: StateInactive}, nil
	}
}

// Request is an operator's register or deregister arriving (the cluster agent's
// UpdateClusterStatusResponse(new_state)). It returns the state to persist together
// with the new desired state. It is current in every case but one: deregister on an
// inactive node returns deregistering (the edge inactive -> deregistering), so the
// loop runs uninstall.sh once — cleaning up after a failed install or uninstall — and
// the node ends inactive again. On a node that never had an engine this costs one
// uninstall.sh run that finds nothing and exits 0. Every other change is left to
// Decide.
func Request(current State, desired Desired) (State, error) {
	if !current.Valid() {
		return "", fmt.Errorf("cluster: request: %w %q (want one of %s)", ErrUnknownState, current, joinStates(States()))
	}
	if !desired.Valid() {
		return "", fmt.Errorf(
			"cluster: request: %w %q (want %s or %s)",
			ErrUnknownDesired, desired, DesiredActive, DesiredInactive,
		)
	}
	if current == StateInactive && desired == DesiredInactive {
		return StateDeregistering, nil
	}
	return current, nil
}
