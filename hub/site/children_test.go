package site

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// hubIDs are made-up hub IDs (64 hex digits).
func hubID(c byte) string { return strings.Repeat(string(c), 64) }

var (
	self   = hubID('a')
	parent = hubID('b')
	berlin = hubID('c')
	below  = hubID('d')
)

// idleSession is a site session that carries nothing: enough for the
// parent's bookkeeping, which never writes to it in these tests.
type idleSession struct {
	tunnel.Session
	done chan struct{}
	once sync.Once
}

func newIdleSession() *idleSession { return &idleSession{done: make(chan struct{})} }

func (s *idleSession) AcceptStream(ctx context.Context) (tunnel.Stream, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, tunnel.ErrSessionClosed
	}
}
func (s *idleSession) RemoteAddr() net.Addr        { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (s *idleSession) Done() <-chan struct{}       { return s.done }
func (s *idleSession) Close() error                { s.once.Do(func() { close(s.done) }); return nil }
func (s *idleSession) Transport() tunnel.Transport { return tunnel.TransportQUIC }

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// fixture is a parent hub's Children on a real store, with site berlin
// (joined with a site token) and node n1 (a node token).
type fixture struct {
	st    *store.DB
	c     *Children
	clock *clock
	audit []store.AuditEvent
	mu    sync.Mutex
}

func newFixture(t testing.TB, above func() (string, []string)) *fixture {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, j := range []struct{ kind, id, name string }{{store.TokenSite, "s1", "berlin"}, {store.TokenNode, "n1", "n1"}} {
		if err := st.CreateToken(ctx, store.Token{
			ID:         "t" + j.id,
			SecretHash: []byte("h"),
			UsesLeft:   1,
			ExpiresAt:  time.Now().Add(time.Hour),
			Kind:       j.kind,
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(ctx, "t"+j.id, func(store.Token) error { return nil },
			store.Node{ID: j.id, Name: j.name}); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{st: st, clock: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	f.c = f.open(t, above)
	return f
}

func (f *fixture) open(t testing.TB, above func() (string, []string)) *Children {
	t.Helper()
	c, err := NewChildren(context.Background(), ChildrenConfig{
		Store:      f.st,
		HubID:      self,
		Above:      above,
		StaleAfter: 30 * time.Second,
		Now:        f.clock.now,
		Audit:      func(e store.AuditEvent) { f.mu.Lock(); f.audit = append(f.audit, e); f.mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func siteHello(subtree ...string) *siteproto.Hello {
	return &siteproto.Hello{Name: "berlin", HubID: berlin, Subtree: append([]string{berlin}, subtree...)}
}

// connect admits and connects berlin; the returned function disconnects it.
func (f *fixture) connect(t testing.TB) (*nodeconn.Conn, func()) {
	t.Helper()
	h := siteHello(below)
	w, err := f.c.Admit(context.Background(), "s1", "berlin", h)
	if err != nil {
		t.Fatal(err)
	}
	conn := nodeconn.NewConn("s1", "berlin", newIdleSession(), nil)
	done := f.c.Connected(context.Background(), conn, h, w)
	return conn, func() { conn.Session.Close(); done() }
}

func TestAdmit(t *testing.T) {
	above := func() (string, []string) { return "region", []string{parent} }
	for _, tc := range []struct {
		name   string
		nodeID string
		hello  *siteproto.Hello
		want   error
	}{
		{"a site below", "s1", siteHello(below), nil},
		{"subtree holds this hub", "s1", siteHello(self), ErrCycle},
		{"subtree holds a hub above", "s1", siteHello(parent), ErrCycle},
		{"the site is this hub", "s1", &siteproto.Hello{Name: "berlin", HubID: self, Subtree: []string{self}}, ErrCycle},
		{
			"a node token's certificate",
			"n1",
			&siteproto.Hello{Name: "n1", HubID: berlin, Subtree: []string{berlin}},
			ErrNotSite,
		},
		{"another site's name", "s1", &siteproto.Hello{Name: "munich", HubID: berlin, Subtree: []string{berlin}}, ErrNotSite},
		{"no site section", "s1", nil, ErrNotSite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, above)
			name := "berlin"
			if tc.nodeID == "n1" {
				name = "n1"
			}
			w, err := f.c.Admit(context.Background(), tc.nodeID, name, tc.hello)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Admit = %v, want %v", err, tc.want)
			}
			if tc.want == nil &&
				(w.Path != "berlin.region" || len(w.Ancestors) != 2 || w.Ancestors[0] != self || w.Ancestors[1] != parent) {
				t.Fatalf("welcome = %+v", w)
			}
		})
	}
}

func status(seq uint64, online int) *control.Message {
	return &control.Message{
		Type:       siteproto.TypeStatus,
		SiteStatus: &siteproto.Status{Seq: seq, Health: siteproto.Healthy, NodesOnline: online, NodesTotal: 9},
	}
}

func TestStaleAfterSilence(t *testing.T) {
	f := newFixture(t, nil)
	conn, disconnect := f.connect(t)
	if _, err := f.c.Dispatch(context.Background(), conn, status(1, 3)); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		wait      time.Duration
		stale     bool
		staleFor  time.Duration
		connected bool
	}{
		{0, false, 0, true},
		{30 * time.Second, false, 0, true}, // at the timeout: not yet
		{time.Second, true, 31 * time.Second, true},
	}
	for i, s := range steps {
		f.clock.add(s.wait)
		c, _ := f.c.Get("berlin")
		if c.Stale != s.stale || c.StaleFor != s.staleFor || c.Connected != s.connected {
			t.Fatalf("step %d: stale %v for %s, connected %v; want %v for %s", i, c.Stale, c.StaleFor, c.Connected, s.stale,
				s.staleFor)
		}
		if want := map[bool]string{true: siteproto.Stale, false: siteproto.Healthy}[s.stale]; c.Health() != want {
			t.Fatalf("step %d: health %s, want %s", i, c.Health(), want)
		}
	}
	// A status brings it back; a cut link makes it unreachable at once and
	// stale after the timeout.
	if _, err := f.c.Dispatch(context.Background(), conn, status(2, 3)); err != nil {
		t.Fatal(err)
	}
	cutAt := f.clock.now()
	disconnect()
	c, _ := f.c.Get("berlin")
	if c.Stale || c.Connected || !c.Since.Equal(cutAt) {
		t.Fatalf("just cut: %+v", c)
	}
	var ue *UnreachableError
	if err := f.c.Send(context.Background(), "berlin", status(3, 3)); !errors.As(err, &ue) ||
		!errors.Is(err, ErrSiteUnreachable) || !ue.Since.Equal(cutAt) {
		t.Fatalf("Send to a cut site = %v", err)
	}
	if !strings.Contains(ue.Error(), "site berlin unreachable since") {
		t.Fatalf("error %q", ue.Error())
	}
	f.clock.add(time.Minute)
	if c, _ = f.c.Get("berlin"); !c.Stale || c.StaleFor != time.Minute {
		t.Fatalf("cut a minute ago: stale %v for %s", c.Stale, c.StaleFor)
	}
}

func TestStatusSeqDropsDuplicates(t *testing.T) {
	f := newFixture(t, nil)
	conn, _ := f.connect(t)
	for _, s := range []struct {
		seq        uint64
		online     int
		wantOnline int
	}{{5, 5, 5}, {3, 3, 5}, {5, 4, 5}, {6, 6, 6}} {
		if _, err := f.c.Dispatch(context.Background(), conn, status(s.seq, s.online)); err != nil {
			t.Fatal(err)
		}
		if c, _ := f.c.Get("berlin"); c.Status.NodesOnline != s.wantOnline {
			t.Fatalf("after seq %d: online %d, want %d", s.seq, c.Status.NodesOnline, s.wantOnline)
		}
	}
	// A restarted parent remembers the last Seq.
	c2 := f.open(t, nil)
	if got, _ := c2.Get("berlin"); got.Status == nil || got.Status.Seq != 6 {
		t.Fatalf("reloaded status = %+v", got.Status)
	}
}

func nodesMsg(full, done bool, removed []string, names ...string) *control.Message {
	m := &siteproto.Nodes{Full: full, Done: done, Removed: removed}
	for _, n := range names {
		m.Nodes = append(m.Nodes, siteproto.Node{
			Name:   n,
			ID:     "id-" + n,
			Labels: map[string]string{"site": "munich", "role": "pos"},
		})
	}
	return &control.Message{Type: siteproto.TypeNodes, SiteNodes: m}
}

func TestInventoryPages(t *testing.T) {
	f := newFixture(t, nil)
	conn, _ := f.connect(t)
	ctx := context.Background()
	list := func() map[string]store.SiteNode {
		t.Helper()
		l, err := f.st.ListSiteNodes(ctx, "s1")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]store.SiteNode{}
		for _, n := range l {
			out[n.FullName()] = n
		}
		return out
	}
	steps := []struct {
		msg  *control.Message
		want []string
	}{
		{nodesMsg(true, true, nil, "old"), []string{"old.berlin"}},
		// A new full run: the old inventory stays until its last page.
		{nodesMsg(true, false, nil, "n1", "n2.sub"), []string{"old.berlin"}},
		{nodesMsg(false, false, nil, "n3"), []string{"old.berlin"}},
		{nodesMsg(false, true, nil, "n4"), []string{"n1.berlin", "n2.sub.berlin", "n3.berlin", "n4.berlin"}},
		// Then changes.
		{nodesMsg(false, false, []string{"n3", "n4"}, "n5"), []string{"n1.berlin", "n2.sub.berlin", "n5.berlin"}},
	}
	for i, s := range steps {
		if _, err := f.c.Dispatch(ctx, conn, s.msg); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got := list()
		if len(got) != len(s.want) {
			t.Fatalf("step %d: inventory %v, want %v", i, got, s.want)
		}
		for _, w := range s.want {
			if _, ok := got[w]; !ok {
				t.Fatalf("step %d: %s missing from %v", i, w, got)
			}
		}
	}
	// The site label is the node's site path relative to this hub,
	// whatever the site claimed.
	got := list()
	if l := got["n1.berlin"].Labels; l["site"] != "berlin" || l["role"] != "pos" {
		t.Fatalf("n1 labels %v", l)
	}
	if l := got["n2.sub.berlin"].Labels; l["site"] != "sub.berlin" {
		t.Fatalf("n2.sub labels %v", l)
	}
}

func TestInventoryNamesOutsideTheSubtree(t *testing.T) {
	// Both valid at the site, so the site protocol's own checks let them through.
	deep := "n" + strings.Repeat(".s", siteproto.MaxDepth)       // one site too deep here
	long := "n" + strings.Repeat("."+strings.Repeat("x", 61), 4) // 249 bytes: too long here
	for _, n := range []string{deep, long} {
		if err := siteproto.ValidNodePath(n); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
	for _, tc := range []struct {
		name string
		msg  *control.Message
	}{
		{"too deep once named here", nodesMsg(false, false, nil, deep)},
		{"in a full run", nodesMsg(true, true, nil, "n1", deep)},
		{"removal too deep once named here", nodesMsg(false, false, []string{deep})},
		{"too long once named here", nodesMsg(false, false, nil, long)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil)
			conn, _ := f.connect(t)
			handled, err := f.c.Dispatch(context.Background(), conn, tc.msg)
			if !handled || err == nil {
				t.Fatalf("Dispatch = %v, %v; want the session closed", handled, err)
			}
			if len(f.audit) != 1 || f.audit[0].Result != "refused" || f.audit[0].Node != "berlin" {
				t.Fatalf("audit = %+v", f.audit)
			}
			if l, _ := f.st.ListSiteNodes(context.Background(), ""); len(l) != 0 {
				t.Fatalf("stored %v", l)
			}
		})
	}
}

func TestDispatchIgnoresNonSites(t *testing.T) {
	f := newFixture(t, nil)
	conn := nodeconn.NewConn("n1", "n1", newIdleSession(), nil)
	if handled, err := f.c.Dispatch(context.Background(), conn, status(1, 1)); handled || err != nil {
		t.Fatalf("a node's site_status handled: %v, %v", handled, err)
	}
}

func TestListFollowsTheStore(t *testing.T) {
	f := newFixture(t, nil)
	conn, _ := f.connect(t)
	if _, err := f.c.Dispatch(context.Background(), conn, status(4, 1)); err != nil {
		t.Fatal(err)
	}
	// Another replica stored a newer status: List shows it.
	other := f.open(t, nil)
	if l := other.List(); len(l) != 1 || l[0].Status == nil || l[0].Status.Seq != 4 || l[0].Connected {
		t.Fatalf("other replica lists %+v", l)
	}
	if _, err := f.st.SetSiteStatus(context.Background(), "s1", 9, []byte(`{"seq":9,"health":"degraded"}`),
		f.clock.now()); err != nil {
		t.Fatal(err)
	}
	if l := f.c.List(); len(l) != 1 || l[0].Status.Seq != 9 || l[0].Health() != siteproto.Degraded {
		t.Fatalf("after a newer stored status: %+v", l)
	}
	// A removed site is gone.
	if err := f.st.DeleteNode(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if l := f.c.List(); len(l) != 0 {
		t.Fatalf("after removal: %+v", l)
	}
	if _, ok := f.c.Get("berlin"); ok {
		t.Fatal("Get finds a removed site")
	}
}
