// Package siteproto is the site protocol: what a site hub and its parent hub
// say to each other, and the route frame a hub puts in front of a stream it
// passes down the tree. Its messages ride on the site's control stream (the
// envelope, hello and welcome are package control's, which carries these
// bodies); both hubs import it, and the agent only for service tunnels
// (TypeServiceBindings, ServiceConnectRequest).
//
// Site hubs: a tree of hubs. A hub started with --parent joins its parent
// like a node (a join token, a certificate from the parent's CA, the same
// transports, backoff and renewal) and announces CapSite in its hello, with
// Hello.Site set. On that session, besides the node protocol:
//
//	parent -> site    welcome       Welcome.Site: the site's path as the root
//	                                names it, the hub IDs above it, and for a
//	                                site with CapSiteLiveness its heartbeat
//	parent -> site    site_trust    the SSH trust of every hub above the site
//	                                (user CAs, roles, revoked keys), on
//	                                connect and whenever it changes
//	parent -> site    desired       desired objects (missions, services), each
//	                                with a generation; a site stores an
//	                                object durably before it acknowledges it
//	site   -> parent  desired_ack   the generations stored
//	site   -> parent  site_status   the site's heartbeat up the tree (health,
//	                                counts, sub-sites, missions), every
//	                                status interval and on change
//	site   -> parent  site_nodes    the site's node inventory (nodes of its
//	                                sub-sites included), full on connect in
//	                                pages, then changes
//
// Streams: the parent opens tunnel.ServiceRoute streams on the site's
// session; a RouteRequest frame follows the header and the site answers
// with a tunnel.Reply. A site opens ServiceRoute streams to its parent only
// for service tunnels (the nearest common hub carries the bytes), and only
// to a parent whose welcome lists HubCapSiteStreams.
//
// Names: a node below a site is named NAME.SITE[.SITE…] from a hub above
// it, innermost site first ("n7.berlin", "n7.berlin.region" from the root
// when berlin sits under region). Every name a site reports is relative to
// the site; its parent appends the site's name, so a site can never claim a
// name outside its own subtree.
package siteproto

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// Site capabilities.
const (
	// CapSite (hello): this session is a site hub, not a node; Hello.Site
	// is set.
	CapSite = "site"
	// HubCapSites (welcome): the hub takes site hubs as children.
	HubCapSites = "sites"
	// HubCapSiteStreams (welcome): the parent accepts ServiceRoute streams
	// the site opens (service tunnels).
	HubCapSiteStreams = "site-streams"
	// CapServiceConnect (a node's hello): the agent runs the local
	// listeners of service tunnels (TypeServiceBindings) and opens a
	// tunnel.ServiceConnect stream per accepted connection.
	CapServiceConnect = "service-connect"
	// CapSiteLiveness (a site's hello): the site heartbeats at the interval
	// its parent's welcome names (Welcome.HeartbeatMillis), so that the
	// parent may judge it dead after Welcome.DeadPeerMillis of silence. A
	// parent gives a site without it the nodes' liveness rule.
	CapSiteLiveness = "site-liveness"
)

// Message types of the site protocol.
const (
	TypeTrust      = "site_trust"  // parent -> site
	TypeDesired    = "desired"     // parent -> site
	TypeDesiredAck = "desired_ack" // site -> parent
	TypeStatus     = "site_status" // site -> parent
	TypeNodes      = "site_nodes"  // site -> parent
	// TypeServiceBindings (hub -> agent with CapServiceConnect): the whole
	// list of service tunnels this node consumes; the agent listens for
	// each and closes listeners no longer listed.
	TypeServiceBindings = "service_bindings"
)

// ServiceBinding is one service tunnel a node consumes: connections to
// Listen on the node are carried to the service.
type ServiceBinding struct {
	Name string `json:"name"`
	// Listen is a loopback address and port on the node ("127.0.0.1:15432").
	Listen string `json:"listen"`
}

// MaxServiceBindings bounds the listeners of one node.
const MaxServiceBindings = 256

// Bounds of the site protocol's frames (each message stays under MaxFrame).
const (
	MaxDepth           = 8    // hubs from a site up to the root
	MaxSubtreeHubs     = 1024 // hubs in a site's subtree (cycle check)
	MaxNodesPerPage    = 2000 // inventory entries per site_nodes message
	MaxDesiredPerFrame = 64   // desired objects per message
	MaxDesiredSpec     = 256 << 10
	MaxRoles           = 256
	maxPath            = 253
)

