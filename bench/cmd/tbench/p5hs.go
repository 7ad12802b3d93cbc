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
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/tunnel"
)

// handshakeRows measures what one returning agent costs: the CPU of a
// full handshake against one resumed from a session ticket, per transport,
// hub and agent in this process (both sides together), with the hub's
// ticket keys as a restarted hub has them (same StatelessResetKey).
func (b *bench) handshakeRows(ctx context.Context) error {
	srv, cli, err := handshakePKI()
	if err != nil {
		return err
	}
	key := [32]byte{1}
	const n = 200
	for _, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		var cost [2]time.Duration
		for i, resume := range []bool{false, true} {
			l, err := tunnel.Listen(ctx, "127.0.0.1:0", tunnel.ListenConfig{TunnelTLS: srv, StatelessResetKey: &key})
			if err != nil {
				return err
			}
			tc := cli.Clone()
			if resume {
				tc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			}
			once := func() (bool, error) {
				dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				agent, err := (&tunnel.Dialer{TLSConfig: tc, Transport: tr}).Dial(dctx, l.Addr().String())
				if err != nil {
					return false, err
				}
				defer agent.Close()
				hub, err := l.Accept(dctx)
				if err != nil {
					return false, err
				}
				defer hub.Close()
				// One round trip hub -> agent carries the ticket.
				go func() {
					if st, err := hub.OpenStream(dctx); err == nil {
						_, _ = st.Write([]byte("x"))
						_, _ = st.Read(make([]byte, 1))
						st.Close()
					}
				}()
				st, err := agent.AcceptStream(dctx)
				if err != nil {
					return false, err
				}
				_, _ = st.Read(make([]byte, 1))
				_, _ = st.Write([]byte("y"))
				st.Close()
				return agent.ConnectionState().DidResume, nil
			}
			if _, err := once(); err != nil { // fetches the first ticket
				_ = l.Close()
				return err
			}
			c0 := selfCPU()
			resumed := 0
			for range n {
				r, err := once()
				if err != nil {
					_ = l.Close()
					return err
				}
				if r {
					resumed++
				}
			}
			cost[i] = (selfCPU() - c0) / n
			_ = l.Close()
			if resume && resumed != n {
				return fmt.Errorf("%v: only %d of %d handshakes resumed", tr, resumed, n)
			}
		}
		b.report.Add(harness.Row{ID: "P5",
			What:  fmt.Sprintf("CPU per handshake, %s, resumed from a session ticket (hub + agent)", pathName(tr.String())),
			Value: fmt.Sprintf("%.2f ms", float64(cost[1].Microseconds())/1000),
			Ref:   fmt.Sprintf("%.2f ms full handshake", float64(cost[0].Microseconds())/1000),
			Ratio: fmt.Sprintf("%.2f×", float64(cost[1])/float64(cost[0])), Target: "a fraction of a full handshake",
			Met: harness.YesNo(cost[1] < cost[0]),
			Comment: fmt.Sprintf("%d handshakes each on loopback; both keep the hybrid X25519MLKEM768 key exchange "+
				"(resumption skips certificates and signatures, not the ECDHE)", n)})
	}
	return nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// handshakePKI makes a throwaway CA, a hub certificate and a node
// certificate (ECDSA P-256, as Tether's).
func handshakePKI() (srv, cli *tls.Config, err error) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	leaf := func(serial int64, cn string, eku x509.ExtKeyUsage, dns []string) (tls.Certificate, error) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		t := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{eku}, DNSNames: dns, KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, t, ca, &k.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, err
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}, nil
	}
	sc, err := leaf(2, "hub", x509.ExtKeyUsageServerAuth, []string{"hub.bench"})
	if err != nil {
		return nil, nil, err
	}
	cc, err := leaf(3, "node", x509.ExtKeyUsageClientAuth, nil)
	if err != nil {
		return nil, nil, err
	}
	srv = &tls.Config{Certificates: []tls.Certificate{sc}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	cli = &tls.Config{Certificates: []tls.Certificate{cc}, RootCAs: pool, ServerName: "hub.bench"}
	return srv, cli, nil
}
