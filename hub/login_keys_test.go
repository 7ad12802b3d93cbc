package hub

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/tether-dev/tether/hub/operator"

	"github.com/tether-dev/tether/hub/api/apitype"
	gossh "golang.org/x/crypto/ssh"
)

// TestLoginWithAnyKey: an operator with several keys logs in with each;
// the certificate certifies the key that signed. A revoked key no longer
// logs in, and the remaining one still does.
func TestLoginWithAnyKey(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	first, second := newSigner(t), newSigner(t)
	if _, err := c.AddOperator(ctx, apitype.OperatorAddRequest{
		Name: "op", PublicKey: string(gossh.MarshalAuthorizedKey(first.PublicKey())),
		PublicKeys: []string{string(gossh.MarshalAuthorizedKey(second.PublicKey()))},
	}); err != nil {
		t.Fatal(err)
	}
	l := newLoginFrom(t, c, "127.0.0.1")
	// named: the key the request says signed ("" for clients that do not
	// say).
	loginNamed := func(key gossh.Signer, named string) (int, gossh.PublicKey) {
		t.Helper()
		_, ch, _ := l.challenge("op")
		sig, err := key.Sign(rand.Reader, operator.LoginPayload("op", ch.Nonce))
		if err != nil {
			t.Fatal(err)
		}
		status, b, _ := l.post("/v1/login", apitype.LoginRequest{
			Operator: "op", Nonce: ch.Nonce, SignatureFormat: sig.Format, Signature: sig.Blob, PublicKey: named,
		})
		if status != http.StatusOK {
			return status, nil
		}
		var resp apitype.LoginResponse
		if err := json.Unmarshal(b, &resp); err != nil {
			t.Fatal(err)
		}
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(resp.Certificate))
		if err != nil {
			t.Fatal(err)
		}
		return status, k.(*gossh.Certificate).Key
	}
	login := func(key gossh.Signer) (int, gossh.PublicKey) {
		return loginNamed(key, string(gossh.MarshalAuthorizedKey(key.PublicKey())))
	}
	for name, key := range map[string]gossh.Signer{"first": first, "second": second} {
		if st, certified := login(key); st != http.StatusOK || !sameKey(certified, key.PublicKey()) {
			t.Errorf("login with the %s key: %d, certificate over %v", name, st, certified)
		}
		if st, certified := loginNamed(key, ""); st != http.StatusOK || !sameKey(certified, key.PublicKey()) {
			t.Errorf("login with the %s key, not naming it: %d, certificate over %v", name, st, certified)
		}
	}
	if st, _ := loginNamed(first, string(gossh.MarshalAuthorizedKey(second.PublicKey()))); st != http.StatusForbidden {
		t.Errorf("signed by one key, naming the other: %d, want 403", st)
	}
	if err := c.RemoveOperatorKey(ctx, "op", gossh.FingerprintSHA256(first.PublicKey())); err != nil {
		t.Fatal(err)
	}
	if st, _ := login(first); st != http.StatusForbidden {
		t.Errorf("login with the revoked key: %d, want 403", st)
	}
	if st, _ := login(second); st != http.StatusOK {
		t.Errorf("login with the remaining key: %d", st)
	}
	// The only key left cannot be removed.
	if err := c.RemoveOperatorKey(ctx, "op", gossh.FingerprintSHA256(second.PublicKey())); err == nil {
		t.Error("removing the operator's only key succeeded")
	}
}

func sameKey(a, b gossh.PublicKey) bool {
	return a != nil && b != nil && string(a.Marshal()) == string(b.Marshal())
}
