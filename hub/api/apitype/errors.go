package apitype

import (
	"errors"
	"net/http"
)

// Kinds of failure the hub answers with, each with its HTTP status. The
// handlers wrap them (hub/api re-exports them); a client branches on them
// with errors.Is on an *Error.
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
	// ErrRateLimited: the caller tried too often (429, with Retry-After).
	ErrRateLimited = errors.New("too many attempts")
	// ErrUnavailable: the hub, or a service it depends on (an external
	// step-ca), cannot serve the request now (503, with Retry-After).
	ErrUnavailable = errors.New("temporarily unavailable")
)

var kindStatus = []struct {
	kind   error
	status int
}{
	{ErrInvalid, http.StatusBadRequest},
	{ErrConflict, http.StatusConflict},
	{ErrUnauthenticated, http.StatusUnauthorized},
	{ErrRefused, http.StatusForbidden},
	{ErrNotFound, http.StatusNotFound},
	{ErrRateLimited, http.StatusTooManyRequests},
	{ErrUnavailable, http.StatusServiceUnavailable},
}

// KindStatus is the HTTP status a kind of failure is answered with; 0 for
// an error that is not one of the kinds.
func KindStatus(kind error) int {
	for _, k := range kindStatus {
		if k.kind == kind {
			return k.status
		}
	}
	return 0
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// Error is an API error with the hub's message.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is lets callers branch on the kinds of failure the hub answers with
// (errors.Is(err, apitype.ErrNotFound)).
func (e *Error) Is(target error) bool {
	s := KindStatus(target)
	return s != 0 && s == e.Status
}
