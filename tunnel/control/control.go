// Package control is the node control protocol: the messages of a
// session's control stream (the first stream the agent opens after
// connecting), their order (see session.go), the capabilities an agent
// announces, the liveness rule both sides apply, and the join request that
// enrols a node. The agent (and a site hub on its uplink) sends hello,
// heartbeats and renewals; the hub answers with welcome, trust, notices and
// renewed certificates. The hub and the agent both import it, and it imports
// nothing of either.
//
// Message is the envelope of every frame on that stream, so it also carries
// the bodies of two other contracts, each in its own package: the site
// protocol (siteproto: a site hub and its parent) and a node's upgrade
// reports (upgradeproto). Read validates those bodies with their own rules.
//
// Wire layout of one control frame:
//
//	| length uint32 BE (1..MaxFrame) | JSON object of that many bytes |
//
// JSON keeps the control plane easy to evolve and debug; it carries a few
// small messages per minute, so its cost does not matter. Every decoded
// message is validated before it is returned.
package control

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path"
	"slices"
	"strings"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// MaxFrame bounds one control message (the largest is a node's authorized key list).
const MaxFrame = 1 << 20

// ProtocolVersion is sent in Hello; the hub refuses versions it does not know.
const ProtocolVersion = 1

// ErrBadMessage wraps every decoding or validation failure, of the control
// messages and of the bodies of other contracts they carry.
var ErrBadMessage = wirecheck.ErrBadMessage

// Type names a control message.
type Type string

// Message types.
const (
	TypeHello          Type = "hello"           // agent -> hub, first message
	TypeWelcome        Type = "welcome"         // hub -> agent, answer to hello
	TypeHeartbeat      Type = "heartbeat"       // agent -> hub, updates last seen
	TypeAuthorizedKeys Type = "authorized_keys" // hub -> agent, keys the embedded SSH server accepts
	TypeNotice         Type = "notice"          // hub -> agent, human-readable (e.g. why the session ends)
	TypeSSHTrust       Type = "ssh_trust"       // hub -> agent, host certificate and user CAs for the node's SSH server
	TypeRenew          Type = "renew"           // agent -> hub, CSR (same key) for a fresh node certificate
	TypeRenewed        Type = "renewed"         // hub -> agent, the new certificate chain (PEM)
	// TypeSSHEvent (agent -> hub) reports something the node's embedded SSH
	// server did that the hub audits: a refused login, a port forwarding.
	// An agent sends it only to a hub whose welcome lists HubCapSSHEvents:
	// older hubs end the session on a message type they do not know.
	TypeSSHEvent Type = "ssh_event"
)

// HubCapSSHEvents in Welcome.Capabilities: the hub takes TypeSSHEvent.
const HubCapSSHEvents = "ssh-events"

// SSHEvent is one TypeSSHEvent report. The hub trusts it as far as the
// node goes: it is the node's word, audited as such.
type SSHEvent struct {
	// Kind is what happened: "login-refused" (a key the node knows asked for
	// a login its roles do not grant), "forward", "forward-refused",
	// "access-revoked" (a live connection closed after a trust change);
	// from an agent announcing CapSSHLoginEvents also "login-accepted" and
	// "login-failed" (every connection's outcome, which the hub puts on the
	// jump's row rather than auditing on its own).
	Kind string `json:"kind"`
	// Login is the login asked for; Operator whose key it was, if the
	// node knows (the authorized key's comment, a certificate's key id).
	Login    string `json:"login,omitempty"`
	Operator string `json:"operator,omitempty"`
	// KeyFingerprint is the key's SHA256 fingerprint (of a certificate's
	// key for a certificate).
	KeyFingerprint string `json:"key_fingerprint,omitempty"`
	// Detail is human-readable: the reason given, the forwarded address.
	Detail string `json:"detail,omitempty"`
}

// Facts describe the machine an agent runs on.
type Facts struct {
	Hostname  string `json:"hostname"`
	OS        string `json:"os"` // PRETTY_NAME from /etc/os-release
	OSID      string `json:"os_id,omitempty"`
	OSVersion string `json:"os_version,omitempty"`
	Arch      string `json:"arch"`
	MachineID string `json:"machine_id,omitempty"`
	// The management interface: the one the default route leaves by
	// (IPv4 first, then IPv6). Address is its first global unicast address
	// without a prefix length; empty when there is no default route.
	Interface string `json:"interface,omitempty"`
	Address   string `json:"address,omitempty"`
	MAC       string `json:"mac,omitempty"`
}

