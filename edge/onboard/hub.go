package onboard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// DefaultHubPort is the hub's port when the address names none.
const DefaultHubPort = "7443"

// Proxy is how the hub is reached: the environment's proxy settings,
// shown and editable before anything is sent.
type Proxy struct {
	HTTPS   string `json:"https_proxy,omitempty"`
	HTTP    string `json:"http_proxy,omitempty"`
	NoProxy string `json:"no_proxy,omitempty"`
}

// ProxyFromEnv reads HTTPS_PROXY, HTTP_PROXY and NO_PROXY (or their lower
// case forms), as curl and Go's own clients do.
func ProxyFromEnv(getenv func(string) string) Proxy {
	get := func(k string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return getenv(strings.ToLower(k))
	}
	return Proxy{HTTPS: get("HTTPS_PROXY"), HTTP: get("HTTP_PROXY"), NoProxy: get("NO_PROXY")}
}

// String is the proxy as shown in the form and the summary.
func (p Proxy) String() string {
	if p.HTTPS == "" && p.HTTP == "" {
		return "none (direct)"
	}
	s := "https_proxy=" + p.HTTPS
	if p.HTTPS == "" {
		s = "http_proxy=" + p.HTTP
	}
	if p.NoProxy != "" {
		s += " no_proxy=" + p.NoProxy
	}
	return s
}

func (p Proxy) validate() error {
	for _, v := range []string{p.HTTPS, p.HTTP} {
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "socks5") {
			return fmt.Errorf("proxy %q: want http://HOST:PORT (or https://, socks5://)", v)
		}
	}
	return nil
}

// NormalizeHub checks a hub address (HOST or HOST:PORT) and adds the
// default port.
func NormalizeHub(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	addr = strings.TrimPrefix(addr, "https://")
	addr = strings.TrimSuffix(addr, "/")
	if addr == "" {
		return "", errors.New("no hub address: give HOST[:PORT] (the hub's TLS port, default 7443)")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = strings.Trim(addr, "[]"), DefaultHubPort
	}
	if host == "" || strings.ContainsAny(host, " /@?#") {
		return "", fmt.Errorf("hub address %q: want HOST[:PORT]", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("hub address %q: port must be 1-65535", addr)
	}
	return net.JoinHostPort(host, port), nil
}

// ParsePin accepts "sha256:HEX" or bare HEX (the ca=… part of a join
// string) and returns the lowercase hex.
func ParsePin(pin string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(pin))
	h = strings.TrimPrefix(h, "sha256:")
	h = strings.ReplaceAll(h, ":", "")
	if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf(
			"--ca-pin %q: want sha256:<64 hex digits> (ca_pin of `tether onboarding create -o json` on the hub, "+
				"or the ca= part of a join string)", pin)
	}
	return h, nil
}

// ErrFingerprintMismatch means the CA the hub serves is not the pinned one.
var ErrFingerprintMismatch = errors.New("onboard: the hub's CA does not match the pinned fingerprint")

// RefusedError is the hub's reasoned refusal of an onboarding (a bad,
// used-up or expired credential, a duplicate machine, no OS profile).
// Retrying cannot help; Credential says whether another credential could.
type RefusedError struct {
	Status int
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("onboard: the hub refused (%d %s): %s", e.Status, http.StatusText(e.Status), e.Reason)
}

// Credential reports whether the refusal is about the credential (another
// one could be accepted), not about the machine (a revoked node).
func (e *RefusedError) Credential() bool {
	return e.Status == http.StatusUnauthorized ||
		(e.Status == http.StatusForbidden && strings.Contains(strings.ToLower(e.Reason), "credential"))
}

// MachineKey reports whether the hub refused because this machine's UUID
// is onboarded already with another key: a second machine with the same
// UUID, or this one reinstalled without its node key.
func (e *RefusedError) MachineKey() bool {
	return e.Status == http.StatusConflict && strings.Contains(e.Reason, "another key")
}

// Hub talks to a hub's onboarding endpoints.
type Hub struct {
	Addr  string
	Proxy Proxy
	// Pin is the hex SHA-256 of the hub's CA; empty only for FetchCA.
	Pin string
	// Attempts bounds the tries of each request (network errors, 5xx,
	// busy answers); Backoff is the first wait, doubled up to 30s, with
	// jitter.
	Attempts int
	Backoff  time.Duration
	// OnRetry is told of each failed try that will be retried.
	OnRetry func(step string, attempt int, err error, wait time.Duration)
}

func (h *Hub) client(tc *tls.Config) *http.Client {
	tc.NextProtos = []string{"http/1.1"}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy: h.Proxy.proxyFunc(), TLSClientConfig: tc, TLSHandshakeTimeout: 10 * time.Second}}
}

// CAResult is the CA the hub serves, unverified until its fingerprint is
// compared, and the hub's clock.
type CAResult struct {
	CA          *x509.Certificate
	Fingerprint string // lowercase hex SHA-256 of the DER
	HubTime     time.Time
}

