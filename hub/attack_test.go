package hub

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// These tests are rows of the attack table in SECURITY.md that need a
// hand-made agent: each attack is refused, the refusal is in the audit log,
// and a well-behaved node on the same hub is not disturbed.

// waitAudit waits until the audit log holds an event matching want.
func waitAudit(t *testing.T, c *apiclient.Client, what string, want func(apitype.AuditEvent) bool) apitype.AuditEvent {
	t.Helper()
	var last []apitype.AuditEvent
	for range 100 {
		evs, err := c.ListAudit(context.Background(), apiclient.AuditQuery{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if want(e) {
				return e
			}
		}
		last = evs
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no audit event for %s in %d events: %+v", what, len(last), last)
	return apitype.AuditEvent{}
}

func refusedConnect(node, detail string) func(apitype.AuditEvent) bool {
	return func(e apitype.AuditEvent) bool {
		return e.Kind == "connect" && e.Result == "refused" && e.Node == node && strings.Contains(e.Detail, detail)
	}
}

// connectAs opens a control stream, says hello as name and returns it with
// the hub's first answer.
func connectAs(t *testing.T, sess tunnel.Session, name string) (tunnel.Stream, *control.Message) {
	t.Helper()
	ctrl, err := sess.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := control.Write(ctrl, hello(name)); err != nil {
		t.Fatal(err)
	}
	_ = ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, err := control.Read(ctrl)
	if err != nil {
		t.Fatalf("answer to hello: %v", err)
	}
	_ = ctrl.SetReadDeadline(time.Time{})
	return ctrl, m
}

// TestAttackSessionRefusalsAudited: a node's certificate claiming another
// node, a revoked node coming back, garbage and unexpected control
// messages, streams opened by an agent and a renewal for a foreign key are
// each refused and audited; the good node stays connected throughout.
func TestAttackSessionRefusalsAudited(t *testing.T) {
	s, c := testHub(t)
	good := joinNode(t, c, "good")
	mallory := joinNode(t, c, "mallory")
	victim := joinNode(t, c, "victim")
	goodSess := dialAs(t, good, tunnel.TransportQUIC)
	if _, m := connectAs(t, goodSess, "good"); m.Type != control.TypeWelcome {
		t.Fatalf("good node: %+v", m)
	}

	t.Run("node A's certificate claims node B", func(t *testing.T) {
		sess := dialAs(t, mallory, tunnel.TransportTCP)
		_, m := connectAs(t, sess, "victim")
		if m.Type != control.TypeNotice || !m.Fatal ||
			!strings.Contains(m.Notice, `belongs to node "mallory", not "victim"`) {
			t.Fatalf("answer: %+v", m)
		}
		waitDone(t, sess, "a false name")
		waitAudit(t, c, "the false claim", refusedConnect("mallory", `claimed to be node "victim"`))
	})

	t.Run("garbage control frame", func(t *testing.T) {
		sess := dialAs(t, mallory, tunnel.TransportQUIC)
		st, _ := sess.OpenStream(context.Background())
		st.Write([]byte{0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o'})
		waitDone(t, sess, "garbage")
		waitAudit(t, c, "garbage hello", refusedConnect("mallory", "bad hello: control: bad message"))
	})

	t.Run("oversized control frame after welcome", func(t *testing.T) {
		sess := dialAs(t, mallory, tunnel.TransportTCP)
		ctrl, m := connectAs(t, sess, "mallory")
		if m.Type != control.TypeWelcome {
			t.Fatalf("answer: %+v", m)
		}
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], control.MaxFrame+1)
		ctrl.Write(b[:])
		waitDone(t, sess, "an oversized frame")
		waitAudit(t, c, "oversized frame",
			refusedConnect("mallory", "control stream closed: control: bad message: frame length"))
	})

	t.Run("hub message sent by an agent", func(t *testing.T) {
		sess := dialAs(t, mallory, tunnel.TransportQUIC)
		ctrl, _ := connectAs(t, sess, "mallory")
		control.Write(ctrl, &control.Message{Type: control.TypeAuthorizedKeys, AuthorizedKeys: []string{"ssh-ed25519 AAAA"}})
		waitDone(t, sess, "a hub-only message")
		waitAudit(t, c, "unexpected message", refusedConnect("mallory", "unexpected authorized_keys message"))
	})

	t.Run("agent opens streams to the hub", func(t *testing.T) {
		sess := dialAs(t, mallory, tunnel.TransportTCP)
		connectAs(t, sess, "mallory")
		for _, target := range []tunnel.Header{{Service: tunnel.ServiceSSH}, {Service: tunnel.ServiceTCP, Port: 7443}} {
			st, err := sess.OpenStream(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// A well-formed header naming a service changes nothing: there
			// is no way to address the hub's internals or another node.
			if err := tunnel.WriteHeader(st, target); err != nil {
				t.Fatal(err)
			}
			rep, err := tunnel.ReadReply(st)
			if err != nil || rep.OK || !strings.Contains(rep.Reason, "agents may not open streams") {
				t.Fatalf("stream to the hub (%s): %+v %v", target, rep, err)
			}
		}
		waitAudit(t, c, "stream refusal", func(e apitype.AuditEvent) bool {
			return e.Kind == "stream" && e.Result == "refused" && e.Node == "mallory"
		})
	})

	t.Run("renewal for another key", func(t *testing.T) {
		sess := dialAs(t, mallory, tunnel.TransportQUIC)
		ctrl, _ := connectAs(t, sess, "mallory")
		key, _ := pki.GenerateKey()
		csr, _ := pki.NewCSR(key, "mallory")
		if err := control.Write(ctrl, &control.Message{Type: control.TypeRenew, CSR: csr}); err != nil {
			t.Fatal(err)
		}
		_ = ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			m, err := control.Read(ctrl)
			if err != nil {
				t.Fatalf("waiting for the refusal: %v", err)
			}
			if m.Type == control.TypeRenewed {
				t.Fatal("hub renewed a certificate for a key the node does not hold")
			}
			if m.Type == control.TypeNotice {
				if !strings.Contains(m.Notice, "renewal refused: the CSR is not for this node's key") {
					t.Fatalf("notice: %q", m.Notice)
				}
				break
			}
		}
		waitAudit(t, c, "renewal refusal", func(e apitype.AuditEvent) bool {
			return e.Kind == "renew" && e.Result == "refused" && e.Node == "mallory" &&
				strings.Contains(e.Detail, "not for this node's key")
		})
	})

	t.Run("revoked node reconnects", func(t *testing.T) {
		if _, err := c.RevokeNode(context.Background(), "victim"); err != nil {
			t.Fatal(err)
		}
		sess := dialAs(t, victim, tunnel.TransportTCP)
		_, m := connectAs(t, sess, "victim")
		if m.Type != control.TypeNotice || !m.Fatal || !strings.Contains(m.Notice, "revoked") {
			t.Fatalf("answer: %+v", m)
		}
		waitDone(t, sess, "a revoked node")
		waitAudit(t, c, "revoked reconnect", refusedConnect("victim", "revoked node tried to reconnect"))
	})

	select {
	case <-goodSess.Done():
		t.Fatal("the good node's session ended")
	default:
	}
	if conn, ok := s.conns.Get("good"); !ok || conn.NodeID != good.Config.NodeID {
		t.Fatal("good node no longer registered")
	}
}

// TestAttackForeignCertAudited: a client certificate from another hub's CA
// gets no session, and the refusal is audited with the certificate's name.
func TestAttackForeignCertAudited(t *testing.T) {
	_, c := testHub(t)
	_, other := testHub(t)
	stranger := joinNode(t, other, "stranger")
	mine := joinNode(t, c, "mine")
	d := &tunnel.Dialer{TLSConfig: pki.ClientTLSConfig(stranger.Cert, mine.CA)}
	for _, tr := range []tunnel.Transport{tunnel.TransportTCP, tunnel.TransportQUIC} {
		d.Transport = tr
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sess, err := d.Dial(ctx, mine.Config.Hubs[0])
		cancel()
		if err == nil {
			// TLS 1.3 clients learn of the refusal at their first read.
			_, err = sess.AcceptStream(ctxTimeout(t, 5*time.Second))
			sess.Close()
		}
		if err == nil {
			t.Fatalf("%s: a foreign certificate got a working session", tr)
		}
	}
	waitAudit(t, c, "foreign certificate", func(e apitype.AuditEvent) bool {
		return e.Kind == "connect" && e.Result == "refused" &&
			strings.Contains(e.Detail, `TLS client certificate "stranger"`) && strings.Contains(e.Detail, "unknown authority")
	})
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestAttackBadStreamReplies: an agent answering the hub's stream header
// with garbage, an oversized reason or a truncated reply fails that jump
// with a clear error and an audit event; the session and other nodes carry
// on. The other way round, a real agent given garbage headers by the hub
// closes only that stream.
func TestAttackBadStreamReplies(t *testing.T) {
	s, c := testHub(t)
	bad := joinNode(t, c, "liar")

	// The good node is a real agent with the embedded SSH server.
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	goodDir := filepath.Join(t.TempDir(), "good")
	if _, err := edge.Join(context.Background(), edge.JoinOptions{
		JoinString: tok.JoinString, StateDir: goodDir, Name: "good",
	}); err != nil {
		t.Fatal(err)
	}
	runAgent(t, context.Background(),
		edge.Config{StateDir: goodDir, SSHTarget: edge.SSHEmbedded, Transport: tunnel.TransportTCP})

	liar := dialAs(t, bad, tunnel.TransportQUIC)
	if _, m := connectAs(t, liar, "liar"); m.Type != control.TypeWelcome {
		t.Fatalf("liar: %+v", m)
	}
	replies := map[string][]byte{
		"garbage":   []byte("HTTP/1.1 200 OK\r\n\r\n"),
		"oversized": {1, 1, 0xff, 0xff},
		"truncated": {1, 1, 0, 50, 'n', 'o'},
	}
	go func() {
		for {
			st, err := liar.AcceptStream(context.Background())
			if err != nil {
				return
			}
			h, err := tunnel.ReadHeader(st)
			if err != nil {
				st.Close()
				continue
			}
			kind := map[uint16]string{1: "garbage", 2: "oversized", 3: "truncated"}[h.Port]
			st.Write(replies[kind])
			st.CloseWrite()
		}
	}()

	operator := newOperator(t, c)
	ssh := dialBastion(t, s, operator)
	for port, kind := range map[int]string{1: "garbage", 2: "oversized", 3: "truncated"} {
		_, err := ssh.Dial("tcp", "liar:"+itoa(port))
		if err == nil || !strings.Contains(err.Error(), "tether: read answer from liar") ||
			!strings.Contains(err.Error(), "bad stream header") {
			t.Fatalf("%s reply: %v", kind, err)
		}
	}
	waitAudit(t, c, "failed jumps to the liar", func(e apitype.AuditEvent) bool {
		return e.Kind == "jump" && e.Node == "liar" && e.Result == "dial_failed" &&
			strings.Contains(e.Detail, "bad stream header")
	})

	// The hub sends garbage to the real agent: it closes that stream only.
	waitFor(t, "good agent online", func() bool { _, ok := s.conns.Get("good"); return ok })
	conn, _ := s.conns.Get("good")
	for _, junk := range [][]byte{{9, 0, 3, 1, 0, 0}, {1, 0, 65, 1}, {1, 0}} {
		st, err := conn.Session.OpenStream(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		st.Write(junk)
		st.CloseWrite()
		_ = st.SetReadDeadline(time.Now().Add(15 * time.Second))
		rep, err := tunnel.ReadReply(st)
		if err == nil && rep.OK {
			t.Fatalf("agent accepted header % x", junk)
		}
		st.Close()
	}
	// ... and still serves the next well-formed stream.
	nc, err := ssh.Dial("tcp", "good:22")
	if err != nil {
		t.Fatalf("jump to the good node after the garbage: %v", err)
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	banner := make([]byte, 4)
	if _, err := nc.Read(banner); err != nil || string(banner) != "SSH-" {
		t.Fatalf("good node's SSH server: %q %v", banner, err)
	}
	nc.Close()
	select {
	case <-liar.Done():
		t.Fatal("the liar's session ended; bad replies should fail only their stream")
	default:
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

// newOperator registers operator "op" with a fresh key.
func newOperator(t *testing.T, c *apiclient.Client) gossh.Signer {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddOperator(context.Background(), apitype.OperatorAddRequest{Name: "op",
		PublicKey: string(gossh.MarshalAuthorizedKey(signer.PublicKey()))}); err != nil {
		t.Fatal(err)
	}
	return signer
}

// dialBastion logs in to the hub's bastion as op, checking the host key
// against the hub's host CA.
func dialBastion(t *testing.T, s *Server, key gossh.Signer) *gossh.Client {
	t.Helper()
	var info apitype.HubInfo
	b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, apitype.HubInfoFile))
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if err != nil {
		t.Fatal(err)
	}
	checker := &gossh.CertChecker{IsHostAuthority: func(auth gossh.PublicKey, _ string) bool {
		for _, k := range s.hostCA.TrustedKeys() {
			if string(k.Marshal()) == string(auth.Marshal()) {
				return true
			}
		}
		return false
	}}
	client, err := gossh.Dial("tcp", info.SSH, &gossh.ClientConfig{
		User: "op", Auth: []gossh.AuthMethod{gossh.PublicKeys(key)},
		HostKeyCallback: checker.CheckHostKey, HostKeyAlgorithms: []string{gossh.CertAlgoED25519v01},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestAttackPathTraversalAudited: every name the hub accepts from the
// network that could end up in a path — node names at join, logins of roles
// (files in a managed sshd's principals dir), operator names, an agent's
// state dir — is refused when it tries to leave its directory, with a clear
// error and an audit event.
func TestAttackPathTraversalAudited(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()

	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The agent refuses such a name itself; post the request by hand.
	js, hc, csr := joinerClient(t, tok.JoinString, "x")
	body, _ := json.Marshal(control.JoinRequest{Token: js.Token, Name: "../../etc", CSR: csr})
	resp, err := hc.Post("https://"+js.Addrs[0]+control.JoinPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "invalid name") {
		t.Fatalf("join as ../../etc: %d %s", resp.StatusCode, b)
	}
	waitAudit(t, c, "join with a traversing name", func(e apitype.AuditEvent) bool {
		return e.Kind == "join" && e.Result == "bad_request" && e.Node == "../../etc" &&
			strings.Contains(e.Detail, "invalid name")
	})

	if _, err := c.PutRole(ctx, "sneaky",
		apitype.RolePutRequest{Nodes: "*", Logins: []string{"../../root/.ssh/authorized_keys"}}); err == nil ||
		!strings.Contains(err.Error(), "invalid login") {
		t.Fatalf("role with a traversing login: %v", err)
	}
	if _, err := c.AddOperator(ctx, apitype.OperatorAddRequest{
		Name: "../op", PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x",
	}); err == nil || !strings.Contains(err.Error(), "invalid name") {
		t.Fatalf("operator with a traversing name: %v", err)
	}
	for _, want := range []string{"PUT /v1/roles/sneaky: 400", "POST /v1/operators: 400"} {
		waitAudit(t, c, want, func(e apitype.AuditEvent) bool { return e.Kind == "api" && strings.Contains(e.Detail, want) })
	}

	n := joinNode(t, c, "n1")
	sess := dialAs(t, n, tunnel.TransportTCP)
	ctrl, err := sess.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := hello("n1")
	m.Hello.StateDir = "/var/lib/tether/../../../etc"
	// The agent's own encoder refuses this; write the frame by hand.
	body, _ = json.Marshal(m)
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	ctrl.Write(append(frame, body...))
	waitDone(t, sess, "a traversing state dir")
	waitAudit(t, c, "traversing state dir", refusedConnect("n1", "state_dir"))
	_ = s
}
