package stepca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.step.sm/crypto/jose"
	"go.step.sm/crypto/x509util"

	"github.com/tether-dev/tether/pki"
)

// provisionerKey is a JWK provisioner key as `step ca provisioner add
// --create` makes one: an EC P-256 key, its thumbprint as kid, encrypted
// with password.
func provisionerKey(t *testing.T, password string) (*jose.JSONWebKey, string) {
	t.Helper()
	jwk, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if jwk.KeyID, err = jose.Thumbprint(jwk); err != nil {
		t.Fatal(err)
	}
	jwe, err := jose.EncryptJWK(jwk, []byte(password))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := jwe.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return jwk, enc
}

// TestToken: the one-time token is what the step-ca's JWK provisioner
// accepts (authority/provisioner/jwk.go's authorizeToken, with
// go.step.sm/crypto's parsing): signed by the provisioner key with its kid,
// valid now for iss = the provisioner, aud = the sign endpoint, and it
// carries the subject, SANs, root fingerprint and a fresh 256-bit ID.
func TestToken(t *testing.T) {
	jwk, _ := provisionerKey(t, "pw")
	const sha = "4f2c7d0c0e1b8e0f9a4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e"
	i := &Issuer{provisioner: "tether", key: jwk, fingerprint: sha, audience: "https://ca.example:9000/1.0/sign"}
	now := time.Now()
	sans := []string{"tether://node/n-123"}
	raw, err := i.token("node-7", sans, now)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jose.ParseSigned(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok.Headers) != 1 || tok.Headers[0].KeyID != jwk.KeyID || tok.Headers[0].Algorithm != "ES256" ||
		tok.Headers[0].ExtraHeaders["typ"] != "JWT" {
		t.Fatalf("header: %+v", tok.Headers)
	}
	// The shape of jwk.go's jwtPayload.
	var claims struct {
		jose.Claims
		SANs []string `json:"sans"`
		SHA  string   `json:"sha"`
	}
	pub := jwk.Public()
	if err := tok.Claims(pub.Key, &claims); err != nil {
		t.Fatalf("verify with the provisioner's public key: %v", err)
	}
	if err := claims.ValidateWithLeeway(jose.Expected{Issuer: "tether", Time: now.UTC()}, time.Minute); err != nil {
		t.Fatalf("claims: %v", err)
	}
	if !slices.Equal(claims.Audience, jose.Audience{i.audience}) || claims.Subject != "node-7" ||
		!slices.Equal(claims.SANs, sans) || claims.SHA != sha {
		t.Fatalf("claims: %+v", claims)
	}
	if got := claims.Expiry.Time().Sub(claims.NotBefore.Time()); got != tokenLifetime {
		t.Errorf("token valid for %v, want %v", got, tokenLifetime)
	}
	if id, err := hex.DecodeString(claims.ID); err != nil || len(id) != 32 {
		t.Errorf("jti %q: want 32 random bytes in hex", claims.ID)
	}
	// aud goes out as one string, as step's client sends it.
	var m map[string]any
	if err := tok.UnsafeClaimsWithoutVerification(&m); err != nil || m["aud"] != i.audience {
		t.Errorf("aud on the wire: %#v (%v)", m["aud"], err)
	}
	other, _ := provisionerKey(t, "pw")
	otherPub := other.Public()
	if err := tok.Claims(otherPub.Key, &claims); err == nil {
		t.Error("the token verifies with another key")
	}
	again, _ := i.token("node-7", sans, now)
	var c2 jose.Claims
	t2, err := jose.ParseSigned(again)
	if err != nil || t2.UnsafeClaimsWithoutVerification(&c2) != nil || c2.ID == claims.ID {
		t.Errorf("second token (%v): jti %q, the first's %q: the step-ca refuses a jti it has seen", err, c2.ID, claims.ID)
	}
}

