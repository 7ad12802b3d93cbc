// Package site is the hub's side of a tree of hubs. A site hub is a full
// hub that also joins a parent hub like a node (a site token, a certificate
// from the parent's CA, one tunnel kept up with the agent's transports,
// backoff and renewal) and announces itself as a site in its hello.
//
// Two roles live here, one per file:
//
//	children.go        the parent's side: the sites below this hub, their
//	                   admission (site certificate, no cycle), their status
//	                   heartbeat and staleness, the streams they open
//	inventory.go       the parent's side of a site's node inventory
//	hub.go             a hub's own status and inventory as it reports them
//	                   up, and which sessions it admits as sites
//	routes.go          reaching nodes below sites: the door's access.Sites
//	                   at a parent, the parent's route streams at a site
//	trust.go           SSH trust down the tree, host CAs up it
//	api.go             GET /v1/sites
//	uplink.go          the site's side: the Uplink and its loop, kept up
//	                   with the agent's backoff
//	uplink_session.go  one session with the parent: hello, heartbeats,
//	                   renewal, control messages and route streams down
//	report.go          the status heartbeat and the inventory sent up
//	identity.go        the site's parent identity in DATA_DIR/parent (a
//	                   restart needs no token), status sequence numbers
//
// Everything a site reports is named relative to itself; the parent
// appends the site's name, so a site can never claim a name outside its
// own subtree. Staleness is judged by the parent from the arrival time of
// the last status, never from the site's clock: a silent site is stale,
// shown with how long, never "failed" (a crashed site and a cut link look
// the same from above, and both may come back).
package site

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// DefaultStatusInterval is how often a site reports its status up.
const DefaultStatusInterval = 10 * time.Second

// StaleFactor times the status interval is how long a site may stay silent
// before its parent shows it stale.
const StaleFactor = 3

// A site's liveness, tighter than a node's: a site's uplink is one
// session per site, not one per node, and every command for the nodes
// below it waits on it. A site heartbeats every DefaultSiteHeartbeat (its
// parent answers each beat), and a parent that hears nothing at all on its
// session for DefaultSiteDeadPeer closes it: commands for its nodes then
// fail at once, saying since when, rather than waiting out the nodes'
// dead-peer timeout. Three beats, and every packet counts (retransmissions
// and acknowledgements too), so that a lossy link does not flap.
const (
	DefaultSiteHeartbeat = time.Second
	DefaultSiteDeadPeer  = 3 * time.Second
)

// Sentinel errors callers branch on.
var (
	// ErrSiteUnreachable: the site's uplink is down (see UnreachableError).
	ErrSiteUnreachable = errors.New("site unreachable")
	// ErrUplinkDown: this site hub has no session with its parent now.
	ErrUplinkDown = errors.New("site: uplink to the parent hub is down")
	// ErrNotSite: the session's certificate was not issued for a site
	// token (a node cannot become a site), or a site's certificate is used
	// without announcing a site.
	ErrNotSite = errors.New("site: not a site identity")
	// ErrCycle: joining would make the tree a cycle.
	ErrCycle = errors.New("site: the hub tree would have a cycle")
	// ErrNoSuchSite: no site of that name below this hub.
	ErrNoSuchSite = errors.New("site: no such site")
)

// UnreachableError says since when a site has been unreachable. It
// matches ErrSiteUnreachable.
type UnreachableError struct {
	Site  string
	Since time.Time // zero: never connected since this hub started
}

func (e *UnreachableError) Error() string {
	if e.Since.IsZero() {
		return fmt.Sprintf("site %s unreachable (not connected since this hub started)", e.Site)
	}
	return fmt.Sprintf("site %s unreachable since %s (%s ago)", e.Site, e.Since.UTC().Format(time.RFC3339),
		time.Since(e.Since).Round(time.Second))
}

// Is makes errors.Is(err, ErrSiteUnreachable) true.
func (e *UnreachableError) Is(target error) bool { return target == ErrSiteUnreachable }

// HubID identifies a hub in the tree: the hex SHA-256 of its CA's root
// certificate, the pin of its join strings.
func HubID(caRoot *x509.Certificate) string { return pki.Fingerprint(caRoot) }

// Child is a site below this hub, as this hub sees it.
type Child struct {
	// Name is the site's name at this hub (its node name here).
	Name string `json:"name"`
	// NodeID is the ID of the site's row in this hub's nodes (its
	// certificate's identity).
	NodeID string `json:"node_id"`
	// HubID is the site hub's ID (see HubID).
	HubID string `json:"hub_id"`
	// Path is the site's full name as the root names it ("berlin.region").
	Path string `json:"path"`
	// HostCAs are the site's SSH host CA keys: trusted for host
	// certificates of names under the site only.
	HostCAs []string `json:"host_cas,omitempty"`
	// Connected: the site's uplink session is up on this hub.
	Connected bool `json:"connected"`
	// LastHeartbeat is when the site's last status arrived here (this
	// hub's clock).
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	// Since is when the site became unreachable (its session ended or it
	// fell silent); zero while it is reachable.
	Since time.Time `json:"since,omitzero"`
	// Stale: no status arrived within the stale timeout; StaleFor is for
	// how long it has been silent (zero when not stale).
	Stale    bool          `json:"stale"`
	StaleFor time.Duration `json:"stale_for,omitempty"`
	// Status is the last status the site sent (nil before its first).
	Status *siteproto.Status `json:"status,omitempty"`
}

// Health is the site's health as shown: stale when it is, else what it
// reported (healthy before its first status if connected).
func (c Child) Health() string {
	switch {
	case c.Stale:
		return siteproto.Stale
	case c.Status != nil:
		return c.Status.Health
	case c.Connected:
		return siteproto.Healthy
	}
	return siteproto.Stale
}

// Unreachable is the error for a command that needs the site now, or nil
// while it is connected and not stale.
func (c Child) Unreachable() error {
	if c.Connected && !c.Stale {
		return nil
	}
	since := c.Since
	if since.IsZero() {
		since = c.LastHeartbeat
	}
	return &UnreachableError{Site: c.Name, Since: since}
}
