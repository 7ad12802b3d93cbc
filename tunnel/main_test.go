package tunnel

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
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testPKI is a throwaway CA with one hub and one node certificate.
type testPKI struct {
	pool   *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

var getPKI = sync.OnceValue(func() *testPKI {
	caKey := mustKey()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tether test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		panic(err)
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) tls.Certificate {
		key := mustKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     dns,
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			panic(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{
		pool:   pool,
		server: issue(2, "hub", x509.ExtKeyUsageServerAuth, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}),
		client: issue(3, "node-1", x509.ExtKeyUsageClientAuth, nil, nil),
	}
})

func mustKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}

// tunnelServerTLS is the hub's tunnel config: mTLS required.
func tunnelServerTLS() *tls.Config {
	p := getPKI()
	return &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientCAs:    p.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// httpServerTLS is the hub's HTTP config: client certificate optional.
func httpServerTLS() *tls.Config {
	p := getPKI()
	return &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientCAs:    p.pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
	}
}

// clientTLS is the agent's config, with or without its node certificate.
func clientTLS(withCert bool) *tls.Config {
	p := getPKI()
	c := &tls.Config{RootCAs: p.pool, ServerName: "localhost"}
	if withCert {
		c.Certificates = []tls.Certificate{p.client}
	}
	return c
}

var transports = []Transport{TransportQUIC, TransportTCP}

// startListener listens on 127.0.0.1:0 and closes the listener at cleanup.
func startListener(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	l, err := Listen(t.Context(), "127.0.0.1:0", ListenConfig{
		TunnelTLS: tunnelServerTLS(),
		HTTPTLS:   httpServerTLS(),
		Config:    cfg,
	})
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// dialAccept dials addr over tr and accepts the session on l.
func dialAccept(
	t testing.TB, l *Listener, addr string, tr Transport, cfg *Config, opts ...func(*Dialer),
) (agent, hub Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := &Dialer{TLSConfig: clientTLS(true), Config: cfg, Transport: tr}
	for _, o := range opts {
		o(d)
	}
	agent, err := d.Dial(ctx, addr)
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

// pair returns a connected agent/hub session pair over tr.
func pair(t testing.TB, tr Transport, cfg *Config) (agent, hub Session) {
	t.Helper()
	l := startListener(t, cfg)
	return dialAccept(t, l, l.Addr().String(), tr, cfg)
}

// openPair opens a stream from "from" and accepts it on "to". It writes one
// byte first (QUIC only announces a stream with data) and reads it on the
// other side.
func openPair(t testing.TB, from, to Session) (Stream, Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	a, err := from.OpenStream(ctx)
	if err != nil {
		t.Fatalf("OpenStream: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	if _, err := a.Write([]byte{'!'}); err != nil {
		t.Fatalf("write: %v", err)
	}
	b, err := to.AcceptStream(ctx)
	if err != nil {
		t.Fatalf("AcceptStream: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	var one [1]byte
	if _, err := b.Read(one[:]); err != nil || one[0] != '!' {
		t.Fatalf("read first byte: %q, %v", one[0], err)
	}
	return a, b
}

// tcpProxy forwards TCP connections to target until blackhole is called,
// after which it keeps the connections open but drops every byte, like a
// link that died without a FIN or RST.
type tcpProxy struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }
func (p *tcpProxy) blackhole()   { p.holed.Store(true) }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

func (p *tcpProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if p.holed.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *tcpProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// udpProxy forwards the datagrams of one client to target until blackhole
// is called, after which it drops them all; dropUp and dropDown drop one
// direction only (a half-open link).
type udpProxy struct {
	front   *net.UDPConn
	back    *net.UDPConn // connected to target
	holed   atomic.Bool
	upHoled atomic.Bool // client to server
	dnHoled atomic.Bool // server to client
	wg      sync.WaitGroup

	mu     sync.Mutex
	client *net.UDPAddr
}

func newUDPProxy(t testing.TB, target string) *udpProxy {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	taddr, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.DialUDP("udp", nil, taddr)
	if err != nil {
		t.Fatal(err)
	}
	p := &udpProxy{front: front, back: back}
	p.wg.Go(p.fromClient)
	p.wg.Go(p.fromServer)
	t.Cleanup(p.close)
	return p
}

func (p *udpProxy) addr() string { return p.front.LocalAddr().String() }
func (p *udpProxy) blackhole()   { p.holed.Store(true) }
func (p *udpProxy) dropUp()      { p.upHoled.Store(true) }
func (p *udpProxy) dropDown()    { p.dnHoled.Store(true) }

func (p *udpProxy) fromClient() {
	buf := make([]byte, 65536)
	for {
		n, from, err := p.front.ReadFromUDP(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		p.client = from
		p.mu.Unlock()
		if !p.holed.Load() && !p.upHoled.Load() {
			_, _ = p.back.Write(buf[:n])
		}
	}
}

func (p *udpProxy) fromServer() {
	buf := make([]byte, 65536)
	for {
		n, err := p.back.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ICMP port unreachable surfaced on the connected socket
		}
		p.mu.Lock()
		client := p.client
		p.mu.Unlock()
		if client != nil && !p.holed.Load() && !p.dnHoled.Load() {
			_, _ = p.front.WriteToUDP(buf[:n], client)
		}
	}
}

func (p *udpProxy) close() {
	_ = p.front.Close()
	_ = p.back.Close()
	p.wg.Wait()
}

// waitClosed fails the test unless ch closes within d.
func waitClosed(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done after %v", what, d)
	}
}
