package ui

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tether-dev/tether/internal/testenv"
)

// BenchmarkFleet measures the fleet view at 10k and 100k nodes through the
// console's HTTP handler (session check, filter, count, sort, page, JSON):
//
//	load:   the first page, sorted by name, from the cached node list
//	cold:   the same with the cache dropped first (re-read of the store)
//	filter: label selector + state filter
//	search: name substring, sorted by last seen
//
// `go test -run '^$' -bench Fleet -benchtime 20x ./hub/ui/` (bench/RESULTS.md).
func BenchmarkFleet(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		tc := newTestConsole(b)
		testenv.FillNodes(b, tc.dbPath, n)
		ck, _ := tc.signInB(b)
		for _, c := range []struct {
			name, query string
			cold        bool
		}{
			{"load", "", false},
			{"cold", "", true},
			{"filter", "label=site%3Ds42,env%3Ddev&state=offline", false},
			{"search", "q=node-0123&sort=-last_seen", false},
		} {
			b.Run(fmt.Sprintf("%dk/%s", n/1000, c.name), func(b *testing.B) {
				get := func() {
					r := httptest.NewRequest("GET", "https://hub.example:7443/ui/api/fleet?"+c.query, nil)
					r.AddCookie(ck)
					w := httptest.NewRecorder()
					tc.ServeHTTP(w, r)
					if w.Code != http.StatusOK {
						b.Fatalf("%d %s", w.Code, w.Body)
					}
				}
				get() // the node list is cached before the clock starts
				for b.Loop() {
					if c.cold {
						tc.fleet.invalidate()
					}
					get()
				}
			})
		}
	}
}

// signInB is signIn for benchmarks.
func (tc *testConsole) signInB(b *testing.B) (*http.Cookie, string) {
	b.Helper()
	w := httptest.NewRecorder()
	tc.ServeHTTP(w, httptest.NewRequest("POST", "https://hub.example:7443/v1/console/codes", nil))
	code := w.Body.String()
	start := len(`{"code":"`)
	end := start + 43
	if len(code) < end {
		b.Fatalf("code: %s", code)
	}
	w = httptest.NewRecorder()
	tc.ServeHTTP(w, httptest.NewRequest("GET", "https://hub.example:7443/ui/signin?code="+code[start:end], nil))
	if w.Code != http.StatusSeeOther {
		b.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	return w.Result().Cookies()[0], ""
}
