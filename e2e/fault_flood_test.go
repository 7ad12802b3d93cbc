package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// The attacker's source address: another loopback address, so the
// operator's own (127.0.0.1) is a different source for the rate limiter.
const attacker = "127.0.0.2"

// TestFaultLoginAndJoinFlood is fault 6: 10k bad SSH logins and 10k bad
// join attempts (100k each under make soak) from one loopback address.
// Both are rate limited per source; an operator on another address keeps
// jumping, and the added latency of their jumps is measured and bounded;
// the audit log gets a bounded number of events, not one per attempt.
func TestFaultLoginAndJoinFlood(t *testing.T) {
	attempts := soakOr(10_000, 100_000)
	h := startHubArgs(t, 0)
	h.cli("operator", "add", "alice", "--key", opPub)
	startAgent(t, h.token(), "flood1", "--ssh", "embedded", "--transport", "tcp")
	h.waitOnline("flood1", "tcp")
	c := newSSHClient(t, h)
	jump := func() time.Duration {
		start := time.Now()
		out, errOut, code := c.run(60*time.Second, "flood1", "echo ok")
		if code != 0 || strings.TrimSpace(out) != "ok" {
			t.Fatalf("legitimate jump: exit %d %q %q", code, out, errOut)
		}
		return time.Since(start)
	}
	jump() // warm up
	var base []time.Duration
	for range 10 {
		base = append(base, jump())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var sshStats, joinStats floodStats
	var wg sync.WaitGroup
	floodStart := time.Now()
	wg.Go(func() { sshFlood(ctx, h.sshAddr(), attempts, &sshStats) })
	wg.Go(func() { joinFlood(ctx, t, h, attempts, &joinStats) })
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var during []time.Duration
	for flooding := true; flooding || len(during) < 10; {
		during = append(during, jump())
		select {
		case <-done:
			flooding = false
		default:
		}
	}
	<-done
	floodFor := time.Since(floodStart)

	t.Logf("SSH flood: %d attempts in %s (%.0f/s): %d reached authentication (all refused), %d refused with a "+
		"banner, %d cut before key exchange, %d other errors",
		attempts, floodFor.Round(time.Millisecond), float64(attempts)/floodFor.Seconds(), sshStats.reached.Load(),
		sshStats.explained.Load(), sshStats.cut.Load(), sshStats.other.Load())
	t.Logf("join flood: %d attempts: %d reached the join handler (all refused), %d got 429, %d other", attempts,
		joinStats.reached.Load(), joinStats.limited.Load(), joinStats.other.Load())
	bp50, bp95, bmax := percentile(base, 50), percentile(base, 95), percentile(base, 100)
	fp50, fp95, fmax := percentile(during, 50), percentile(during, 95), percentile(during, 100)
	t.Logf("legitimate ssh -J: baseline p50 %s p95 %s max %s (%d); under the flood p50 %s p95 %s max %s (%d); "+
		"added p50 %s, p95 %s",
		bp50.Round(time.Millisecond), bp95.Round(time.Millisecond), bmax.Round(time.Millisecond), len(base),
		fp50.Round(time.Millisecond), fp95.Round(time.Millisecond), fmax.Round(time.Millisecond), len(during),
		(fp50 - bp50).Round(time.Millisecond), (fp95 - bp95).Round(time.Millisecond))

	// Rate limited: what got through is the burst plus the refill over the
	// flood's duration (20 and one per 2 s for SSH, 20 and one per second
	// for joins; see hub/limits.go).
	if max := 20 + int64(floodFor/(2*time.Second)) + 2; sshStats.reached.Load() > max {
		t.Errorf("%d bad logins reached authentication in %s; the limit allows %d", sshStats.reached.Load(), floodFor, max)
	}
	if max := 20 + int64(floodFor/time.Second) + 2; joinStats.reached.Load() > max {
		t.Errorf("%d bad joins reached the handler in %s; the limit allows %d", joinStats.reached.Load(), floodFor, max)
	}
	if sshStats.explained.Load() == 0 || sshStats.other.Load() > int64(attempts)/100 || joinStats.other.Load() > 0 {
		t.Errorf("unexpected outcomes: ssh %+v, join %+v", &sshStats, &joinStats)
	}
	// Bounded added latency: a legitimate jump under the flood stays
	// within a second of the worst one without it.
	if fp95 > bmax+time.Second {
		t.Errorf("legitimate jumps slowed from max %s to p95 %s under the flood", bmax, fp95)
	}

	// Audited, but not once per attempt.
	counts := map[string]int{}
	for _, e := range h.audit("--since", "1h") {
		if e.Kind == "ssh_login" || e.Kind == "join" {
			counts[e.Kind+"/"+e.Result]++
		}
	}
	t.Logf("audit events from the floods: %v", counts)
	if counts["ssh_login/rate_limited"] == 0 || counts["join/rate_limited"] == 0 ||
		counts["ssh_login/refused"] == 0 || counts["join/refused"] == 0 {
		t.Errorf("the floods are not in the audit log: %v", counts)
	}
	if total := counts["ssh_login/refused"] + counts["ssh_login/rate_limited"] +
		counts["join/refused"] + counts["join/rate_limited"]; total > 400 {
		t.Errorf("%d audit events for %d attempts: the audit log is flooded", total, 2*attempts)
	}
	body := h.metrics(t)
	for _, m := range []string{`tether_rate_limited_total{endpoint="ssh"}`, `tether_rate_limited_total{endpoint="join"}`} {
		if v, ok := metricValue(body, m); !ok || v < float64(attempts)/2 {
			t.Errorf("%s = %v", m, v)
		}
	}
}

type floodStats struct {
	reached, explained, cut, limited, other atomic.Int64
}

func (s *floodStats) String() string {
	return fmt.Sprintf("reached %d explained %d cut %d limited %d other %d", s.reached.Load(), s.explained.Load(),
		s.cut.Load(), s.limited.Load(), s.other.Load())
}

// sshFlood makes n login attempts with a key the bastion does not know.
func sshFlood(ctx context.Context, addr string, n int, st *floodStats) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := gossh.NewSignerFromKey(priv)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(attacker)}}
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				conn, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					st.other.Add(1)
					continue
				}
				_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
				banner := ""
				cfg := &gossh.ClientConfig{User: "mallory", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
					HostKeyCallback: gossh.InsecureIgnoreHostKey(), // an attacker checks nothing
					BannerCallback:  func(m string) error { banner += m; return nil }}
				_, _, _, err = gossh.NewClientConn(conn, addr, cfg)
				conn.Close()
				switch {
				case err == nil:
					st.other.Add(1) // logged in: must never happen
				case strings.Contains(banner, "too many failed SSH logins"):
					st.explained.Add(1)
				case strings.Contains(err.Error(), "unable to authenticate"):
					st.reached.Add(1)
				case strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "connection reset"):
					st.cut.Add(1)
				default:
					st.other.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// joinFlood posts n join requests with well-formed tokens the hub never
