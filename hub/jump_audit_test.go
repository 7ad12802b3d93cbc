package hub

import (
	"fmt"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
)

// TestJumpAuditNamesTheKey: a jump's audit row carries the fingerprint of
// the operator's key, the one `tether operator list` shows, whether the
// key itself or a `tether login` certificate over it authenticated; a
// certificate is named in the detail by serial and key id.
func TestJumpAuditNamesTheKey(t *testing.T) {
	s, c := testHub(t)
	key := newOperator(t, c)
	cert, err := s.userCA.SignUser(key.PublicKey(), access.UserCertKeyIDPrefix+"op", []string{"tether:all:root"},
		time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	withCert, err := gossh.NewCertSigner(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	fp := gossh.FingerprintSHA256(key.PublicKey())
	for _, tc := range []struct {
		name   string
		signer gossh.Signer
		node   string
		detail string
	}{
		{"key", key, "nosuch-a", ""},
		{"certificate", withCert, "nosuch-b", fmt.Sprintf("certificate serial %d, key id %q", cert.Serial, cert.KeyId)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := dialBastion(t, s, tc.signer)
			if conn, err := client.Dial("tcp", tc.node+":22"); err == nil {
				conn.Close()
				t.Fatalf("jump to unknown node %s opened", tc.node)
			}
			e := waitAudit(t, c, "the jump to "+tc.node, func(e apitype.AuditEvent) bool {
				return e.Kind == "jump" && e.Node == tc.node
			})
			if e.KeyFingerprint != fp || e.Operator != "op" {
				t.Errorf("jump row: operator %q key %q, want op's key %s", e.Operator, e.KeyFingerprint, fp)
			}
			if tc.detail != "" && !strings.Contains(e.Detail, tc.detail) {
				t.Errorf("jump row detail %q does not name the certificate (%s)", e.Detail, tc.detail)
			}
			if tc.detail == "" && strings.Contains(e.Detail, "certificate") {
				t.Errorf("jump row detail %q names a certificate for a plain key", e.Detail)
			}
		})
	}
}
