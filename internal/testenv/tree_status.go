package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SiteRow is one site of `tether sites -o json`, the sub-sites flattened:
// Path is the site's name relative to the hub asked ("berlin.region" at
// the root, "berlin" at the region).
type SiteRow struct {
	Name          string    `json:"name"`
	Path          string    `json:"path"`
	Health        string    `json:"health"`
	Connected     bool      `json:"connected"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	NodesOnline   int       `json:"nodes_online"`
	NodesTotal    int       `json:"nodes_total"`
}

// siteJSON is what ParseSites accepts: a site with its status, either flat
// or with its sub-sites nested under "sites", and the counts either at the
// top or under "status".
type siteJSON struct {
	SiteRow
	Stale  bool `json:"stale"`
	Status *struct {
		Health      string     `json:"health"`
		NodesOnline int        `json:"nodes_online"`
		NodesTotal  int        `json:"nodes_total"`
		Sites       []siteJSON `json:"sites"`
	} `json:"status"`
	Sites []siteJSON `json:"sites"`
}

// ParseSites reads `tether sites -o json`: a list of sites (or an object
// with the list under "sites"), sub-sites nested (under "sites" or
// "status"."sites") or flat; "stale": true wins over a reported health. The rows come
// back flat, sorted by path, each Path relative to the hub that printed
// them.
func ParseSites(out []byte) ([]SiteRow, error) {
	out = bytes.TrimSpace(out)
	var list []siteJSON
	if len(out) > 0 && out[0] == '{' {
		var wrap struct {
			Sites []siteJSON `json:"sites"`
		}
		if err := json.Unmarshal(out, &wrap); err != nil {
			return nil, fmt.Errorf("testenv: tether sites -o json: %w", err)
		}
		list = wrap.Sites
	} else if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("testenv: tether sites -o json: %w", err)
	}
	var rows []SiteRow
	var walk func(prefix string, l []siteJSON)
	walk = func(prefix string, l []siteJSON) {
		for _, s := range l {
			r := s.SiteRow
			if r.Path == "" {
				r.Path = r.Name
				if prefix != "" {
					r.Path = r.Name + "." + prefix
				}
			}
			if r.Name == "" {
				r.Name, _, _ = strings.Cut(r.Path, ".")
			}
			if st := s.Status; st != nil {
				if r.Health == "" {
					r.Health = st.Health
				}
				if r.NodesTotal == 0 {
					r.NodesOnline, r.NodesTotal = st.NodesOnline, st.NodesTotal
				}
			}
			if s.Stale {
				r.Health = "stale"
			}
			rows = append(rows, r)
			walk(r.Path, s.Sites)
			if s.Status != nil {
				walk(r.Path, s.Status.Sites)
			}
		}
	}
	walk("", list)
	sort.Slice(rows, func(i, j int) bool { return rows[i].Path < rows[j].Path })
	return slices.CompactFunc(rows, func(a, b SiteRow) bool { return a.Path == b.Path }), nil
}

// Sites runs `tether sites -o json` at the hub.
func (h *TreeHub) Sites(ctx context.Context) ([]SiteRow, error) {
	out, err := h.Tether(ctx, "sites", "-o", "json")
	if err != nil {
		return nil, err
	}
	return ParseSites([]byte(out))
}

// SiteMap is Sites by path; an error gives an empty map.
func (h *TreeHub) SiteMap(ctx context.Context) map[string]SiteRow {
	rows, _ := h.Sites(ctx)
	m := make(map[string]SiteRow, len(rows))
	for _, r := range rows {
		m[r.Path] = r
	}
	return m
}

// InventoryNode is one node of `tether nodes -o json`: a hub's own nodes
// and the nodes below its sites (named NAME.SITE_PATH).
type InventoryNode struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels"`
	Online    bool              `json:"online"`
	Transport string            `json:"transport"`
}

// Nodes runs `tether nodes -o json` at the hub, by name.
func (h *TreeHub) Nodes(ctx context.Context) (map[string]InventoryNode, error) {
	out, err := h.Tether(ctx, "nodes", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list []InventoryNode
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("testenv: tether nodes -o json at %s: %w", h.Name, err)
	}
	m := make(map[string]InventoryNode, len(list))
	for _, n := range list {
		m[n.Name] = n
	}
	return m, nil
}

// TreeState is what a hub shows of the part of the tree below it.
type TreeState struct {
	Sites map[string]SiteRow
	Nodes map[string]InventoryNode
}

// State reads the hub's sites and nodes (empty maps for what failed).
func (h *TreeHub) State(ctx context.Context) TreeState {
	s := TreeState{Sites: h.SiteMap(ctx), Nodes: map[string]InventoryNode{}}
	if n, err := h.Nodes(ctx); err == nil {
		s.Nodes = n
	}
	return s
}