// Hello is the agent's introduction on a new session.
type Hello struct {
	ProtocolVersion int      `json:"protocol_version"`
	Name            string   `json:"name"`
	AgentVersion    string   `json:"agent_version"`
	Facts           Facts    `json:"facts"`
	Capabilities    []string `json:"capabilities,omitempty"` // the Cap* constants; unknown ones are ignored
	// HostKey is the node SSH server's public host key (authorized_keys
	// format), which the hub certifies with its host CA; empty if unknown.
	HostKey string `json:"host_key,omitempty"`
	// StateDir is the agent's state directory (absolute), where the hub
	// caches files such as a cluster engine's uninstall script.
	StateDir string `json:"state_dir,omitempty"`
	// Labels are what the node says about itself (its labels file). The
	// hub checks them against its label rules, shows them apart from the
	// labels it sets, and never selects a node by them.
	Labels map[string]string `json:"labels,omitempty"`
	// Upgrade says how the hub runs the node-side updater (with
	// upgradeproto.CapUpgrade); nil from an agent without one.
	Upgrade *upgradeproto.Support `json:"upgrade,omitempty"`
	// Site is set by a site hub (with siteproto.CapSite).
	Site *siteproto.Hello `json:"site,omitempty"`
	// MovedFrom is set when this session replaces a live one of the same
	// agent on another transport ("tcp": the agent fell back to TCP and
	// its QUIC re-probe got through). The hub then lets the old session
	// drain (no new streams; the agent closes it once its live streams
	// end) instead of closing it.
	MovedFrom string `json:"moved_from,omitempty"`
	// TransportWhy says why the session is on its transport when that is
	// worth showing ("udp blocked, re-probing", "moved from tcp 12:03"):
	// the hub shows it beside the transport in `tether nodes`.
	TransportWhy string `json:"transport_why,omitempty"`
	// ResumeInstance names the uplink process's held streams (with
	// CapResume): 32 hex digits, new at every start. A hub that kept the
	// node's streams for another instance ends them at once, since the
	// process that held their other side is gone ("" from an older agent:
	// they wait out the window).
	ResumeInstance string `json:"resume_instance,omitempty"`
}

// SSHTrust tells the node's SSH server what to present and whom to trust.
type SSHTrust struct {
	HostCert string   `json:"host_cert,omitempty"` // certificate for Hello.HostKey, authorized_keys format
	UserCAs  []string `json:"user_cas"`            // user CA public keys (several during a rotation overlap)
	// RevokedKeys are operator keys the node's sshd must refuse (removed
	// operators), with or without a certificate.
	RevokedKeys []string `json:"revoked_keys,omitempty"`
	// Principals maps a login to the user-certificate principals that may
	// use it on this node ("tether:ROLE:LOGIN" for each role selecting it);
	// AnyLogin lists principals valid for every login (roles allowing "*",
	// honoured by the embedded server only).
	Principals map[string][]string `json:"principals,omitempty"`
	AnyLogin   []string            `json:"any_login,omitempty"`
	// NoForwarding lists the principals (of Principals and AnyLogin) whose
	// role does not allow port forwarding; a certificate login through
	// any other principal may forward. Empty, as from a hub that predates
	// the field, allows forwarding everywhere: the documented default for
	// roles. Plain keys carry the same as the no-port-forwarding option of
	// their authorized_keys line.
	NoForwarding []string `json:"no_forwarding,omitempty"`
	// ScopedUserCAs are the user CAs of hubs above this node's site hub:
	// each is trusted ONLY for the principals listed with it (what that
	// hub's roles grant on this node), never through UserCAs, Principals
	// or AnyLogin, so a principal an ancestor did not grant here (or one of
	// this site's own roles) does nothing with an ancestor's certificate.
	ScopedUserCAs []ScopedUserCA `json:"scoped_user_cas,omitempty"`
}

// ScopedUserCA is one ancestor hub's user CA with what its certificates
// may do on the node.
type ScopedUserCA struct {
	// Keys are the CA's public keys (authorized_keys format; several during
	// a rotation overlap).
	Keys []string `json:"keys"`
	// Principals maps a login to the principals of this CA's certificates
	// that may use it; AnyLogin lists principals valid for every login
	// (embedded server only, as SSHTrust.AnyLogin).
	Principals map[string][]string `json:"principals,omitempty"`
	AnyLogin   []string            `json:"any_login,omitempty"`
	// NoForwarding lists the principals (of Principals and AnyLogin) whose
	// role does not allow port forwarding.
	NoForwarding []string `json:"no_forwarding,omitempty"`
}

