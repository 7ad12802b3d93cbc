package hub

import (
	"context"
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// A node's embedded server reports a refused login; the hub audits it,
// naming the operator only when the reported key is the operator's
// registered key: a node cannot pin its report on someone else.
func TestSSHEventsAudited(t *testing.T) {
	_, c := testHub(t)
	key := testenv.NewKey(t)
	if _, err := c.AddOperator(context.Background(), apitype.OperatorAddRequest{
		Name: "alice", PublicKey: string(gossh.MarshalAuthorizedKey(key.Pub())),
	}); err != nil {
		t.Fatal(err)
	}
	n := joinNode(t, c, "n1")
	ctrl, m := connectAs(t, dialAs(t, n, tunnel.TransportTCP), "n1")
	if m.Type != control.TypeWelcome || !slices.Contains(m.Welcome.Capabilities, control.HubCapSSHEvents) {
		t.Fatalf("welcome %+v: want the ssh-events capability", m.Welcome)
	}
	fp := gossh.FingerprintSHA256(key.Pub())
	for _, ev := range []control.SSHEvent{
		{Kind: "login-refused", Login: "root", Operator: "alice", KeyFingerprint: fp, Detail: "roles allow: ubuntu"},
		{Kind: "forward-refused", Login: "root", Operator: "alice", KeyFingerprint: "SHA256:not-alices",
			Detail: "local 10.0.0.1:22"},
	} {
		if err := control.Write(ctrl, &control.Message{Type: control.TypeSSHEvent, SSHEvent: &ev}); err != nil {
			t.Fatal(err)
		}
	}
	waitAudit(t, c, "the refused login", func(e apitype.AuditEvent) bool {
		return e.Kind == "login_refused" && e.Result == "refused" && e.Node == "n1" && e.Operator == "alice" &&
			e.KeyFingerprint == fp && strings.Contains(e.Detail, `login "root"`)
	})
	waitAudit(t, c, "the forwarding with a foreign key", func(e apitype.AuditEvent) bool {
		return e.Kind == "ssh_forward" && e.Result == "refused" && e.Node == "n1" && e.Operator == "" &&
			strings.Contains(e.Detail, `node reports operator "alice"`)
	})
}
