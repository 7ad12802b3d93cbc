package hub

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// TestRevokedNodeCannotResume: a session resumed from a TLS session ticket
// (the reconnect storm's cheap handshake) is still bound to the node's
// certificate: the hub knows the node by the certificate the ticket
// carries, welcomes it while it is in good standing, and refuses it once
// revoked, although the resumed handshake checks no certificate signature.
func TestRevokedNodeCannotResume(t *testing.T) {
	_, c := testHub(t)
	for _, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		t.Run(tr.String(), func(t *testing.T) {
			name := "resumer-" + tr.String()
			id := joinNode(t, c, name)
			tc := pki.ClientTLSConfig(id.Cert, id.CA)
			tc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			connect := func() (resumed bool, m *control.Message) {
				t.Helper()
				d := &tunnel.Dialer{TLSConfig: tc, Transport: tr}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				sess, err := d.Dial(ctx, id.Config.Hubs[0])
				if err != nil {
					t.Fatal(err)
				}
				defer sess.Close()
				// The hub sends its ticket before the welcome, so once the
				// answer is read the cache holds the ticket.
				_, m = connectAs(t, sess, name)
				return sess.ConnectionState().DidResume, m
			}
			if resumed, m := connect(); resumed || m.Type != control.TypeWelcome {
				t.Fatalf("first session: resumed %v, answer %+v; want a full handshake and a welcome", resumed, m)
			}
			if resumed, m := connect(); !resumed || m.Type != control.TypeWelcome {
				t.Fatalf("second session: resumed %v, answer %+v; want a resumed handshake and a welcome", resumed, m)
			}
			if _, err := c.RevokeNode(context.Background(), name); err != nil {
				t.Fatal(err)
			}
			resumed, m := connect()
			if !resumed {
				t.Fatal("the session after the revocation did not resume: the test proves nothing")
			}
			if m.Type != control.TypeNotice || !m.Fatal || !strings.Contains(m.Notice, "revoked") {
				t.Fatalf("revoked node on a resumed session: answer %+v, want a fatal revoked notice", m)
			}
		})
	}
}
