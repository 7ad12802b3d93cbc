package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tether-dev/tether/hub/kubeone"
)

// TestKubeOneErrors: the KubeOne service's kinds of failure answer 400,
// 404 and 409 with the service's message (without its package prefix);
// anything else is the hub's own failure, its cause kept from the client.
func TestKubeOneErrors(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		msg    string
	}{
		{fmt.Errorf("%w: no KubeOne cluster named \"x\"", kubeone.ErrNotFound), http.StatusNotFound, `no KubeOne cluster named "x"`},
		{fmt.Errorf("%w: member \"n1\" is not connected", kubeone.ErrConflict), http.StatusConflict, `member "n1" is not connected`},
		{errors.Join(fmt.Errorf("%w: first", kubeone.ErrInvalid)), http.StatusBadRequest, "first"},
		{fmt.Errorf("%w: %w", kubeone.ErrInvalid, errors.New("store: node 1 is taken")), http.StatusBadRequest, "node 1 is taken"},
		{errors.New("store: disk on fire"), http.StatusInternalServerError, "render KubeOne manifest failed on the hub; its log has the cause"},
	} {
		got := kubeoneErr("render KubeOne manifest", tc.err)
		if s := statusOf(got); s != tc.status {
			t.Errorf("%v: status %d, want %d", tc.err, s, tc.status)
		}
		var f *failure
		if !errors.As(got, &f) || f.msg != tc.msg {
			t.Errorf("%v: message %q, want %q", tc.err, got, tc.msg)
		}
	}
}

// TestKubeOneDisabled: a hub without the KubeOne service answers 404 on
// its endpoints (behind the admin check, which the handler is tested
// without here).
func TestKubeOneDisabled(t *testing.T) {
	h := &handler{}
	rec := httptest.NewRecorder()
	h.kubeoneStatus(rec, httptest.NewRequest(http.MethodGet, "/v1/kubeone/x/status", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("status %d, want 404", rec.Code)
	}
}