// ErrBadSite is wrapped by every error about a malformed site message or
// route frame; it matches control.ErrBadMessage too.
var ErrBadSite = fmt.Errorf("%w (site protocol)", wirecheck.ErrBadMessage)

// Hello is what a site hub says about itself in its hello.
type Hello struct {
	// Name is the site's name under its parent (a DNS label, as a node
	// name): the last label of every name below it.
	Name string `json:"name"`
	// HubID identifies the site hub: the hex SHA-256 of its CA's root
	// certificate (its join pin).
	HubID string `json:"hub_id"`
	// Subtree lists the hub IDs of this hub and of every hub below it: the
	// parent refuses a site whose subtree holds itself or one of its
	// ancestors (a cycle).
	Subtree []string `json:"subtree"`
	// HostCAs are the site's SSH host CA keys (authorized_keys format):
	// hubs above trust them for host certificates of names under the site
	// (*.SITE) and nothing else.
	HostCAs []string `json:"host_cas"`
}

// Welcome is the parent's answer to a site.
type Welcome struct {
	// Path is the site's full name as the root names it ("berlin.region");
	// the site signs its nodes' host certificates for every suffix of it.
	Path string `json:"path"`
	// Ancestors are the hub IDs from the parent up to the root; a site
	// whose own ID is among them must stop (a cycle) with a clear error.
	Ancestors []string `json:"ancestors"`
	// HeartbeatMillis, for a site that announced CapSiteLiveness, is how
	// often it heartbeats on its control stream; DeadPeerMillis is how long
	// the parent hears nothing at all on the site's session before it
	// closes it and fails commands for the site's nodes at once. Both 0
	// from a parent without (the nodes' rule applies).
	HeartbeatMillis int `json:"heartbeat_ms,omitempty"`
	DeadPeerMillis  int `json:"dead_peer_ms,omitempty"`
}

// Bounds of a site's liveness (Welcome.HeartbeatMillis, DeadPeerMillis).
const (
	MinHeartbeatMillis = 100
	MaxLivenessMillis  = 3600 * 1000
)

// TrustRole is one role of a hub above a site, as sites apply it to their
// own nodes.
type TrustRole struct {
	Name string `json:"name"`
	// Selector is the role's node selector, in the hub's label selector
	// syntax (what `tether role create -l` takes); it is matched
	// against a node's labels as that hub sees them, which include
	// site=SUFFIX (the node's site path relative to that hub).
	Selector string   `json:"selector"`
	Logins   []string `json:"logins"`
	// NoForwarding: the role does not allow port forwarding.
	NoForwarding bool `json:"no_forwarding,omitempty"`
}

// AncestorTrust is what one hub above a site lets its operators do on the
// site's nodes. Its user CAs are trusted at the site's nodes only for the
// principals its roles grant there ("tether:ROLE:LOGIN"), never for the
// site's own principals.
type AncestorTrust struct {
	HubID string `json:"hub_id"`
	// Suffix is how that hub names the site ("berlin" from the parent,
	// "berlin.region" from the root): a node N of the site is N.Suffix there,
	// with the label site=Suffix.
	Suffix      string      `json:"suffix"`
	UserCAs     []string    `json:"user_cas"`
	Roles       []TrustRole `json:"roles"`
	RevokedKeys []string    `json:"revoked_keys,omitempty"`
	// ProvisionLogin is the login that hub's jobs use on a node unless the
	// node's provision-login label names another: its user CA is accepted
	// there for the hub's provisioning principal ("tether-hub") on that
	// login only, so a job from that hub reaches the site's nodes.
	ProvisionLogin string `json:"provision_login,omitempty"`
}

// Trust is TypeTrust's body: the trust of every hub above the site,
// the parent first. A site passes it on to its own sites with its own entry
// in front.
type Trust struct {
	Ancestors []AncestorTrust `json:"ancestors"`
}

// DesiredObject is one object of desired state sent down the tree.
type DesiredObject struct {
	// Kind is what the object is ("mission", "service"); a site that does
	// not know a kind stores and acknowledges it and passes it on.
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Origin is the hub ID where the object was created; Kind+Origin+Name
	// identifies it.
	Origin string `json:"origin"`
	// Generation grows with every change at the origin. A site keeps the
	// highest generation it stored; an older or equal one is acknowledged
	// again and changes nothing, so a reconnect never re-runs work.
	Generation int64 `json:"generation"`
	// Deleted marks a tombstone: this generation removes the object. A site
	// never removes an object because a parent did not mention it.
	Deleted bool `json:"deleted,omitempty"`
	// Spec is the kind's own document, validated by the kind's owner.
	Spec json.RawMessage `json:"spec,omitempty"`
}

