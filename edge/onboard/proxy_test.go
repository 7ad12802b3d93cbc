package onboard

import (
	"net/http"
	"testing"
)

// The proxy choice follows Go's environment proxy rules: scheme picks the
// proxy, loopback and NO_PROXY entries (IP, CIDR, domain with subdomains,
// optional port, "*") go direct.
func TestProxyFunc(t *testing.T) {
	p := Proxy{HTTPS: "p:3128", HTTP: "http://h:8080", NoProxy: "10.0.0.0/8, .corp.example, hub.example:7443, 192.0.2.7"}
	for _, tc := range []struct {
		url, want string
	}{
		{"https://hub.other:7443/x", "http://p:3128"},
		{"http://hub.other/x", "http://h:8080"},
		{"https://127.0.0.1:7443/", ""},
		{"https://localhost:7443/", ""},
		{"https://10.1.2.3:7443/", ""},
		{"https://11.1.2.3:7443/", "http://p:3128"},
		{"https://a.corp.example:7443/", ""},
		{"https://corp.example:7443/", ""},
		{"https://notcorp.example:7443/", "http://p:3128"},
		{"https://hub.example:7443/", ""},
		{"https://hub.example:8443/", "http://p:3128"},
		{"https://192.0.2.7/", ""},
	} {
		r, _ := http.NewRequest(http.MethodGet, tc.url, nil)
		u, err := p.proxyFunc()(r)
		got := ""
		if u != nil {
			got = u.String()
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: proxy %q, %v; want %q", tc.url, got, err, tc.want)
		}
	}
	all := Proxy{HTTPS: "p:1", NoProxy: "*"}
	r, _ := http.NewRequest(http.MethodGet, "https://x.example/", nil)
	if u, _ := all.proxyFunc()(r); u != nil {
		t.Errorf("NO_PROXY=* still proxied via %v", u)
	}
}
