package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// pushRecorder reads a node's control stream and keeps the access pushes.
type pushRecorder struct {
	mu    sync.Mutex
	keys  [][]string
	trust []*control.SSHTrust
}

func (r *pushRecorder) counts() (keys, trust int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys), len(r.trust)
}

func (r *pushRecorder) last() ([]string, *control.SSHTrust) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys[len(r.keys)-1], r.trust[len(r.trust)-1]
}

// connectRecording joins name with labels, says hello with an SSH host key
// and records what the hub pushes.
func connectRecording(t *testing.T, c *apiclient.Client, name string, labels map[string]string) *pushRecorder {
	t.Helper()
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	id, err := edge.Join(context.Background(),
		edge.JoinOptions{JoinString: tok.JoinString, StateDir: filepath.Join(t.TempDir(), name), Name: name})
	if err != nil {
		t.Fatal(err)
	}
	sess := dialAs(t, id, tunnel.TransportTCP)
	ctrl, err := sess.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sshPub, _ := gossh.NewPublicKey(pub)
	h := hello(name)
	h.Hello.HostKey = string(gossh.MarshalAuthorizedKey(sshPub))
	if err := control.Write(ctrl, h); err != nil {
		t.Fatal(err)
	}
	r := &pushRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := control.Read(ctrl)
			if err != nil {
				return
			}
			r.mu.Lock()
			switch m.Type {
			case control.TypeAuthorizedKeys:
				r.keys = append(r.keys, m.AuthorizedKeys)
			case control.TypeSSHTrust:
				r.trust = append(r.trust, m.SSHTrust)
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { sess.Close(); <-done })
	waitFor(t, name+"'s first pushes", func() bool { k, tr := r.counts(); return k == 1 && tr == 1 })
	return r
}

// TestAccessChangePushesOnlyWhatChanged: a role and an operator that select
// one node's labels reach that node (new keys and principals, the same host
// certificate as at connect: an access change signs nothing) and send
// nothing at all to a node they do not select.
func TestAccessChangePushesOnlyWhatChanged(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	berlin := connectRecording(t, c, "berlin-1", map[string]string{"site": "berlin"})
	munich := connectRecording(t, c, "munich-1", map[string]string{"site": "munich"})
	_, trustBefore := berlin.last()
	if trustBefore.HostCert == "" {
		t.Fatal("no host certificate pushed at connect")
	}

	if _, err := c.PutRole(ctx, "berlin-ops", apitype.RolePutRequest{
		Nodes: "site=berlin", Logins: []string{"ops"},
	}); err != nil {
		t.Fatal(err)
	}
	// The role alone changes berlin's principals, not munich's.
	waitFor(t, "berlin's principals for the new role", func() bool { _, tr := berlin.counts(); return tr == 2 })
	opPub, _, _ := ed25519.GenerateKey(rand.Reader)
	opKey, _ := gossh.NewPublicKey(opPub)
	if _, err := c.AddOperator(ctx, apitype.OperatorAddRequest{
		Name: "alice", PublicKey: string(gossh.MarshalAuthorizedKey(opKey)), Roles: []string{"berlin-ops"},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "alice's key at berlin", func() bool { k, _ := berlin.counts(); return k == 2 })
	keys, trust := berlin.last()
	if len(keys) != 1 || !strings.Contains(keys[0], `tether-logins="ops"`) || !strings.HasSuffix(keys[0], " alice") {
		t.Errorf("berlin's keys after adding alice: %q", keys)
	}
	if got := trust.Principals["ops"]; len(got) != 1 || got[0] != "tether:berlin-ops:ops" {
		t.Errorf("berlin's principals for ops: %q", got)
	}
	if trust.HostCert != trustBefore.HostCert {
		t.Error("an access change re-signed berlin's host certificate")
	}
	// A change for munich only: push rounds run one after another, so once
	// munich has it, every earlier round is over.
	if _, err := c.PutRole(ctx, "munich-ops", apitype.RolePutRequest{
		Nodes: "site=munich", Logins: []string{"ops"},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "munich's principals for its role", func() bool { _, tr := munich.counts(); return tr == 2 })
	// Adding alice changed nothing in berlin's trust (same principals):
	// two trust pushes in all, at connect and for the role.
	if k, tr := berlin.counts(); k != 2 || tr != 2 {
		t.Errorf("berlin got %d key and %d trust pushes, want 2 and 2", k, tr)
	}
	if k, tr := munich.counts(); k != 1 || tr != 2 {
		t.Errorf("munich got %d key and %d trust pushes, want 1 (connect) and 2 (connect, its role): "+
			"the berlin changes reached it", k, tr)
	}
}

// TestResyncPushesOnlyAfterAChange: the change feed's periodic re-read
// starts no push round when the stored access is what the nodes already
// have, and does start one when it finds a change the hub was not told of
// (another replica's notice lost), which then reaches the node.
func TestResyncPushesOnlyAfterAChange(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()
	berlin := connectRecording(t, c, "berlin-1", map[string]string{"site": "berlin"})
	if s.pusher.Resync(ctx) {
		t.Fatal("a re-read with nothing changed asked for a push round")
	}
	// Behind the hub's back, as another replica would write it.
	if err := s.store.PutRole(ctx, store.Role{
		Name: "berlin-ops", Nodes: "site=berlin", Logins: []string{"ops"},
	}); err != nil {
		t.Fatal(err)
	}
	if !s.pusher.Resync(ctx) {
		t.Fatal("a re-read that found a new role asked for no push round")
	}
	waitFor(t, "berlin's principals for the role found by the re-read",
		func() bool { _, tr := berlin.counts(); return tr == 2 })
	if _, trust := berlin.last(); len(trust.Principals["ops"]) != 1 {
		t.Errorf("berlin's principals after the re-read: %v", trust.Principals)
	}
	if s.pusher.Resync(ctx) {
		t.Error("a second re-read of the same change asked for another push round")
	}
}
