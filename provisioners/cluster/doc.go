// Package cluster holds the pure parts of Tether's cluster provisioning: the
// install/uninstall state machine of the Edge Node Cluster Agent (the cluster-agent state
// machine: inactive → registering → install_in_progress → active → deregistering →
// uninstall_in_progress) and the
// Kubernetes engine definitions the hub runs on nodes. It does no I/O on nodes; the hub's
// controller loads a node's state, asks this package what to do, does it over SSH,
// validates the move with Transition and persists the new state.
//
// # States
//
// In the Edge Node Cluster Agent the state machine runs inside an agent on the node and the Edge Cluster
// Manager sends it triggers. In Tether the hub is both: the state machine lives in the hub,
// one per node, and the hub drives the node over SSH. A node is in exactly one of:
//
//	inactive               no engine installed (or a failed install/uninstall left one behind)
//	registering            the hub accepted a register request for the node
//	install_in_progress    the engine's install.sh is running (or must be re-run)
//	active                 install.sh succeeded
//	deregistering          the hub accepted a deregister request for the node
//	uninstall_in_progress  the engine's uninstall.sh is running (or must be re-run)
//
// The only legal transitions are these, each named after the cluster agent's trigger:
//
//	inactive              -> registering            UpdateClusterStatusResponse(register)
//	inactive              -> deregistering          UpdateClusterStatusResponse(deregister)
//	registering           -> install_in_progress    RegisterClusterResponse(success)
//	install_in_progress   -> active                 installation command successful
//	install_in_progress   -> inactive               installation command failed
//	active                -> deregistering          UpdateClusterStatusResponse(deregister)
//	deregistering         -> uninstall_in_progress  uninstall command cached || RegisterClusterResponse(success)
//	uninstall_in_progress -> inactive               uninstallation command successful || failed
//
// Each node also has a desired state, active (register) or inactive (deregister). The
// controller is a loop of "load, Decide, act, Transition, persist": Decide(current,
// desired) returns a Step naming the Action to run in the current state (none, register,
// install or uninstall) and the state to move to when it succeeds or fails. Because the
// state is persisted before the action that belongs to it runs, a hub that crashes
// resumes every state by re-running that state's step: registering continues to
// install_in_progress, install_in_progress re-runs install.sh, deregistering continues to
// uninstall_in_progress and uninstall_in_progress re-runs uninstall.sh. Engine scripts
// must therefore be idempotent.
//
// The state machine has no edges that cancel an install or uninstall under way: a deregister
// that arrives while a node is registering or installing is honoured once the install
// has ended, whichever way, with the uninstall script cached at the install's start: a
// successful install goes on through active -> deregistering; a failed one, which may
// have left half an engine, through inactive -> deregistering at once (Step.Path), in
// one write, so a crash cannot drop the deregister. A register that arrives while a node
// is deregistering is honoured once the uninstall has finished (inactive -> registering).
// The desired state is the operator's alone: the controller records its progress
// without ever writing it, so a request made during a step survives the step's end.
//
// Audit events and logs give each transition's reason (Step.Reason): of the trigger's
// alternatives the one that happened ("uninstallation command failed", not the diagram's
// "successful || failed"), and whether a deregister waits for the install.
//
// A deregister request for a node that is already inactive (for example after a failed
// install, which may have left half an engine behind) uses the state machine's inactive ->
// deregistering edge: Request moves the node to deregistering, the loop runs
// uninstall.sh once and the node ends inactive again. Decide never leaves inactive on its
// own while the desired state is inactive, so the clean-up runs once per request, not in
// a loop.
//
// # Engines
//
// An engine is a directory named after the engine (a DNS label: lowercase letters,
// digits and inner dashes, at most 63 characters) holding:
//
//	install.sh     required; installs the engine; idempotent (exits 0 early if the
//	               engine is already installed and running)
//	uninstall.sh   required; removes the engine; idempotent (exits 0 when nothing is
//	               installed)
//	engine.yaml    optional:
//	                 description: one line shown to operators
//	                 timeout: 30m        # Go duration for each script run, 1s..24h, default 30m
//	                 env:                # environment for both scripts
//	                   INSTALL_K3S_VERSION: v1.31.4+k3s1
//
// Scripts must be non-empty, at most 1 MiB and start with "#!". Unknown engine.yaml
// fields are an error. Other files in the directory are ignored.
//
// Tether ships two built-in engines, k3s and rke2, that install through the vendors'
// official installers (get.k3s.io, get.rke2.io). LoadEngines(dir) returns the built-ins
// plus every subdirectory of dir; a directory with a built-in's name replaces the
// built-in. Names starting with "." and plain files in dir are skipped. A broken engine
// directory makes only that engine unusable (Catalog.Get returns its error, Catalog.Err
// lists all), never the built-in of the same name in its stead. The controller
// reloads the catalog at each install, so edits in dir are seen without a restart; an
// Engine's Digest changes whenever its scripts or env change.
package cluster
