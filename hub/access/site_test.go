package access

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

const testHubID = "1111111111111111111111111111111111111111111111111111111111111111"

// fakeSites is a hub's child sites: berlin (reachable) with n1 (role=pos),
// n2 (role=kiosk), off-1 (offline), gone-1 (revoked) and n3.sub (a node of
// berlin's own site sub); munich (down since a fixed time) with m1.
type fakeSites struct {
	children map[string]SiteState
	nodes    []SiteNode
	opened   []*siteproto.RouteRequest
	openTo   []string
}

func newFakeSites(down time.Time) *fakeSites {
	return &fakeSites{
		children: map[string]SiteState{"berlin": {Reachable: true}, "munich": {Since: down}},
		nodes: []SiteNode{
			{Name: "n1.berlin", ID: "inv-n1", Labels: map[string]string{"role": "pos", "site": "mitte"}, Online: true},
			{Name: "n2.berlin", ID: "inv-n2", Labels: map[string]string{"role": "kiosk"}, Online: true},
			{Name: "off-1.berlin", ID: "inv-off", Online: false, LastSeen: time.Now().Add(-2 * time.Minute)},
			{Name: "gone-1.berlin", ID: "inv-gone", Revoked: true, Online: true},
			{Name: "n3.sub.berlin", ID: "inv-n3", Labels: map[string]string{"role": "pos"}, Online: true},
			{Name: "m1.munich", ID: "inv-m1", Online: true},
		},
	}
}

func (f *fakeSites) HubID() string { return testHubID }

func (f *fakeSites) Child(name string) (SiteState, bool) {
	s, ok := f.children[name]
	return s, ok
}

func (f *fakeSites) Node(_ context.Context, id, name string) (SiteNode, error) {
	for _, n := range f.nodes {
		if (id != "" && n.ID == id) || (id == "" && n.Name == name) {
			return n, nil
		}
	}
	return SiteNode{}, fmt.Errorf("inventory: %w", store.ErrNotFound)
}

func (f *fakeSites) Nodes(context.Context) ([]SiteNode, error) { return f.nodes, nil }

func (f *fakeSites) OpenRoute(_ context.Context, child string, req *siteproto.RouteRequest) (tunnel.Stream, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	f.opened = append(f.opened, req)
	f.openTo = append(f.openTo, child)
	a, b := net.Pipe()
	b.Close()
	return pipeStream{a}, nil
}

type pipeStream struct{ net.Conn }

func (pipeStream) CloseWrite() error { return nil }

func TestResolveSite(t *testing.T) {
	f := newFixture(t)
	down := time.Now().Add(-3*time.Minute - 5*time.Second)
	sites := newFakeSites(down)
	f.door.SetSites(sites)
	ctx := context.Background()
	for _, tc := range []struct {
		ref     NodeRef
		want    error // nil: a site route
		wantMsg string
		child   string
		target  string
	}{
		{ref: ByName("n1.berlin"), child: "berlin", target: "n1"},
		{ref: ByID("inv-n1"), child: "berlin", target: "n1"},
		{ref: ByName("n3.sub.berlin"), child: "berlin", target: "n3.sub"},
		{ref: ByName("n9.berlin"), want: ErrUnknownNode, wantMsg: `no node named "n9.berlin" in site berlin's inventory`},
		// A name outside every child's subtree resolves to nothing.
		{ref: ByName("n1.paris"), want: ErrUnknownNode, wantMsg: `this hub has no site "paris"`},
		{ref: ByName("n1.berlin.paris"), want: ErrUnknownNode, wantMsg: `no site "paris"`},
		{ref: ByID("inv-ghost"), want: ErrUnknownNode, wantMsg: "nor in any site's inventory"},
		{ref: ByName("gone-1.berlin"), want: ErrRevoked, wantMsg: "revoked at its site"},
		{ref: ByName("off-1.berlin"), want: ErrOffline, wantMsg: `node "off-1.berlin" is offline (last seen 2m`},
		{ref: ByName("m1.munich"), want: ErrOffline,
			wantMsg: "site munich unreachable since " + down.UTC().Format(time.RFC3339) + " (3m ago)"},
		// The hub's own nodes still resolve as before.
		{ref: ByName("berlin-1"), want: ErrOffline, wantMsg: `node "berlin-1" is offline`},
	} {
		n, route, err := f.door.Resolve(ctx, tc.ref)
		if tc.want != nil {
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Resolve(%s) = %v, want %v containing %q", tc.ref, err, tc.want, tc.wantMsg)
			}
			if route != nil {
				t.Errorf("Resolve(%s) gave a route with an error", tc.ref)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Resolve(%s): %v", tc.ref, err)
		}
		if route.String() != "site "+tc.child {
			t.Errorf("Resolve(%s) route %s, want site %s", tc.ref, route, tc.child)
		}
		st, err := route.Dial(WithHop(ctx, Hop{Purpose: siteproto.PurposeJob, Operator: "alice", Trace: "t1"}),
			tunnel.Header{Service: tunnel.ServiceSSH})
		if err != nil {
			t.Fatalf("Dial %s: %v", tc.ref, err)
		}
		st.Close()
		req := sites.opened[len(sites.opened)-1]
		if sites.openTo[len(sites.openTo)-1] != tc.child || req.Target != tc.target || req.Origin != testHubID ||
			req.Purpose != siteproto.PurposeJob || req.Operator != "alice" || req.Trace != "t1" ||
			req.Service != uint8(tunnel.ServiceSSH) {
			t.Errorf("Resolve(%s) opened %+v to %s, want target %s at %s", tc.ref, req,
				sites.openTo[len(sites.openTo)-1], tc.target, tc.child)
		}
		if n.Labels["site"] == "" {
			t.Errorf("%s has no site label", n.Name)
		}
	}
}