// fakeCA serves the step-ca's provisioner list in pages of what pages
// holds and answers a sign request with a 401 as the CA words it.
func fakeCA(t *testing.T, pages [][]provisioner) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/1.0/provisioners":
			mu.Lock()
			queries = append(queries, r.URL.RawQuery)
			mu.Unlock()
			n := 0
			if c := r.URL.Query().Get("cursor"); c != "" {
				fmt.Sscanf(c, "page%d", &n)
			}
			resp := provisionersResponse{Provisioners: pages[n]}
			if n+1 < len(pages) {
				resp.NextCursor = fmt.Sprintf("page%d", n+1)
			}
			json.NewEncoder(w).Encode(resp)
		case "/1.0/sign":
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"status":401,"message":"The request lacked necessary authorization to be completed."}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(queries) }
}

// TestNew: the provisioner key is found across pages of the list (the first
// one of the name that the password decrypts), the token's sha is the
// root the CA's TLS chains to, and every way of not finding a usable key
// says which.
func TestNew(t *testing.T) {
	const password = "correct horse"
	jwk, good := provisionerKey(t, password)
	_, wrongPW := provisionerKey(t, "other")
	filler := make([]provisioner, pageLimit)
	for n := range filler {
		filler[n] = provisioner{Type: "JWK", Name: fmt.Sprintf("p%d", n), EncryptedKey: wrongPW}
	}
	for _, tc := range []struct {
		name  string
		pages [][]provisioner
		want  string // the error, or "" for the key
	}{
		{"second page", [][]provisioner{filler, {{Type: "JWK", Name: "tether", EncryptedKey: wrongPW},
			{Type: "JWK", Name: "tether", EncryptedKey: good}}}, ""},
		{"absent", [][]provisioner{filler}, "no JWK provisioner of that name"},
		{"not JWK", [][]provisioner{{{Type: "OIDC", Name: "tether"}}}, "a provisioner of type OIDC"},
		{"no encrypted key", [][]provisioner{{{Type: "JWK", Name: "tether"}}}, "no JWK provisioner of that name"},
		{"wrong password", [][]provisioner{{{Type: "JWK", Name: "tether", EncryptedKey: wrongPW}}},
			"does not decrypt its key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, queries := fakeCA(t, tc.pages)
			dir := t.TempDir()
			rootFile, pwFile := filepath.Join(dir, "root.crt"), filepath.Join(dir, "pw")
			os.WriteFile(rootFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
			os.WriteFile(pwFile, []byte(password+"\n"), 0o600)
			i, err := New(Config{URL: srv.URL, RootFile: rootFile, Provisioner: "tether", PasswordFile: pwFile})
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"tether"`) {
					t.Fatalf("error %v, want one naming the provisioner and %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if i.key.KeyID != jwk.KeyID || i.fingerprint != x509util.Fingerprint(srv.Certificate()) ||
				i.audience != srv.URL+"/1.0/sign" {
				t.Fatalf("kid %q fingerprint %q audience %q", i.key.KeyID, i.fingerprint, i.audience)
			}
			if want := []string{"limit=100", "cursor=page1&limit=100"}; !slices.Equal(queries(), want) {
				t.Errorf("list queries %q, want %q", queries(), want)
			}
			// A refusal reaches the caller in the CA's words.
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			csr, _ := pki.NewCSR(key, "node-7")
			_, err = i.IssueNode(context.Background(), csr, pki.Identity{Kind: pki.KindNode, ID: "n-1"}, "node-7", time.Hour)
			if err == nil || !strings.Contains(err.Error(), "401") ||
				!strings.Contains(err.Error(), "lacked necessary authorization") {
				t.Fatalf("sign refused: %v", err)
			}
		})
	}
}

// TestParseURL: the step-ca address is https, with or without the scheme
// written; anything else is refused up front with the flag's name.
func TestParseURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://ca.example.com:9000": "https://ca.example.com:9000",
		"ca.example.com:9000":         "https://ca.example.com:9000",
		"http://ca.example.com":       "",
		"https://":                    "",
	} {
		u, err := parseURL(in)
		switch {
		case want == "" && (err == nil || !strings.Contains(err.Error(), "--step-ca-url")):
			t.Errorf("parseURL(%q) = %v, %v; want an error naming --step-ca-url", in, u, err)
		case want != "" && (err != nil || u.String() != want):
			t.Errorf("parseURL(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
}
