package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
)

// A handler's error wraps a kind of failure (or a domain error below, or
// a store sentinel), and statusOf turns it into the HTTP status: the one
// place that decides what a failure looks like on the wire. The kinds are
// apitype's, named here for the handlers.
var (
	ErrInvalid         = apitype.ErrInvalid
	ErrConflict        = apitype.ErrConflict
	ErrUnauthenticated = apitype.ErrUnauthenticated
	ErrRefused         = apitype.ErrRefused
	ErrNotFound        = apitype.ErrNotFound
	ErrRateLimited     = apitype.ErrRateLimited
	ErrUnavailable     = apitype.ErrUnavailable
)

// Domain errors callers branch on.
var (
	// ErrLoginRefused is wrapped by Login errors the client caused (403).
	ErrLoginRefused = route.ErrLoginRefused
	// ErrJoinRefused is wrapped by the join handler's token refusals
	// (unknown, wrong secret, expired, used up: 403). The handler audits
	// these itself, with the token id; a guard in front of the API can tell
	// them by errors.Is on its Outcome.
	ErrJoinRefused = errors.New("join refused")
)

// statusOf is the HTTP status for err; anything not classified is the
// hub's own failure (500).
func statusOf(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case store.IsStorageFull(err):
		return http.StatusInsufficientStorage
	case errors.Is(err, ErrRateLimited):
		return http.StatusTooManyRequests
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrInvalid), errors.Is(err, jobs.ErrBadSpec), errors.Is(err, cluster.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, ErrRefused), errors.Is(err, ErrLoginRefused), errors.Is(err, ErrJoinRefused),
		errors.Is(err, store.ErrTokenUnknown), errors.Is(err, store.ErrTokenExpired), errors.Is(err, store.ErrTokenUsedUp):
		return http.StatusForbidden
	case errors.Is(err, ErrNotFound), errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrConflict), errors.Is(err, store.ErrNameTaken), errors.Is(err, cluster.ErrConflict),
		errors.Is(err, jobs.ErrNotRunning):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// fail returns an error of kind whose client-facing message is the
// formatted text.
func fail(kind error, format string, args ...any) error {
	return route.Fail(kind, format, args...)
}

// internal is the hub's own failure at step (e.g. "list tokens").
func internal(step string, cause error) error { return route.Internal(step, cause) }

var errInternal = route.ErrInternal

// RetryAfter marks err as worth retrying after d (route.RetryAfter).
func RetryAfter(err error, d time.Duration) error { return route.RetryAfter(err, d) }

// WithOutcome returns r carrying a fresh Outcome (route.WithOutcome).
func WithOutcome(r *http.Request) (*http.Request, *route.Outcome) { return route.WithOutcome(r) }

// writeErr answers r with err (route.Errors.Error with statusOf).
func (h *handler) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	route.Errors{Logger: h.Logger, Status: statusOf}.Error(w, r, err)
}

func clean(err error) string { return route.Clean(err) }
