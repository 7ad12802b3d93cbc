package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/siteproto"
)

var testOrigin = strings.Repeat("ab", 32)

// TestDesiredGenerations: a higher generation replaces, an older or equal
// one changes nothing, a tombstone is kept (and refuses older generations),
// and a child's acks only move forward.
func TestDesiredGenerations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx, s := context.Background(), openTest(t)
		obj := func(gen int64, spec string, deleted bool) siteproto.DesiredObject {
			o := siteproto.DesiredObject{Kind: "mission", Origin: testOrigin, Name: "m1", Generation: gen, Deleted: deleted}
			if spec != "" {
				o.Spec = []byte(spec)
			}
			return o
		}
		now := time.Now()
		steps := []struct {
			o        siteproto.DesiredObject
			stored   bool
			wantGen  int64
			wantSpec string
		}{
			{obj(2, `{"v":2}`, false), true, 2, `{"v":2}`},
			{obj(1, `{"v":1}`, false), false, 2, `{"v":2}`},
			{obj(2, `{"v":"other"}`, false), false, 2, `{"v":2}`},
			{obj(3, "", true), true, 3, ""},
			{obj(3, `{"v":3}`, false), false, 3, ""},
			{obj(4, `{"v":4}`, false), true, 4, `{"v":4}`},
		}
		for i, st := range steps {
			got, err := s.StoreDesired(ctx, st.o, now)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if got != st.stored {
				t.Errorf("step %d: stored = %v, want %v", i, got, st.stored)
			}
			d, err := s.GetDesired(ctx, "mission", testOrigin, "m1")
			if err != nil {
				t.Fatal(err)
			}
			if d.Generation != st.wantGen || string(d.Spec) != st.wantSpec {
				t.Errorf("step %d: stored gen %d spec %q, want %d %q", i, d.Generation, d.Spec, st.wantGen, st.wantSpec)
			}
		}
		if _, err := s.GetDesired(ctx, "mission", testOrigin, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing object: %v, want ErrNotFound", err)
		}

		// Acks: the site has acknowledged nothing, then gen 4, then an old
		// ack arrives late and changes nothing.
		un, err := s.UnackedDesired(ctx, "site-a")
		if err != nil || len(un) != 1 || un[0].Generation != 4 {
			t.Fatalf("unacked before ack = %+v, %v", un, err)
		}
		if err := s.AckDesired(ctx, "site-a", []siteproto.DesiredAck{
			{Kind: "mission", Origin: testOrigin, Name: "m1", Generation: 4},
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.AckDesired(ctx, "site-a", []siteproto.DesiredAck{
			{Kind: "mission", Origin: testOrigin, Name: "m1", Generation: 2},
		}); err != nil {
			t.Fatal(err)
		}
		if un, _ := s.UnackedDesired(ctx, "site-a"); len(un) != 0 {
			t.Errorf("unacked after ack = %+v", un)
		}
		if un, _ := s.UnackedDesired(ctx, "site-b"); len(un) != 1 {
			t.Errorf("another site's unacked = %+v, want the object", un)
		}
		if _, err := s.StoreDesired(ctx, obj(5, `{"v":5}`, false), now); err != nil {
			t.Fatal(err)
		}
		if un, _ := s.UnackedDesired(ctx, "site-a"); len(un) != 1 || un[0].Generation != 5 {
			t.Errorf("unacked after a new generation = %+v", un)
		}
	})
}

