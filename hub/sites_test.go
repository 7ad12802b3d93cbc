package hub

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

func siteToken(t *testing.T, c *apiclient.Client) string {
	t.Helper()
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1, Kind: "site"})
	if err != nil {
		t.Fatal(err)
	}
	return tok.JoinString
}

// startSiteHub runs a hub in-process that joins parent as site name.
func startSiteHub(t *testing.T, join, name string) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := New(context.Background(), Config{DataDir: dir, Listen: "127.0.0.1:0", SSHListen: "127.0.0.1:0",
		Site: SiteConfig{ParentJoin: join, Name: name, StatusInterval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("site hub Run: %v", err)
		}
	})
	return s
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSiteUplink: a site hub joins in-process; both ends see each other,
// control messages flow both ways through Handle, and route streams are
// refused with a reason while nobody serves them.
func TestSiteUplink(t *testing.T) {
	root, rc := testHub(t)
	got := make(chan *control.Message, 1)
	root.children.Handle(siteproto.TypeDesiredAck, func(_ context.Context, c site.Child, m *control.Message) {
		if c.Name == "berlin" {
			got <- m
		}
	})
	up := make(chan string, 1)
	root.children.ServeStreams(func(_ context.Context, c site.Child, st tunnel.Stream, r *siteproto.RouteRequest) {
		defer st.Close()
		if r.Target == "refuse" {
			_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "no such service here"})
			return
		}
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: true})
		up <- c.Name + " " + r.ServiceName
	})
	s := startSiteHub(t, siteToken(t, rc), "berlin")
	down := make(chan *control.Message, 1)
	s.uplink.Handle(siteproto.TypeDesired, func(_ context.Context, m *control.Message) { down <- m })

	waitUntil(t, "berlin healthy at the root", func() bool {
		c, ok := root.children.Get("berlin")
		return ok && c.Connected && c.Status != nil && c.Health() == siteproto.Healthy
	})
	if !s.uplink.Connected() || s.uplink.Path() != "berlin" || len(s.uplink.Ancestors()) != 1 ||
		s.uplink.Ancestors()[0] != root.ca.Pin() ||
		s.uplink.ParentHubID() != root.ca.Pin() {
		t.Fatalf("uplink: connected %v, path %q, ancestors %v", s.uplink.Connected(), s.uplink.Path(), s.uplink.Ancestors())
	}
	ack := siteproto.DesiredAck{Kind: "mission", Origin: root.ca.Pin(), Name: "m", Generation: 1}
	if err := s.uplink.Send(&control.Message{
		Type: siteproto.TypeDesiredAck, DesiredAcks: []siteproto.DesiredAck{ack},
	}); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m.DesiredAcks[0] != ack {
		t.Fatalf("root got %+v", m)
	}
	obj := siteproto.DesiredObject{Kind: "mission", Origin: root.ca.Pin(), Name: "m", Generation: 1, Spec: []byte(`{}`)}
	if err := root.children.Send(context.Background(), "berlin", &control.Message{
		Type: siteproto.TypeDesired, Desired: []siteproto.DesiredObject{obj},
	}); err != nil {
		t.Fatal(err)
	}
	if m := <-down; m.Desired[0].Name != "m" {
		t.Fatalf("site got %+v", m)
	}

	// Route streams up: the parent's callback gets them, or its refusal
	// comes back as the error.
	upReq := &siteproto.RouteRequest{Target: "m2.munich", Service: uint8(tunnel.ServiceTCP), Port: 5432,
		Purpose: siteproto.PurposeService, ServiceName: "db", Origin: s.ca.Pin()}
	st0, err := s.uplink.OpenRoute(context.Background(), upReq)
	if err != nil {
		t.Fatal(err)
	}
	st0.Close()
	if got := <-up; got != "berlin db" {
		t.Fatalf("parent served %q", got)
	}
	upReq.Target = "refuse"
	if _, err := s.uplink.OpenRoute(context.Background(), upReq); err == nil ||
		!strings.Contains(err.Error(), "no such service here") {
		t.Fatalf("refused route up: %v", err)
	}
	// Route streams down: refused while the site serves none.
	req := &siteproto.RouteRequest{Target: "n1", Service: uint8(tunnel.ServiceSSH), Purpose: siteproto.PurposeJump,
		Origin: root.ca.Pin()}
	conn, ok := root.children.Session("berlin")
	if !ok {
		t.Fatal("no session for berlin")
	}
	st, err := conn.Session.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceRoute}); err != nil {
		t.Fatal(err)
	}
	// The site keeps its parent's streams: each carries a resume id.
	if st, err = conn.OpenResumable(st); err != nil {
		t.Fatal(err)
	}
	if err := siteproto.WriteRouteRequest(st, req); err != nil {
		t.Fatal(err)
	}
	// (With the site route wired in, the site's door answers: no such node.)
	if rep, err := tunnel.ReadReply(st); err != nil || rep.OK ||
		!(strings.Contains(rep.Reason, "serves no routes") || strings.Contains(rep.Reason, `no node named "n1"`)) {
		t.Fatalf("route down without a server: %+v, %v", rep, err)
	}
	// And with one.
	served := make(chan string, 1)
	s.uplink.ServeRoutes(func(_ context.Context, st tunnel.Stream, r *siteproto.RouteRequest) {
		defer st.Close()
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: true})
		served <- r.Target
	})
	st2, err := conn.Session.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	_ = tunnel.WriteHeader(st2, tunnel.Header{Service: tunnel.ServiceRoute})
	if st2, err = conn.OpenResumable(st2); err != nil {
		t.Fatal(err)
	}
	_ = siteproto.WriteRouteRequest(st2, req)
	if rep, err := tunnel.ReadReply(st2); err != nil || !rep.OK {
		t.Fatalf("route down with a server: %+v, %v", rep, err)
	}
	if target := <-served; target != "n1" {
		t.Fatalf("served %q", target)
	}
}

