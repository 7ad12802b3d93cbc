package ui

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
)

// Node states the fleet view shows.
const (
	StateOnline  = "online"  // a live tunnel whose agent is heard
	StateStale   = "stale"   // a live tunnel whose agent fell silent (StaleAfter)
	StateOffline = "offline" // no live tunnel
	StateRevoked = "revoked" // refused for good
)

// fleet serves the paged, filtered node list. It filters a cached copy of
// the store's nodes joined with the live node connections, which are
// always current: a node going offline shows at once, a relabel or a new
// node within FleetCacheTTL. A request that finds the copy older than that
// is answered from it while one background read of the store replaces it,
// so no request waits for a 100k-row read but the very first.
type fleet struct {
	cfg Config

	load sync.Mutex // serializes first loads

	mu         sync.Mutex // guards the following fields
	nodes      []store.Node
	fetched    time.Time
	refreshing bool
}

func newFleet(cfg Config) *fleet { return &fleet{cfg: cfg} }

// fleetRefreshTimeout bounds a background re-read of the store.
const fleetRefreshTimeout = time.Minute

// list returns the cached nodes, starting a refresh if they are old.
func (f *fleet) list(ctx context.Context) ([]store.Node, error) {
	f.mu.Lock()
	if nodes := f.nodes; nodes != nil {
		if time.Since(f.fetched) > f.cfg.FleetCacheTTL && !f.refreshing {
			f.refreshing = true
			// Owned by the fleet, bounded by one store read.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), fleetRefreshTimeout)
				defer cancel()
				fresh, err := f.cfg.Store.ListNodes(ctx)
				f.mu.Lock()
				defer f.mu.Unlock()
				f.refreshing = false
				if err != nil {
					f.cfg.Logger.Warn("fleet view: re-read of the nodes failed; showing the previous list", "err", err)
					return
				}
				f.set(fresh)
			}()
		}
		f.mu.Unlock()
		return nodes, nil
	}
	f.mu.Unlock()
	f.load.Lock()
	defer f.load.Unlock()
	f.mu.Lock()
	nodes := f.nodes
	f.mu.Unlock()
	if nodes != nil {
		return nodes, nil // loaded while this request waited
	}
	fresh, err := f.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set(fresh)
	return f.nodes, nil
}

// set installs a fresh list; f.mu is held.
func (f *fleet) set(fresh []store.Node) {
	if fresh == nil {
		fresh = []store.Node{}
	}
	f.nodes, f.fetched = fresh, time.Now()
}

// invalidate drops the cached list: the next request re-reads the store
// (the benchmark's cold load).
func (f *fleet) invalidate() {
	f.mu.Lock()
	f.nodes = nil
	f.mu.Unlock()
}

// live is the live connections by node name, read once per request.
func live(reg *nodeconn.Table) map[string]*nodeconn.Conn {
	all := reg.All()
	m := make(map[string]*nodeconn.Conn, len(all))
	for _, c := range all {
		m[c.Name] = c
	}
	return m
}

// stateOf is node n's state given the live sessions.
func stateOf(
	n *store.Node, conns map[string]*nodeconn.Conn, staleAfter time.Duration, now time.Time,
) (string, *nodeconn.Conn) {
	if !n.RevokedAt.IsZero() {
		return StateRevoked, nil
	}
	c, ok := conns[n.Name]
	if !ok || c.NodeID != n.ID {
		return StateOffline, nil
	}
	heard := c.Connected
	if h := c.Heard.Load(); h != 0 {
		heard = time.Unix(0, h)
	}
	if now.Sub(heard) > staleAfter {
		return StateStale, c
	}
	return StateOnline, c
}

// FleetNode is one row of the fleet view.
type FleetNode struct {
	ID           string            `json:"id"`
	Name         string            `json:"name"`
	State        string            `json:"state"`
	Site         string            `json:"site,omitempty"`
	Labels       map[string]string `json:"labels"`
	AgentVersion string            `json:"agent_version"`
	OS           string            `json:"os"`
	Arch         string            `json:"arch,omitempty"`
	Transport    string            `json:"transport,omitempty"`
	LastSeen     time.Time         `json:"last_seen,omitzero"`
}

// FleetPage answers GET /ui/api/fleet.
type FleetPage struct {
	// Total is the number of nodes the caller may see; Matched of those
	// the filters select, Counts the matched ones by state.
	Total   int            `json:"total"`
	Matched int            `json:"matched"`
	Counts  map[string]int `json:"counts"`
	// Versions and OSes count the visible nodes by agent version and OS,
	// for the filter menus.
	Versions map[string]int `json:"versions"`
	OSes     map[string]int `json:"oses"`
	Offset   int            `json:"offset"`
	Nodes    []FleetNode    `json:"nodes"`
}

// FleetQuery is a fleet view request: filters (all optional), sort and page.
type FleetQuery struct {
	Search   string // substring of the name or hostname, case-insensitive
	States   []string
	Selector string // on hub-set labels, as roles select: site=berlin,env=dev
	Version  string
	OS       string
	Sort     string // name, state, site, version, os, last_seen, transport; "-" first for descending
	Offset   int
	Limit    int // default 50, at most 500
}