// DesiredAck says the site stored Kind/Origin/Name at Generation.
type DesiredAck struct {
	Kind       string `json:"kind"`
	Origin     string `json:"origin"`
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
}

// Site health values.
const (
	Healthy  = "healthy"
	Degraded = "degraded" // a sub-site is stale, or fewer than all nodes online
	Stale    = "stale"    // set by the parent: no heartbeat within the timeout
)

// Status is the site's heartbeat up the tree (TypeStatus).
type Status struct {
	// Seq grows with every status a site hub sends (kept across restarts),
	// so a parent drops a late duplicate.
	Seq uint64 `json:"seq"`
	// At is when the site built the report, by its clock.
	At          time.Time `json:"at"`
	Health      string    `json:"health"`
	NodesOnline int       `json:"nodes_online"`
	NodesTotal  int       `json:"nodes_total"`
	// Sites are the site's own sites, each with the status it last
	// received from it (nested: the whole subtree).
	Sites []SubSite `json:"sites,omitempty"`
	// ReceivedMissions and ActiveMissions name missions as Origin/Name.
	ReceivedMissions []string `json:"received_missions,omitempty"`
	ActiveMissions   []string `json:"active_missions,omitempty"`
	// Missions is the state of every mission the site holds, aggregated
	// over its nodes and sub-sites (the mission owner's document).
	Missions json.RawMessage `json:"missions,omitempty"`
	// QueuedSince is when statuses started queuing because the uplink was
	// down (zero when it was not).
	QueuedSince time.Time `json:"queued_since,omitzero"`
}

