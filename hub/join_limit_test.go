package hub

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/ratelimit"
)

// TestJoinRateLimitSparesBusySites: the failed-join limit must not refuse a
// site whose machines all join at once from one address (more at once than
// the failure burst), and an agent that meets the limit (429 after a flood of
// bad joins from its address) waits for Retry-After and joins.
func TestJoinRateLimitSparesBusySites(t *testing.T) {
	s, c := testHub(t)
	const site = 3 * ratelimit.JoinFailBurst
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 600, Uses: site + 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, site)
	for i := range site {
		wg.Go(func() {
			_, err := edge.Enroll(ctx, edge.JoinOptions{JoinString: tok.JoinString, Name: fmt.Sprintf("site-%02d", i)})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent join from one address: %v", err)
		}
	}

	if n := testutil.ToFloat64(s.limits.Refused.WithLabelValues("join")); n != 0 {
		t.Errorf("%v of %d concurrent valid joins were rate limited", n, site)
	}

	// Spend the failure burst with a token of the right shape but a
	// wrong secret.
	at := strings.Index(tok.JoinString, "@")
	flip := byte('a') // a secret with its last base32 character changed
	if tok.JoinString[at-1] == 'a' {
		flip = 'b'
	}
	bad := tok.JoinString[:at-1] + string(flip) + tok.JoinString[at:]
	for i := range ratelimit.JoinFailBurst {
		_, err := edge.Enroll(ctx, edge.JoinOptions{JoinString: bad, Name: "intruder"})
		if !errors.Is(err, edge.ErrJoinRefused) {
			t.Fatalf("bad join %d: %v, want a refusal", i+1, err)
		}
	}
	start := time.Now()
	if _, err := edge.Enroll(ctx, edge.JoinOptions{
		JoinString: tok.JoinString, Name: "late", StateDir: filepath.Join(t.TempDir(), "late"),
	}); err != nil {
		t.Fatalf("valid join after a flood of bad ones from the same address: %v", err)
	}
	took := time.Since(start)
	if took < time.Second {
		t.Errorf("valid join right after %d bad ones took %s: the hub did not rate limit the address",
			ratelimit.JoinFailBurst, took)
	}
	t.Logf("%d concurrent joins from one address succeeded; "+
		"a valid join right after %d bad ones waited out the limit in %s",
		site, ratelimit.JoinFailBurst, took.Round(time.Millisecond))
}