// ParseFleetQuery reads a FleetQuery from URL parameters q, state, label,
// version, os, sort, offset and limit.
func ParseFleetQuery(r *http.Request) (FleetQuery, error) {
	v := r.URL.Query()
	q := FleetQuery{Search: strings.ToLower(strings.TrimSpace(v.Get("q"))), Selector: strings.TrimSpace(v.Get("label")),
		Version: v.Get("version"), OS: v.Get("os"), Sort: v.Get("sort"), Limit: 50}
	if s := v.Get("state"); s != "" {
		for _, st := range strings.Split(s, ",") {
			switch st {
			case StateOnline, StateStale, StateOffline, StateRevoked:
				q.States = append(q.States, st)
			default:
				return q, fmt.Errorf("state %q: want online, stale, offline or revoked", st)
			}
		}
	}
	for _, p := range []struct {
		name     string
		dst      *int
		min, max int
	}{{"offset", &q.Offset, 0, 1 << 30}, {"limit", &q.Limit, 1, 500}} {
		if s := v.Get(p.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < p.min || n > p.max {
				return q, fmt.Errorf("%s %q: want %d..%d", p.name, s, p.min, p.max)
			}
			*p.dst = n
		}
	}
	if _, ok := sorters[strings.TrimPrefix(q.Sort, "-")]; q.Sort != "" && !ok {
		return q, fmt.Errorf(
			"sort %q: want one of name, state, site, version, os, last_seen, transport (- first for descending)", q.Sort)
	}
	return q, nil
}

var stateRank = map[string]int{StateOffline: 0, StateStale: 1, StateOnline: 2, StateRevoked: 3}

// hit is a node that passed the filters; rows are built for one page only.
type hit struct {
	n     *store.Node
	state string
	conn  *nodeconn.Conn
}

var sorters = map[string]func(a, b *hit) int{
	"name":      func(a, b *hit) int { return 0 },
	"state":     func(a, b *hit) int { return cmp.Compare(stateRank[a.state], stateRank[b.state]) },
	"site":      func(a, b *hit) int { return cmp.Compare(api.NodeSite(a.n.Labels), api.NodeSite(b.n.Labels)) },
	"version":   func(a, b *hit) int { return cmp.Compare(a.n.AgentVersion, b.n.AgentVersion) },
	"os":        func(a, b *hit) int { return cmp.Compare(a.n.OS, b.n.OS) },
	"transport": func(a, b *hit) int { return cmp.Compare(a.n.Transport, b.n.Transport) },
	"last_seen": func(a, b *hit) int { return a.lastSeen().Compare(b.lastSeen()) },
}

// lastSeen is now for a node with a live session.
func (h *hit) lastSeen() time.Time {
	if h.conn != nil {
		return time.Now()
	}
	return h.n.LastSeen
}

// Page filters, counts, sorts and pages the fleet for the caller: only the
// nodes the door lets it list (access.Door.AuthorizeList), as GET
// /v1/nodes does.
func (f *fleet) Page(ctx context.Context, sees func(*store.Node) bool, q FleetQuery) (FleetPage, error) {
	var match func(map[string]string) bool
	if q.Selector != "" && q.Selector != "*" {
		sel, err := roles.ParseSelector(q.Selector)
		if err != nil {
			return FleetPage{}, fmt.Errorf("label selector: %w", err)
		}
		match = sel.Matches
	}
	nodes, err := f.list(ctx)
	if err != nil {
		return FleetPage{}, err
	}
	conns := live(f.cfg.Conns)
	now := time.Now()
	out := FleetPage{Counts: map[string]int{StateOnline: 0, StateStale: 0, StateOffline: 0, StateRevoked: 0},
		Versions: map[string]int{}, OSes: map[string]int{}, Offset: q.Offset, Nodes: []FleetNode{}}
	hits := make([]hit, 0, 1024)
	for i := range nodes {
		n := &nodes[i]
		if !sees(n) {
			continue
		}
		out.Total++
		out.Versions[n.AgentVersion]++
		out.OSes[n.OS]++
		if match != nil && !match(n.Labels) {
			continue
		}
		if q.Version != "" && n.AgentVersion != q.Version {
			continue
		}
		if q.OS != "" && n.OS != q.OS {
			continue
		}
		if q.Search != "" && !containsFold(n.Name, q.Search) && !containsFold(n.Hostname, q.Search) {
			continue
		}
		state, c := stateOf(n, conns, f.cfg.StaleAfter, now)
		if len(q.States) > 0 && !slices.Contains(q.States, state) {
			continue
		}
		out.Matched++
		out.Counts[state]++
		hits = append(hits, hit{n: n, state: state, conn: c})
	}
	key := strings.TrimPrefix(q.Sort, "-")
	desc := strings.HasPrefix(q.Sort, "-")
	if key == "" {
		key = "name"
	}
	by := sorters[key]
	order := func(a, b hit) int {
		c := by(&a, &b)
		if c == 0 {
			c = cmp.Compare(a.n.Name, b.n.Name)
		}
		if desc {
			c = -c
		}
		return c
	}
	// The store lists nodes by name: the default order needs no sort.
	if !slices.IsSortedFunc(hits, order) {
		slices.SortFunc(hits, order)
	}
	if q.Offset < len(hits) {
		hits = hits[q.Offset:min(len(hits), q.Offset+q.Limit)]
	} else {
		hits = nil
	}
	for _, h := range hits {
		n := h.n
		row := FleetNode{ID: n.ID, Name: n.Name, State: h.state, Site: api.NodeSite(n.Labels), Labels: n.Labels,
			AgentVersion: n.AgentVersion, OS: n.OS, Arch: n.Arch, Transport: n.Transport, LastSeen: n.LastSeen}
		if h.conn != nil {
			row.Transport, row.LastSeen = h.conn.Session.Transport().String(), now
		}
		out.Nodes = append(out.Nodes, row)
	}
	return out, nil
}

