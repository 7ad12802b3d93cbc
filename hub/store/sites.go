package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Token kinds: what a join token may register.
const (
	// TokenNode registers a node (the default; "" means it too).
	TokenNode = "node"
	// TokenSite registers a site hub: its node row comes with a sites row,
	// and only a session announcing a site may use its certificate.
	TokenSite = "site"
)

// Site is a site hub below this hub: a row in nodes (its certificate's
// identity, name = site name) plus what it says about itself.
type Site struct {
	NodeID string `json:"node_id"`
	Name   string `json:"name"`
	// HubID, Path, HostCAs and Subtree are from the site's latest hello
	// and this hub's welcome ("" and nil before its first session).
	HubID   string   `json:"hub_id"`
	Path    string   `json:"path"`
	HostCAs []string `json:"host_cas"`
	Subtree []string `json:"subtree"`
	// Status is the site's last status (siteproto.Status, JSON), with
	// its sequence number and when it arrived here (this hub's clock).
	Status    json.RawMessage `json:"status,omitempty"`
	StatusSeq uint64          `json:"status_seq"`
	StatusAt  time.Time       `json:"status_at"`
	// DisconnectedAt is when its last session ended (zero while one is up
	// or before the first).
	DisconnectedAt time.Time `json:"disconnected_at"`
	JoinedAt       time.Time `json:"joined_at"`
}

// SiteNode is one node of a site's inventory at this hub, never a row of
// nodes: this hub issued it no certificate. Name is relative to the site
// ("n7", "n7.sub"); the node's name here is Name + "." + Site.
type SiteNode struct {
	SiteID string `json:"site_id"`
	Site   string `json:"site"`
	Name   string `json:"name"`
	ID     string `json:"id"`
	// Labels are the site's labels for the node with site=SUFFIX (its
	// site path relative to this hub) in place of any site label of its own.
	Labels    map[string]string `json:"labels"`
	Online    bool              `json:"online"`
	LastSeen  time.Time         `json:"last_seen"`
	Transport string            `json:"transport"`
	Revoked   bool              `json:"revoked"`
}

// FullName is the node's name at this hub ("n7.berlin").
func (n SiteNode) FullName() string { return n.Name + "." + n.Site }

// SiteStore holds the sites below this hub and their inventories.
type SiteStore interface {
	// GetSite returns the site whose node row is nodeID (ErrNotFound if
	// that node did not join with a site token).
	GetSite(ctx context.Context, nodeID string) (Site, error)
	ListSites(ctx context.Context) ([]Site, error)
	// UpdateSiteHello records what the site's latest hello and welcome said.
	UpdateSiteHello(ctx context.Context, nodeID, hubID, path string, hostCAs, subtree []string) error
	// SetSiteStatus stores status if seq is above the stored one, and
	// reports whether it did (a late duplicate changes nothing).
	SetSiteStatus(ctx context.Context, nodeID string, seq uint64, status json.RawMessage, at time.Time) (bool, error)
	// SetSiteDisconnected records when the site's session ended.
	SetSiteDisconnected(ctx context.Context, nodeID string, at time.Time) error
	// ReplaceSiteNodes makes nodes the site's whole inventory, atomically.
	ReplaceSiteNodes(ctx context.Context, siteID string, nodes []SiteNode) error
	// ApplySiteNodes upserts nodes and removes the names in removed.
	ApplySiteNodes(ctx context.Context, siteID string, nodes []SiteNode, removed []string) error
	// ListSiteNodes returns the inventory of site siteID, or of every site
	// for "", ordered by site and name.
	ListSiteNodes(ctx context.Context, siteID string) ([]SiteNode, error)
}

const siteColumns = `node_id, name, hub_id, path, host_cas, subtree, status, status_seq, status_at, ` +
	`disconnected_at, joined_at`

func scanSite(r scanner) (Site, error) {
	var s Site
	var hostCAs, subtree, status string
	var seq, at, disc, joined int64
	if err := r.Scan(&s.NodeID, &s.Name, &s.HubID, &s.Path, &hostCAs, &subtree, &status, &seq, &at, &disc,
		&joined); err != nil {
		return Site{}, err
	}
	if err := json.Unmarshal([]byte(hostCAs), &s.HostCAs); err != nil {
		return Site{}, fmt.Errorf("store: site %s host CAs: %w", s.Name, err)
	}
	if err := json.Unmarshal([]byte(subtree), &s.Subtree); err != nil {
		return Site{}, fmt.Errorf("store: site %s subtree: %w", s.Name, err)
	}
	if status != "" {
		s.Status = json.RawMessage(status)
	}
	s.StatusSeq = uint64(seq)
	s.StatusAt, s.DisconnectedAt, s.JoinedAt = fromUnix(at), fromUnix(disc), fromUnix(joined)
	return s, nil
}

