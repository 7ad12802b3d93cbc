package kubeone

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
)

// TestKubeOneErrors: the clusters' kinds of failure answer 400, 404 and
// 409 (apitype's kinds) with the clusters' message (without its package prefix);
// anything else is the hub's own failure, its cause kept from the client.
func TestKubeOneErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind error // the API answers its status
		msg  string
	}{
		{fmt.Errorf("%w: no KubeOne cluster named \"x\"", ErrNotFound), apitype.ErrNotFound,
			`no KubeOne cluster named "x"`},
		{fmt.Errorf("%w: member \"n1\" is not connected", ErrConflict), apitype.ErrConflict,
			`member "n1" is not connected`},
		{errors.Join(fmt.Errorf("%w: first", ErrInvalid)), apitype.ErrInvalid, "first"},
		{fmt.Errorf("%w: %w", ErrInvalid, errors.New("store: node 1 is taken")), apitype.ErrInvalid, "node 1 is taken"},
		{errors.New("store: disk on fire"), route.ErrInternal,
			"render KubeOne manifest failed on the hub; its log has the cause"},
	} {
		got := apiErr("render KubeOne manifest", tc.err)
		if !errors.Is(got, tc.kind) {
			t.Errorf("%v: kind of %v, want %v", tc.err, got, tc.kind)
		}
		if msg, ok := route.Message(got); !ok || msg != tc.msg {
			t.Errorf("%v: message %q, want %q", tc.err, got, tc.msg)
		}
	}
}

// TestKubeOneDisabled: a hub without KubeOne clusters answers 404 on
// their endpoints (behind the admin check, which the handler is tested
// without here).
func TestKubeOneDisabled(t *testing.T) {
	a := &API{}
	rec := httptest.NewRecorder()
	a.status(rec, httptest.NewRequest(http.MethodGet, "/v1/kubeone/x/status", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("status %d, want 404", rec.Code)
	}
}
