package resume

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-dev/tether/tunnel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var transports = []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP}

// testCerts is a throwaway CA with a hub and a node certificate, for real
// tunnel sessions on 127.0.0.1.
type testCerts struct {
	pool           *x509.CertPool
	server, client tls.Certificate
}

var getCerts = sync.OnceValue(func() *testCerts {
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "resume test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		panic(err)
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) tls.Certificate {
		key := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			panic(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testCerts{
		pool:   pool,
		server: issue(2, "hub", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)}),
		client: issue(3, "node-1", x509.ExtKeyUsageClientAuth, nil),
	}
})

// startListener listens on 127.0.0.1:0 until the test ends.
func startListener(t testing.TB) *tunnel.Listener {
	t.Helper()
	c := getCerts()
	l, err := tunnel.Listen(t.Context(), "127.0.0.1:0", tunnel.ListenConfig{
		TunnelTLS: &tls.Config{
			Certificates: []tls.Certificate{c.server}, ClientCAs: c.pool, ClientAuth: tls.RequireAndVerifyClientCert,
		},
	})
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// dial connects an agent session to l over tr and accepts it as the hub's.
// Both are closed when the test ends.
func dial(t testing.TB, l *tunnel.Listener, tr tunnel.Transport) (agent, hub tunnel.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := getCerts()
	d := &tunnel.Dialer{
		TLSConfig: &tls.Config{RootCAs: c.pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{c.client}},
		Transport: tr,
	}
	agent, err := d.Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatalf("Dial %v: %v", tr, err)
	}
	t.Cleanup(func() { _ = agent.Close() })
	hub, err = l.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { _ = hub.Close() })
	return agent, hub
}

// openUnder opens a tunnel stream on from and accepts it on to, with the
// Open frame of id, as the caller of New does.
func openUnder(t testing.TB, from, to tunnel.Session, id ID) (tunnel.Stream, tunnel.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := from.OpenStream(ctx)
	if err != nil {
		t.Fatalf("OpenStream: %v", err)
	}
	if err := WriteOpen(a, id); err != nil {
		t.Fatalf("WriteOpen: %v", err)
	}
	b, err := to.AcceptStream(ctx)
	if err != nil {
		t.Fatalf("AcceptStream: %v", err)
	}
	got, err := ReadOpen(b)
	if err != nil || got != id {
		t.Fatalf("ReadOpen = %v, %v; want %v", got, err, id)
	}
	return a, b
}

// pair is a resumable stream between a hub and an agent session: the hub
// opened it and keeps it in its Set (it accepts resumes); the agent resumes.
type pair struct {
	hub, agent       *Stream
	hubSet, agentSet *Set
}

func newPair(t testing.TB, agentSess, hubSess tunnel.Session, hubCfg, agentCfg Config) *pair {
	t.Helper()
	return newPairIn(t, agentSess, hubSess, hubCfg, agentCfg, NewSet(), NewSet())
}

// newPairIn is newPair with the sets the streams join.
func newPairIn(t testing.TB, agentSess, hubSess tunnel.Session, hubCfg, agentCfg Config, hubSet, agentSet *Set) *pair {
	t.Helper()
	id := NewID()
	hu, au := openUnder(t, hubSess, agentSess, id)
	p := &pair{hub: New(id, hu, hubCfg), agent: New(id, au, agentCfg), hubSet: hubSet, agentSet: agentSet}
	if err := p.hubSet.Add(p.hub); err != nil {
		t.Fatal(err)
	}
	if err := p.agentSet.Add(p.agent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.hub.Abort("test over")
		p.agent.Abort("test over")
	})
	return p
}

// acceptor serves Resume requests arriving on a hub session into set, as
// the hub's integration does, until the session ends.
type acceptor struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func serveResumes(t testing.TB, hub tunnel.Session, set *Set) *acceptor {
	acc := &acceptor{}
	ctx, cancel := context.WithCancel(context.Background())
	acc.wg.Go(func() {
		for {
			st, err := hub.AcceptStream(ctx)
			if err != nil {
				return
			}
			acc.wg.Go(func() {
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := set.Accept(actx, st); err != nil {
					acc.mu.Lock()
					acc.errs = append(acc.errs, err)
					acc.mu.Unlock()
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		_ = hub.Close()
		acc.wg.Wait()
	})
	return acc
}

func (acc *acceptor) errors() []error {
	acc.mu.Lock()
	defer acc.mu.Unlock()
	return append([]error(nil), acc.errs...)
}

// resumeOver re-attaches s over a new stream of sess, retrying while the
// handshake fails for a reason other than the stream's end (for up to 10s).
func resumeOver(t testing.TB, sess tunnel.Session, s *Stream) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		u, err := sess.OpenStream(ctx)
		if err == nil {
			err = s.Resume(ctx, u)
		}
		cancel()
		var ended *EndedError
		if err == nil || errors.As(err, &ended) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-s.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// under returns the current underlying stream of s, or nil.
func under(s *Stream) tunnel.Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.att == nil {
		return nil
	}
	return s.att.under
}

// cut closes the current underlying stream of s, as a dying link would.
func cut(s *Stream) {
	if u := under(s); u != nil {
		_ = u.Close()
	}
}

// waitFor polls cond every 5ms for up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitClosed(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done after %v", what, d)
	}
}

// tcpPair is a connected pair of loopback TCP connections: a real
// tunnel.Stream (net.Conn with CloseWrite) for tests that need no session.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = a.Close(); _ = r.c.Close() })
	return a.(*net.TCPConn), r.c.(*net.TCPConn)
}
