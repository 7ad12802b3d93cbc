package bastion

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel"
)

// newSigner is a fresh ed25519 key (internal/testenv).
func newSigner(t *testing.T) gossh.Signer { return testenv.NewKey(t).Signer }

type noDialer struct{}

func (noDialer) Dial(context.Context, JumpRequest) (tunnel.Stream, error) {
	return nil, errors.New("no nodes in this test")
}

type failures struct {
	mu  sync.Mutex
	all []LoginFailure
}

func (f *failures) add(x LoginFailure) { f.mu.Lock(); f.all = append(f.all, x); f.mu.Unlock() }
func (f *failures) get() []LoginFailure {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]LoginFailure(nil), f.all...)
}

// testBastion runs a bastion on loopback that lets alice in with key.
func testBastion(
	t *testing.T, key gossh.PublicKey, lim *ratelimit.Limiter, handshake time.Duration,
) (*Bastion, string, *failures) {
	t.Helper()
	fs := &failures{}
	b, addr := startBastion(t, Config{
		Addr: "127.0.0.1:0", HostSigner: newSigner(t), Dialer: noDialer{}, Limiter: lim, OnLoginFailure: fs.add,
		HandshakeTimeout: handshake,
		Authorize: func(user string, k gossh.PublicKey) bool {
			return user == "alice" && string(k.Marshal()) == string(key.Marshal())
		},
	})
	return b, addr, fs
}

// startBastion serves a bastion made from cfg until the test ends.
func startBastion(t *testing.T, cfg Config) (*Bastion, string) {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := b.Listen()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Serve() }()
	t.Cleanup(func() {
		b.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return b, addr.String()
}

// login connects from source IP from as user with key; banner collects
// any banner the server sends.
func login(addr, from, user string, key gossh.Signer) (banner string, err error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	cfg := &gossh.ClientConfig{
		User: user, Auth: []gossh.AuthMethod{gossh.PublicKeys(key)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), // the test's own bastion; host keys are not under test
		BannerCallback:  func(m string) error { banner += m; return nil },
	}
	c, chans, reqs, err := gossh.NewClientConn(conn, addr, cfg)
	if err != nil {
		return banner, err
	}
	gossh.NewClient(c, chans, reqs).Close()
	return banner, nil
}

// TestBadLoginsRateLimited: a source that fails Burst times is refused at
// connect — now and then with a banner that says why, otherwise without a
// key exchange — and reported once per episode; another source's operator
// still gets in.
func TestBadLoginsRateLimited(t *testing.T) {
	noLeaks(t)
	alice := newSigner(t)
	mallory := newSigner(t)
	lim := ratelimit.New(ratelimit.Config{Burst: 3, Every: time.Hour, ExplainEvery: time.Hour})
	_, addr, fs := testBastion(t, alice.PublicKey(), lim, 5*time.Second)

	for i := range 3 {
		if _, err := login(addr, "127.0.0.2", "mallory", mallory); err == nil ||
			!strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("bad login %d: %v", i, err)
		}
	}
	// Failures are counted when the server closes the connection.
	waitFor(t, func() bool { return len(fs.get()) == 3 })
	// The first refusal is explained in a banner (and still refused).
	banner, err := login(addr, "127.0.0.2", "alice", alice)
	if err == nil || !strings.Contains(banner, "too many failed SSH logins from 127.0.0.2; try again in") {
		t.Fatalf("first refused login: banner %q, err %v", banner, err)
	}
	// Later ones are cut before the key exchange.
	for range 5 {
		banner, err := login(addr, "127.0.0.2", "mallory", mallory)
		if err == nil || banner != "" {
			t.Fatalf("refused login: banner %q, err %v", banner, err)
		}
	}
	if _, err := login(addr, "127.0.0.1", "alice", alice); err != nil {
		t.Fatalf("alice from another address: %v", err)
	}

	waitFor(t, func() bool { return len(fs.get()) >= 4 })
	var refused, limited int
	for _, f := range fs.get() {
		switch f.Result {
		case "refused":
			refused++
			if f.User != "mallory" || f.Attempts < 1 || !strings.HasPrefix(f.Remote, "127.0.0.2:") ||
				!strings.Contains(f.Reason, "authentication failed") {
				t.Errorf("failure report: %+v", f)
			}
		case "rate_limited":
			limited++
			if !strings.Contains(f.Reason, "too many failed logins from 127.0.0.2") {
				t.Errorf("rate limit report: %+v", f)
			}
		default:
			t.Errorf("unexpected report: %+v", f)
		}
	}
	if refused != 3 || limited != 1 {
		t.Fatalf("%d refused and %d rate_limited reports, want 3 and 1 (one per episode): %+v", refused, limited, fs.get())
	}
}

// TestSlowlorisBounded: a client that connects and then trickles (or sends
// nothing) is cut at the handshake timeout, however active it looks, and
// reported as a timeout.
func TestSlowlorisBounded(t *testing.T) {
	noLeaks(t)
	_, addr, fs := testBastion(t, newSigner(t).PublicKey(), nil, 400*time.Millisecond)
	for _, trickle := range []bool{false, true} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		closed := make(chan struct{})
		go func() { io.Copy(io.Discard, conn); close(closed) }()
		if trickle {
			for _, c := range []byte("SSH-2.0-slow") {
				if _, err := conn.Write([]byte{c}); err != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("trickle=%v: connection still open after 5 s", trickle)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("trickle=%v: closed after %s with a 400ms handshake timeout", trickle, d)
		}
		conn.Close()
	}
	waitFor(t, func() bool { return len(fs.get()) == 2 })
	for _, f := range fs.get() {
		if f.Result != "timeout" || !strings.Contains(f.Reason, "not completed within 400ms") {
			t.Errorf("report: %+v", f)
		}
	}
}

// noLeaks checks, after every other cleanup, that the test's goroutines
// are gone.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 100 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("condition not met within 5 s")
}
