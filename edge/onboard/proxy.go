package onboard

import (
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// proxyFunc chooses the proxy for a request as Go's environment proxy
// (golang.org/x/net/http/httpproxy) does: HTTPS for https URLs, HTTP for
// http ones, none for loopback and for hosts NO_PROXY names. It is written
// out here because that package links Unicode normalization tables into the
// agent binary for the one request onboarding makes.
func (p Proxy) proxyFunc() func(*http.Request) (*url.URL, error) {
	return func(r *http.Request) (*url.URL, error) {
		raw := p.HTTP
		if r.URL.Scheme == "https" {
			raw = p.HTTPS
		}
		if raw == "" || !p.useProxy(r.URL) {
			return nil, nil
		}
		if !strings.Contains(raw, "://") {
			raw = "http://" + raw
		}
		return url.Parse(raw)
	}
}

// useProxy reports whether u's host goes through the proxy under NoProxy:
// "*" exempts every host; an entry is an IP, a CIDR, or a domain that also
// covers its subdomains ("example.com", ".example.com", "*.example.com"),
// each optionally with ":PORT".
func (p Proxy) useProxy(u *url.URL) bool {
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	host = strings.ToLower(host)
	if host == "localhost" {
		return false
	}
	ip, ipErr := netip.ParseAddr(host)
	if ipErr == nil && ip.IsLoopback() {
		return false
	}
	for _, e := range strings.Split(p.NoProxy, ",") {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		if e == "*" {
			return false
		}
		if pfx, err := netip.ParsePrefix(e); err == nil {
			if ipErr == nil && pfx.Contains(ip) {
				return false
			}
			continue
		}
		ePort := ""
		if h, pt, err := net.SplitHostPort(e); err == nil {
			e, ePort = h, pt
		}
		if ePort != "" && ePort != port {
			continue
		}
		if eip, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil {
			if ipErr == nil && eip == ip {
				return false
			}
			continue
		}
		e = strings.TrimPrefix(strings.TrimPrefix(e, "*"), ".")
		if host == e || strings.HasSuffix(host, "."+e) {
			return false
		}
	}
	return true
}