func insertSiteTx(ctx context.Context, tx *sql.Tx, n Node) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO sites (node_id, name, joined_at) VALUES (?,?,?)`, n.ID, n.Name,
		unix(n.CreatedAt)); err != nil {
		return fmt.Errorf("store: site %q: %w", n.Name, err)
	}
	return nil
}

// GetSite implements SiteStore.
func (s *DB) GetSite(ctx context.Context, nodeID string) (Site, error) {
	st, err := scanSite(s.hot().QueryRowContext(ctx, `SELECT `+siteColumns+` FROM sites WHERE node_id = ?`, nodeID))
	if errors.Is(err, sql.ErrNoRows) {
		return Site{}, fmt.Errorf("store: site %s: %w", nodeID, ErrNotFound)
	}
	if err != nil {
		return Site{}, fmt.Errorf("store: site %s: %w", nodeID, err)
	}
	return st, nil
}

// ListSites implements SiteStore.
func (s *DB) ListSites(ctx context.Context) ([]Site, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+siteColumns+` FROM sites ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list sites: %w", err)
	}
	defer rows.Close()
	var out []Site
	for rows.Next() {
		st, err := scanSite(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

func jsonList(l []string) string {
	if l == nil {
		l = []string{}
	}
	b, _ := json.Marshal(l)
	return string(b)
}

// UpdateSiteHello implements SiteStore.
func (s *DB) UpdateSiteHello(ctx context.Context, nodeID, hubID, path string, hostCAs, subtree []string) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE sites SET hub_id = ?, path = ?, host_cas = ?, subtree = ?, disconnected_at = 0 WHERE node_id = ?`,
		hubID, path, jsonList(hostCAs), jsonList(subtree), nodeID)
	return affectedOne(res, err, "site "+nodeID)
}

// SetSiteStatus implements SiteStore.
func (s *DB) SetSiteStatus(
	ctx context.Context, nodeID string, seq uint64, status json.RawMessage, at time.Time,
) (bool, error) {
	res, err := s.db.ExecContext(ctx,
		`UPDATE sites SET status = ?, status_seq = ?, status_at = ? WHERE node_id = ? AND status_seq < ?`,
		string(status), int64(seq), unix(at), nodeID, int64(seq))
	if err != nil {
		return false, fmt.Errorf("store: site %s status: %w", nodeID, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// SetSiteDisconnected implements SiteStore.
func (s *DB) SetSiteDisconnected(ctx context.Context, nodeID string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sites SET disconnected_at = ? WHERE node_id = ?`, unix(at), nodeID)
	return affectedOne(res, err, "site "+nodeID)
}

func affectedOne(res sql.Result, err error, what string) error {
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: %s: %w", what, ErrNotFound)
	}
	return nil
}

// ReplaceSiteNodes implements SiteStore.
func (s *DB) ReplaceSiteNodes(ctx context.Context, siteID string, nodes []SiteNode) error {
	return s.siteNodesTx(ctx, siteID, func(tx *sql.Tx, site string) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM site_nodes WHERE site_id = ?`, siteID); err != nil {
			return err
		}
		return upsertSiteNodesTx(ctx, tx, siteID, site, nodes)
	})
}

// ApplySiteNodes implements SiteStore.
func (s *DB) ApplySiteNodes(ctx context.Context, siteID string, nodes []SiteNode, removed []string) error {
	return s.siteNodesTx(ctx, siteID, func(tx *sql.Tx, site string) error {
		for _, name := range removed {
			if _, err := tx.ExecContext(ctx, `DELETE FROM site_nodes WHERE site_id = ? AND name = ?`, siteID, name); err != nil {
				return err
			}
		}
		return upsertSiteNodesTx(ctx, tx, siteID, site, nodes)
	})
}

func (s *DB) siteNodesTx(ctx context.Context, siteID string, f func(tx *sql.Tx, site string) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: site %s inventory: %w", siteID, err)
	}
	defer tx.Rollback()
	var site string
	err = tx.QueryRowContext(ctx, `SELECT name FROM sites WHERE node_id = ?`+s.d.forUpdate, siteID).Scan(&site)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: site %s: %w", siteID, ErrNotFound)
	}
	if err == nil {
		err = f(tx, site)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return fmt.Errorf("store: site %s inventory: %w", site, err)
	}
	return nil
}

func upsertSiteNodesTx(ctx context.Context, tx *sql.Tx, siteID, site string, nodes []SiteNode) error {
	for _, n := range nodes {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO site_nodes (site_id, site, name, id, labels, online, last_seen, transport, revoked)
			VALUES (?,?,?,?,?,?,?,?,?)
			ON CONFLICT (site_id, name) DO UPDATE SET id = excluded.id, labels = excluded.labels, online = excluded.online,
				last_seen = excluded.last_seen, transport = excluded.transport, revoked = excluded.revoked`,
			siteID, site, n.Name, n.ID, encodeLabels(n.Labels), n.Online, unix(n.LastSeen), n.Transport, n.Revoked); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// ListSiteNodes implements SiteStore.
func (s *DB) ListSiteNodes(ctx context.Context, siteID string) ([]SiteNode, error) {
	q := `SELECT site_id, site, name, id, labels, online, last_seen, transport, revoked FROM site_nodes`
	args := []any{}
	if siteID != "" {
		q += ` WHERE site_id = ?`
		args = append(args, siteID)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY site, name`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list site nodes: %w", err)
	}
	defer rows.Close()
	var out []SiteNode
	for rows.Next() {
		var n SiteNode
		var labels string
		var seen int64
		if err := rows.Scan(&n.SiteID, &n.Site, &n.Name, &n.ID, &labels, &n.Online, &seen, &n.Transport,
			&n.Revoked); err != nil {
			return nil, fmt.Errorf("store: list site nodes: %w", err)
		}
		if n.Labels, err = decodeLabels(labels); err != nil {
			return nil, fmt.Errorf("store: site node %s: %w", n.FullName(), err)
		}
		n.LastSeen = fromUnix(seen)
		out = append(out, n)
	}
	return out, rows.Err()
}
