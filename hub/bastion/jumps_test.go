package bastion

import (
	"testing"
)

// TestJumpLoginOutcome: a refusal the node reports lands on its operator's
// jump to that node and no other; an accepted login settles a waiting jump
// without a refusal; only a relayed jump to a node that reports outcomes
// waits for one; a report that comes in after the jump ended still counts.
func TestJumpLoginOutcome(t *testing.T) {
	var l liveJumps
	l.add(1, liveJump{operator: "bob", nodeID: "n1"}, true)
	l.add(2, liveJump{operator: "alice", nodeID: "n1"}, true)
	l.add(3, liveJump{operator: "bob", nodeID: "n2"}, true)
	l.add(4, liveJump{operator: "carol", nodeID: "n3"}, false)
	l.add(5, liveJump{operator: "dave", nodeID: "n4"}, true)

	l.noteOutcome("n1", "bob", `login "root": not granted`)
	l.noteOutcome("n1", "", "") // alice's login accepted
	rec := func(id uint64, result string) JumpRecord {
		r := JumpRecord{Result: result}
		r.ID = id
		return r
	}
	for _, tc := range []struct {
		id      uint64
		result  string
		waits   bool
		settled bool
		refusal string
	}{
		{1, "ok", true, true, `login "root": not granted`},
		{2, "ok", true, true, ""},
		{3, "ok", true, false, ""},      // n1's reports are not n2's
		{4, "ok", false, false, ""},     // node does not report outcomes
		{5, "denied", false, false, ""}, // never relayed
	} {
		o := l.outcome(tc.id)
		if o == nil {
			t.Fatalf("jump %d: no outcome record", tc.id)
		}
		if w := outcomeWaitFor(o, rec(tc.id, tc.result)); (w > 0) != tc.waits {
			t.Errorf("jump %d (%s): waits %v, want waiting %v", tc.id, tc.result, w, tc.waits)
		}
		if got := isClosed(o.known); got != tc.settled {
			t.Errorf("jump %d: settled %v, want %v", tc.id, got, tc.settled)
		}
		if got := l.settle(tc.id, o, 0); got != tc.refusal {
			t.Errorf("jump %d: refusal %q, want %q", tc.id, got, tc.refusal)
		}
	}
	if l.outcome(99) != nil {
		t.Error("a jump that never reached the dialer has an outcome record")
	}

	// The row of jump 6 starts waiting; the node's report comes in after
	// that (a failed login is reported when the node sees the connection
	// close) and must still find the record.
	l.add(6, liveJump{operator: "erin", nodeID: "n5"}, true)
	o := l.outcome(6)
	l.noteOutcome("n5", "erin", `login "x": not granted`)
	if got := l.settle(6, o, outcomeWait); got != `login "x": not granted` {
		t.Errorf("late report: refusal %q", got)
	}
	if len(l.outcomes) != 0 {
		t.Errorf("%d outcomes left after every jump was audited", len(l.outcomes))
	}
}
