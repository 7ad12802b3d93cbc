package kubeone

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

func testCAPEM(t testing.TB) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubernetes"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestKubeconfigCA(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString(testCAPEM(t))
	cases := []struct {
		name, conf, wantErr string
	}{
		{
			"admin.conf",
			"clusters:\n- name: k\n  cluster:\n    certificate-authority-data: " + ca + "\n    server: https://10.0.0.1:6443\n",
			"",
		},
		{"no clusters", "apiVersion: v1\n", "no cluster CA"},
		{"no CA", "clusters:\n- cluster: {server: https://x}\n", "no cluster CA"},
		{"not base64", "clusters:\n- cluster: {certificate-authority-data: '%%%'}\n", "certificate-authority-data"},
		{
			"not a certificate",
			"clusters:\n- cluster: {certificate-authority-data: " + base64.StdEncoding.EncodeToString(
				[]byte("hello"),
			) + "}\n",
			"no certificate",
		},
		{"not yaml", "clusters: [", "yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := kubeconfigCA([]byte(tc.conf))
			if tc.wantErr == "" {
				if err != nil || pool == nil {
					t.Fatalf("kubeconfigCA: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// FuzzKubeconfigCA: admin.conf comes from a node, so it is untrusted input
// to the hub; reading its CA never panics.
func FuzzKubeconfigCA(f *testing.F) {
	f.Add(
		[]byte(
			"clusters:\n- cluster:\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString(
				testCAPEM(f),
			) + "\n",
		),
	) // kubeadm's shape
	f.Add(
		[]byte("clusters: [{cluster: {certificate-authority-data: 1}}]"),
	) // a number
	f.Add(
		[]byte("clusters: 7"),
	) // wrong type
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = kubeconfigCA(b)
	})
}
