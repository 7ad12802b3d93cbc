package store

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// TestLabelNodes: a label change applies to every named node in one
// transaction, is refused as a whole when one node is gone or check
// refuses, is visible to a second connection without a clean close (what a
// kill -9 leaves), and never touches the reported labels.
func TestLabelNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		path := b.newLoc(t)
		s, err := b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.CreateToken(ctx, Token{
			ID:         "t",
			SecretHash: []byte("h"),
			UsesLeft:   10,
			ExpiresAt:  time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []Node{
			{ID: "1", Name: "a", Labels: map[string]string{"env": "dev", "old": "x"}},
			{ID: "2", Name: "b", Labels: map[string]string{"env": "dev"}},
		} {
			if _, err := s.Join(ctx, "t", accept, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SetReportedLabels(ctx, "1", map[string]string{"env": "prod", "rack": "r7"}); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name    string
			ids     []string
			change  LabelChange
			check   func(Node) error
			wantErr bool
			want    map[string]map[string]string // by id, after the case
		}{
			{"set and remove", []string{"1", "2"}, LabelChange{
				Set: map[string]string{"env": "prod"}, Remove: []string{"old", "absent"},
			}, nil, false,
				map[string]map[string]string{"1": {"env": "prod"}, "2": {"env": "prod"}}},
			{"one node gone changes none", []string{"1", "nope"}, LabelChange{Set: map[string]string{"tier": "edge"}}, nil, true,
				map[string]map[string]string{"1": {"env": "prod"}, "2": {"env": "prod"}}},
			{"check refuses changes none", []string{"1", "2"}, LabelChange{Set: map[string]string{"tier": "edge"}},
				func(n Node) error {
					if n.ID == "2" {
						return errors.New("no")
					}
					return nil
				}, true,
				map[string]map[string]string{"1": {"env": "prod"}, "2": {"env": "prod"}}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := s.LabelNodes(ctx, tc.ids, tc.change, tc.check)
				if (err != nil) != tc.wantErr {
					t.Fatalf("LabelNodes: %v, want error %v", err, tc.wantErr)
				}
				// A second connection sees exactly what was committed.
				other, err := b.open(ctx, path)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				for id, want := range tc.want {
					n, err := other.GetNode(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					if !maps.Equal(n.Labels, want) {
						t.Errorf("node %s labels %v, want %v", id, n.Labels, want)
					}
				}
			})
		}
		n, err := s.GetNode(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(n.ReportedLabels, map[string]string{"env": "prod", "rack": "r7"}) || n.Labels["rack"] != "" {
			t.Errorf("reported labels %v, labels %v: want them apart", n.ReportedLabels, n.Labels)
		}
		if err := s.SetReportedLabels(ctx, "nope", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("SetReportedLabels of an unknown node: %v, want ErrNotFound", err)
		}
	})
}

// TestMigrateReportedLabels: a v7 database keeps its nodes and their labels;
// every node starts with no reported labels.
func TestMigrateReportedLabels(t *testing.T) {
	ctx := context.Background()
	path := dataDirAt(t, 7,
		`INSERT INTO nodes (id, name, labels, created_at) VALUES ('id-1', 'edge-1', '{"env":"prod"}', 1)`)
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.GetNode(ctx, "id-1")
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels["env"] != "prod" || n.ReportedLabels == nil || len(n.ReportedLabels) != 0 {
		t.Fatalf("after migration: labels %v, reported %v", n.Labels, n.ReportedLabels)
	}
}

// TestNodeFacts: facts given at join are stored; a later hello's replace
// them; a v9 database's nodes start with empty facts.
func TestNodeFacts(t *testing.T) {
	ctx := context.Background()
	path := dataDirAt(t, 9, `INSERT INTO nodes (id, name, created_at) VALUES ('id-old', 'old', 1)`)
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := s.GetNode(ctx, "id-old")
	if err != nil {
		t.Fatal(err)
	}
	if old.Facts != (control.Facts{}) {
		t.Fatalf("migrated node facts = %+v, want empty", old.Facts)
	}
	joined := control.Facts{
		Hostname:  "h",
		Arch:      "arm64",
		Interface: "eth0",
		Address:   "192.168.1.7",
		MAC:       "02:00:00:00:00:01",
	}
	if err := s.CreateToken(ctx, Token{
		ID:         "t",
		SecretHash: []byte("h"),
		UsesLeft:   1,
		ExpiresAt:  time.Now().Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Join(ctx, "t", accept, Node{ID: "id-1", Name: "edge-1", Facts: joined}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.GetNode(ctx, "id-1"); err != nil || n.Facts != joined {
		t.Fatalf("after join: %+v, %v; want %+v", n.Facts, err, joined)
	}
	moved := joined
	moved.Address = "10.0.0.9"
	if err := s.SetNodeFacts(ctx, "id-1", moved); err != nil {
		t.Fatal(err)
	}
	if n, err := s.GetNode(ctx, "id-1"); err != nil || n.Facts != moved {
		t.Fatalf("after hello: %+v, %v; want %+v", n.Facts, err, moved)
	}
	if err := s.SetNodeFacts(ctx, "nope", moved); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetNodeFacts of an unknown node: %v, want ErrNotFound", err)
	}
}

// TestCountNodes: the count is of enrolled nodes that are not revoked,
// on both backends.
func TestCountNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s, err := b.open(ctx, b.newLoc(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		count := func(want int) {
			t.Helper()
			if n, err := s.CountNodes(ctx); err != nil || n != want {
				t.Fatalf("CountNodes = %d, %v; want %d", n, err, want)
			}
		}
		count(0)
		if err := s.CreateToken(ctx, Token{
			ID:         "t",
			SecretHash: []byte("h"),
			UsesLeft:   10,
			ExpiresAt:  time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []Node{{ID: "1", Name: "a"}, {ID: "2", Name: "b"}, {ID: "3", Name: "c"}} {
			if _, err := s.Join(ctx, "t", accept, n); err != nil {
				t.Fatal(err)
			}
		}
		count(3)
		if err := s.RevokeNode(ctx, "2", time.Now()); err != nil {
			t.Fatal(err)
		}
		count(2)
	})
}
