package uplink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// fakeSession is a dialed session that only counts its Close.
type fakeSession struct {
	tunnel.Session
	addr   string
	closed atomic.Bool
}

func (f *fakeSession) Close() error { f.closed.Store(true); return nil }

// TestDialStaggered: the first address is dialed first and wins when it
// answers; a hub that fails sends Dial on to the next at once, one that
// does not answer only after the stagger; the first to answer wins, every
// other session is closed and every attempt has ended when Dial returns.
func TestDialStaggered(t *testing.T) {
	const stagger = 300 * time.Millisecond
	refused := errors.New("connection refused")
	answer := func(after time.Duration) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			select {
			case <-time.After(after):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	hang := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	fail := func(context.Context) error { return refused }
	for _, tc := range []struct {
		name     string
		hubs     map[string]func(ctx context.Context) error
		order    []string
		want     string        // the winner; "" for an error naming every address
		dialed   []string      // the addresses dialed, in order
		min, max time.Duration // how long Dial takes
	}{
		{name: "first answers", order: []string{"a:1", "b:1"},
			hubs: map[string]func(context.Context) error{"a:1": answer(0), "b:1": answer(0)},
			want: "a:1", dialed: []string{"a:1"}, max: stagger / 2},
		{name: "first slow but within the stagger keeps its uplink", order: []string{"a:1", "b:1"},
			hubs: map[string]func(context.Context) error{"a:1": answer(stagger / 2), "b:1": answer(0)},
			want: "a:1", dialed: []string{"a:1"}, max: stagger},
		{name: "first refused: next at once", order: []string{"a:1", "b:1"},
			hubs: map[string]func(context.Context) error{"a:1": fail, "b:1": answer(0)},
			want: "b:1", dialed: []string{"a:1", "b:1"}, max: stagger / 2},
		{name: "first silent: next after the stagger", order: []string{"a:1", "b:1", "c:1"},
			hubs: map[string]func(context.Context) error{"a:1": hang, "b:1": answer(0), "c:1": answer(0)},
			want: "b:1", dialed: []string{"a:1", "b:1"}, min: stagger, max: 2 * stagger},
		{name: "two silent, third answers", order: []string{"a:1", "b:1", "c:1"},
			hubs: map[string]func(context.Context) error{"a:1": hang, "b:1": hang, "c:1": answer(0)},
			want: "c:1", dialed: []string{"a:1", "b:1", "c:1"}, min: 2 * stagger, max: 3 * stagger},
		{name: "the later answer wins, the slower one is closed", order: []string{"a:1", "b:1"},
			hubs: map[string]func(context.Context) error{"a:1": answer(3 * stagger / 2), "b:1": answer(0)},
			want: "b:1", dialed: []string{"a:1", "b:1"}, min: stagger, max: 2 * stagger},
		{name: "every hub refuses", order: []string{"a:1", "b:1"},
			hubs:   map[string]func(context.Context) error{"a:1": fail, "b:1": fail},
			dialed: []string{"a:1", "b:1"}, max: stagger / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu       sync.Mutex
				dialed   []string
				sessions []*fakeSession
				running  sync.WaitGroup
			)
			dial := func(ctx context.Context, addr string) (tunnel.Session, error) {
				running.Add(1)
				defer running.Done()
				mu.Lock()
				dialed = append(dialed, addr)
				mu.Unlock()
				if err := tc.hubs[addr](ctx); err != nil {
					return nil, err
				}
				s := &fakeSession{addr: addr}
				mu.Lock()
				sessions = append(sessions, s)
				mu.Unlock()
				return s, nil
			}
			began := time.Now()
			s, addr, err := dialStaggered(context.Background(), dial, tc.order, stagger)
			took := time.Since(began)
			running.Wait() // returns at once if Dial waited for every attempt
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(dialed, tc.dialed) {
				t.Errorf("dialed %v, want %v", dialed, tc.dialed)
			}
			if took < tc.min || took > tc.max+150*time.Millisecond {
				t.Errorf("Dial took %s, want %s..%s", took, tc.min, tc.max)
			}
			if tc.want == "" {
				for _, a := range tc.order {
					if err == nil || !strings.Contains(err.Error(), a+": "+refused.Error()) {
						t.Fatalf("Dial error %v, want one naming %s", err, a)
					}
				}
				return
			}
			if err != nil || addr != tc.want || s.(*fakeSession).addr != tc.want {
				t.Fatalf("Dial = %v, %q, %v; want the session of %s", s, addr, err, tc.want)
			}
			for _, f := range sessions {
				if f.closed.Load() != (f.addr != tc.want) {
					t.Errorf("session of %s closed %v, want %v", f.addr, f.closed.Load(), f.addr != tc.want)
				}
			}
		})
	}
}

// TestDialNoAddress: an identity without hub addresses says so.
func TestDialNoAddress(t *testing.T) {
	_, _, err := dialStaggered(context.Background(), nil, nil, time.Second)
	if err == nil || !strings.Contains(err.Error(), "no hub address") {
		t.Fatalf("Dial with no addresses: %v", err)
	}
}

func TestHubOrder(t *testing.T) {
	abc := []string{"a:1", "b:1", "c:1"}
	for _, tc := range []struct {
		name string
		got  []string
		want []string
	}{
		{"prefer the middle", Prefer(abc, "b:1"), []string{"b:1", "a:1", "c:1"}},
		{"prefer the first", Prefer(abc, "a:1"), abc},
		{"prefer an unknown address", Prefer(abc, "x:1"), abc},
		{"rotate", Rotate(abc), []string{"b:1", "c:1", "a:1"}},
		{"rotate one", Rotate([]string{"a:1"}), []string{"a:1"}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if !slices.Equal(abc, []string{"a:1", "b:1", "c:1"}) {
		t.Errorf("the input changed: %v", abc)
	}
}

// TestMergeHubs: announced addresses are added once, malformed ones never;
// known ones stay, unless room is needed past MaxHubs.
func TestMergeHubs(t *testing.T) {
	many := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s%d.example:7443", prefix, i))
		}
		return out
	}
	full := many("k", MaxHubs)
	for _, tc := range []struct {
		name             string
		known, announced []string
		want             []string
		changed          bool
	}{
		{"nothing new", []string{"a:1", "b:1"}, []string{"b:1", "a:1"}, []string{"a:1", "b:1"}, false},
		{"a replica joined", []string{"a:1", "b:1"}, []string{"b:1", "c:1"}, []string{"a:1", "b:1", "c:1"}, true},
		{"a down replica is kept", []string{"a:1", "b:1"}, []string{"b:1"}, []string{"a:1", "b:1"}, false},
		{"malformed and repeated addresses are skipped", []string{"a:1"},
			[]string{"c:1", "no-port", "bad host:1", "c:1", "d:0"}, []string{"a:1", "c:1"}, true},
		{"full: an unannounced address makes room", full, []string{full[0], "new:1"},
			append(slices.Clone(full[:MaxHubs-1]), "new:1"), true},
		{"full of announced addresses: the new one stays out", full, append(slices.Clone(full), "new:1"),
			full, false},
	} {
		got, changed := MergeHubs(tc.known, tc.announced)
		if !slices.Equal(got, tc.want) || changed != tc.changed {
			t.Errorf("%s: MergeHubs = %v, %v; want %v, %v", tc.name, got, changed, tc.want, tc.changed)
		}
	}
}