// SubSite is a site's view of one of its own sites.
type SubSite struct {
	Name    string   `json:"name"`
	HubID   string   `json:"hub_id"`
	HostCAs []string `json:"host_cas"`
	// Connected: the sub-site's uplink is up now; LastHeartbeat is when its
	// last status arrived.
	Connected     bool      `json:"connected"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	Status        *Status   `json:"status,omitempty"`
}

// Node is one node of a site's inventory, named relative to the site.
type Node struct {
	// Name is "n7" for the site's own node, "n7.sub" for a node of sub-site
	// sub.
	Name string `json:"name"`
	ID   string `json:"id"`
	// Labels are the labels the node's own hub selects it by.
	Labels    map[string]string `json:"labels,omitempty"`
	Online    bool              `json:"online"`
	LastSeen  time.Time         `json:"last_seen,omitzero"`
	Transport string            `json:"transport,omitempty"`
	Revoked   bool              `json:"revoked,omitempty"`
}

// Nodes is one TypeNodes message. A full inventory is a run of
// pages from Full (first page) to Done (last page); until Done the parent
// keeps the previous inventory. Outside a full run, Nodes are upserts and
// Removed are names gone from the site.
type Nodes struct {
	Full    bool     `json:"full,omitempty"`
	Done    bool     `json:"done,omitempty"`
	Nodes   []Node   `json:"nodes,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// Route purposes, for audit at every hop.
const (
	PurposeJump    = "jump"
	PurposeJob     = "job"
	PurposeService = "service"
	PurposeConsole = "console"
	PurposeUpgrade = "upgrade"
)

// RouteRequest follows a tunnel.ServiceRoute header: where the stream goes
// and on whose behalf. The hub that received the operator's request
// authorized it; each hub below re-checks that the stream came from its
// parent (or, for a service, that it knows the service) and that Target is
// one of its own nodes or below one of its sites, and audits the hop.
type RouteRequest struct {
	// Target is the node relative to the receiving hub: "n7" or "n7.sub".
	// One exception: a service route a site sends up to its parent names
	// the target as the service's origin hub names it (Origin is then the
	// service's origin), since a target outside the parent's subtree has
	// no name relative to the parent; every hub holding the service knows
	// how the origin names it.
	Target string `json:"target"`
	// Service and Port are the tunnel.Header to open at the node.
	Service uint8  `json:"service"`
	Port    uint16 `json:"port,omitempty"`
	Purpose string `json:"purpose"`
	// Operator is who asked, as the authorizing hub knows them; Origin is
	// that hub's ID. Both are for audit: no hub below grants anything
	// because of them.
	Operator string `json:"operator,omitempty"`
	Origin   string `json:"origin"`
	// ServiceName names the service tunnel for PurposeService; a hub
	// receiving the stream from below carries it only for a service it
	// holds.
	ServiceName string `json:"service_name,omitempty"`
	// Trace correlates the audit rows of one stream across hops.
	Trace string `json:"trace,omitempty"`
	// WaitMillis is how long the hub that opened the stream waits for the
	// answer (0: unsaid). A hub that routes on answers within it, so that
	// the refusal that names the slow hop arrives before the hub above
	// gives up on the whole route.
	WaitMillis int `json:"wait_ms,omitempty"`
}

// MaxRouteWaitMillis bounds RouteRequest.WaitMillis.
const MaxRouteWaitMillis = 60 * 1000

// ServiceConnectRequest follows a tunnel.ServiceConnect header an agent
// opens: a connection to service tunnel Name accepted on its local
// listener.
type ServiceConnectRequest struct {
	Name string `json:"name"`
}

const maxRouteFrame = 4 << 10

// WriteRouteRequest writes r as one frame (2-byte length, JSON).
func WriteRouteRequest(w io.Writer, r *RouteRequest) error {
	if err := r.Validate(); err != nil {
		return err
	}
	return writeSmallFrame(w, r)
}

// ReadRouteRequest reads and validates one route request frame.
func ReadRouteRequest(rd io.Reader) (*RouteRequest, error) {
	var r RouteRequest
	if err := readSmallFrame(rd, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// WriteServiceConnect writes r as one frame (2-byte length, JSON).
func WriteServiceConnect(w io.Writer, r *ServiceConnectRequest) error {
	if err := r.Validate(); err != nil {
		return err
	}
	return writeSmallFrame(w, r)
}

// ReadServiceConnect reads and validates one service connect frame.
func ReadServiceConnect(rd io.Reader) (*ServiceConnectRequest, error) {
	var r ServiceConnectRequest
	if err := readSmallFrame(rd, &r); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

func writeSmallFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("control: encode %T: %w", v, err)
	}
	if len(body) > maxRouteFrame {
		return fmt.Errorf("%w: %T is %d bytes, max %d", ErrBadSite, v, len(body), maxRouteFrame)
	}
	frame := make([]byte, 2+len(body))
	binary.BigEndian.PutUint16(frame, uint16(len(body)))
	copy(frame[2:], body)
	if _, err := w.Write(frame); err != nil {
		return fmt.Errorf("control: send %T: %w", v, err)
	}
	return nil
}

func readSmallFrame(rd io.Reader, v any) error {
	var hdr [2]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		return fmt.Errorf("control: read %T length: %w", v, err)
	}
	n := int(binary.BigEndian.Uint16(hdr[:]))
	if n == 0 || n > maxRouteFrame {
		return fmt.Errorf("%w: %T frame of %d bytes (want 1..%d)", ErrBadSite, v, n, maxRouteFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return fmt.Errorf("%w: truncated %T frame: %v", ErrBadSite, v, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %T is not JSON: %v", ErrBadSite, v, err)
	}
	return nil
}

// Validate checks a route request's shape and bounds.
func (r *RouteRequest) Validate() error {
	if err := ValidNodePath(r.Target); err != nil {
		return fmt.Errorf("%w: route target: %v", ErrBadSite, err)
	}
	switch r.Service {
	case 1: // tunnel.ServiceSSH
		if r.Port != 0 {
			return fmt.Errorf("%w: route to ssh with port %d", ErrBadSite, r.Port)
		}
	case 2: // tunnel.ServiceTCP
		if r.Port == 0 {
			return fmt.Errorf("%w: route to tcp without a port", ErrBadSite)
		}
	default:
		return fmt.Errorf("%w: route to service %d (want ssh or tcp)", ErrBadSite, r.Service)
	}
	switch r.Purpose {
	case PurposeJump, PurposeJob, PurposeConsole, PurposeUpgrade:
	case PurposeService:
		if err := ValidLabel("service name", r.ServiceName); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSite, err)
		}
	default:
		return fmt.Errorf("%w: route purpose %.32q unknown", ErrBadSite, r.Purpose)
	}
	if !validHubID(r.Origin) {
		return fmt.Errorf("%w: route origin %.80q is not a hub ID", ErrBadSite, r.Origin)
	}
	if r.WaitMillis < 0 || r.WaitMillis > MaxRouteWaitMillis {
		return fmt.Errorf("%w: route wait %d ms (want 0..%d)", ErrBadSite, r.WaitMillis, MaxRouteWaitMillis)
	}
	for field, v := range map[string]string{"operator": r.Operator, "trace": r.Trace} {
		if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a service connect request.
func (r *ServiceConnectRequest) Validate() error {
	if err := ValidLabel("service name", r.Name); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSite, err)
	}
	return nil
}

// ValidLabel checks one label of a name below a site (a node, site or
// service name): a DNS label of lower-case letters, digits and dashes, not
// all digits. It is the same rule as internal/validate's node names, which
// this package cannot import.
func ValidLabel(what, s string) error {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return fmt.Errorf(
			"%s %.80q: want 1-63 lower-case letters, digits and dashes, not starting or ending with a dash",
			what,
			s,
		)
	}
	digits := true
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z', c == '-':
			digits = false
		default:
			return fmt.Errorf("%s %.80q: want 1-63 lower-case letters, digits and dashes", what, s)
		}
	}
	if digits {
		return fmt.Errorf("%s %q: all digits; a name needs a letter", what, s)
	}
	return nil
}

