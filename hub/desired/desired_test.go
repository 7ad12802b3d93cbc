package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

var (
	rootID = strings.Repeat("a", 64)
	midID  = strings.Repeat("b", 64)
	leafID = strings.Repeat("c", 64)
)

func openStore(t *testing.T, path string) *store.DB {
	t.Helper()
	s, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// recorder counts what a kind's Apply saw.
type recorder struct {
	mu      sync.Mutex
	applied []siteproto.DesiredObject
}

func (r *recorder) apply(_ context.Context, o siteproto.DesiredObject) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, o)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied)
}

func newSync(t *testing.T, st store.DesiredStore, id string, ancestors []string, rec *recorder) *Sync {
	t.Helper()
	s, err := New(Config{Store: st, HubID: id, Ancestors: func() []string { return ancestors }})
	if err != nil {
		t.Fatal(err)
	}
	k := Kind{Name: "mission", Validate: func(spec json.RawMessage) error {
		if !json.Valid(spec) {
			return errors.New("not JSON")
		}
		return nil
	}}
	if rec != nil {
		k.Apply = rec.apply
	}
	if err := s.Register(k); err != nil {
		t.Fatal(err)
	}
	return s
}

func obj(name string, gen int64, spec string) siteproto.DesiredObject {
	o := siteproto.DesiredObject{Kind: "mission", Origin: rootID, Name: name, Generation: gen}
	if spec == "" {
		o.Deleted = true
	} else {
		o.Spec = json.RawMessage(spec)
	}
	return o
}

func deliver(t *testing.T, s *Sync, objs ...siteproto.DesiredObject) []siteproto.DesiredAck {
	t.Helper()
	var acks []siteproto.DesiredAck
	err := s.HandleDesired(context.Background(), &control.Message{Type: siteproto.TypeDesired, Desired: objs},
		func(m *control.Message) error {
			acks = append(acks, m.DesiredAcks...)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return acks
}

// TestAckAfterDurableStore: the acknowledgement leaves only after the
// object is in the store; a site killed between the store and the ack gets
// the object again on reconnect and acknowledges it without applying
// (re-running) it.
func TestAckAfterDurableStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "site.db")
	st := openStore(t, path)
	rec := &recorder{}
	site := newSync(t, st, midID, []string{rootID}, rec)
	// The ack fails as if the hub died right before sending it; at that
	// moment the object must already be stored (durably: read through a
	// second connection to the file).
	err := site.HandleDesired(context.Background(),
		&control.Message{Type: siteproto.TypeDesired, Desired: []siteproto.DesiredObject{obj("m", 1, `{"v":1}`)}},
		func(m *control.Message) error {
			other := openStore(t, path)
			d, err := other.GetDesired(context.Background(), "mission", rootID, "m")
			if err != nil || d.Generation != 1 {
				t.Errorf("at ack time the object is %+v, %v; want generation 1 stored", d, err)
			}
			return errors.New("killed")
		})
	if err == nil {
		t.Fatal("HandleDesired hid the failed ack")
	}
	if rec.count() != 1 {
		t.Fatalf("applied %d times, want 1", rec.count())
	}

	// Restart: a new process on the same file; the parent re-sends.
	st.Close()
	st2 := openStore(t, path)
	rec2 := &recorder{}
	site2 := newSync(t, st2, midID, []string{rootID}, rec2)
	acks := deliver(t, site2, obj("m", 1, `{"v":1}`))
	if len(acks) != 1 || acks[0].Generation != 1 {
		t.Fatalf("acks after re-send = %+v, want generation 1", acks)
	}
	if rec2.count() != 0 {
		t.Errorf("the re-sent generation was applied again (%d): a reconnect must not re-run work", rec2.count())
	}
}

