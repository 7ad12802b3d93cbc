package sshserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

// eventLog collects the server's events.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) find(kind EventKind) (Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Kind == kind {
			return e, true
		}
	}
	return Event{}, false
}

func newEventEnv(t *testing.T) (*testEnv, *eventLog) {
	l := &eventLog{}
	return newTestEnv(t, func(c *Config) { c.OnEvent = l.add }), l
}

// echoServer listens on the loopback and echoes one line per connection.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				io.WriteString(c, "echo:"+line)
			})
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

func TestLocalForwarding(t *testing.T) {
	cases := []struct {
		name, host string
		noForward  bool
		wantErr    string // "" = works
	}{
		{"loopback v4", "127.0.0.1", false, ""},
		{"localhost", "localhost", false, ""},
		{"not loopback", "192.0.2.1", false, "is not the node's loopback"},
		{"role denies", "127.0.0.1", true, "none of your roles"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, events := newEventEnv(t)
			tc := tc
			tc.host = net.JoinHostPort(tc.host, fmt.Sprint(echoServer(t)))
			dest := tc.host
			e.srv.SetAuthorizedKeyLogins([]AuthorizedKey{{Key: e.key.Pub(), NoForwarding: tc.noForward, Name: "alice"}})
			// -W opens the same direct-tcpip channel as -L.
			reply, r := e.stdioForward(dest, "hi\n")
			if tc.wantErr == "" {
				mustSucceed(t, "ssh -W", r)
				if reply != "echo:hi\n" {
					t.Fatalf("forwarded reply %q", reply)
				}
				if ev, ok := events.find(EventForward); !ok || ev.Operator != "alice" || !strings.Contains(ev.Detail, dest) {
					t.Errorf("forward event %+v, %v", ev, ok)
				}
				return
			}
			if r.code != 255 || !strings.Contains(r.stderr, tc.wantErr) {
				t.Fatalf("exit %d, stderr %q; want 255 and %q", r.code, r.stderr, tc.wantErr)
			}
			if _, ok := events.find(EventForwardRefused); !ok {
				t.Error("no forward-refused event")
			}
		})
	}
}

func TestRemoteForwarding(t *testing.T) {
	t.Run("loopback", func(t *testing.T) {
		e, events := newEventEnv(t)
		echo := echoServer(t)
		listen := testenv.FreePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := e.clientCmd(
			ctx, "ssh", "-o", "ExitOnForwardFailure=yes", "-R", fmt.Sprintf("%d:127.0.0.1:%d", listen, echo), testHost,
			"sleep 60",
		)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); cmd.Wait() }()
		var reply string
		testenv.WaitFor(t, "the remote forward answers", 20*time.Second, func() bool {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", listen), time.Second)
			if err != nil {
				return false
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "remote\n")
			reply, _ = bufio.NewReader(c).ReadString('\n')
			return reply != ""
		})
		if reply != "echo:remote\n" {
			t.Fatalf("reply %q", reply)
		}
		if _, ok := events.find(EventForward); !ok {
			t.Error("no forward event")
		}
	})
	for _, tc := range []struct{ name, bind string }{
		{"any address", "0.0.0.0"},
		{"other address", "192.0.2.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newEventEnv(t)
			echo := echoServer(t)
			r := e.ssh(
				"-o", "ExitOnForwardFailure=yes", "-R",
				fmt.Sprintf("%s:%d:127.0.0.1:%d", tc.bind, testenv.FreePort(t), echo), testHost, "true",
			)
			if r.code != 255 || !strings.Contains(r.stderr, "remote port forwarding failed") {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
		})
	}
}

// stdioForward runs ssh -W dest, sends line, reads one line of answer and
// then closes stdin. Stdin stays open until the answer is in: gliderlabs'
// forwarding has no half-close, so EOF from the client ends both directions.
func (e *testEnv) stdioForward(dest, line string) (reply string, r result) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := e.clientCmd(ctx, "ssh", "-o", "LogLevel=INFO", "-W", dest, testHost)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	io.WriteString(stdin, line)
	reply, _ = bufio.NewReader(stdout).ReadString('\n')
	stdin.Close()
	io.Copy(io.Discard, stdout)
	err := cmd.Wait()
	r = result{stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
	if ctx.Err() != nil {
		e.t.Fatalf("ssh -W %s: timed out (%v); stderr %s", dest, err, r.stderr)
	}
	return reply, r
}

// Certificate logins: forwarding follows the principal the login came
// through; a hub that never sends no_forwarding principals allows it.
func TestCertificateForwarding(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noForward []string // nil: never set, as with an older hub
		wantErr   string
	}{
		{"older hub", nil, ""},
		{"other role refuses", []string{"tether:audit:operator"}, ""},
		{"role refuses", []string{"tether:ops:operator"}, "none of your roles"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			echo := echoServer(t)
			ca := newCA(t)
			e.srv.SetAuthorizedKeys(nil)
			e.srv.SetTrustedUserCAs([]gossh.PublicKey{ca.PublicKey()})
			e.srv.SetCertPrincipals(map[string][]string{"operator": {"tether:ops:operator"}}, nil)
			if tc.noForward != nil {
				e.srv.SetNoForwardingPrincipals(tc.noForward)
			}
			cert := signCert(t, ca, &gossh.Certificate{
				Key: e.key.Pub(), CertType: gossh.UserCert, KeyId: "tether:operator:alice",
				ValidPrincipals: []string{"tether:ops:operator"}, ValidBefore: gossh.CertTimeInfinity,
			})
			if err := os.WriteFile(e.key.Path+"-cert.pub", gossh.MarshalAuthorizedKey(cert), 0o644); err != nil {
				t.Fatal(err)
			}
			reply, r := e.stdioForward(fmt.Sprintf("127.0.0.1:%d", echo), "cert\n")
			if tc.wantErr == "" {
				if r.code != 0 || reply != "echo:cert\n" {
					t.Fatalf("exit %d, reply %q, stderr %q", r.code, reply, r.stderr)
				}
				return
			}
			if r.code != 255 || !strings.Contains(r.stderr, tc.wantErr) {
				t.Fatalf("exit %d, stderr %q; want %q", r.code, r.stderr, tc.wantErr)
			}
		})
	}
}