// FetchCA gets the hub's CA from OnboardCAPath. Nothing is trusted yet: the
// TLS connection is not verified, which is why the caller compares the
// fingerprint (pinned or confirmed by a person) before it sends anything.
func (h *Hub) FetchCA(ctx context.Context) (*CAResult, error) {
	var out *CAResult
	err := h.retry(ctx, "fetch CA", func() error {
		c := h.client(&tls.Config{
			MinVersion: tls.VersionTLS12, InsecureSkipVerify: true,
		}) //nolint:gosec // verified by fingerprint below
		defer c.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+h.Addr+onboardproto.CAPath, nil)
		if err != nil {
			return permanent(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			return err
		}
		if err := statusError(resp, b); err != nil {
			return err
		}
		certs, err := pki.ParseCerts(b)
		if err != nil {
			return permanent(fmt.Errorf("the hub at %s served no CA certificate at %s: %w", h.Addr, onboardproto.CAPath, err))
		}
		out = &CAResult{CA: certs[0], Fingerprint: pki.Fingerprint(certs[0])}
		out.HubTime, _ = http.ParseTime(resp.Header.Get("Date"))
		return nil
	})
	return out, err
}

// CheckPin compares a fetched CA with the pin, naming both on a mismatch.
func CheckPin(ca *CAResult, pin string) error {
	if ca.Fingerprint != pin {
		return fmt.Errorf("%w: the hub serves sha256:%s, the pin is sha256:%s; "+
			"this is another hub or someone in between; check the address and take the pin from the hub's admin (ca_pin of "+
			"`tether onboarding create -o json`)",
			ErrFingerprintMismatch, ca.Fingerprint, pin)
	}
	return nil
}

// Onboard posts the request over TLS that must chain to the pinned CA.
func (h *Hub) Onboard(ctx context.Context, req *onboardproto.Request) (*onboardproto.Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out onboardproto.Response
	err = h.retry(ctx, "onboard", func() error {
		tc, err := pki.PinnedTLSConfig(h.Pin, nil)
		if err != nil {
			return permanent(err)
		}
		c := h.client(tc)
		defer c.CloseIdleConnections()
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+h.Addr+onboardproto.Path,
			bytes.NewReader(body))
		if err != nil {
			return permanent(err)
		}
		hr.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(hr)
		if errors.Is(err, pki.ErrPinMismatch) {
			return permanent(pki.ErrPinMismatch)
		} else if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		if err != nil {
			return err
		}
		if err := statusError(resp, b); err != nil {
			return err
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return permanent(fmt.Errorf("decode the hub's onboarding answer: %w", err))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// statusError turns a non-200 answer into a refusal (4xx: permanent), a
// busy answer (429/503: retried after Retry-After) or a server error
// (retried).
func statusError(resp *http.Response, body []byte) error {
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var e control.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if e.Error == "" {
		e.Error = strings.TrimSpace(string(body))
		if len(e.Error) > 300 || e.Error == "" {
			e.Error = resp.Status
		}
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		after := time.Duration(0)
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			after = min(time.Duration(secs)*time.Second, time.Minute)
		}
		return &busyError{after: after, msg: fmt.Sprintf("hub busy (%s): %s", resp.Status, e.Error)}
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return permanent(&RefusedError{Status: resp.StatusCode, Reason: e.Error})
	}
	return fmt.Errorf("hub error (%s): %s", resp.Status, e.Error)
}

type busyError struct {
	after time.Duration
	msg   string
}

func (e *busyError) Error() string { return e.msg }

// permanentError ends the retries.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return permanentError{err} }

// retry runs try until it succeeds, fails permanently, the attempts are
// used up or ctx ends, waiting with capped exponential backoff and jitter
// (or the hub's Retry-After) between tries.
func (h *Hub) retry(ctx context.Context, step string, try func() error) error {
	attempts, wait := h.Attempts, h.Backoff
	if attempts <= 0 {
		attempts = 6
	}
	if wait <= 0 {
		wait = time.Second
	}
	for attempt := 1; ; attempt++ {
		err := try()
		var perm permanentError
		if err == nil {
			return nil
		}
		if errors.As(err, &perm) {
			return perm.err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s at %s: %w", step, h.Addr, ctx.Err())
		}
		if attempt >= attempts {
			return fmt.Errorf("%s at %s: gave up after %d tries: %w", step, h.Addr, attempt, err)
		}
		d := wait + rand.N(wait/2+1)
		var busy *busyError
		if errors.As(err, &busy) && busy.after > 0 {
			d = busy.after + rand.N(busy.after/2+1)
		}
		if h.OnRetry != nil {
			h.OnRetry(step, attempt, err, d)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s at %s: %w (last error: %w)", step, h.Addr, ctx.Err(), err)
		case <-time.After(d):
		}
		wait = min(wait*2, 30*time.Second)
	}
}
