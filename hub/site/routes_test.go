package site

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// TestSiteRoutesNodeByID: inventory nodes are found by ID (jobs key on
// it), and an ID two sites both report is refused rather than picked: a
// site could otherwise take over another site's node's job targets.
func TestSiteRoutesNodeByID(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, s := range []struct{ id, name string }{{"s1", "berlin"}, {"s2", "munich"}} {
		tok := store.Token{ID: "tok-" + s.id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour),
			Kind: store.TokenSite}
		if err := st.CreateToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
		node := store.Node{ID: s.id, Name: s.name}
		if _, err := st.Join(ctx, "tok-"+s.id, func(store.Token) error { return nil }, node); err != nil {
			t.Fatal(err)
		}
	}
	berlin := []store.SiteNode{{Name: "n1", ID: "id-n1", Online: true}, {Name: "n2", ID: "id-dup"}}
	if err := st.ReplaceSiteNodes(ctx, "s1", berlin); err != nil {
		t.Fatal(err)
	}
	if err := st.ReplaceSiteNodes(ctx, "s2", []store.SiteNode{{Name: "m1", ID: "id-dup"}}); err != nil {
		t.Fatal(err)
	}
	r := &Routes{store: st}
	n, err := r.Node(ctx, "id-n1", "")
	if err != nil || n.Name != "n1.berlin" || !n.Online {
		t.Fatalf("Node(id-n1) = %+v, %v", n, err)
	}
	if _, err := r.Node(ctx, "id-dup", ""); err == nil || !strings.Contains(err.Error(), "several sites") {
		t.Fatalf("Node(id-dup) = %v, want refused", err)
	}
	if _, err := r.Node(ctx, "id-none", ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Node(id-none) = %v, want ErrNotFound", err)
	}
	all, err := r.Nodes(ctx)
	if err != nil || len(all) != 3 {
		t.Fatalf("Nodes = %v, %v", all, err)
	}
}

func TestReplyReason(t *testing.T) {
	got := replyReason(errors.New("a\nb\x1b[31m" + strings.Repeat("é", 400)))
	if len(got) > tunnel.MaxReasonLen || strings.ContainsAny(got, "\n\x1b") || !strings.HasPrefix(got, "a b [31m") {
		t.Fatalf("reason %q (%d bytes)", got, len(got))
	}
}
