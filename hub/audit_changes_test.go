package hub

import (
	"context"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	gossh "golang.org/x/crypto/ssh"
)

// TestAccessChangesAudited: every change of who may do what leaves an
// audit row naming what changed (SECURITY.md, "Audited changes").
func TestAccessChangesAudited(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	key, key2 := newSigner(t), newSigner(t)
	var tokenID, apiTokenID string
	for _, step := range []struct {
		kind, detail string
		do           func() error
	}{
		{"token_create", "labels site=berlin", func() error {
			tok, err := c.CreateToken(ctx,
				apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 2, Labels: map[string]string{"site": "berlin"}})
			tokenID = tok.ID
			return err
		}},
		{"token_remove", "join token ", func() error { return c.DeleteToken(ctx, tokenID) }},
		{"role_put", "ops", func() error {
			_, err := c.PutRole(ctx, "ops", apitype.RolePutRequest{Nodes: "site=berlin", Logins: []string{"root"}})
			return err
		}},
		{"apitoken_create", "role ops", func() error {
			tok, err := c.CreateAPIToken(ctx, apitype.APITokenCreateRequest{Role: "ops"})
			apiTokenID = tok.ID
			return err
		}},
		{"apitoken_remove", "API token ", func() error { return c.DeleteAPIToken(ctx, apiTokenID) }},
		{"operator_add", "roles ops", func() error {
			_, err := c.AddOperator(ctx, apitype.OperatorAddRequest{Name: "dora", Roles: []string{"ops"},
				PublicKey: string(gossh.MarshalAuthorizedKey(key.PublicKey()))})
			return err
		}},
		{"operator_key_add", "key SHA256:", func() error {
			_, err := c.AddOperatorKey(ctx, "dora",
				apitype.OperatorKeyAddRequest{PublicKey: string(gossh.MarshalAuthorizedKey(key2.PublicKey()))})
			return err
		}},
		// A fingerprint holds '/' and '+': it travels path-escaped.
		{"operator_key_remove", "revoked",
			func() error { return c.RemoveOperatorKey(ctx, "dora", gossh.FingerprintSHA256(key.PublicKey())) }},
		{"operator_edit", "roles all,ops (were ops)", func() error {
			_, err := c.EditOperator(ctx, "dora", apitype.OperatorEditRequest{Roles: []string{"ops", "all"}})
			return err
		}},
		{"operator_remove", "", func() error { return c.RemoveOperator(ctx, "dora") }},
		{"role_remove", "ops", func() error { return c.DeleteRole(ctx, "ops") }},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.kind, err)
		}
		waitAudit(t, c, step.kind, func(e apitype.AuditEvent) bool {
			return e.Kind == step.kind && e.Result == "ok" && strings.Contains(e.Detail, step.detail)
		})
	}
	// Token ids are named; no token row carries a secret.
	evs, err := c.ListAudit(ctx, apiclient.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if (e.Kind == "token_create" || e.Kind == "token_remove") && !strings.Contains(e.Detail, tokenID) {
			t.Errorf("%s row does not name token %s: %q", e.Kind, tokenID, e.Detail)
		}
		if e.Kind == "apitoken_remove" && !strings.Contains(e.Detail, apiTokenID) {
			t.Errorf("apitoken_remove row does not name token %s: %q", apiTokenID, e.Detail)
		}
	}
}