// TestDesiredBump: the origin's generations count up on a changed spec,
// stay on an unchanged one, and a delete is a tombstone at the next
// generation.
func TestDesiredBump(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx, s := context.Background(), openTest(t)
		now := time.Now()
		if _, _, err := s.BumpDesired(ctx, "mission", testOrigin, "m", nil, true, now); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of nothing: %v, want ErrNotFound", err)
		}
		steps := []struct {
			spec    string
			deleted bool
			gen     int64
			changed bool
		}{
			{`{"a":1}`, false, 1, true},
			{`{"a":1}`, false, 1, false},
			{`{"a":2}`, false, 2, true},
			{"", true, 3, true},
			{"", true, 3, false},
			{`{"a":2}`, false, 4, true},
		}
		for i, st := range steps {
			o, changed, err := s.BumpDesired(ctx, "mission", testOrigin, "m", []byte(st.spec), st.deleted, now)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if o.Generation != st.gen || changed != st.changed || o.Deleted != st.deleted {
				t.Errorf("step %d: gen %d changed %v deleted %v, want %d %v %v", i, o.Generation, changed, o.Deleted, st.gen,
					st.changed, st.deleted)
			}
		}
		list, err := s.ListDesired(ctx, "mission")
		if err != nil || len(list) != 1 {
			t.Fatalf("list = %+v, %v", list, err)
		}
		if other, _ := s.ListDesired(ctx, "service"); len(other) != 0 {
			t.Errorf("list of another kind = %+v", other)
		}
	})
}

// TestMissionNodes: a node runs a generation once: start succeeds once
// per generation, a finish needs the running phase, a new generation
// re-plans, an old one does not.
func TestMissionNodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx, s := context.Background(), openTest(t)
		now := time.Now()
		n := MissionNode{Origin: testOrigin, Mission: "m", NodeID: "id1", Node: "n1", Generation: 1, UpdatedAt: now}
		mustBool := func(what string, got bool, err error, want bool) {
			t.Helper()
			if err != nil || got != want {
				t.Fatalf("%s = %v, %v; want %v", what, got, err, want)
			}
		}
		ok, err := s.PlanMissionNode(ctx, n)
		mustBool("plan gen 1", ok, err, true)
		ok, err = s.PlanMissionNode(ctx, n)
		mustBool("plan gen 1 again", ok, err, false)
		ok, err = s.StartMissionNode(ctx, testOrigin, "m", "id1", 1, "job1", now)
		mustBool("start", ok, err, true)
		ok, err = s.StartMissionNode(ctx, testOrigin, "m", "id1", 1, "job2", now)
		mustBool("start twice", ok, err, false)
		ok, err = s.PlanMissionNode(ctx, n)
		mustBool("plan gen 1 while running", ok, err, false)
		ok, err = s.FinishMissionNode(ctx, testOrigin, "m", "id1", 1, MissionApplied, "", now)
		mustBool("finish", ok, err, true)
		ok, err = s.FinishMissionNode(ctx, testOrigin, "m", "id1", 1, MissionFailed, "late", now)
		mustBool("finish twice", ok, err, false)
		if err := s.SetMissionCheck(ctx, testOrigin, "m", "id1", "ok", "fine", now); err != nil {
			t.Fatal(err)
		}
		list, err := s.ListMissionNodes(ctx, testOrigin, "m")
		if err != nil || len(list) != 1 {
			t.Fatalf("list = %+v, %v", list, err)
		}
		if g := list[0]; g.Phase != MissionApplied || g.JobID != "job1" || g.CheckState != "ok" || g.CheckOutput != "fine" ||
			g.StartedAt.IsZero() {
			t.Errorf("record = %+v", g)
		}
		n.Generation = 2
		ok, err = s.PlanMissionNode(ctx, n)
		mustBool("plan gen 2", ok, err, true)
		list, _ = s.ListMissionNodes(ctx, "", "")
		if len(list) != 1 || list[0].Phase != MissionPending || list[0].Generation != 2 || list[0].JobID != "" {
			t.Errorf("after gen 2: %+v", list)
		}
		if err := s.DeleteMissionNodes(ctx, testOrigin, "m", ""); err != nil {
			t.Fatal(err)
		}
		if list, _ = s.ListMissionNodes(ctx, "", ""); len(list) != 0 {
			t.Errorf("after delete: %+v", list)
		}
	})
}