// maxScopedCAs bounds SSHTrust.ScopedUserCAs: one per hub above a site.
const maxScopedCAs = 8

func (s *ScopedUserCA) validate() error {
	if len(s.Keys) == 0 || len(s.Keys) > wirecheck.MaxCaps {
		return fmt.Errorf("%w: scoped user CA with %d keys (want 1..%d)", ErrBadMessage, len(s.Keys), wirecheck.MaxCaps)
	}
	for _, k := range s.Keys {
		if err := wirecheck.String("scoped user CA", k, wirecheck.MaxKeyLen); err != nil {
			return err
		}
	}
	if len(s.Principals) > wirecheck.MaxKeys || len(s.AnyLogin) > wirecheck.MaxKeys ||
		len(s.NoForwarding) > wirecheck.MaxKeys {
		return fmt.Errorf("%w: too many scoped principals", ErrBadMessage)
	}
	for login, ps := range s.Principals {
		if err := wirecheck.String("login", login, 32); err != nil {
			return err
		}
		if len(ps) > wirecheck.MaxKeys {
			return fmt.Errorf("%w: too many scoped principals for %.32q", ErrBadMessage, login)
		}
		for _, pr := range ps {
			if err := wirecheck.String("scoped principal", pr, wirecheck.MaxShort); err != nil {
				return err
			}
		}
	}
	for _, pr := range append(slices.Clone(s.AnyLogin), s.NoForwarding...) {
		if err := wirecheck.String("scoped principal", pr, wirecheck.MaxShort); err != nil {
			return err
		}
	}
	return nil
}

// Welcome confirms the session.
type Welcome struct {
	NodeID           string `json:"node_id"`
	Name             string `json:"name"`
	HeartbeatSeconds int    `json:"heartbeat_seconds"`
	// DeadPeerSeconds is the hub's dead-peer timeout (its QUIC idle
	// timeout), rounded up; 0 from a hub of an earlier version. QUIC takes
	// the shorter of the two sides', so the agent needs it to know when
	// its own keepalive is due (tunnel.Config.PingAfter).
	DeadPeerSeconds int `json:"dead_peer_seconds,omitempty"`
	// ResumeWindowSeconds is how long the hub keeps a stream of this agent
	// whose link went down (HubCapResume); the agent keeps its side as
	// long. 0 from a hub without resumable streams.
	ResumeWindowSeconds int `json:"resume_window_seconds,omitempty"`
	// Capabilities are the HubCap* constants this hub supports; an agent
	// ignores the ones it does not know, and an older hub sends none.
	Capabilities []string `json:"capabilities,omitempty"`
	// Site answers a site hub's hello.
	Site *siteproto.Welcome `json:"site,omitempty"`
	// Hubs are the addresses agents dial for the live hub replicas sharing
	// this hub's store (join strings name the same); none from a hub that
	// is no replica, or of an earlier version. An agent adds those it
	// lacks to the ones it dials, so it learns of replicas added after it
	// joined; it skips any that is not HOST:PORT.
	Hubs []string `json:"hubs,omitempty"`
}

// MaxWelcomeHubs bounds Welcome.Hubs.
const MaxWelcomeHubs = 16

// Message is one control frame. Exactly the field matching Type is set.
type Message struct {
	Type           Type      `json:"type"`
	Hello          *Hello    `json:"hello,omitempty"`
	Welcome        *Welcome  `json:"welcome,omitempty"`
	AuthorizedKeys []string  `json:"authorized_keys,omitempty"`
	Notice         string    `json:"notice,omitempty"`
	SSHTrust       *SSHTrust `json:"ssh_trust,omitempty"`
	SSHEvent       *SSHEvent `json:"ssh_event,omitempty"`
	// UpgradeStates: the node's upgrade records (upgradeproto.TypeState).
	UpgradeStates []upgradeproto.NodeState `json:"upgrade_states,omitempty"`
	// The site protocol's bodies (package siteproto): siteproto.TypeTrust,
	// TypeDesired, TypeDesiredAck, TypeStatus, TypeNodes.
	SiteTrust   *siteproto.Trust          `json:"site_trust,omitempty"`
	Desired     []siteproto.DesiredObject `json:"desired,omitempty"`
	DesiredAcks []siteproto.DesiredAck    `json:"desired_acks,omitempty"`
	SiteStatus  *siteproto.Status         `json:"site_status,omitempty"`
	SiteNodes   *siteproto.Nodes          `json:"site_nodes,omitempty"`
	// ServiceBindings: siteproto.TypeServiceBindings (an empty list closes
	// every listener).
	ServiceBindings []siteproto.ServiceBinding `json:"service_bindings,omitempty"`
	CSR             []byte                     `json:"csr,omitempty"`  // renew: DER certificate request
	Cert            string                     `json:"cert,omitempty"` // renewed: PEM chain, leaf first
	// Fatal marks a notice after which the agent must not reconnect with
	// this identity (the node was removed, or the identity is wrong).
	Fatal bool `json:"fatal,omitempty"`
}