// Rel is path relative to hub h: "n1.berlin.region" is "n1.berlin" at the
// region; ok is false when path is not below h.
func (h *TreeHub) Rel(path string) (string, bool) {
	if h.Path == "" {
		return path, true
	}
	return strings.CutSuffix(path, "."+h.Path)
}

// Healthy reports what, of the tree below h, h does not yet show healthy:
// every site below h connected and healthy, every agent below h (or its
// own) online in its inventory. "" when all is well.
func (tr *Tree) Healthy(ctx context.Context, h *TreeHub) string {
	st := h.State(ctx)
	var missing []string
	for _, sub := range tr.Hubs {
		if sub == h || !tr.below(sub, h) {
			continue
		}
		// A site's path may be printed relative to h or as the root
		// names it.
		rel, _ := h.Rel(sub.Path)
		r, ok := st.Sites[rel]
		if !ok {
			r, ok = st.Sites[sub.Path]
		}
		if !ok || r.Health != "healthy" {
			missing = append(missing, fmt.Sprintf("site %s (%s)", rel, r.Health))
		}
	}
	for _, a := range tr.Agents() {
		if a.Hub != h && !tr.below(a.Hub, h) {
			continue
		}
		rel, _ := h.Rel(a.Path())
		if n, ok := st.Nodes[rel]; !ok || !n.Online {
			missing = append(missing, "node "+rel)
		}
	}
	return strings.Join(missing, ", ")
}

// below reports whether hub a is below hub b.
func (tr *Tree) below(a, b *TreeHub) bool {
	for p := a.Parent; p != nil; p = p.Parent {
		if p == b {
			return true
		}
	}
	return false
}

// WaitHealthy waits until h shows every site below it healthy and every
// agent below it online (Healthy).
func (tr *Tree) WaitHealthy(ctx context.Context, h *TreeHub, timeout time.Duration) error {
	var last string
	err := Poll(ctx, timeout, "hub "+h.Name+" to show the tree below it healthy", func() bool {
		last = tr.Healthy(ctx, h)
		return last == ""
	})
	if err != nil {
		return fmt.Errorf("%w; not yet: %s", err, last)
	}
	return nil
}

// WaitTree waits until every hub shows the tree below it healthy, leaves
// first.
func (tr *Tree) WaitTree(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i := len(tr.Hubs) - 1; i >= 0; i-- {
		if err := tr.WaitHealthy(ctx, tr.Hubs[i], max(time.Until(deadline), time.Second)); err != nil {
			return err
		}
	}
	return nil
}

// Metrics fetches the hub's Prometheus metrics from its own port (not
// through its link, so that they can be read while the link is down) and
// returns the sum of every sample of each metric name, labels ignored.
func (h *TreeHub) Metrics(ctx context.Context) (map[string]float64, error) {
	caPEM, err := os.ReadFile(filepath.Join(h.DataDir, "ca", "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("testenv: metrics of hub %s: %w", h.Name, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "hub.tether.internal"}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+h.Listen+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("testenv: metrics of hub %s: %w", h.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("testenv: metrics of hub %s: %w", h.Name, err)
	}
	return SumMetrics(string(body)), nil
}

// SumMetrics sums the samples of each metric in a Prometheus text
// exposition by name (labels dropped).
func SumMetrics(text string) map[string]float64 {
	m := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		m[strings.TrimSpace(name)] += v
	}
	return m
}

// MissionView is what the tree tests read of `tether mission show NAME -o
// json`: the generation at the hub asked, the totals over its subtree, and
// every node's phase, named relative to that hub ("n1.berlin.region" at the
// root).
type MissionView struct {
	Generation int64 `json:"generation"`
	Total      struct {
		Nodes   int `json:"nodes"`
		Pending int `json:"pending"`
		Running int `json:"running"`
		Applied int `json:"applied"`
		Failed  int `json:"failed"`
	} `json:"total"`
	Nodes []struct {
		Site       string `json:"site"`
		Node       string `json:"node"`
		Generation int64  `json:"generation"`
		Phase      string `json:"phase"`
	} `json:"nodes"`
}

// ParseMission reads `tether mission show NAME -o json`.
func ParseMission(out []byte) (MissionView, error) {
	var m MissionView
	if err := json.Unmarshal(out, &m); err != nil {
		return m, fmt.Errorf("testenv: tether mission show -o json: %w", err)
	}
	return m, nil
}

// Phases are the nodes' phases at generation gen (pending, running,
// applied, failed), by node name.
func (m MissionView) Phases(gen int64) map[string]string {
	out := map[string]string{}
	for _, n := range m.Nodes {
		if n.Generation == gen {
			out[n.Node] = n.Phase
		}
	}
	return out
}

// Mission runs `tether mission show NAME -o json` at the hub.
func (h *TreeHub) Mission(ctx context.Context, name string) (MissionView, error) {
	out, err := h.Tether(ctx, "mission", "show", name, "-o", "json")
	if err != nil {
		return MissionView{}, err
	}
	return ParseMission([]byte(out))
}