// TestSiteTokensAndNodeTokensStayApart: a node token's certificate cannot
// announce a site, a site token's certificate cannot serve as a node's,
// and neither token joins as the other kind.
func TestSiteTokensAndNodeTokensStayApart(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	if _, err := edge.Enroll(
		ctx, edge.JoinOptions{JoinString: siteToken(t, c), Name: "n9"},
	); err == nil || !strings.Contains(err.Error(), "this is a site token") {
		t.Fatalf("a node joining with a site token: %v", err)
	}
	nodeTok, _ := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if _, err := edge.Enroll(ctx, edge.JoinOptions{
		JoinString: nodeTok.JoinString, Name: "s9", Kind: control.JoinSite,
	}); err == nil || !strings.Contains(err.Error(), "this is a node token") {
		t.Fatalf("a site joining with a node token: %v", err)
	}

	node := joinNode(t, c, "n1")
	if _, err := edge.Enroll(ctx, edge.JoinOptions{
		JoinString: siteToken(t, c), Name: "n1", Kind: control.JoinSite,
	}); err == nil || !strings.Contains(err.Error(), "choose another --site") {
		t.Fatalf("a site named as a node: %v", err)
	}
	siteID, err := edge.Join(ctx, edge.JoinOptions{
		JoinString: siteToken(t, c), StateDir: filepath.Join(t.TempDir(), "s1"), Name: "s1", Kind: control.JoinSite,
	})
	if err != nil {
		t.Fatal(err)
	}
	fakeID := strings.Repeat("e", 64)
	for _, tc := range []struct {
		name  string
		id    *edge.Identity
		hello *control.Hello
		want  string
	}{
		{"node certificate announces a site", node, &control.Hello{
			ProtocolVersion: control.ProtocolVersion, Name: "n1", Capabilities: []string{siteproto.CapSite},
			Site: &siteproto.Hello{Name: "n1", HubID: fakeID, Subtree: []string{fakeID}},
		}, "joined with a node token"},
		{"site certificate says hello as a node", siteID,
			&control.Hello{ProtocolVersion: control.ProtocolVersion, Name: "s1"}, "joined with a site token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := dialAs(t, tc.id, tunnel.TransportTCP)
			ctrl, err := sess.OpenStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := control.Write(ctrl, &control.Message{Type: control.TypeHello, Hello: tc.hello}); err != nil {
				t.Fatal(err)
			}
			m, err := control.Read(ctrl)
			if err != nil || m.Type != control.TypeNotice || !m.Fatal || !strings.Contains(m.Notice, tc.want) {
				t.Fatalf("got %+v, %v; want a fatal notice saying %q", m, err, tc.want)
			}
			waitDone(t, sess, tc.name)
		})
	}
}