// maxTransportWhy bounds Hello.TransportWhy.
const maxTransportWhy = 64

// Validate checks the facts' bounds, and that the management address and
// MAC parse; the hub stores them as the node's word, nothing more.
func (f *Facts) Validate() error {
	for field, v := range map[string]string{"hostname": f.Hostname, "os": f.OS, "os_id": f.OSID, "os_version": f.OSVersion,
		"arch": f.Arch, "machine_id": f.MachineID, "interface": f.Interface, "address": f.Address, "mac": f.MAC} {
		if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
			return err
		}
	}
	if f.Address != "" {
		if _, err := netip.ParseAddr(f.Address); err != nil {
			return fmt.Errorf("%w: facts address %.64q is not an IP address", ErrBadMessage, f.Address)
		}
	}
	if f.MAC != "" {
		if _, err := net.ParseMAC(f.MAC); err != nil {
			return fmt.Errorf("%w: facts mac %.64q is not a MAC address", ErrBadMessage, f.MAC)
		}
	}
	return nil
}

// Validate checks a message's shape and bounds.
func (m *Message) Validate() error {
	switch m.Type {
	case TypeHello:
		h := m.Hello
		if h == nil {
			return fmt.Errorf("%w: hello without body", ErrBadMessage)
		}
		if h.ProtocolVersion != ProtocolVersion {
			return fmt.Errorf(
				"%w: protocol version %d not supported (want %d): upgrade the agent or hub",
				ErrBadMessage,
				h.ProtocolVersion,
				ProtocolVersion,
			)
		}
		for field, v := range map[string]string{"name": h.Name, "agent_version": h.AgentVersion} {
			if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
				return err
			}
		}
		if err := h.Facts.Validate(); err != nil {
			return err
		}
		if len(h.Capabilities) > wirecheck.MaxCaps {
			return fmt.Errorf("%w: more than %d capabilities", ErrBadMessage, wirecheck.MaxCaps)
		}
		for _, c := range h.Capabilities {
			if err := wirecheck.String("capability", c, wirecheck.MaxShort); err != nil {
				return err
			}
		}
		if err := wirecheck.String("host_key", h.HostKey, wirecheck.MaxKeyLen); err != nil {
			return err
		}
		if err := wirecheck.String("state_dir", h.StateDir, wirecheck.MaxShort); err != nil {
			return err
		}
		if h.StateDir != "" && (!strings.HasPrefix(h.StateDir, "/") || path.Clean(h.StateDir) != h.StateDir) {
			return fmt.Errorf("%w: state_dir %q is not a clean absolute path", ErrBadMessage, h.StateDir)
		}
		if len(h.TransportWhy) > maxTransportWhy ||
			strings.IndexFunc(h.TransportWhy, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
			return fmt.Errorf(
				"%w: transport_why is not up to %d printable ASCII characters",
				ErrBadMessage,
				maxTransportWhy,
			)
		}
		if h.ResumeInstance != "" && (len(h.ResumeInstance) != 32 ||
			strings.Trim(h.ResumeInstance, "0123456789abcdef") != "") {
			return fmt.Errorf("%w: resume_instance %.40q is not 32 lowercase hex digits", ErrBadMessage,
				h.ResumeInstance)
		}
		if h.MovedFrom != "" && h.MovedFrom != "tcp" && h.MovedFrom != "quic" {
			return fmt.Errorf("%w: moved_from %.16q is not a transport (tcp, quic)", ErrBadMessage, h.MovedFrom)
		}
		if err := h.Upgrade.Validate(); err != nil {
			return err
		}
		if slices.Contains(h.Capabilities, siteproto.CapSite) || h.Site != nil {
			if err := h.Site.Validate(); err != nil {
				return err
			}
		}
		if len(h.Labels) > wirecheck.MaxLabels {
			return fmt.Errorf("%w: more than %d labels", ErrBadMessage, wirecheck.MaxLabels)
		}
		for k, v := range h.Labels {
			if err := wirecheck.String("label key", k, wirecheck.MaxShort); err != nil {
				return err
			}
			if err := wirecheck.String("label value", v, wirecheck.MaxShort); err != nil {
				return err
			}
		}
	case TypeSSHTrust:
		t := m.SSHTrust
		if t == nil {
			return fmt.Errorf("%w: ssh_trust without body", ErrBadMessage)
		}
		if err := wirecheck.String("host_cert", t.HostCert, wirecheck.MaxKeyLen); err != nil {
			return err
		}
		if len(t.RevokedKeys) > wirecheck.MaxKeys {
			return fmt.Errorf("%w: more than %d revoked keys", ErrBadMessage, wirecheck.MaxKeys)
		}
		for _, k := range t.RevokedKeys {
			if err := wirecheck.String("revoked key", k, wirecheck.MaxKeyLen); err != nil {
				return err
			}
		}
		if len(t.Principals) > wirecheck.MaxKeys || len(t.AnyLogin) > wirecheck.MaxKeys {
			return fmt.Errorf("%w: too many principals", ErrBadMessage)
		}
		for login, ps := range t.Principals {
			if err := wirecheck.String("login", login, 32); err != nil {
				return err
			}
			if len(ps) > wirecheck.MaxKeys {
				return fmt.Errorf("%w: too many principals for %.32q", ErrBadMessage, login)
			}
			for _, pr := range append(ps, t.AnyLogin...) {
				if err := wirecheck.String("principal", pr, wirecheck.MaxShort); err != nil {
					return err
				}
			}
		}
		if len(t.NoForwarding) > wirecheck.MaxKeys {
			return fmt.Errorf("%w: too many no_forwarding principals", ErrBadMessage)
		}
		for _, pr := range t.NoForwarding {
			if err := wirecheck.String("no_forwarding principal", pr, wirecheck.MaxShort); err != nil {
				return err
			}
		}
		if len(t.UserCAs) > wirecheck.MaxCaps {
			return fmt.Errorf("%w: more than %d user CAs", ErrBadMessage, wirecheck.MaxCaps)
		}
		for _, k := range t.UserCAs {
			if err := wirecheck.String("user CA", k, wirecheck.MaxKeyLen); err != nil {
				return err
			}
		}
		if len(t.ScopedUserCAs) > maxScopedCAs {
			return fmt.Errorf("%w: more than %d scoped user CAs", ErrBadMessage, maxScopedCAs)
		}
		for i := range t.ScopedUserCAs {
			if err := t.ScopedUserCAs[i].validate(); err != nil {
				return err
			}
		}
	case TypeWelcome:
		if m.Welcome == nil || m.Welcome.NodeID == "" {
			return fmt.Errorf("%w: welcome without node id", ErrBadMessage)
		}
		for _, f := range []struct {
			name string
			v    int
		}{
			{"heartbeat_seconds", m.Welcome.HeartbeatSeconds},
			{"dead_peer_seconds", m.Welcome.DeadPeerSeconds},
			{"resume_window_seconds", m.Welcome.ResumeWindowSeconds},
		} {
			if f.v < 0 || f.v > maxLivenessSeconds {
				return fmt.Errorf(
					"%w: welcome %s %d is not between 0 and %d",
					ErrBadMessage,
					f.name,
					f.v,
					maxLivenessSeconds,
				)
			}
		}
		if err := wirecheck.String("name", m.Welcome.Name, wirecheck.MaxShort); err != nil {
			return err
		}
		if len(m.Welcome.Capabilities) > wirecheck.MaxCaps {
			return fmt.Errorf("%w: more than %d hub capabilities", ErrBadMessage, wirecheck.MaxCaps)
		}
		for _, c := range m.Welcome.Capabilities {
			if err := wirecheck.String("hub capability", c, wirecheck.MaxShort); err != nil {
				return err
			}
		}
		if len(m.Welcome.Hubs) > MaxWelcomeHubs {
			return fmt.Errorf("%w: more than %d hub addresses in the welcome", ErrBadMessage, MaxWelcomeHubs)
		}
		for _, h := range m.Welcome.Hubs {
			if err := wirecheck.String("hub address", h, wirecheck.MaxShort); err != nil {
				return err
			}
		}
		if m.Welcome.Site != nil {
			if err := m.Welcome.Site.Validate(); err != nil {
				return err
			}
		}
	case siteproto.TypeTrust:
		return m.SiteTrust.Validate()
	case siteproto.TypeDesired:
		return siteproto.ValidateDesired(m.Desired)
	case siteproto.TypeDesiredAck:
		return siteproto.ValidateAcks(m.DesiredAcks)
	case siteproto.TypeStatus:
		return m.SiteStatus.Validate()
	case siteproto.TypeNodes:
		return m.SiteNodes.Validate()
	case siteproto.TypeServiceBindings:
		return siteproto.ValidateBindings(m.ServiceBindings)
	case TypeSSHEvent:
		e := m.SSHEvent
		if e == nil || e.Kind == "" {
			return fmt.Errorf("%w: ssh_event without kind", ErrBadMessage)
		}
		fields := map[string]string{"kind": e.Kind, "login": e.Login, "operator": e.Operator,
			"key_fingerprint": e.KeyFingerprint}
		for field, v := range fields {
			if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
				return err
			}
		}
		if err := wirecheck.String("detail", e.Detail, wirecheck.MaxNotice); err != nil {
			return err
		}
	case TypeRenew:
		if len(m.CSR) == 0 || len(m.CSR) > 8<<10 {
			return fmt.Errorf("%w: renew needs a CSR of at most 8 KiB", ErrBadMessage)
		}
	case TypeRenewed:
		if m.Cert == "" || len(m.Cert) > 64<<10 {
			return fmt.Errorf("%w: renewed needs a certificate of at most 64 KiB", ErrBadMessage)
		}
	case upgradeproto.TypeState:
		if err := upgradeproto.ValidateStates(m.UpgradeStates); err != nil {
			return err
		}
	case TypeHeartbeat:
	case TypeAuthorizedKeys:
		if len(m.AuthorizedKeys) > wirecheck.MaxKeys {
			return fmt.Errorf("%w: more than %d authorized keys", ErrBadMessage, wirecheck.MaxKeys)
		}
		for _, k := range m.AuthorizedKeys {
			if err := wirecheck.String("authorized key", k, wirecheck.MaxKeyLen); err != nil {
				return err
			}
		}
	case TypeNotice:
		if err := wirecheck.String("notice", m.Notice, wirecheck.MaxNotice); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: unknown type %.32q", ErrBadMessage, m.Type)
	}
	return nil
}