func TestSiteUnreachableIsOffline(t *testing.T) {
	err := error(&SiteUnreachableError{Site: "berlin", Since: time.Date(2026, 11, 24, 8, 40, 0, 0, time.UTC)})
	if !errors.Is(err, ErrOffline) {
		t.Fatal("a site unreachable error does not match ErrOffline")
	}
	if !strings.HasPrefix(err.Error(), "site berlin unreachable since 2026-11-24T08:40:00Z (") {
		t.Fatalf("message %q", err)
	}
	if got := (&SiteUnreachableError{Site: "berlin"}).Error(); got != "site berlin unreachable (never connected)" {
		t.Fatalf("never connected: %q", got)
	}
}

// TestSiteAuthorization: decisions about nodes below a site are this
// hub's, with this hub's roles on the inventory labels plus site=SUFFIX,
// which replaces the site label a node carries at its own hub.
func TestSiteAuthorization(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, r := range []store.Role{
		{Name: "berlin-pos", Nodes: "site=berlin,role=pos", Logins: []string{"root"}},
		{Name: "mitte", Nodes: "site=mitte", Logins: []string{"root"}},
	} {
		if err := f.st.PutRole(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for name, rs := range map[string][]string{"pos": {"berlin-pos"}, "mitte": {"mitte"}} {
		k := newKey(t)
		if err := f.st.AddOperator(ctx, store.Operator{
			Name: name, PublicKey: string(gossh.MarshalAuthorizedKey(k.PublicKey())),
			Fingerprint: gossh.FingerprintSHA256(k.PublicKey()), Roles: rs, CreatedAt: time.Now(),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	f.door.SetSites(newFakeSites(time.Now()))
	for _, tc := range []struct {
		operator, node string
		allowed        bool
	}{
		{"pos", "n1.berlin", true},
		{"pos", "n2.berlin", false},     // role=kiosk: not selected
		{"pos", "n3.sub.berlin", false}, // site=sub.berlin, not berlin
		{"mitte", "n1.berlin", false},   // the node's own site label is replaced
		{"alice", "n1.berlin", true},    // berlin-ops selects site=berlin
		{"nobody", "n1.berlin", false},
		{"root", "n3.sub.berlin", true},
	} {
		n, _, err := f.door.Resolve(ctx, ByName(tc.node))
		if err != nil {
			t.Fatalf("Resolve %s: %v", tc.node, err)
		}
		err = f.door.AuthorizeJump(tc.operator, n)
		if (err == nil) != tc.allowed {
			t.Errorf("AuthorizeJump(%s, %s) = %v, want allowed %v", tc.operator, tc.node, err, tc.allowed)
		}
	}
	// Jobs: the role of an API token decides on the same labels.
	n, _, _ := f.door.Resolve(ctx, ByName("n2.berlin"))
	if err := f.door.AuthorizeJob(Caller{Role: "berlin-pos", Name: "apitoken:x"}, n); !errors.Is(err, ErrDenied) {
		t.Errorf("AuthorizeJob on n2.berlin with berlin-pos = %v, want denied", err)
	}
	n, _, _ = f.door.Resolve(ctx, ByName("n1.berlin"))
	if err := f.door.AuthorizeJob(Caller{Role: "berlin-pos", Name: "apitoken:x"}, n); err != nil {
		t.Errorf("AuthorizeJob on n1.berlin with berlin-pos = %v, want allowed", err)
	}
}

func TestInventoryNodes(t *testing.T) {
	f := newFixture(t)
	if ns, err := f.door.InventoryNodes(context.Background()); err != nil || len(ns) != 0 {
		t.Fatalf("without sites: %v, %v", ns, err)
	}
	f.door.SetSites(newFakeSites(time.Now()))
	ns, err := f.door.InventoryNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range ns {
		got[n.Name] = n.Labels["site"]
	}
	if got["n1.berlin"] != "berlin" || got["n3.sub.berlin"] != "sub.berlin" || got["m1.munich"] != "munich" {
		t.Fatalf("site labels: %v", got)
	}
	for _, n := range ns {
		if n.Name == "m1.munich" && n.Online {
			t.Error("a node below an unreachable site is listed online")
		}
		if n.Name == "n1.berlin" && !n.Online {
			t.Error("n1.berlin is listed offline")
		}
	}
}

// TestAuthorizeRoute: a site serves its parent's route requests only for
// a node of its own subtree; a name outside it resolves to nothing, even
// when a node of that name exists elsewhere in the tree.
func TestAuthorizeRoute(t *testing.T) {
	f := newFixture(t)
	f.door.SetSites(newFakeSites(time.Now()))
	ctx := context.Background()
	ok := siteproto.RouteRequest{Target: "n1.berlin", Service: 1, Purpose: siteproto.PurposeJump, Origin: testHubID}
	if _, route, err := f.door.Serve(ctx, &ok); err != nil || route == nil {
		t.Fatalf("Serve(n1.berlin) = %v", err)
	}
	for name, req := range map[string]siteproto.RouteRequest{
		"outside the subtree": {Target: "n1.paris", Service: 1, Purpose: siteproto.PurposeJump, Origin: testHubID},
		"unknown own node":    {Target: "ghost", Service: 1, Purpose: siteproto.PurposeJump, Origin: testHubID},
	} {
		if _, _, err := f.door.Serve(ctx, &req); !errors.Is(err, ErrUnknownNode) {
			t.Errorf("%s: Serve = %v, want ErrUnknownNode", name, err)
		}
	}
	for name, req := range map[string]siteproto.RouteRequest{
		"service purpose": {Target: "n1.berlin", Service: 1, Purpose: siteproto.PurposeService, ServiceName: "db",
			Origin: testHubID},
		"route service": {Target: "n1.berlin", Service: 3, Purpose: siteproto.PurposeJump, Origin: testHubID},
		"bad origin":    {Target: "n1.berlin", Service: 1, Purpose: siteproto.PurposeJump, Origin: "root"},
	} {
		if _, _, err := f.door.Serve(ctx, &req); !errors.Is(err, ErrDenied) {
			t.Errorf("%s: Serve = %v, want ErrDenied", name, err)
		}
	}
}

// TestScopedCAsFor: a site trusts each hub above it only for what that
// hub's roles grant on the node as that hub sees it (site=SUFFIX).
func TestScopedCAsFor(t *testing.T) {
	root := strings.Repeat("a", 64)
	region := strings.Repeat("b", 64)
	tr := CompileAncestorTrust(&siteproto.Trust{Ancestors: []siteproto.AncestorTrust{
		{HubID: region, Suffix: "berlin", UserCAs: []string{"region-ca"}, ProvisionLogin: "root",
			Roles: []siteproto.TrustRole{{Name: "ops", Selector: "site=berlin", Logins: []string{"ubuntu"}}}},
		{HubID: root, Suffix: "berlin.eu", UserCAs: []string{"root-ca"}, RevokedKeys: []string{"bad-key"},
			ProvisionLogin: "admin",
			Roles: []siteproto.TrustRole{
				{Name: "pos", Selector: "site=berlin.eu,role=pos", Logins: []string{"root"}, NoForwarding: true},
				{Name: "all", Selector: "*", Logins: []string{"*"}},
				{Name: "munich", Selector: "site=munich.eu", Logins: []string{"root"}},
				{Name: "broken", Selector: "site==", Logins: []string{"root"}},
			}},
	}})
	scoped, revoked := tr.ScopedCAsFor(map[string]string{"role": "pos", "site": "own-label"})
	if len(scoped) != 2 || len(revoked) != 1 {
		t.Fatalf("scoped %+v revoked %v", scoped, revoked)
	}
	reg, rt := scoped[0], scoped[1]
	if fmt.Sprint(reg.Principals) != "map[root:[tether-hub] ubuntu:[tether:ops:ubuntu]]" || reg.Keys[0] != "region-ca" {
		t.Errorf("region: %+v", reg)
	}
	if fmt.Sprint(rt.Principals) != "map[admin:[tether-hub] root:[tether:pos:root]]" ||
		fmt.Sprint(rt.AnyLogin) != "[tether:all:*]" ||
		fmt.Sprint(rt.NoForwarding) != "[tether:pos:root]" {
		t.Errorf("root: %+v", rt)
	}
	// A node the root's pos role does not select gets no pos principal.
	scoped, _ = tr.ScopedCAsFor(map[string]string{"role": "kiosk"})
	if _, ok := scoped[1].Principals["root"]; ok {
		t.Errorf("kiosk node: root grants %+v", scoped[1].Principals)
	}
}