// TestGenerationsAndTombstones: newer generations apply, older or equal
// ones are acknowledged and change nothing, a tombstone applies as
// deleted and refuses older generations after it.
func TestGenerationsAndTombstones(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	rec := &recorder{}
	site := newSync(t, st, midID, []string{rootID}, rec)
	steps := []struct {
		o       siteproto.DesiredObject
		applied bool
	}{
		{obj("m", 2, `{"v":2}`), true},
		{obj("m", 1, `{"v":1}`), false},
		{obj("m", 2, `{"v":2}`), false},
		{obj("m", 3, `{"v":3}`), true},
		{obj("m", 4, ""), true},
		{obj("m", 3, `{"v":3}`), false},
		{obj("m", 4, ""), false},
	}
	for i, s := range steps {
		before := rec.count()
		acks := deliver(t, site, s.o)
		if len(acks) != 1 || acks[0].Generation != s.o.Generation {
			t.Errorf("step %d: acks %+v, want generation %d acknowledged", i, acks, s.o.Generation)
		}
		if got := rec.count() > before; got != s.applied {
			t.Errorf("step %d (gen %d): applied = %v, want %v", i, s.o.Generation, got, s.applied)
		}
	}
	d, err := site.Get(context.Background(), "mission", rootID, "m")
	if err != nil || !d.Deleted || d.Generation != 4 {
		t.Errorf("stored = %+v, %v; want the generation 4 tombstone", d, err)
	}
	if last := rec.applied[len(rec.applied)-1]; !last.Deleted {
		t.Errorf("last apply = %+v, want the tombstone", last)
	}
}

// TestAbsenceNeverDeletes: a message (or a reconnect) that does not
// mention an object leaves it stored and applied.
func TestAbsenceNeverDeletes(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	rec := &recorder{}
	site := newSync(t, st, midID, []string{rootID}, rec)
	deliver(t, site, obj("a", 1, `{}`), obj("b", 1, `{}`))
	deliver(t, site, obj("b", 2, `{"x":1}`))
	list, err := site.List(context.Background(), "mission")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, d := range list {
		if !d.Deleted {
			names[d.Name] = true
		}
	}
	if !names["a"] || !names["b"] {
		t.Errorf("live objects after a message without a: %v; absence must never delete", names)
	}
}

// TestRefusals: objects from a hub that is not an ancestor, and specs the
// kind refuses, are neither stored nor acknowledged.
func TestRefusals(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	site := newSync(t, st, midID, []string{rootID}, nil)
	stranger := obj("x", 1, `{}`)
	stranger.Origin = leafID
	bad := obj("y", 1, `not json`)
	acks := deliver(t, site, stranger, bad, obj("ok", 1, `{}`))
	if len(acks) != 1 || acks[0].Name != "ok" {
		t.Errorf("acks = %+v, want only ok", acks)
	}
	for _, name := range []string{"x", "y"} {
		if _, err := site.Get(context.Background(), "mission", leafID, name); !errors.Is(err, store.ErrNotFound) {
			if _, err2 := site.Get(context.Background(), "mission", rootID, name); !errors.Is(err2, store.ErrNotFound) {
				t.Errorf("refused object %s was stored", name)
			}
		}
	}
	// A root (no ancestors) takes nothing from above.
	root := newSync(t, openStore(t, filepath.Join(t.TempDir(), "r.db")), rootID, nil, nil)
	if acks := deliver(t, root, obj("m", 1, `{}`)); len(acks) != 0 {
		t.Errorf("a root acknowledged %+v", acks)
	}
}

// tree links Syncs in-process: a parent's Send delivers to the child's
// HandleDesired, whose acks go back to the parent's HandleAck.
type tree struct {
	mu     sync.Mutex
	parent *Sync
	kids   map[string]*kid
}

type kid struct {
	s      *Sync
	id     string
	up     bool
	frames []int
}

func (tr *tree) Connected() []Child {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []Child
	for name, k := range tr.kids {
		if k.up {
			out = append(out, Child{Name: name, ID: k.id})
		}
	}
	return out
}

func (tr *tree) Send(ctx context.Context, site string, m *control.Message) error {
	tr.mu.Lock()
	k := tr.kids[site]
	up := k != nil && k.up
	if up {
		k.frames = append(k.frames, len(m.Desired))
	}
	tr.mu.Unlock()
	if !up {
		return fmt.Errorf("site %s unreachable", site)
	}
	if len(m.Desired) > siteproto.MaxDesiredPerFrame {
		return fmt.Errorf("frame of %d objects", len(m.Desired))
	}
	if err := m.Validate(); err != nil {
		return err
	}
	return k.s.HandleDesired(ctx, m, func(ack *control.Message) error {
		return tr.parent.HandleAck(ctx, Child{Name: site, ID: k.id}, ack)
	})
}

func (tr *tree) connect(name string, up bool) {
	tr.mu.Lock()
	k := tr.kids[name]
	k.up = up
	tr.mu.Unlock()
	if up {
		tr.parent.ChildConnected(Child{Name: name, ID: k.id})
	}
}

