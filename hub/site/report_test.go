package site

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/siteproto"
)

// TestSeqsGrowAcrossRestarts: a restarted site never reuses a status
// sequence number, so its parent never drops a fresh status as a duplicate.
func TestSeqsGrowAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	var last uint64
	for restart := 0; restart < 3; restart++ {
		s, err := loadSeqs(dir)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < seqBlock+5; i++ { // across a reservation
			n, err := s.take()
			if err != nil {
				t.Fatal(err)
			}
			if n <= last {
				t.Fatalf("restart %d: seq %d after %d", restart, n, last)
			}
			last = n
		}
	}
}

func TestSameStatus(t *testing.T) {
	base := siteproto.Status{Seq: 1, At: time.Unix(1, 0), Health: siteproto.Healthy, NodesOnline: 1, NodesTotal: 2}
	for _, tc := range []struct {
		name   string
		change func(*siteproto.Status)
		same   bool
	}{
		{"seq and time", func(s *siteproto.Status) { s.Seq, s.At = 2, time.Unix(2, 0) }, true},
		{"queued since", func(s *siteproto.Status) { s.QueuedSince = time.Unix(3, 0) }, true},
		{"a node came online", func(s *siteproto.Status) { s.NodesOnline = 2 }, false},
		{"health", func(s *siteproto.Status) { s.Health = siteproto.Degraded }, false},
		{"a sub-site", func(s *siteproto.Status) { s.Sites = []siteproto.SubSite{{Name: "sub"}} }, false},
		{"missions", func(s *siteproto.Status) { s.ActiveMissions = []string{"o/m"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := base
			tc.change(&b)
			if got := sameStatus(&base, &b); got != tc.same {
				t.Fatalf("sameStatus = %v, want %v", got, tc.same)
			}
		})
	}
}

func TestInventoryChanges(t *testing.T) {
	n := func(name string, online bool, labels map[string]string) siteproto.Node {
		return siteproto.Node{Name: name, ID: "id-" + name, Online: online, Labels: labels, LastSeen: time.Now()}
	}
	sent, pages := inventoryChanges(nil, []siteproto.Node{n("a", true, nil), n("b", true, nil), n("c.sub", false, nil)})
	if len(pages) != 1 || len(pages[0].Nodes) != 3 {
		t.Fatalf("from nothing: %+v", pages)
	}
	for _, tc := range []struct {
		name    string
		nodes   []siteproto.Node
		up      []string
		removed []string
	}{
		{
			"nothing changed but last seen",
			[]siteproto.Node{n("a", true, nil), n("b", true, nil), n("c.sub", false, nil)},
			nil,
			nil,
		},
		{"one offline, one gone, one new, one relabelled", []siteproto.Node{
			n("a", false, nil), n("c.sub", false, map[string]string{"role": "pos"}), n("d", true, nil),
		},
			[]string{"a", "c.sub", "d"}, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pages := inventoryChanges(sent, tc.nodes)
			var up, removed []string
			for _, p := range pages {
				if p.Full || p.Done {
					t.Fatalf("a change page marked full: %+v", p)
				}
				for _, x := range p.Nodes {
					up = append(up, x.Name)
				}
				removed = append(removed, p.Removed...)
			}
			if strings.Join(up, ",") != strings.Join(tc.up, ",") || strings.Join(removed, ",") != strings.Join(tc.removed, ",") {
				t.Fatalf("up %v removed %v; want %v and %v", up, removed, tc.up, tc.removed)
			}
		})
	}
	// Many changes are split into pages under the frame bound.
	var many []siteproto.Node
	for i := range 2*inventoryPage + 1 {
		many = append(many, n(fmt.Sprintf("n%d", i), true, nil))
	}
	if _, pages := inventoryChanges(nil, many); len(pages) != 3 || len(pages[2].Nodes) != 1 {
		t.Fatalf("%d pages", len(pages))
	}
}

func TestCheckWelcome(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ancestors []string
		want      error
	}{
		{"below the root", []string{parent}, nil},
		{"two levels down", []string{parent, below}, nil},
		{"this hub above its parent", []string{parent, self}, ErrCycle},
		{"this hub its own parent", []string{self}, ErrCycle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkWelcome(self, &siteproto.Welcome{Path: "berlin", Ancestors: tc.ancestors}); !errors.Is(err, tc.want) {
				t.Fatalf("checkWelcome = %v, want %v", err, tc.want)
			}
		})
	}
}
