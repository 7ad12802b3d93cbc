package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 200},
		{fail(ErrInvalid, "bad"), 400},
		{fmt.Errorf("wrapped: %w", fail(ErrInvalid, "bad")), 400},
		{fail(ErrUnauthenticated, "who"), 401},
		{fail(ErrRefused, "no"), 403},
		{fmt.Errorf("%w: x", ErrLoginRefused), 403},
		{route.Failure(ErrJoinRefused, store.ErrTokenUsedUp, "x"), 403},
		{store.ErrTokenUnknown, 403},
		{fmt.Errorf("%w at noon", store.ErrTokenExpired), 403},
		{fmt.Errorf("store: node %q: %w", "x", store.ErrNotFound), 404},
		{fail(ErrNotFound, "gone"), 404},
		{store.ErrNameTaken, 409},
		{fail(ErrConflict, "clash"), 409},
		{fmt.Errorf("%w: parallel 0", jobs.ErrBadSpec), 400},
		{fmt.Errorf("%w: node is revoked", cluster.ErrInvalid), 400},
		{fmt.Errorf("%w: node runs k3s", cluster.ErrConflict), 409},
		{internal("store the join token", fmt.Errorf("store: create token x: %w", syscall.ENOSPC)), 507},
		{fmt.Errorf("job x: %w", jobs.ErrNotRunning), 409},
		{RetryAfter(fail(ErrRateLimited, "slow down"), time.Second), 429},
		{RetryAfter(fail(ErrUnavailable, "later"), time.Second), 503},
		{internal("step", errors.New("store: disk I/O error")), 500},
		{errors.New("anything else"), 500},
	} {
		if got := statusOf(tc.err); got != tc.want {
			t.Errorf("statusOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestWriteErr: the answer carries the status, Retry-After when asked, the
// client-facing message only (never a store or package prefix), and the
// typed error reaches an Outcome.
func TestWriteErr(t *testing.T) {
	h := &handler{Deps{Logger: slog.New(slog.DiscardHandler)}}
	for _, tc := range []struct {
		err       error
		status    int
		retry     string
		want, not string
	}{
		{RetryAfter(fail(ErrUnavailable, "the CA is down; try again"), 1500*time.Millisecond), 503, "2", "the CA is down",
			""},
		{
			internal("list nodes", errors.New("store: list nodes: database is locked")),
			500,
			"",
			"list nodes failed on the hub",
			"store:",
		},
		{errors.New("store: unclassified: SQL logic error"), 500, "", "the hub could not serve", "SQL"},
		{fail(ErrInvalid, "%s", clean(errors.New(`roles: role "x": no logins`))), 400, "", `role "x": no logins`, "roles:"},
	} {
		r, outcome := WithOutcome(httptest.NewRequest(http.MethodGet, "/v1/x", nil))
		w := httptest.NewRecorder()
		h.writeErr(w, r, tc.err)
		b, _ := io.ReadAll(w.Body)
		var e control.ErrorResponse
		_ = json.Unmarshal(b, &e)
		if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retry || !strings.Contains(e.Error, tc.want) ||
			(tc.not != "" && strings.Contains(e.Error, tc.not)) {
			t.Errorf("writeErr(%v): %d Retry-After %q %q; want %d, %q, containing %q and not %q", tc.err, w.Code,
				w.Header().Get("Retry-After"), e.Error, tc.status, tc.retry, tc.want, tc.not)
		}
		if !errors.Is(outcome.Err(), tc.err) {
			t.Errorf("outcome %v, want %v", outcome.Err(), tc.err)
		}
	}
}

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		`roles: role "a": selector "x": term 1 "x": missing operator`: `role "a": selector "x": term 1 "x": missing operator`,
		`selector: roles: selector "(": bad`:                          `selector "(": bad`,
		`store: node "n": not found`:                                  `node "n": not found`,
		`no prefix: stays`:                                            `no prefix: stays`,
	} {
		if got := clean(errors.New(in)); got != want {
			t.Errorf("clean(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestClientErrorIs: the client's Error matches the kind its status was
// mapped from.
func TestClientErrorIs(t *testing.T) {
	for _, k := range []error{
		ErrInvalid, ErrUnauthenticated, ErrRefused, ErrNotFound, ErrConflict, ErrRateLimited, ErrUnavailable,
	} {
		e := &apitype.Error{Status: statusOf(fail(k, "x"))}
		if !errors.Is(e, k) {
			t.Errorf("Error{%d} is not %v", e.Status, k)
		}
		if k != ErrNotFound && errors.Is(e, ErrNotFound) {
			t.Errorf("Error{%d} is ErrNotFound", e.Status)
		}
	}
}
