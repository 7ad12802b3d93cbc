package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// tunnelRelay is the hub-to-agent data path without the SSH hop, in one
// process: a TCP front (the hub side) opens a tunnel stream per connection
// and pipes it with tunnel.Pipe; the agent side accepts the stream, dials
// the target and pipes again. It uses the tunnel package exactly as the hub
// and agent do, with throwaway certificates.
type tunnelRelay struct {
	front  net.Listener
	ln     *tunnel.Listener
	hub    tunnel.Session
	agent  tunnel.Session
	target string
	wg     sync.WaitGroup
}

func newTunnelRelay(ctx context.Context, tr tunnel.Transport, target string) (*tunnelRelay, error) {
	serverTLS, clientTLS, err := throwawayPKI()
	if err != nil {
		return nil, err
	}
	ln, err := tunnel.Listen(ctx, "127.0.0.1:0", tunnel.ListenConfig{TunnelTLS: serverTLS})
	if err != nil {
		return nil, err
	}
	r := &tunnelRelay{ln: ln, target: target}
	d := &tunnel.Dialer{TLSConfig: clientTLS, Transport: tr}
	if r.agent, err = d.Dial(ctx, ln.Addr().String()); err != nil {
		ln.Close()
		return nil, err
	}
	if r.hub, err = ln.Accept(ctx); err != nil {
		r.agent.Close()
		ln.Close()
		return nil, err
	}
	if r.front, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		r.Close()
		return nil, err
	}
	r.wg.Go(r.serveFront)
	r.wg.Go(r.serveAgent)
	return r, nil
}

func (r *tunnelRelay) addr() string { return r.front.Addr().String() }

func (r *tunnelRelay) serveFront() {
	for {
		c, err := r.front.Accept()
		if err != nil {
			return
		}
		r.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			st, err := r.hub.OpenStream(ctx)
			cancel()
			if err != nil {
				c.Close()
				return
			}
			_, _ = st.Write([]byte{1}) // QUIC announces a stream with its first byte
			tunnel.Pipe(c, st, nil)
		})
	}
}

func (r *tunnelRelay) serveAgent() {
	for {
		st, err := r.agent.AcceptStream(context.Background())
		if err != nil {
			return
		}
		r.wg.Go(func() {
			var one [1]byte
			if _, err := st.Read(one[:]); err != nil {
				st.Close()
				return
			}
			c, err := net.Dial("tcp", r.target)
			if err != nil {
				st.Close()
				return
			}
			tunnel.Pipe(st, c, nil)
		})
	}
}

func (r *tunnelRelay) Close() {
	if r.front != nil {
		r.front.Close()
	}
	r.agent.Close()
	r.hub.Close()
	r.ln.Close()
	r.wg.Wait()
}

// throwawayPKI makes a CA, a hub certificate for "hub" and a node client
// certificate, all P-256 as the hub's own CA issues.
func throwawayPKI() (server, client *tls.Config, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage, dns []string) (tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: fmt.Sprint("bench-", serial)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, err
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
	}
	hubCert, err := issue(2, x509.ExtKeyUsageServerAuth, []string{"hub"})
	if err != nil {
		return nil, nil, err
	}
	nodeCert, err := issue(3, x509.ExtKeyUsageClientAuth, nil)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	server = &tls.Config{Certificates: []tls.Certificate{hubCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	client = &tls.Config{Certificates: []tls.Certificate{nodeCert}, RootCAs: pool, ServerName: "hub"}
	return server, client, nil
}
