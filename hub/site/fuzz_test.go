package site

import (
	"bytes"
	"context"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// FuzzSiteMessages: whatever a site sends on its control stream, what the
// parent keeps is named inside the site's subtree (NAME.berlin, a valid
// node path there) and labelled with its own site path, and nothing
// panics. Frames go through control.Read first, as on a real session.
func FuzzSiteMessages(f *testing.F) {
	seeds := []string{
		// a full inventory in one page
		`{"type":"site_nodes","site_nodes":{"full":true,"done":true,` +
			`"nodes":[{"name":"n1","id":"a","online":true,"labels":{"site":"munich"}}]}}`,
		// a change naming a node of a sub-site, and a removal
		`{"type":"site_nodes","site_nodes":{"nodes":[{"name":"n2.sub","id":"b"}],"removed":["n1"]}}`,
		// a name that is valid at the site but one site too deep here
		`{"type":"site_nodes","site_nodes":{"nodes":[{"name":"n.s.s.s.s.s.s.s.s"}]}}`,
		// a status, and a late duplicate
		`{"type":"site_status","site_status":{"seq":3,"health":"healthy","nodes_online":1,"nodes_total":2}}`,
		`{"type":"site_status","site_status":{"seq":2,"health":"degraded","nodes_online":0,"nodes_total":2}}`,
		// names trying to climb out
		`{"type":"site_nodes","site_nodes":{"nodes":[{"name":"..n"},{"name":"n.."},{"name":"N1"},{"name":"n1 .x"}]}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	fx := newFixture(f, nil)
	conn, _ := fx.connect(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		var frame bytes.Buffer
		_ = binary.Write(&frame, binary.BigEndian, uint32(len(body)))
		frame.Write(body)
		m, err := control.Read(&frame)
		if err != nil {
			return // the session would close: nothing reaches the parent
		}
		_, _ = fx.c.Dispatch(context.Background(), conn, m)
		nodes, err := fx.st.ListSiteNodes(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			full := n.FullName()
			if !strings.HasSuffix(full, ".berlin") || n.Site != "berlin" || siteproto.ValidNodePath(full) != nil {
				t.Fatalf("kept %q (site %q)", full, n.Site)
			}
			if want := full[strings.Index(full, ".")+1:]; n.Labels["site"] != want {
				t.Fatalf("%s labelled site=%q, want %q", full, n.Labels["site"], want)
			}
		}
	})
}
