package operator

import (
	"fmt"
	"testing"
)

// TestLoginChallengesEvictOldest: a full table of pending challenges
// forgets its oldest nonce instead of refusing a new one.
func TestLoginChallengesEvictOldest(t *testing.T) {
	var c challenges
	first, _, err := c.issue("op-0")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < maxChallenges; i++ {
		if _, _, err := c.issue(fmt.Sprintf("op-%d", i)); err != nil {
			t.Fatalf("challenge %d of %d: %v", i+1, maxChallenges, err)
		}
	}
	newest, _, err := c.issue("owner")
	if err != nil {
		t.Fatalf("a challenge with the table full: %v (the owner is locked out)", err)
	}
	if c.take(first, "op-0") {
		t.Error("the oldest challenge survived a full table")
	}
	if !c.take(newest, "owner") {
		t.Error("the newest challenge does not verify")
	}
	if c.take(newest, "owner") {
		t.Error("a challenge verified twice")
	}
}