// issued and a valid CSR (the costly kind: a CSR is checked before the
// token).
func joinFlood(ctx context.Context, t *testing.T, h *hub, n int, st *floodStats) {
	key, _ := pki.GenerateKey()
	csr, _ := pki.NewCSR(key, "intruder")
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // an attacker checks nothing
		DialContext:         (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(attacker)}}).DialContext,
		MaxIdleConnsPerHost: 16,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	var next atomic.Int64
	var wg sync.WaitGroup
	var bad sync.Once
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n) && ctx.Err() == nil; i = next.Add(1) {
				body, _ := json.Marshal(control.JoinRequest{Token: base32ID(i) + "." + strings.Repeat("a", 32),
					Name: fmt.Sprintf("intruder-%d", i), CSR: csr})
				resp, err := hc.Post("https://"+h.apiAddr()+control.JoinPath, "application/json", bytes.NewReader(body))
				if err != nil {
					st.other.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" &&
					strings.Contains(string(b), "too many failed join attempts from "+attacker):
					st.limited.Add(1)
				case resp.StatusCode == http.StatusForbidden:
					st.reached.Add(1)
				default:
					st.other.Add(1)
					bad.Do(func() { t.Logf("unexpected join answer: %d %s", resp.StatusCode, b) })
				}
			}
		})
	}
	wg.Wait()
}

// base32ID is a well-formed token id (8 characters of a-z2-7) for i.
func base32ID(i int64) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, 8)
	for k := range b {
		b[k] = alphabet[i%32]
		i /= 32
	}
	return string(b)
}
