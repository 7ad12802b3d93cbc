package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// joinAs creates a token of kind and joins node name with it.
func joinAs(t *testing.T, s *DB, kind, id, name string) Node {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateToken(ctx, Token{
		ID:         "tok-" + id,
		SecretHash: []byte("h"),
		UsesLeft:   1,
		ExpiresAt:  time.Now().Add(time.Hour),
		Kind:       kind,
	}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Join(ctx, "tok-"+id, func(Token) error { return nil }, Node{ID: id, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSiteTokensMakeSites(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		joinAs(t, s, TokenSite, "s1", "berlin")
		joinAs(t, s, TokenNode, "n1", "n1")
		joinAs(t, s, "", "n2", "n2") // a token of before kinds: a node token
		toks, err := s.ListTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]string{}
		for _, tk := range toks {
			kinds[tk.ID] = tk.Kind
		}
		if kinds["tok-s1"] != TokenSite || kinds["tok-n1"] != TokenNode || kinds["tok-n2"] != TokenNode {
			t.Fatalf("token kinds = %v", kinds)
		}
		site, err := s.GetSite(ctx, "s1")
		if err != nil || site.Name != "berlin" || site.JoinedAt.IsZero() {
			t.Fatalf("GetSite(s1) = %+v, %v", site, err)
		}
		if _, err := s.GetSite(ctx, "n1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a node token's node is a site: %v", err)
		}
		if err := s.UpdateSiteHello(ctx, "s1", "hub", "berlin.region", []string{"ca"}, []string{"hub", "below"}); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateSiteHello(ctx, "n1", "hub", "x", nil, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("hello of a non-site = %v, want ErrNotFound", err)
		}
		sites, err := s.ListSites(ctx)
		if err != nil || len(sites) != 1 || sites[0].Path != "berlin.region" || len(sites[0].Subtree) != 2 ||
			sites[0].HostCAs[0] != "ca" {
			t.Fatalf("ListSites = %+v, %v", sites, err)
		}
	})
}

func TestSiteStatusKeepsTheNewest(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		joinAs(t, s, TokenSite, "s1", "berlin")
		at := time.UnixMilli(time.Now().UnixMilli())
		for _, tc := range []struct {
			seq  uint64
			want bool
		}{{5, true}, {3, false}, {5, false}, {6, true}} {
			body, _ := json.Marshal(map[string]uint64{"seq": tc.seq})
			got, err := s.SetSiteStatus(ctx, "s1", tc.seq, body, at)
			if err != nil || got != tc.want {
				t.Fatalf("SetSiteStatus(seq %d) = %v, %v; want %v", tc.seq, got, err, tc.want)
			}
		}
		site, err := s.GetSite(ctx, "s1")
		if err != nil || site.StatusSeq != 6 || !site.StatusAt.Equal(at) || string(site.Status) != `{"seq":6}` {
			t.Fatalf("site = %+v, %v", site, err)
		}
		if err := s.SetSiteDisconnected(ctx, "s1", at); err != nil {
			t.Fatal(err)
		}
		if site, _ = s.GetSite(ctx, "s1"); !site.DisconnectedAt.Equal(at) {
			t.Fatalf("disconnected_at = %v", site.DisconnectedAt)
		}
	})
}

func TestSiteInventory(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		joinAs(t, s, TokenSite, "s1", "berlin")
		joinAs(t, s, TokenSite, "s2", "munich")
		names := func(site string) []string {
			t.Helper()
			l, err := s.ListSiteNodes(ctx, site)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, n := range l {
				out = append(out, n.FullName())
			}
			return out
		}
		n7 := SiteNode{Name: "n7", ID: "id7", Labels: map[string]string{"site": "berlin"}, Online: true, Transport: "quic"}
		if err := s.ReplaceSiteNodes(ctx, "s1", []SiteNode{n7, {Name: "n8.sub"}}); err != nil {
			t.Fatal(err)
		}
		if err := s.ReplaceSiteNodes(ctx, "s2", []SiteNode{{Name: "m1"}}); err != nil {
			t.Fatal(err)
		}
		if got := names(""); len(got) != 3 || got[0] != "n7.berlin" || got[1] != "n8.sub.berlin" || got[2] != "m1.munich" {
			t.Fatalf("all = %v", got)
		}
		l, _ := s.ListSiteNodes(ctx, "s1")
		if l[0].ID != "id7" || !l[0].Online || l[0].Labels["site"] != "berlin" || l[0].Transport != "quic" {
			t.Fatalf("n7 = %+v", l[0])
		}
		// Changes: an upsert and a removal; a full inventory replaces all.
		if err := s.ApplySiteNodes(ctx, "s1", []SiteNode{
			{Name: "n7", ID: "id7", Online: false}, {Name: "n9"},
		}, []string{"n8.sub"}); err != nil {
			t.Fatal(err)
		}
		if got := names("s1"); len(got) != 2 || got[0] != "n7.berlin" || got[1] != "n9.berlin" {
			t.Fatalf("after changes = %v", got)
		}
		if l, _ = s.ListSiteNodes(ctx, "s1"); l[0].Online {
			t.Fatal("upsert did not update n7")
		}
		if err := s.ReplaceSiteNodes(ctx, "s1", []SiteNode{{Name: "x1"}}); err != nil {
			t.Fatal(err)
		}
		if got := names("s1"); len(got) != 1 || got[0] != "x1.berlin" {
			t.Fatalf("after replace = %v", got)
		}
		if err := s.ReplaceSiteNodes(ctx, "n-none", nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("inventory of no site = %v", err)
		}
		// Removing the site's node removes the site and its inventory.
		if err := s.DeleteNode(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if got := names(""); len(got) != 1 || got[0] != "m1.munich" {
			t.Fatalf("after removing berlin = %v", got)
		}
		if _, err := s.GetSite(ctx, "s1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("site survived its node: %v", err)
		}
	})
}