// TestForwardDownTheTree: root → mid → leaf. Objects created at the root
// reach the leaf through mid (a kind mid does not know included), a child
// that was down gets what it missed on reconnect, in frames of at most
// MaxDesiredPerFrame, and acknowledged objects are not sent again.
func TestForwardDownTheTree(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rootRec, midRec, leafRec := &recorder{}, &recorder{}, &recorder{}
	root := newSync(t, openStore(t, filepath.Join(dir, "root.db")), rootID, nil, rootRec)
	if err := root.Register(Kind{Name: "service"}); err != nil {
		t.Fatal(err)
	}
	mid := newSync(t, openStore(t, filepath.Join(dir, "mid.db")), midID, []string{rootID}, midRec)
	leaf := newSync(t, openStore(t, filepath.Join(dir, "leaf.db")), leafID, []string{midID, rootID}, leafRec)
	rootTree := &tree{parent: root, kids: map[string]*kid{"mid": {s: mid, id: midID}}}
	midTree := &tree{parent: mid, kids: map[string]*kid{"leaf": {s: leaf, id: leafID}}}
	root.SetChildren(rootTree)
	mid.SetChildren(midTree)
	pump := func() {
		for range 3 {
			root.SendPending(ctx)
			mid.SendPending(ctx)
		}
	}

	// Everything is created while both links are down.
	for i := range 150 {
		if _, _, err := root.Put(ctx, "mission", fmt.Sprintf("m%d", i), json.RawMessage(`{"i":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := root.Put(ctx, "service", "db", json.RawMessage(`{"port":5432}`)); err != nil {
		t.Fatal(err)
	}
	if rootRec.count() != 150 {
		t.Errorf("root applied %d, want 150", rootRec.count())
	}
	pump()
	if midRec.count() != 0 {
		t.Fatalf("a down child got objects")
	}
	rootTree.connect("mid", true)
	midTree.connect("leaf", true)
	pump()
	if midRec.count() != 150 || leafRec.count() != 150 {
		t.Fatalf("applied at mid %d, leaf %d; want 150 each", midRec.count(), leafRec.count())
	}
	if _, err := leaf.Get(ctx, "service", rootID, "db"); err != nil {
		t.Errorf("a kind mid does not know was not passed on to leaf: %v", err)
	}
	for _, k := range []*kid{rootTree.kids["mid"], midTree.kids["leaf"]} {
		for _, n := range k.frames {
			if n > siteproto.MaxDesiredPerFrame {
				t.Errorf("frame of %d objects", n)
			}
		}
		if len(k.frames) < 3 {
			t.Errorf("151 objects in %d frames", len(k.frames))
		}
	}

	// Acknowledged: a reconnect sends nothing again.
	framesBefore := len(rootTree.kids["mid"].frames)
	rootTree.connect("mid", true)
	pump()
	if got := len(rootTree.kids["mid"].frames); got != framesBefore {
		t.Errorf("a reconnect re-sent %d acknowledged frames", got-framesBefore)
	}

	// A change and a delete while leaf is cut off: mid applies them at
	// once, leaf on reconnect, without the other 148 again.
	midTree.connect("leaf", false)
	if _, changed, err := root.Put(ctx, "mission", "m0", json.RawMessage(`{"i":2}`)); err != nil || !changed {
		t.Fatalf("put m0 gen 2: changed %v, %v", changed, err)
	}
	if _, changed, _ := root.Put(ctx, "mission", "m0", json.RawMessage(`{"i":2}`)); changed {
		t.Error("the same spec again made a new generation")
	}
	if _, err := root.Delete(ctx, "mission", "m1"); err != nil {
		t.Fatal(err)
	}
	pump()
	if midRec.count() != 152 || leafRec.count() != 150 {
		t.Fatalf("applied at mid %d (want 152), leaf %d (want 150 while cut off)", midRec.count(), leafRec.count())
	}
	midTree.connect("leaf", true)
	pump()
	if leafRec.count() != 152 {
		t.Fatalf("leaf applied %d after reconnect, want 152 (no duplicates)", leafRec.count())
	}
	d, err := leaf.Get(ctx, "mission", rootID, "m1")
	if err != nil || !d.Deleted {
		t.Errorf("leaf m1 = %+v, %v; want a tombstone", d, err)
	}
	if _, err := root.Delete(ctx, "mission", "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete of nothing: %v", err)
	}
	if _, _, err := root.Put(ctx, "nope", "x", json.RawMessage(`{}`)); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("put of an unknown kind: %v", err)
	}
	if _, _, err := root.Put(ctx, "mission", "x", json.RawMessage(`nope`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("put of an invalid spec: %v", err)
	}
}
