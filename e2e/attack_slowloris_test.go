package e2e

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAttackSlowloris: connections that open a TLS or SSH handshake and
// then stall or trickle are cut at the handshake timeout (10 s for TLS on
// the tunnel/API port, 20 s for the bastion), one source holds at most the
// rate limiter's burst of unauthenticated SSH connections, an operator on
// another address jumps meanwhile, the stalled SSH handshakes are audited,
// and the hub's file descriptors return to where they were.
func TestAttackSlowloris(t *testing.T) {
	t.Parallel()
	const (
		tlsTimeout = 10 * time.Second // tunnel.DefaultHandshakeTimeout
		sshTimeout = 20 * time.Second // bastion default HandshakeTimeout
		perPort    = 40
	)
	h := startHubArgs(t, 0)
	h.cli("operator", "add", "alice", "--key", opPub)
	startAgent(t, h.token(), "slow1", "--ssh", "embedded")
	h.waitOnline("slow1", "")
	c := newSSHClient(t, h)
	if out, _, code := c.run(30*time.Second, "slow1", "echo ok"); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatal("jump before the attack")
	}
	base := h.steadyLoad(t)

	type conn struct {
		port   string
		opened time.Time
		closed time.Time
		got    string
	}
	var mu sync.Mutex
	var conns []*conn
	var wg sync.WaitGroup
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(attacker)}}
	for _, addr := range []string{h.apiAddr(), h.sshAddr()} {
		for i := range perPort {
			nc, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			cn := &conn{port: addr, opened: time.Now()}
			mu.Lock()
			conns = append(conns, cn)
			mu.Unlock()
			wg.Go(func() {
				defer nc.Close()
				if i%2 == 1 { // trickle one byte a second, looking busy
					go func() {
						for _, b := range []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 SSH-2.0-slow") {
							if _, err := nc.Write([]byte{b}); err != nil {
								return
							}
							time.Sleep(time.Second)
						}
					}()
				}
				_ = nc.SetReadDeadline(time.Now().Add(sshTimeout + 15*time.Second))
				b, _ := io.ReadAll(nc)
				mu.Lock()
				cn.closed, cn.got = time.Now(), string(b)
				mu.Unlock()
			})
		}
	}
	// Meanwhile, the operator jumps as usual.
	start := time.Now()
	if out, errOut, code := c.run(30*time.Second, "slow1", "echo during"); code != 0 ||
		strings.TrimSpace(out) != "during" {
		t.Fatalf("jump during the slowloris: exit %d %q %q", code, out, errOut)
	}
	t.Logf("a jump during the attack took %s", time.Since(start).Round(time.Millisecond))
	wg.Wait()

	var tlsHeld, sshHeld, sshRefused int
	for _, cn := range conns {
		held := cn.closed.Sub(cn.opened)
		switch {
		case cn.port == h.apiAddr():
			if held < tlsTimeout-time.Second || held > tlsTimeout+3*time.Second {
				t.Errorf("TLS handshake held %s, want about %s", held, tlsTimeout)
			}
			tlsHeld++
		case strings.Contains(cn.got, "too many failed SSH logins"):
			sshRefused++
		default:
			if held < sshTimeout-time.Second || held > sshTimeout+3*time.Second {
				t.Errorf("SSH handshake held %s, want about %s", held, sshTimeout)
			}
			sshHeld++
		}
	}
	t.Logf("slowloris from one address: %d TLS handshakes cut at ~%s; %d SSH handshakes cut at ~%s, "+
		"%d more refused at once by the rate limiter",
		tlsHeld, tlsTimeout, sshHeld, sshTimeout, sshRefused)
	// 20 attempts, plus now and then (one per 2 s) a refusal explained in
	// a banner, which takes a handshake that can stall too.
	if sshHeld > 22 || sshRefused < perPort-22 {
		t.Errorf("one source held %d unauthenticated SSH connections, %d refused; the limiter allows 20", sshHeld, sshRefused)
	}
	// The bastion closes a timed-out connection first and audits it after,
	// so the attacker's EOF can come before the audit row: wait for it.
	timeouts := waitForState(t, "the cut handshakes in the audit log", 20*time.Second, func() int {
		n := 0
		for _, e := range h.audit("--since", "1h") {
			if e.Kind == "ssh_login" && e.Result == "timeout" && strings.HasPrefix(e.Remote, attacker+":") {
				n++
			}
		}
		return n
	}, func(n int) bool { return n >= 20 })
	if timeouts > sshHeld {
		t.Errorf("%d ssh_login timeout audit events for %d cut handshakes", timeouts, sshHeld)
	}
	end := h.steadyLoad(t)
	t.Logf("hub before %s, after %s", base, end)
	if end.fds > base.fds+2 || end.goroutines > base.goroutines+5 {
		t.Errorf("hub did not recover from the slowloris: %s -> %s", base, end)
	}
}
