package control

import (
	"slices"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// The node control protocol, on the first stream of a session (the agent
// opens it):
//
//	agent -> hub   hello      who it is, its facts and Capabilities
//	hub  -> agent  welcome    the node ID and the heartbeat interval
//	                          (or a fatal notice: this identity is refused)
//	then, until the session ends, in any order:
//	agent -> hub   heartbeat  every Liveness.Every, unless Liveness.Transport
//	hub  -> agent  heartbeat  every Liveness.Every, if the agent announced CapHeartbeat,
//	                          unless Liveness.Transport
//	agent -> hub   renew      a CSR for a fresh node certificate; the hub answers renewed
//	hub  -> agent  authorized_keys, ssh_trust  whenever access changes
//	hub  -> agent  notice     human-readable; Fatal ends the session for good
//	agent -> hub   ssh_event  audit reports of the embedded SSH server, only
//	                          if the welcome listed HubCapSSHEvents
//	agent -> hub   upgrade_state  the node's upgrade records (upgradeproto), only
//	                          if the welcome listed upgradeproto.HubCapUpgrades
//	hub  -> agent  service_bindings  the service tunnels the node consumes
//	                          (siteproto), if it announced siteproto.CapServiceConnect
//
// A site hub's session carries the site protocol besides (package siteproto).
//
// Each side treats a peer silent for Liveness.Deadline as gone. When the
// agent announced CapTransportLiveness and the welcome lists it too
// (Liveness.Transport), neither side heartbeats: the transport's keepalives
// carry liveness (the agent pings, the hub watches), and the transport
// closes a session whose peer fell silent (tunnel.Config.IdleTimeout).

// Capabilities an agent announces in Hello.
const (
	// CapTCP: the agent serves "tcp" streams to its allowed ports.
	CapTCP = "tcp"
	// CapHeartbeat: the agent takes heartbeats from the hub on the control
	// stream (the hub announces nothing: its first heartbeat arms the
	// agent's watchdog).
	CapHeartbeat = "heartbeat"
	// CapSSHEmbedded: "ssh" streams reach the agent's embedded SSH server.
	CapSSHEmbedded = "ssh-embedded"
	// CapSSHLocal: "ssh" streams reach the node's own sshd.
	CapSSHLocal = "ssh-local"
	// CapSSHLoginEvents: the embedded SSH server reports the outcome of
	// every connection's authentication (a login-accepted or login-refused
	// SSHEvent) to a hub that takes SSH events, so the hub can put a
	// refused login on the row of the jump that carried it.
	CapSSHLoginEvents = "ssh-login-events"
	// CapTransportLiveness: the agent keeps its session alive with the
	// transport's keepalives alone when the hub's welcome lists
	// HubCapTransportLiveness, and then sends no heartbeats.
	CapTransportLiveness = "transport-liveness"
	// CapResume: the agent (or site hub) keeps its streams with the hub
	// across a reconnect (tunnel/resume) when the welcome lists
	// HubCapResume: every stream the hub opens then carries a resume Open
	// frame after its header (and the agent's service connects too, with
	// CapResumeConnect), and after a reconnect the uplink re-attaches the
	// streams it still holds (tunnel.ServiceResume).
	CapResume = "resume-streams"
	// CapResumeConnect: with CapResume, the agent's service connects are
	// resumable too, when the welcome lists HubCapResumeConnect: each then
	// carries a resume Open frame after its header. Agents that announce
	// CapResume alone send none, and hubs that do not list
	// HubCapResumeConnect read none.
	CapResumeConnect = "resume-connects"
)

// HubCapResume in Welcome.Capabilities: the hub keeps the streams of an
// agent that announced CapResume across its reconnects, for its resume
// window (Welcome.ResumeWindow).
const HubCapResume = "resume-streams"

// HubCapResumeConnect in Welcome.Capabilities, beside HubCapResume: the hub
// keeps the service connects of an agent that announced CapResumeConnect
// too, and reads their Open frame.
const HubCapResumeConnect = "resume-connects"

// HubCapTransportLiveness in Welcome.Capabilities: the hub takes the
// transport's keepalives as the agent's liveness, from an agent that
// announced CapTransportLiveness, and then neither side heartbeats on the
// control stream. An idle session then costs the hub one keepalive and its
// answer per interval, handled inside the transport: no control-stream
// read, no answer to write, and on QUIC one packet each way instead of
// three.
const HubCapTransportLiveness = "transport-liveness"

// DefaultHeartbeat is the agent's heartbeat interval when a welcome names
// none.
const DefaultHeartbeat = 30 * time.Second

// Liveness says how often the peers of a session heartbeat on the control
// stream and how long a silent peer is given.
type Liveness struct {
	Every    time.Duration // heartbeat interval, whole seconds, at least one
	Deadline time.Duration // a peer silent this long is gone
	// Transport: the transport's keepalives carry liveness and nobody
	// heartbeats (CapTransportLiveness on both sides).
	Transport bool
	// HubIdle is the hub's dead-peer timeout: LivenessOf's own, or what the
	// welcome said (0: a hub of an earlier version did not say).
	HubIdle time.Duration
}

// AgentHeartbeats reports whether an agent whose transport keepalive goes
// out after pingAfter of silence (tunnel.Config.PingAfter) heartbeats on
// the control stream every l.Every. It always does without transport
// liveness. With it, the hub counts on hearing the agent within a quarter
// interval past l.Every, as an agent on the hub's own settings pings
// (the console calls a node silent for two intervals stale): an agent
// whose own keepalive setting is longer would look stale between its
// pings, so it heartbeats at the hub's interval instead, which the hub
// takes without answering. On the same settings, or longer ones at the
// hub, it sends none.
func (l Liveness) AgentHeartbeats(pingAfter time.Duration) bool {
	return !l.Transport || pingAfter > l.Every+l.Every/4
}

// maxLivenessSeconds bounds the intervals a welcome may name (a week), so
// that they convert to a time.Duration without overflow.
const maxLivenessSeconds = 7 * 24 * 3600

// LivenessOf is the hub's side of the rule (AgentLiveness the agent's). It
// derives the control-stream
// heartbeat from the tunnel's keepalive (c nil or a zero field: the tunnel
// defaults): a heartbeat every keepalive interval (whole seconds, at least
// one), and a node silent for half a heartbeat less than the IdleTimeout
// (the dead-peer timeout) is dead. Half a heartbeat less because both the
// watchdog and the transport's idle timeout count from the node's last
// word: when QUIC's idle timeout wins it ends the session silently, and an
// agent whose direction of a half-open link still works would never hear
// of it, waiting out its own watchdog instead.
//
// The transport's own idle timeout does not cover this on QUIC: an
// endpoint that still receives packets never times out, so a half-open link
// (one direction lost) would otherwise go unnoticed on one side. A whole
// IdleTimeout (three heartbeats by default) rather than less: a peer on a
// CPU-starved machine is late, not dead, and closing its session kills
// whatever runs through it.
func LivenessOf(c *tunnel.Config) Liveness {
	ka, idle := tunnel.DefaultKeepAliveInterval, idleTimeout(c)
	if c != nil && c.KeepAliveInterval > 0 {
		ka = c.KeepAliveInterval
	}
	every := max(time.Second, ka.Truncate(time.Second))
	return Liveness{Every: every, Deadline: DeadPeerAfter(idle, every), HubIdle: idle}
}

// Welcome is the hub's answer to a hello, announcing l's heartbeat
// interval and dead-peer timeout (rounded up to whole seconds).
func (l Liveness) Welcome(nodeID, name string) *Welcome {
	return &Welcome{NodeID: nodeID, Name: name, HeartbeatSeconds: int(l.Every / time.Second),
		DeadPeerSeconds: int((l.HubIdle + time.Second - 1) / time.Second)}
}

// AgentLiveness is the agent's side of the same rule: it heartbeats at the
// interval the hub's welcome names (DefaultHeartbeat if none), and gives a
// hub that heartbeats its own IdleTimeout (c as in LivenessOf), but at least
// two of the hub's intervals should the two sides be configured
// differently. Transport is set when the welcome lists
// HubCapTransportLiveness (an agent that reads it announced
// CapTransportLiveness), HubIdle to the welcome's dead-peer timeout.
func AgentLiveness(c *tunnel.Config, w *Welcome) Liveness {
	every := time.Duration(0)
	if w != nil {
		every = time.Duration(w.HeartbeatSeconds) * time.Second
	}
	l := Liveness{Every: every, Deadline: DeadPeerAfter(idleTimeout(c), every)}
	if l.Every <= 0 {
		l.Every = DefaultHeartbeat
	}
	if w != nil {
		l.Transport = slices.Contains(w.Capabilities, HubCapTransportLiveness)
		l.HubIdle = time.Duration(w.DeadPeerSeconds) * time.Second
	}
	return l
}

// DeadPeerAfter is how long a peer that heartbeats every `every` may be
// silent: half a heartbeat less than the dead-peer timeout idle (so the
// watchdog, not the transport's silent idle close, ends the session; see
// LivenessOf), but at least two heartbeats and two seconds.
func DeadPeerAfter(idle, every time.Duration) time.Duration {
	return max(idle-every/2, 2*every, 2*time.Second)
}

func idleTimeout(c *tunnel.Config) time.Duration {
	if c != nil && c.IdleTimeout > 0 {
		return c.IdleTimeout
	}
	return tunnel.DefaultIdleTimeout
}
