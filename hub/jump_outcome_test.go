package hub

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/bastion"
)

// TestJumpLoginOutcome: a refusal the node reports lands on its operator's
// jump to that node and no other; an accepted login settles a waiting jump
// without a refusal; a jump whose node does not report outcomes, or that
// was never relayed, is not held back.
func TestJumpLoginOutcome(t *testing.T) {
	var l liveJumps
	l.add(1, liveJump{operator: "bob", nodeID: "n1"}, true)
	l.add(2, liveJump{operator: "alice", nodeID: "n1"}, true)
	l.add(3, liveJump{operator: "bob", nodeID: "n2"}, true)
	l.add(4, liveJump{operator: "carol", nodeID: "n3"}, false)
	l.add(5, liveJump{operator: "dave", nodeID: "n4"}, true)

	l.noteOutcome("n1", "bob", `login "root": not granted`)
	l.noteOutcome("n1", "", "") // alice's login accepted
	rec := func(id uint64, result string) bastion.JumpRecord {
		r := bastion.JumpRecord{Result: result}
		r.ID = id
		return r
	}
	for _, tc := range []struct {
		id     uint64
		result string
		want   string
	}{
		{1, "ok", `login "root": not granted`},
		{2, "ok", ""},
		{4, "ok", ""},     // node does not report outcomes: no wait
		{5, "denied", ""}, // never relayed: no wait
		{99, "ok", ""},    // never reached the dialer
	} {
		start := time.Now()
		if got := l.refusalOf(rec(tc.id, tc.result)); got != tc.want {
			t.Errorf("jump %d: refusal %q, want %q", tc.id, got, tc.want)
		}
		if d := time.Since(start); d >= outcomeWait {
			t.Errorf("jump %d: its row waited %v for an outcome it needed not wait for", tc.id, d)
		}
	}
	// Jump 3 (bob to n2) saw no refusal: n1's report is not n2's.
	l.noteOutcome("n2", "", "")
	if got := l.refusalOf(rec(3, "ok")); got != "" {
		t.Errorf("bob's jump to n2 took n1's refusal: %q", got)
	}
	// A failed login is reported after the jump ended, while its row
	// waits: the report must still find it.
	l.add(6, liveJump{operator: "erin", nodeID: "n5"}, true)
	got := make(chan string, 1)
	go func() { got <- l.refusalOf(rec(6, "ok")) }()
	for {
		l.mu.Lock()
		o := l.outcomes[6]
		l.mu.Unlock()
		if o == nil {
			t.Fatal("jump 6's outcome left the registry before it was reported")
		}
		l.noteOutcome("n5", "erin", "login \"x\": not granted")
		if isClosed(o.known) {
			break
		}
	}
	if r := <-got; r != "login \"x\": not granted" {
		t.Errorf("late report: refusal %q", r)
	}
	if len(l.outcomes) != 0 {
		t.Errorf("%d outcomes left after every jump was audited", len(l.outcomes))
	}
}
