package replica

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
)

func openStore(t *testing.T) *store.DB {
	t.Helper()
	s, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var testFiles = []string{"ca/ca.crt", "ca/ca.key", "secret.key"}

// testCreate stands in for the hub's identity maker: random contents,
// files that exist are kept.
func testCreate(dir string) error {
	for _, f := range testFiles {
		p := filepath.Join(dir, f)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		key, err := pki.GenerateKey()
		if err != nil {
			return err
		}
		b, _ := pki.EncodeKey(key)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func readFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, f := range testFiles {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		out[f] = b
	}
	return out
}

func sameFiles(a, b map[string][]byte) bool {
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return len(a) == len(b)
}

// Replicas starting together on one store end with one identity, and a
// restart (same data dir) or a new replica (empty data dir) gets it too,
// byte for byte.
func TestShareIdentityOneIdentity(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	const n = 4
	dirs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		dirs[i] = t.TempDir()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ShareIdentity(ctx, st, dirs[i], testFiles, testCreate); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	first := readFiles(t, dirs[0])
	for i := 1; i < n; i++ {
		if !sameFiles(first, readFiles(t, dirs[i])) {
			t.Fatalf("replica %d has another identity than replica 0", i)
		}
	}
	// A restart rotates nothing.
	if err := ShareIdentity(ctx, st, dirs[0], testFiles, testCreate); err != nil {
		t.Fatal(err)
	}
	if !sameFiles(first, readFiles(t, dirs[0])) {
		t.Fatal("a restart changed the identity")
	}
	// A lost file comes back from the store.
	os.Remove(filepath.Join(dirs[1], "secret.key"))
	if err := ShareIdentity(ctx, st, dirs[1], testFiles, testCreate); err != nil ||
		!sameFiles(first, readFiles(t, dirs[1])) {
		t.Fatalf("restoring a lost file: %v", err)
	}
	if entries, _ := filepath.Glob(filepath.Join(dirs[2], ".identity-*")); len(entries) != 0 {
		t.Fatalf("scratch dirs left behind: %v", entries)
	}
}

// A hub that already had an identity becomes the first replica with it
// (its join pins stay valid); a data dir with another identity than the
// store's is refused, never overwritten.
func TestShareIdentityExistingHub(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	old := t.TempDir()
	if err := testCreate(old); err != nil {
		t.Fatal(err)
	}
	before := readFiles(t, old)
	if err := ShareIdentity(ctx, st, old, testFiles, testCreate); err != nil {
		t.Fatal(err)
	}
	if !sameFiles(before, readFiles(t, old)) {
		t.Fatal("the existing hub's identity changed")
	}
	other := t.TempDir()
	if err := testCreate(other); err != nil {
		t.Fatal(err)
	}
	err := ShareIdentity(ctx, st, other, testFiles, testCreate)
	if !errors.Is(err, ErrIdentityMismatch) {
		t.Fatalf("a data dir with another identity: %v, want ErrIdentityMismatch", err)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "ca/ca.key")); bytes.Equal(b, before["ca/ca.key"]) {
		t.Fatal("the other identity was overwritten")
	}
}

// twoReplicas starts replicas a and b on one store and CA; hold answers
// for b's nodes.
type testReplica struct {
	p   *Peers
	reg *prometheus.Registry
}

func startReplica(t *testing.T, st store.ReplicaStore, c *ca.CA, id string, hold HoldFunc,
	opts ...func(*Config)) testReplica {
	t.Helper()
	reg := prometheus.NewRegistry()
	tc := tunnel.DefaultConfig()
	cfg := Config{
		ID:         id,
		Store:      st,
		CA:         c,
		Listen:     "127.0.0.1:0",
		Hold:       hold,
		Tunnel:     tc,
		Registerer: reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), store.Replica{APIAddr: "api-" + id,
		Hubs: []string{id + ".example:7443"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return testReplica{p: p, reg: reg}
}

func testCA(t *testing.T) *ca.CA {
	t.Helper()
	c, err := ca.LoadOrCreate(t.TempDir(), "Test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echoHold stands in for the holder's node tunnel: an in-memory stream
// that echoes, for node "n1" only.
func echoHold(t *testing.T) HoldFunc {
	return func(_ context.Context, nodeID string, h tunnel.Header) (tunnel.Stream, error) {
		if nodeID != "n1" {
			return nil, errors.New("node " + nodeID + " is not held here")
		}
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(b, b); b.Close() }()
		return pipeStream{a}, nil
	}
}

type pipeStream struct{ net.Conn }

// node is the store's record of node id, as the door passes it.
func node(id string) store.Node { return store.Node{ID: id, Name: id} }

func (p pipeStream) CloseWrite() error { return p.Close() }

// A stream for a node held by replica b, entering at replica a, reaches
// b's hold over a peer link and carries bytes both ways; the link is
// dialed once and metered.
func TestPeerRouteForwards(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	a := startReplica(t, st, c, "a", func(context.Context, string, tunnel.Header) (tunnel.Stream, error) {
		return nil, errors.New("a holds nothing")
	})
	b := startReplica(t, st, c, "b", echoHold(t))
	ctx := context.Background()
	if r, ok, err := a.p.Route(ctx, node("n1")); err != nil || ok {
		t.Fatalf("route before any presence: %v, %v, %v", r, ok, err)
	}
	claim := b.p.Connected(ctx, "n1", nil)
	if r, ok, _ := b.p.Route(ctx, node("n1")); ok {
		t.Fatalf("the holder routed its own node through a peer: %v", r)
	}
	r, ok, err := a.p.Route(ctx, node("n1"))
	if err != nil || !ok || r.String() != "peer b" {
		t.Fatalf("route: %v, %v, %v; want peer b", r, ok, err)
	}
	for i := range 3 {
		s, err := r.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		msg := []byte(strings.Repeat("x", 1000))
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("echo: %v", err)
		}
		s.Close()
	}
	if got := testutil.ToFloat64(a.p.m.streams.WithLabelValues("out", "ok")); got != 3 {
		t.Errorf("a's forwarded streams: %v, want 3", got)
	}
	if got := testutil.ToFloat64(a.p.m.links.WithLabelValues("out")); got != 1 {
		t.Errorf("a's outgoing links: %v, want 1 (dialed once, reused)", got)
	}
	if got := testutil.ToFloat64(a.p.m.bytes.WithLabelValues("to_peer")); got != 3000 {
		t.Errorf("a's bytes to the peer: %v, want 3000", got)
	}
	if links := a.p.Links(); len(links) != 1 || links[0] != "b" {
		t.Errorf("a's links: %v, want [b]", links)
	}
	// The holder refuses a node it does not hold; the error says why.
	b.p.Connected(ctx, "n2", nil)
	r2, ok, _ := a.p.Route(ctx, node("n2"))
	if !ok {
		t.Fatal("no route to n2")
	}
	if _, err := r2.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH}); err == nil ||
		!strings.Contains(err.Error(), "not held here") {
		t.Fatalf("dial a node the holder does not hold: %v", err)
	}
	// Once b releases the node, a no longer routes to it.
	b.p.Disconnected(claim)
	if _, ok, _ := a.p.Route(ctx, node("n1")); ok {
		t.Fatal("route to a released node")
	}
}

// A replica that stops heartbeating loses its nodes when its lease ends.
func TestPresenceExpiresWithLease(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	// A dead replica: its record and claim, and no heartbeat since.
	past := time.Now().Add(-time.Second)
	if err := st.HeartbeatReplica(ctx, store.Replica{ID: "dead", PeerAddr: "127.0.0.1:1", LeaseUntil: past}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimPresence(ctx, store.Presence{NodeID: "n1", ReplicaID: "dead", LeaseUntil: past}); err != nil {
		t.Fatal(err)
	}
	a := startReplica(t, st, testCA(t), "a", echoHold(t))
	if r, ok, err := a.p.Route(ctx, node("n1")); ok || err != nil {
		t.Fatalf("route through a replica whose lease ended: %v, %v", r, err)
	}
}

// Only a hub replica's certificate opens a peer link: a node's (or any
// other kind's) certificate from the same CA is refused in the handshake,
// and a replica dialing a peer checks it is the replica it meant.
func TestPeerLinkNeedsReplicaCertificate(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	b := startReplica(t, st, c, "b", echoHold(t))
	node, _, err := c.IssueKeyPair(pki.Identity{Kind: pki.KindNode, ID: "n1"}, "n1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	replicaA, err := c.IssueReplica("a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		ok   bool
	}{
		{"node certificate", node, false},
		{"replica certificate", replicaA, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tunnel.Dialer{Transport: tunnel.TransportTCP, TLSConfig: &tls.Config{
				Certificates: []tls.Certificate{tc.cert},
				RootCAs:      c.Pool(),
				ServerName:   ca.ReplicaServerName,
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sess, err := d.Dial(ctx, b.p.Addr().String())
			if err == nil {
				defer sess.Close()
				// TLS 1.3: the client may finish first; a refused session
				// ends at once.
				st, oerr := sess.OpenStream(ctx)
				if oerr == nil {
					_ = WriteRequest(st, Request{NodeID: "n1", Header: tunnel.Header{Service: tunnel.ServiceSSH}})
					_, err = tunnel.ReadReply(st)
				} else {
					err = oerr
				}
			}
			if (err == nil) != tc.ok {
				t.Fatalf("dial with a %s: %v, want ok=%v", tc.name, err, tc.ok)
			}
		})
	}
	// The dialer side: a server that is a replica, but not the one wanted.
	cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{replicaA.Leaf}}
	if _, err := checkPeer(cs, "b"); err == nil {
		t.Fatal("replica a accepted as replica b")
	}
	nodeState := tls.ConnectionState{PeerCertificates: []*x509.Certificate{node.Leaf}}
	if _, err := checkPeer(nodeState, ""); err == nil {
		t.Fatal("a node certificate accepted as a replica")
	}
}

// A malformed peer request closes that stream only: the link and the
// replica keep serving.
func TestMalformedPeerRequestClosesStream(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	a := startReplica(t, st, c, "a", echoHold(t))
	b := startReplica(t, st, c, "b", echoHold(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := a.p.dial(ctx, "b", b.p.addr, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, junk := range [][]byte{
		{9, 1, 'x'}, {1, 0}, {1, 2, 0xff, '\n', 1, 0, 3, 1, 0, 0}, {1, 2, 'n', '1', 7, 0, 3, 9, 9, 9},
	} {
		s, err := sess.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = s.Write(junk)
		_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := s.Read(make([]byte, 16)); err == nil {
			t.Fatalf("request %x: got %d bytes of answer, want the stream closed", junk, n)
		}
		s.Close()
	}
	if got := testutil.ToFloat64(b.p.m.streams.WithLabelValues("in", "malformed")); got != 4 {
		t.Errorf("malformed requests counted: %v, want 4", got)
	}
	b.p.Connected(ctx, "n1", nil)
	r, ok, err := a.p.Route(ctx, node("n1"))
	if !ok || err != nil {
		t.Fatalf("route: %v %v", ok, err)
	}
	s, err := r.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
	if err != nil {
		t.Fatalf("a good request after malformed ones: %v", err)
	}
	s.Close()
}

func TestRequestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	want := Request{NodeID: "3f2a-node_1.x", Header: tunnel.Header{Service: tunnel.ServiceTCP, Port: 8080}}
	if err := WriteRequest(&buf, want); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("payload")
	got, err := ReadRequest(&buf)
	if err != nil || got != want {
		t.Fatalf("ReadRequest: %+v, %v; want %+v", got, err, want)
	}
	if buf.String() != "payload" {
		t.Fatalf("ReadRequest read into the payload: %q left", buf.String())
	}
	for _, bad := range []Request{
		{NodeID: "", Header: want.Header},
		{NodeID: strings.Repeat("a", 65), Header: want.Header},
		{NodeID: "a/b", Header: want.Header},
	} {
		if err := WriteRequest(io.Discard, bad); !errors.Is(err, ErrBadRequest) {
			t.Errorf("WriteRequest(%q): %v, want ErrBadRequest", bad.NodeID, err)
		}
	}
}

func FuzzReadRequest(f *testing.F) {
	var ok bytes.Buffer
	_ = WriteRequest(&ok, Request{NodeID: "n1", Header: tunnel.Header{Service: tunnel.ServiceSSH}})
	f.Add(ok.Bytes())           // a valid request
	f.Add([]byte{1, 0})         // empty node id
	f.Add([]byte{2, 1, 'a'})    // unknown version
	f.Add([]byte{1, 255, 'a'})  // truncated node id
	f.Add([]byte{1, 1, 'a', 1}) // truncated header
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ReadRequest(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		var out bytes.Buffer
		if err := WriteRequest(&out, r); err != nil {
			t.Fatalf("a request that was read does not write back: %v", err)
		}
		if !bytes.HasPrefix(b, out.Bytes()) {
			t.Fatalf("round trip: %x is not a prefix of %x", out.Bytes(), b)
		}
	})
}