// ValidNodePath checks a node name relative to a hub: "n7", "n7.berlin",
// "n7.sub.berlin" — at most MaxDepth sites.
func ValidNodePath(s string) error {
	if len(s) > maxPath {
		return fmt.Errorf("node path is %d bytes, max %d", len(s), maxPath)
	}
	labels := strings.Split(s, ".")
	if len(labels) > MaxDepth+1 {
		return fmt.Errorf("node path %.80q is below more than %d sites", s, MaxDepth)
	}
	for i, l := range labels {
		what := "site"
		if i == 0 {
			what = "node"
		}
		if err := ValidLabel(what, l); err != nil {
			return err
		}
	}
	return nil
}

// ValidPath checks a site path ("berlin", "berlin.region").
func ValidPath(s string) error {
	if len(s) > maxPath {
		return fmt.Errorf("site path is %d bytes, max %d", len(s), maxPath)
	}
	labels := strings.Split(s, ".")
	if len(labels) > MaxDepth {
		return fmt.Errorf("site path %.80q is deeper than %d", s, MaxDepth)
	}
	for _, l := range labels {
		if err := ValidLabel("site", l); err != nil {
			return err
		}
	}
	return nil
}

// validHubID: 64 lower-case hex digits.
func validHubID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func validateKeys(field string, keys []string, max int) error {
	if len(keys) > max {
		return fmt.Errorf("%w: more than %d %s", ErrBadSite, max, field)
	}
	for _, k := range keys {
		if err := wirecheck.String(field, k, wirecheck.MaxKeyLen); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a site hub's hello section; a nil one is an error, since
// only a hello announcing CapSite (or carrying a section) is checked.
func (h *Hello) Validate() error {
	if h == nil {
		return fmt.Errorf("%w: hello announces %q without a site section", ErrBadSite, CapSite)
	}
	if err := ValidLabel("site name", h.Name); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSite, err)
	}
	if !validHubID(h.HubID) {
		return fmt.Errorf("%w: site hub id %.80q is not 64 hex digits", ErrBadSite, h.HubID)
	}
	if len(h.Subtree) == 0 || len(h.Subtree) > MaxSubtreeHubs {
		return fmt.Errorf("%w: site subtree of %d hubs (want 1..%d)", ErrBadSite, len(h.Subtree), MaxSubtreeHubs)
	}
	for _, id := range h.Subtree {
		if !validHubID(id) {
			return fmt.Errorf("%w: subtree hub id %.80q is not 64 hex digits", ErrBadSite, id)
		}
	}
	return validateKeys("host CAs", h.HostCAs, wirecheck.MaxCaps)
}

