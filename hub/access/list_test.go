package access

import (
	"errors"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

// TestAuthorizeList: who sees which node in listings and inventories. A node
// reporting labels that a role selects on is not shown for them: reported
// labels never take part in a decision.
func TestAuthorizeList(t *testing.T) {
	f := newFixture(t)
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	munich := store.Node{Name: "munich-1", Labels: map[string]string{"site": "munich"}}
	liar := store.Node{
		Name:           "munich-2",
		Labels:         map[string]string{"site": "munich"},
		ReportedLabels: map[string]string{"site": "berlin"},
	}
	for _, tc := range []struct {
		caller Caller
		node   store.Node
		ok     bool
	}{
		{Caller{Admin: true}, munich, true},
		{Caller{Operator: "alice"}, berlin, true},
		{Caller{Operator: "alice"}, munich, false},
		{Caller{Operator: "alice"}, liar, false},
		{Caller{Operator: "root"}, munich, true},
		{Caller{Operator: "nobody"}, berlin, false},
		{Caller{Operator: "mallory"}, berlin, false},
		{Caller{Role: "berlin-ops"}, berlin, true}, // sees it, though it may not run jobs as root there
		{Caller{Role: "berlin-ops"}, liar, false},
		{Caller{Role: "gone"}, berlin, false},
		{Caller{}, berlin, false},
	} {
		err := f.door.AuthorizeList(tc.caller, tc.node)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("AuthorizeList(%+v, %s) = %v, want ok=%v", tc.caller, tc.node.Name, err, tc.ok)
		}
	}
}