// Write sends one message.
func Write(w io.Writer, m *Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("control: encode %s: %w", m.Type, err)
	}
	if len(body) > MaxFrame {
		return fmt.Errorf("control: %s message is %d bytes, max %d", m.Type, len(body), MaxFrame)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	if _, err := w.Write(frame); err != nil {
		return fmt.Errorf("control: send %s: %w", m.Type, err)
	}
	return nil
}

// heartbeatBody is a heartbeat as Write encodes it. Heartbeats are almost
// all an idle session says (one each way per keepalive interval), so
// WriteHeartbeat sends it ready-made and Read recognises it without the
// JSON codec, whose reflection and garbage showed in the profile of a hub
// holding 10k idle agents.
var heartbeatBody = func() []byte {
	b, err := json.Marshal(&Message{Type: TypeHeartbeat})
	if err != nil {
		panic(err)
	}
	return b
}()

// heartbeatFrame is heartbeatBody with its length prefix.
var heartbeatFrame = append(binary.BigEndian.AppendUint32(nil, uint32(len(heartbeatBody))), heartbeatBody...)

// WriteHeartbeat sends a heartbeat: the same bytes as Write of
// &Message{Type: TypeHeartbeat}.
func WriteHeartbeat(w io.Writer) error {
	if _, err := w.Write(heartbeatFrame); err != nil {
		return fmt.Errorf("control: send %s: %w", TypeHeartbeat, err)
	}
	return nil
}

// Read receives and validates one message. The reader's error is returned
// as is when the stream ends between frames: io.EOF for a clean end, or
// whatever the stream says of a session that ended (which may wrap
// io.ErrUnexpectedEOF: that is no truncated frame).
func Read(r io.Reader) (*Message, error) {
	var hdr [4]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if n > 0 {
			return nil, fmt.Errorf("%w: truncated length (%d of 4 bytes): %w", ErrBadMessage, n, err)
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrame {
		return nil, fmt.Errorf("%w: frame length %d outside 1..%d", ErrBadMessage, n, MaxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("%w: truncated frame (%d bytes announced): %v", ErrBadMessage, n, err)
	}
	if bytes.Equal(body, heartbeatBody) {
		return &Message{Type: TypeHeartbeat}, nil
	}
	var m Message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}