// Validate checks the parent's answer to a site.
func (w *Welcome) Validate() error {
	if err := ValidPath(w.Path); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSite, err)
	}
	if len(w.Ancestors) == 0 || len(w.Ancestors) > MaxDepth {
		return fmt.Errorf("%w: %d ancestors (want 1..%d)", ErrBadSite, len(w.Ancestors), MaxDepth)
	}
	for _, id := range w.Ancestors {
		if !validHubID(id) {
			return fmt.Errorf("%w: ancestor hub id %.80q is not 64 hex digits", ErrBadSite, id)
		}
	}
	if w.HeartbeatMillis == 0 && w.DeadPeerMillis == 0 {
		return nil
	}
	if w.HeartbeatMillis < MinHeartbeatMillis || w.HeartbeatMillis > MaxLivenessMillis ||
		w.DeadPeerMillis < 2*w.HeartbeatMillis || w.DeadPeerMillis > MaxLivenessMillis {
		return fmt.Errorf("%w: site liveness of a heartbeat every %d ms, dead after %d ms "+
			"(want %d..%d ms, dead after at least two heartbeats)",
			ErrBadSite, w.HeartbeatMillis, w.DeadPeerMillis, MinHeartbeatMillis, MaxLivenessMillis)
	}
	return nil
}

// Validate checks a site_trust body.
func (t *Trust) Validate() error {
	if t == nil {
		return fmt.Errorf("%w: site_trust without body", ErrBadSite)
	}
	if len(t.Ancestors) == 0 || len(t.Ancestors) > MaxDepth {
		return fmt.Errorf("%w: trust of %d ancestors (want 1..%d)", ErrBadSite, len(t.Ancestors), MaxDepth)
	}
	for _, a := range t.Ancestors {
		if !validHubID(a.HubID) {
			return fmt.Errorf("%w: trust hub id %.80q is not 64 hex digits", ErrBadSite, a.HubID)
		}
		if err := ValidPath(a.Suffix); err != nil {
			return fmt.Errorf("%w: trust suffix: %v", ErrBadSite, err)
		}
		if err := validateKeys("user CAs", a.UserCAs, wirecheck.MaxCaps); err != nil {
			return err
		}
		if err := validateKeys("revoked keys", a.RevokedKeys, wirecheck.MaxKeys); err != nil {
			return err
		}
		if err := wirecheck.String("provision login", a.ProvisionLogin, 32); err != nil {
			return err
		}
		if len(a.Roles) > MaxRoles {
			return fmt.Errorf("%w: more than %d roles", ErrBadSite, MaxRoles)
		}
		for _, r := range a.Roles {
			if err := wirecheck.String("role name", r.Name, wirecheck.MaxShort); err != nil {
				return err
			}
			if err := wirecheck.String("role selector", r.Selector, wirecheck.MaxNotice); err != nil {
				return err
			}
			if len(r.Logins) > wirecheck.MaxLabels {
				return fmt.Errorf("%w: role %.32q has more than %d logins", ErrBadSite, r.Name, wirecheck.MaxLabels)
			}
			for _, l := range r.Logins {
				if err := wirecheck.String("login", l, 32); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// ValidateDesired checks the objects of one desired message.
func ValidateDesired(objs []DesiredObject) error {
	if len(objs) == 0 || len(objs) > MaxDesiredPerFrame {
		return fmt.Errorf(
			"%w: %d desired objects in one message (want 1..%d)",
			ErrBadSite,
			len(objs),
			MaxDesiredPerFrame,
		)
	}
	for _, o := range objs {
		if err := ValidLabel("desired kind", o.Kind); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSite, err)
		}
		if err := ValidLabel("desired name", o.Name); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSite, err)
		}
		if !validHubID(o.Origin) {
			return fmt.Errorf("%w: desired %s/%s origin is not a hub ID", ErrBadSite, o.Kind, o.Name)
		}
		if o.Generation <= 0 {
			return fmt.Errorf("%w: desired %s/%s generation %d (want > 0)", ErrBadSite, o.Kind, o.Name, o.Generation)
		}
		if len(o.Spec) > MaxDesiredSpec {
			return fmt.Errorf(
				"%w: desired %s/%s spec is %d bytes, max %d",
				ErrBadSite,
				o.Kind,
				o.Name,
				len(o.Spec),
				MaxDesiredSpec,
			)
		}
		if !o.Deleted && len(o.Spec) == 0 {
			return fmt.Errorf("%w: desired %s/%s has no spec", ErrBadSite, o.Kind, o.Name)
		}
	}
	return nil
}

