package edge

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
)

// fuzzStateDir is a state dir with a valid key and certificate, into which
// the fuzz targets write the files under test.
func fuzzStateDir(f *testing.F) string {
	f.Helper()
	dir := f.TempDir()
	key, err := pki.GenerateKey()
	if err != nil {
		f.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "n1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		f.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyPEM, _ := pki.EncodeKey(key)
	for name, data := range map[string][]byte{
		keyFile: keyPEM, certFile: pki.EncodeCerts(cert), caFile: pki.EncodeCerts(cert),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			f.Fatal(err)
		}
	}
	return dir
}

// FuzzLoadIdentity: whatever node.json and node_ca.crt hold, loading the
// identity returns an error or a complete identity, never panics.
func FuzzLoadIdentity(f *testing.F) {
	dir := fuzzStateDir(f)
	good, _ := json.Marshal(NodeConfig{NodeID: "0123456789abcdef", Name: "n1", Hubs: []string{"hub:7443"},
		JoinedAt: time.Unix(0, 0)})
	ca, _ := os.ReadFile(filepath.Join(dir, caFile))
	f.Add(good, ca)
	f.Add(good, []byte{})
	f.Add([]byte(`{"node_id":"x","name":"n","hubs":[]}`), ca)
	f.Add([]byte(`{"node_id":1}`), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("null"), []byte("garbage"))
	f.Fuzz(func(t *testing.T, nodeJSON, nodeCA []byte) {
		if err := os.WriteFile(filepath.Join(dir, configFile), nodeJSON, 0o600); err != nil {
			t.Fatal(err)
		}
		if len(nodeCA) == 0 {
			os.Remove(filepath.Join(dir, nodeCAFile))
		} else if err := os.WriteFile(filepath.Join(dir, nodeCAFile), nodeCA, 0o600); err != nil {
			t.Fatal(err)
		}
		id, err := LoadIdentity(dir)
		if err != nil {
			return
		}
		if id.Config.NodeID == "" || id.Config.Name == "" || len(id.Config.Hubs) == 0 || id.CA == nil ||
			id.NodeCA == nil || id.Key() == nil {
			t.Fatalf("incomplete identity loaded from %q: %+v", nodeJSON, id.Config)
		}
	})
}

// FuzzReadStatus: status.json of any content reads as a status or an
// error, and a status that reads writes back and reads the same.
func FuzzReadStatus(f *testing.F) {
	dir := f.TempDir()
	good, _ := json.Marshal(Status{Name: "n1", NodeID: "id", State: "connected", Hub: "hub:7443",
		Transport: "quic", PID: 42})
	f.Add(good)
	f.Add([]byte(`{"state":"refused","last_error":"this node was removed","since":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"since":"not a time"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, statusFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := ReadStatus(dir)
		if err != nil {
			return
		}
		if err := writeStatus(dir, st); err != nil {
			t.Fatalf("status read from %q does not write back: %v", data, err)
		}
		again, err := ReadStatus(dir)
		if err != nil || again.State != st.State || again.Name != st.Name || !again.Since.Equal(st.Since) {
			t.Fatalf("status %+v reads back as %+v, %v", st, again, err)
		}
	})
}
