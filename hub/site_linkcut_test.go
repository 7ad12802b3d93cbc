package hub

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// siteBehindLink runs a site hub, name, of the parent whose API client is
// pc, whose uplink reaches the parent through a fault link, with short
// keepalives (a cut ends its uplink's session within a second); it returns
// the site, its API client and the link.
func siteBehindLink(t *testing.T, pc *apiclient.Client, name string, transport tunnel.Transport) (*Server,
	*apiclient.Client, *faultproxy.Link) {
	t.Helper()
	join := siteToken(t, pc)
	js, err := pki.ParseJoinString(join)
	if err != nil {
		t.Fatal(err)
	}
	link, err := faultproxy.NewLink("127.0.0.1:0", js.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	s, c := testHubConfig(t, func(cfg *Config) {
		// Joined first, and then told to reach the parent through the
		// link (the join's answer names the parent's own address).
		dir := filepath.Join(cfg.DataDir, parentDir)
		if _, err := site.JoinParent(context.Background(), dir, join, name, Version); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, "parent.json")
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var pj map[string]any
		if err := json.Unmarshal(b, &pj); err != nil {
			t.Fatal(err)
		}
		pj["hubs"] = []string{link.Addr()}
		if b, err = json.Marshal(pj); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Tunnel = linkCutTunnel
		cfg.Site = SiteConfig{Name: name, StatusInterval: 200 * time.Millisecond, Transport: transport}
	})
	return s, c, link
}

// TestRouteThroughSiteOutlivesItsUplink: a stream the root routes through
// a site hub to a node below it (a jump's, a job's) keeps working across a
// cut of the site's uplink that ends the uplink's session, on both
// transports: the site holds the route on below, reconnects and
// re-attaches the stream, and what was written during the cut arrives. A
// cut longer than the root's resume window ends the stream with a reason
// that names the site's uplink; on a root that does not keep streams
// (--resume-window 0) a cut ends it at once.
func TestRouteThroughSiteOutlivesItsUplink(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport tunnel.Transport
		window    time.Duration
	}{
		{"quic", tunnel.TransportQUIC, 0},
		{"tcp", tunnel.TransportTCP, 0},
		{"tcp past the window", tunnel.TransportTCP, time.Second},
		{"tcp without resuming", tunnel.TransportTCP, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, rc := testHubConfig(t, func(cfg *Config) { cfg.ResumeWindow, cfg.Tunnel = tc.window, linkCutTunnel })
			berlin, bc, link := siteBehindLink(t, rc, "berlin", tc.transport)
			_, port, _ := nodeBehindLink(t, berlin, joinNode(t, bc, "n1"), tunnel.TransportTCP, linkCutTunnel)
			ctx := access.WithHop(context.Background(), access.Hop{Purpose: siteproto.PurposeJump, Operator: "test"})
			var st tunnel.Stream
			waitFor(t, "a route from the root to n1.berlin", func() bool {
				_, route, err := root.door.Resolve(ctx, access.ByName("n1.berlin"))
				if err == nil {
					st, err = route.Dial(ctx, tunnel.Header{Service: tunnel.ServiceTCP, Port: port})
				}
				return err == nil
			})
			defer st.Close()
			echo(t, st, "before the cut")

			first, ok := root.children.Session("berlin")
			if !ok {
				t.Fatal("berlin has no session at the root")
			}
			writeDuringCut(t, link, st, first.Session, "the site's session")
			if tc.window > 0 {
				// The root's window passes while the link is down.
				_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := st.Read(make([]byte, 1))
				var ended *resume.EndedError
				if !errors.As(err, &ended) || !errors.Is(err, resume.ErrExpired) ||
					!strings.Contains(ended.Reason, "site berlin's uplink was down") {
					t.Fatalf("read past the window: %v; want the end of the stream naming the site's uplink", err)
				}
				return
			}
			if err := link.Up(); err != nil {
				t.Fatal(err)
			}
			got, err := readAfterCut(st, 15*time.Second)
			if tc.window < 0 {
				if err == nil {
					t.Fatal("a route outlived the site's uplink session on a root that does not keep streams")
				}
				return
			}
			if err != nil || got != duringCut {
				t.Fatalf("echo of what was written during the cut: %q, %v", got, err)
			}
			if now, ok := root.children.Session("berlin"); !ok || now == first {
				t.Fatal("the stream works, but the site has no new session")
			}
			echo(t, st, "after the cut")
		})
	}
}
