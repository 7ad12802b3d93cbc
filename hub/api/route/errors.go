package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// Refusals of identities, wrapped by hub/operator's checks; hub/api maps them to
// statuses without importing that feature.
var (
	ErrLoginRefused        = errors.New("login refused")
	ErrAdminRefused        = errors.New("admin certificate refused")
	ErrNotOperatorIdentity = errors.New("not an operator API identity of this hub")
)

// failure is an API error with the message the client reads. The message
// says what failed and what to do; the kind and the cause stay available
// to errors.Is for the status and for guards, but the cause's text (store
// prefixes, SQL) never reaches the client.
type failure struct {
	kind  error
	msg   string
	cause error
}

func (e *failure) Error() string   { return e.msg }
func (e *failure) Unwrap() []error { return []error{e.kind, e.cause} }

// Fail returns an error of kind (one of apitype's) whose client-facing
// message is the formatted text.
func Fail(kind error, format string, args ...any) error {
	return &failure{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// Failure returns an error of kind with the client-facing msg that keeps
// cause for errors.Is and the log.
func Failure(kind, cause error, msg string) error {
	return &failure{kind: kind, msg: msg, cause: cause}
}

// ErrInternal is the kind of the hub's own failures (500).
var ErrInternal = errors.New("internal error")

const internalSuffix = " failed on the hub; its log has the cause"

// Internal is the hub's own failure at step (e.g. "list tokens"): the
// client reads which step failed, the cause goes to the hub's log.
func Internal(step string, cause error) error {
	return &failure{kind: ErrInternal, msg: step + internalSuffix, cause: cause}
}

// retryAfter is an error the client may retry after a while.
type retryAfter struct {
	error
	after time.Duration
}

func (e retryAfter) Unwrap() error { return e.error }

// RetryAfter marks err (usually of kind ErrRateLimited or ErrUnavailable)
// as worth retrying after d: the answer carries a Retry-After header.
func RetryAfter(err error, d time.Duration) error { return retryAfter{err, d} }

// Clean is err's text without the package prefixes ("roles: ", "selector:
// ", "store: ") that say where in the hub an error was made: the client is
// told what was wrong with its input, not which package noticed.
func Clean(err error) string {
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
// the handler did not answer through an Errors).
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

// Errors answers requests with errors: the one place that decides what a
// failure looks like on the wire.
type Errors struct {
	Logger *slog.Logger
	// Status is the HTTP status for an error (hub/api's, which knows the
	// features' error kinds as well as apitype's).
	Status func(error) int
}

// Error answers r with err (see Routes.Error).
func (e Errors) Error(w http.ResponseWriter, r *http.Request, err error) {
	noteOutcome(r, err)
	status := e.Status(err)
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
		e.Logger.Error("api request failed: disk full", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
			"err", err)
		step := "the change"
		if ae != nil {
			step = strings.TrimSuffix(ae.msg, internalSuffix)
		}
		msg = step + " failed: the hub's disk is full; free space where its data dir is and try again"
	}
	if status == http.StatusInternalServerError {
		cause := err
		if ae != nil && ae.cause != nil {
			cause = ae.cause
		}
		e.Logger.Error(
			"api request failed",
			"method",
			r.Method,
			"path",
			r.URL.Path,
			"remote",
			r.RemoteAddr,
			"err",
			cause,
		)
		if ae == nil {
			// An error no handler classified: its text (store prefixes,
			// SQL) is not for the client.
			msg = "the hub could not serve " + r.Method + " " + r.URL.Path + "; its log has the cause"
		}
	}
	JSON(w, status, apitype.ErrorResponse{Error: msg})
}

// Message is the client-facing message of an error made by Fail, Failure
// or Internal, and whether err (or an error it wraps) is one.
func Message(err error) (string, bool) {
	var f *failure
	if errors.As(err, &f) {
		return f.msg, true
	}
	return "", false
}
