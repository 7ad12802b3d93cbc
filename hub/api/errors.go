package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
)

// Kinds of failure. A handler's error wraps one of these (or a domain
// error below, or a store sentinel), and statusOf turns it into the HTTP
// status: the one place that decides what a failure looks like on the
// wire.
var (
	// ErrInvalid: the request itself is wrong (400).
	ErrInvalid = errors.New("invalid request")
	// ErrConflict: the request clashes with what exists (409).
	ErrConflict = errors.New("conflict")
	// ErrUnauthenticated: no acceptable credential was presented (401).
	ErrUnauthenticated = errors.New("not authenticated")
	// ErrRefused: the credential or the request was refused (403).
	ErrRefused = errors.New("refused")
	// ErrNotFound: what the request names does not exist (404).
	ErrNotFound = errors.New("not found")
	// ErrRateLimited: the caller tried too often; wrap it with RetryAfter (429).
	ErrRateLimited = errors.New("too many attempts")
	// ErrUnavailable: the hub, or a service it depends on (an external
	// step-ca), cannot serve the request now; wrap it with RetryAfter (503).
	ErrUnavailable = errors.New("temporarily unavailable")
)

// Domain errors callers branch on.
var (
	// ErrLoginRefused is wrapped by Login errors the client caused (403).
	ErrLoginRefused = errors.New("login refused")
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
	case errors.Is(err, ErrConflict), errors.Is(err, store.ErrNameTaken), errors.Is(err, cluster.ErrConflict), errors.Is(err, jobs.ErrNotRunning):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// failure is an API error with the message the client reads. The message
// says what failed and what to do; the kind and the cause stay
// available to errors.Is for statusOf and for guards, but the cause's text
// (store prefixes, SQL) never reaches the client.
type failure struct {
	kind  error
	msg   string
	cause error
}

func (e *failure) Error() string   { return e.msg }
func (e *failure) Unwrap() []error { return []error{e.kind, e.cause} }

// fail returns an error of kind whose client-facing message is the
// formatted text.
func fail(kind error, format string, args ...any) error {
	return &failure{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// internal is the hub's own failure at step (e.g. "list tokens"): the
// client reads which step failed, the cause goes to the hub's log.
func internal(step string, cause error) error {
	return &failure{kind: errInternal, msg: step + " failed on the hub; its log has the cause", cause: cause}
}

var errInternal = errors.New("internal error")

// retryAfter is an error the client may retry after a while.
type retryAfter struct {
	error
	after time.Duration
}

func (e retryAfter) Unwrap() error { return e.error }

// RetryAfter marks err (usually of kind ErrRateLimited or ErrUnavailable)
// as worth retrying after d: the answer carries a Retry-After header.
func RetryAfter(err error, d time.Duration) error { return retryAfter{err, d} }

// Outcome is where the API's handlers note the error they answered a
// request with, so a wrapper in front of the API (the hub's join rate
// limiter) branches on the typed error rather than parsing the body.
type Outcome struct {
	mu  sync.Mutex // guards err
	err error
}

type outcomeKey struct{}

// WithOutcome returns r carrying a fresh Outcome.
func WithOutcome(r *http.Request) (*http.Request, *Outcome) {
	o := &Outcome{}
	return r.WithContext(context.WithValue(r.Context(), outcomeKey{}, o)), o
}

// Err is the error the request was answered with (nil on success, or when
// the handler did not answer through writeErr).
func (o *Outcome) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

func noteOutcome(r *http.Request, err error) {
	if o, ok := r.Context().Value(outcomeKey{}).(*Outcome); ok {
		o.mu.Lock()
		o.err = err
		o.mu.Unlock()
	}
}

// writeErr answers r with err: the status from statusOf, Retry-After when
// err carries one, and a JSON body with the client-facing message. A 500's
// cause is logged here.
func (h *handler) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	noteOutcome(r, err)
	status := statusOf(err)
	var ra retryAfter
	if errors.As(err, &ra) {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((ra.after+time.Second-1)/time.Second))))
	}
	msg := err.Error()
	var ae *failure
	if errors.As(err, &ae) {
		msg = ae.msg
	}
	if status == http.StatusInsufficientStorage {
		// Said plainly: the operator can act on it without the log.
		h.Logger.Error("api request failed: disk full", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
		step := "the change"
		if ae != nil {
			step = strings.TrimSuffix(ae.msg, " failed on the hub; its log has the cause")
		}
		msg = step + " failed: the hub's disk is full; free space where its data dir is and try again"
	}
	if status == http.StatusInternalServerError {
		cause := err
		if ae != nil && ae.cause != nil {
			cause = ae.cause
		}
		h.Logger.Error("api request failed", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "err", cause)
		if ae == nil {
			// An error no handler classified: its text (store prefixes,
			// SQL) is not for the client.
			msg = "the hub could not serve " + r.Method + " " + r.URL.Path + "; its log has the cause"
		}
	}
	writeError(w, status, msg)
}

// clean is err's text without the package prefixes ("roles: ", "selector:
// ", "store: ") that say where in the hub an error was made: the client is
// told what was wrong with its input, not which package noticed.
func clean(err error) string {
	msg := err.Error()
	for {
		trimmed := msg
		for _, p := range []string{"roles: ", "selector: ", "store: "} {
			trimmed = strings.TrimPrefix(trimmed, p)
		}
		if trimmed == msg {
			return msg
		}
		msg = trimmed
	}
}