// ValidateAcks checks the acknowledgements of one desired_ack message.
func ValidateAcks(acks []DesiredAck) error {
	if len(acks) == 0 || len(acks) > MaxDesiredPerFrame {
		return fmt.Errorf("%w: %d acks in one message (want 1..%d)", ErrBadSite, len(acks), MaxDesiredPerFrame)
	}
	for _, a := range acks {
		if ValidLabel("kind", a.Kind) != nil || ValidLabel("name", a.Name) != nil || !validHubID(a.Origin) ||
			a.Generation <= 0 {
			return fmt.Errorf(
				"%w: desired_ack %.32q/%.64q generation %d is malformed",
				ErrBadSite,
				a.Kind,
				a.Name,
				a.Generation,
			)
		}
	}
	return nil
}

// Validate checks a status report and the sub-site reports nested in it.
func (s *Status) Validate() error { return s.validate(0) }

func (s *Status) validate(depth int) error {
	if s == nil {
		return fmt.Errorf("%w: site_status without body", ErrBadSite)
	}
	if depth > MaxDepth {
		return fmt.Errorf("%w: site status nested deeper than %d", ErrBadSite, MaxDepth)
	}
	switch s.Health {
	case Healthy, Degraded, Stale:
	default:
		return fmt.Errorf("%w: site health %.32q (want %s, %s or %s)", ErrBadSite, s.Health, Healthy, Degraded, Stale)
	}
	if s.NodesOnline < 0 || s.NodesTotal < 0 || s.NodesOnline > s.NodesTotal {
		return fmt.Errorf("%w: site nodes online %d of %d", ErrBadSite, s.NodesOnline, s.NodesTotal)
	}
	if len(s.ReceivedMissions) > MaxRoles*4 || len(s.ActiveMissions) > MaxRoles*4 {
		return fmt.Errorf("%w: too many missions named", ErrBadSite)
	}
	for _, m := range append(append([]string(nil), s.ReceivedMissions...), s.ActiveMissions...) {
		if err := wirecheck.String("mission", m, wirecheck.MaxShort); err != nil {
			return err
		}
	}
	for _, sub := range s.Sites {
		if err := ValidLabel("sub-site name", sub.Name); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSite, err)
		}
		if !validHubID(sub.HubID) {
			return fmt.Errorf("%w: sub-site %s hub id is not 64 hex digits", ErrBadSite, sub.Name)
		}
		if err := validateKeys("host CAs", sub.HostCAs, wirecheck.MaxCaps); err != nil {
			return err
		}
		if sub.Status != nil {
			if err := sub.Status.validate(depth + 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// ValidateBindings checks a service_bindings list (empty is valid: it closes
// every listener).
func ValidateBindings(bs []ServiceBinding) error {
	if len(bs) > MaxServiceBindings {
		return fmt.Errorf("%w: more than %d service bindings", ErrBadSite, MaxServiceBindings)
	}
	for _, b := range bs {
		if err := ValidLabel("service name", b.Name); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSite, err)
		}
		ap, err := netip.ParseAddrPort(b.Listen)
		if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
			return fmt.Errorf(
				"%w: service %s listen address %.64q is not a loopback address with a port",
				ErrBadSite,
				b.Name,
				b.Listen,
			)
		}
	}
	return nil
}

// Validate checks one page of a site's inventory.
func (n *Nodes) Validate() error {
	if n == nil {
		return fmt.Errorf("%w: site_nodes without body", ErrBadSite)
	}
	if len(n.Nodes)+len(n.Removed) > MaxNodesPerPage {
		return fmt.Errorf("%w: more than %d inventory entries in one message", ErrBadSite, MaxNodesPerPage)
	}
	for _, x := range n.Nodes {
		if err := ValidNodePath(x.Name); err != nil {
			return fmt.Errorf("%w: inventory: %v", ErrBadSite, err)
		}
		if err := wirecheck.String("node id", x.ID, wirecheck.MaxShort); err != nil {
			return err
		}
		if err := wirecheck.String("transport", x.Transport, wirecheck.MaxShort); err != nil {
			return err
		}
		if len(x.Labels) > wirecheck.MaxLabels {
			return fmt.Errorf("%w: node %s has more than %d labels", ErrBadSite, x.Name, wirecheck.MaxLabels)
		}
		for k, v := range x.Labels {
			if err := wirecheck.String("label key", k, wirecheck.MaxShort); err != nil {
				return err
			}
			if err := wirecheck.String("label value", v, wirecheck.MaxShort); err != nil {
				return err
			}
		}
	}
	for _, r := range n.Removed {
		if err := ValidNodePath(r); err != nil {
			return fmt.Errorf("%w: inventory removal: %v", ErrBadSite, err)
		}
	}
	return nil
}
