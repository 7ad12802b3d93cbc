package hub

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// testHub runs a real hub in-process on loopback ports and stops it (and
// checks for leaked goroutines) at cleanup.
func testHub(t *testing.T) (*Server, *apiclient.Client) {
	t.Helper()
	return testHubWith(t, nil)
}

// testHubWith is testHub with setup applied to the server before it runs.
func testHubWith(t *testing.T, setup func(*Server)) (*Server, *apiclient.Client) {
	t.Helper()
	return startTestHub(t, nil, setup)
}

// testHubConfig is testHub with configure applied to the hub's Config
// before New.
func testHubConfig(t *testing.T, configure func(*Config)) (*Server, *apiclient.Client) {
	t.Helper()
	return startTestHub(t, configure, nil)
}

func startTestHub(t *testing.T, configure func(*Config), setup func(*Server)) (*Server, *apiclient.Client) {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Listen: "127.0.0.1:0", SSHListen: "127.0.0.1:0"}
	if configure != nil {
		configure(&cfg)
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var c *apiclient.Client
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err = apiclient.NewLocalClient(dir); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("hub Run: %v", err)
		}
		goleak.VerifyNone(t, goleak.IgnoreCurrent())
	})
	return s, c
}

// joinNode joins a node through the real join endpoint and returns its identity.
func joinNode(t *testing.T, c *apiclient.Client, name string) *edge.Identity {
	t.Helper()
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	id, err := edge.Join(
		context.Background(),
		edge.JoinOptions{JoinString: tok.JoinString, StateDir: filepath.Join(t.TempDir(), name), Name: name},
	)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// runAgent runs a real agent of cfg until ctx ends or the test does, and
// waits for it to return.
func runAgent(t *testing.T, ctx context.Context, cfg edge.Config) {
	t.Helper()
	a, err := edge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func dialAs(t *testing.T, id *edge.Identity, transport tunnel.Transport) tunnel.Session {
	t.Helper()
	d := &tunnel.Dialer{TLSConfig: pki.ClientTLSConfig(id.Cert, id.CA), Transport: transport}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := d.Dial(ctx, id.Config.Hubs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess
}

func waitDone(t *testing.T, sess tunnel.Session, what string) {
	t.Helper()
	select {
	case <-sess.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("hub did not close the session after %s", what)
	}
}

func hello(name string) *control.Message {
	return &control.Message{
		Type:  control.TypeHello,
		Hello: &control.Hello{ProtocolVersion: control.ProtocolVersion, Name: name, AgentVersion: "test"},
	}
}

// TestBadAgentsCloseOnlyTheirSession: garbage, oversized and lying control
// messages and streams opened by an agent end that one session; a well
// behaved node on the same hub stays connected throughout.
func TestBadAgentsCloseOnlyTheirSession(t *testing.T) {
	s, c := testHub(t)
	good := joinNode(t, c, "good")
	bad := joinNode(t, c, "bad")

	goodSess := dialAs(t, good, tunnel.TransportQUIC)
	ctrl, err := goodSess.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := control.Write(ctrl, hello("good")); err != nil {
		t.Fatal(err)
	}
	if m, err := control.Read(ctrl); err != nil || m.Type != control.TypeWelcome {
		t.Fatalf("good node: %v %v", m, err)
	}
	// A well-behaved agent heartbeats (the hub closes a silent one); the
	// hub's own heartbeats are drained so its sends never block.
	stopBeats := make(chan struct{})
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopBeats:
				return
			case <-t.C:
				if control.Write(ctrl, &control.Message{Type: control.TypeHeartbeat}) != nil {
					return
				}
			}
		}
	}()
	go func() { _, _ = io.Copy(io.Discard, ctrl) }()
	t.Cleanup(func() { close(stopBeats); <-beatsDone })

	attacks := []struct {
		name string
		do   func(t *testing.T, st tunnel.Stream)
	}{
		{"oversized frame", func(t *testing.T, st tunnel.Stream) {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], 0xffffffff)
			st.Write(b[:])
		}},
		{"garbage json", func(t *testing.T, st tunnel.Stream) {
			st.Write([]byte{0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o'})
		}},
		{"truncated frame", func(t *testing.T, st tunnel.Stream) {
			st.Write([]byte{0, 0, 1, 0, '{'})
			st.CloseWrite()
		}},
		{"claims another node's name", func(t *testing.T, st tunnel.Stream) {
			control.Write(st, hello("good"))
			m, err := control.Read(st)
			if err != nil || m.Type != control.TypeNotice {
				t.Errorf("want a notice explaining the refusal, got %v %v", m, err)
			}
		}},
		{"unexpected message after hello", func(t *testing.T, st tunnel.Stream) {
			control.Write(st, hello("bad"))
			control.Read(st) // welcome
			control.Write(st, &control.Message{Type: control.TypeNotice, Notice: "I am the hub now"})
		}},
		{"no control stream", func(t *testing.T, st tunnel.Stream) {}},
	}
	for _, transport := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		for _, a := range attacks {
			t.Run(transport.String()+"/"+a.name, func(t *testing.T) {
				sess := dialAs(t, bad, transport)
				if a.name != "no control stream" {
					st, err := sess.OpenStream(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					a.do(t, st)
				}
				waitDone(t, sess, a.name)
			})
		}
	}

	t.Run("agent opens a stream to the hub", func(t *testing.T) {
		sess := dialAs(t, bad, tunnel.TransportTCP)
		ctrl, _ := sess.OpenStream(context.Background())
		control.Write(ctrl, hello("bad"))
		control.Read(ctrl)
		st, err := sess.OpenStream(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		rep, err := tunnel.ReadReply(st)
		if err != nil || rep.OK {
			t.Fatalf("stream to the hub: %+v %v, want a refusal", rep, err)
		}
	})

	// The good node was never disturbed.
	select {
	case <-goodSess.Done():
		t.Fatal("good node's session ended")
	default:
	}
	if conn, ok := s.conns.Get("good"); !ok || conn.NodeID != good.Config.NodeID {
		t.Fatal("good node no longer registered")
	}
	nodes, err := c.ListNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == "good" && !n.Online {
			t.Fatal("good node shown offline")
		}
	}
}

// TestForeignCertRefused: a certificate from another hub's CA gets no session.
func TestForeignCertRefused(t *testing.T) {
	_, c := testHub(t)
	_, other := testHub(t)
	id := joinNode(t, other, "stranger")
	mine := joinNode(t, c, "mine")
	id.Config.Hubs = mine.Config.Hubs // point the stranger at our hub
	id.CA = mine.CA                   // and let it trust our hub, so only our check can refuse it
	d := &tunnel.Dialer{TLSConfig: pki.ClientTLSConfig(id.Cert, id.CA), Transport: tunnel.TransportTCP}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := d.Dial(ctx, id.Config.Hubs[0])
	if err == nil {
		sess.Close()
		t.Fatal("foreign certificate got a tunnel session")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("refused as expected: %v", err)
	}
}