// containsFold reports whether s contains lower (already lower case),
// ignoring case, without allocating for ASCII names.
func containsFold(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		j := 0
		for ; j < len(lower); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != lower[j] {
				break
			}
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}

func (c *Console) sees(s *signedIn) func(*store.Node) bool {
	return func(n *store.Node) bool { return c.cfg.Door.AuthorizeList(s.caller, *n) == nil }
}

func (c *Console) fleetPage(w http.ResponseWriter, r *http.Request, s *signedIn) {
	q, err := ParseFleetQuery(r)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	page, err := c.fleet.Page(r.Context(), c.sees(s), q)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// NodeDetail answers GET /ui/api/fleet/nodes/{name}.
type NodeDetail struct {
	store.Node
	State string `json:"state"`
	// Logins are those the caller's roles allow on this node (for the
	// terminal); "*" means any.
	Logins []string `json:"logins"`
}

func (c *Console) nodeDetail(w http.ResponseWriter, r *http.Request, s *signedIn) {
	name := r.PathValue("name")
	n, err := c.cfg.Store.GetNodeByName(r.Context(), name)
	// A node the caller may not see is answered like one that does not
	// exist: the console tells nobody which names exist beyond their roles.
	if errors.Is(err, store.ErrNotFound) || (err == nil && c.cfg.Door.AuthorizeList(s.caller, n) != nil) {
		writeErr(w, http.StatusNotFound, fmt.Sprintf("no node named %q among the nodes you may see", name))
		return
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	state, conn := stateOf(&n, live(c.cfg.Conns), c.cfg.StaleAfter, time.Now())
	n.Online = conn != nil
	if conn != nil {
		n.Transport = conn.Session.Transport().String()
	}
	d := NodeDetail{Node: n, State: state, Logins: []string{}}
	if s.caller.Operator != "" {
		if o, ok := c.cfg.Door.Snapshot().Operator(s.caller.Operator); ok {
			if ok, logins := roles.AllowedCompiled(o.Roles, n.Labels); ok {
				d.Logins = logins
			}
		}
	}
	writeJSON(w, http.StatusOK, d)
}

// fleetEvents streams server-sent events: "fleet" whenever a node comes,
// goes or turns stale (the page then re-reads its view). It polls the
// registry once a second rather than hooking every session: one cheap pass
// over the live sessions per open console, whatever the churn.
func (c *Console) fleetEvents(w http.ResponseWriter, r *http.Request, s *signedIn) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, ": tether console fleet events\n\n")
	_ = rc.Flush()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last uint64
	for n := 0; ; n++ {
		if fp := c.liveFingerprint(); fp != last {
			last = fp
			if _, err := fmt.Fprintf(w, "event: fleet\ndata: %d\n\n", fp); err != nil {
				return
			}
			_ = rc.Flush()
		} else if n%15 == 0 {
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			_ = rc.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
		if n%10 == 9 {
			// The session may have ended (signed out, operator removed).
			if _, err := c.signedIn(r); err != nil {
				_, _ = fmt.Fprint(w, "event: signedout\ndata: 0\n\n")
				return
			}
		}
	}
}

// liveFingerprint changes when a live session comes or goes or its
// staleness changes.
func (c *Console) liveFingerprint() uint64 {
	now := time.Now()
	var sum uint64
	var b [9]byte
	for _, conn := range c.cfg.Conns.All() {
		h := fnv.New64a()
		h.Write([]byte(conn.NodeID))
		binary.LittleEndian.PutUint64(b[:8], uint64(conn.Connected.UnixNano()))
		heard := conn.Connected
		if v := conn.Heard.Load(); v != 0 {
			heard = time.Unix(0, v)
		}
		b[8] = 0
		if now.Sub(heard) > c.cfg.StaleAfter {
			b[8] = 1
		}
		h.Write(b[:])
		sum += h.Sum64()
	}
	return sum
}
