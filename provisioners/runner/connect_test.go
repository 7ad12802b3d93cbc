package runner

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

func TestConnectHostVerification(t *testing.T) {
	for _, kind := range serverKinds {
		t.Run(kind, func(t *testing.T) {
			good := newServer(t, kind, hostCertOK)
			tests := []struct {
				name    string
				server  func() *testServer
				node    string
				cas     func(s *testServer) []ssh.PublicKey // nil: the server's host CA
				wantErr error
				wantMsg string
			}{
				{name: "certified node", node: testNodeName},
				{name: "second principal", node: testNodeName + ".tether"},
				{name: "CA rotation overlap", node: testNodeName, cas: func(s *testServer) []ssh.PublicKey {
					return []ssh.PublicKey{testenv.NewKey(t).Pub(), s.hostCA.Pub()}
				}},
				{name: "certificate for another node", node: "node2", wantErr: ErrHostKey, wantMsg: "principal"},
				{name: "certificate from a foreign CA", node: testNodeName, wantErr: ErrHostKey,
					wantMsg: "not a trusted SSH host CA",
					server:  func() *testServer { return newServer(t, kind, hostCertRogue) }},
				{name: "plain host key", node: testNodeName, wantErr: ErrHostKey, wantMsg: "plain",
					server: func() *testServer { return newServer(t, kind, hostCertNone) }},
				{name: "expired host certificate", node: testNodeName, wantErr: ErrHostKey, wantMsg: "expired",
					server: func() *testServer { return newServer(t, kind, hostCertExpired) }},
				{name: "no trusted CA", node: testNodeName, wantErr: ErrHostKey, wantMsg: "no trusted SSH host CA",
					cas: func(*testServer) []ssh.PublicKey { return nil }},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					s := good
					if tt.server != nil {
						s = tt.server()
					}
					var mu sync.Mutex
					var dialed []error
					r := s.runner(t, func(c *Config) {
						if tt.cas != nil {
							c.HostCAs = func() []ssh.PublicKey { return tt.cas(s) }
						}
						c.OnDial = func(node string, took time.Duration, err error) {
							mu.Lock()
							defer mu.Unlock()
							if node != tt.node || took <= 0 {
								t.Errorf("OnDial(%q, %v)", node, took)
							}
							dialed = append(dialed, err)
						}
					})
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					c, err := r.Connect(ctx, tt.node, s.auth(t, s.userCA, certOpts{}))
					if c != nil {
						defer c.Close()
					}
					if tt.wantErr == nil {
						if err != nil {
							t.Fatalf("Connect: %v", err)
						}
						if out := mustRun(t, c, "echo ok"); out != "ok\n" {
							t.Errorf("output %q", out)
						}
					} else if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) ||
						!strings.Contains(err.Error(), tt.node) {
						t.Fatalf("Connect: %v, want %v mentioning %q and the node", err, tt.wantErr, tt.wantMsg)
					}
					mu.Lock()
					defer mu.Unlock()
					if len(dialed) != 1 || !errors.Is(dialed[0], tt.wantErr) && dialed[0] != tt.wantErr {
						t.Errorf("OnDial saw %v, want one call with %v", dialed, tt.wantErr)
					}
				})
			}
		})
	}
}

func TestConnectUserAuth(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		r := s.runner(t)
		plainKey := testenv.NewKey(t)
		tests := []struct {
			name string
			auth Auth
		}{
			{"certificate from a foreign CA", s.auth(t, testenv.NewKey(t), certOpts{})},
			{"certificate for another login", s.auth(t, s.userCA, certOpts{principals: []string{"someone-else"}})},
			{"expired certificate", s.auth(t, s.userCA, certOpts{expired: true})},
			{"plain key", Auth{Login: s.login, Signer: plainKey.Signer}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c, err := r.Connect(ctx, testNodeName, tt.auth)
				if err == nil {
					c.Close()
				}
				if !errors.Is(err, ErrAuth) || errors.Is(err, ErrHostKey) || !strings.Contains(err.Error(), testNodeName) {
					t.Fatalf("Connect: %v, want ErrAuth naming the node", err)
				}
			})
		}
	})
}

func TestConnectTimeouts(t *testing.T) {
	ca := testenv.NewKey(t)
	auth := Auth{Login: "root", Signer: testenv.NewKey(t).Signer}
	newRunner := func(t *testing.T, dial DialFunc) *Runner {
		r, err := New(Config{
			Dial:             dial,
			HostCAs:          func() []ssh.PublicKey { return []ssh.PublicKey{ca.Pub()} },
			HandshakeTimeout: 300 * time.Millisecond,
			Logger:           testenv.Logger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// silentPeer is a stream whose other end never says anything.
	silentPeer := func(t *testing.T) DialFunc {
		return func(context.Context, string) (net.Conn, error) {
			hub, peer, err := socketPair()
			if err == nil {
				t.Cleanup(func() { peer.Close() })
			}
			return hub, err
		}
	}

	t.Run("handshake timeout", func(t *testing.T) {
		start := time.Now()
		_, err := newRunner(t, silentPeer(t)).Connect(context.Background(), testNodeName, auth)
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Connect: %v, want ErrTimeout", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("took %v with a 300ms handshake timeout", took)
		}
	})
	t.Run("cancelled during handshake", func(t *testing.T) {
		r := newRunner(t, silentPeer(t))
		r.cfg.HandshakeTimeout = time.Minute
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := r.Connect(ctx, testNodeName, auth)
		if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Connect: %v, want ErrCanceled", err)
		}
	})
	t.Run("dial blocks", func(t *testing.T) {
		_, err := newRunner(t, func(ctx context.Context, _ string) (net.Conn, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}).Connect(context.Background(), testNodeName, auth)
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("Connect: %v, want ErrTimeout", err)
		}
	})
	t.Run("dial fails", func(t *testing.T) {
		dialErr := errors.New("node not connected")
		_, err := newRunner(t, func(context.Context, string) (net.Conn, error) { return nil, dialErr }).
			Connect(context.Background(), testNodeName, auth)
		if !errors.Is(err, dialErr) || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), testNodeName) {
			t.Fatalf("Connect: %v, want the dial error naming the node", err)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		r := newRunner(t, silentPeer(t))
		for _, node := range []string{"", "a b", "a\nb"} {
			if _, err := r.Connect(context.Background(), node, auth); !errors.Is(err, ErrInvalid) {
				t.Errorf("node %q: %v, want ErrInvalid", node, err)
			}
		}
		if _, err := r.Connect(context.Background(), testNodeName, Auth{Login: "root"}); !errors.Is(err, ErrInvalid) {
			t.Errorf("no signer: %v, want ErrInvalid", err)
		}
		for _, cfg := range []Config{{}, {Dial: silentPeer(t)}, {HostCAs: func() []ssh.PublicKey { return nil }}} {
			if _, err := New(cfg); !errors.Is(err, ErrInvalid) {
				t.Errorf("New(%+v): %v, want ErrInvalid", cfg, err)
			}
		}
	})
}
