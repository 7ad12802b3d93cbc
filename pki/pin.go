package pki

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
)

// ErrPinMismatch means the hub did not present the pinned CA. Its text says
// where a pin comes from, for every command that takes one (a join string,
// `tether login --ca-pin`).
var ErrPinMismatch = errors.New(
	"the hub's CA does not match the pinned sha256 (the ca=sha256:… part of the join string, or --ca-pin): " +
		"this address is another hub's, or its CA changed; " +
		"take the pin from a current join string (`tether token create` on the hub)",
)

// PinnedTLSConfig returns a client TLS config that trusts a hub only if its
// presented chain contains the CA certificate whose SHA-256 is pin and the
// leaf verifies against that CA for HubServerName. The verified CA is
// reported through onCA so the caller can store it.
func PinnedTLSConfig(pin string, onCA func(*x509.Certificate)) (*tls.Config, error) {
	want, err := hex.DecodeString(pin)
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("pki: bad pin %q", pin)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: HubServerName,
		// Chain verification is done below against the pinned CA instead of
		// system roots; InsecureSkipVerify only disables the default check.
		InsecureSkipVerify: true, //nolint:gosec // replaced by VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			var ca *x509.Certificate
			certs := make([]*x509.Certificate, 0, len(raw))
			for _, r := range raw {
				c, err := x509.ParseCertificate(r)
				if err != nil {
					return fmt.Errorf("parse hub certificate: %w", err)
				}
				certs = append(certs, c)
				sum := sha256.Sum256(r)
				if subtle.ConstantTimeCompare(sum[:], want) == 1 {
					ca = c
				}
			}
			if ca == nil || len(certs) == 0 {
				return ErrPinMismatch
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			inter := x509.NewCertPool()
			for _, c := range certs[1:] {
				inter.AddCert(c)
			}
			if _, err := certs[0].Verify(x509.VerifyOptions{DNSName: HubServerName, Roots: roots,
				Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("verify hub certificate against pinned CA: %w", err)
			}
			if onCA != nil {
				onCA(ca)
			}
			return nil
		},
	}, nil
}

// ClientTLSConfig returns an mTLS client config: present cert, trust only ca,
// expect HubServerName.
func ClientTLSConfig(cert tls.Certificate, ca *x509.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		ServerName:   HubServerName,
		RootCAs:      pool,
		Certificates: []tls.Certificate{cert},
	}
}
