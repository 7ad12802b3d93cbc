package hub

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// helloWith is hello(name) announcing caps.
func helloWith(name string, caps ...string) *control.Message {
	m := hello(name)
	m.Hello.Capabilities = caps
	return m
}

// connectWith opens the control stream, says hello with caps and waits for
// the welcome.
func connectWith(t *testing.T, sess tunnel.Session, name string, caps ...string) tunnel.Stream {
	t.Helper()
	ctrl, err := sess.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := control.Write(ctrl, helloWith(name, caps...)); err != nil {
		t.Fatal(err)
	}
	_ = ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := control.Read(ctrl); err != nil || m.Type != control.TypeWelcome {
		t.Fatalf("%s: answer to hello: %+v %v", name, m, err)
	}
	_ = ctrl.SetReadDeadline(time.Time{})
	return ctrl
}

// waitBindings reads ctrl until a service bindings message satisfying ok.
func waitBindings(t *testing.T, ctrl tunnel.Stream, ok func([]siteproto.ServiceBinding) bool) {
	t.Helper()
	_ = ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer ctrl.SetReadDeadline(time.Time{})
	for {
		m, err := control.Read(ctrl)
		if err != nil {
			t.Fatalf("waiting for service bindings: %v", err)
		}
		if m.Type == siteproto.TypeServiceBindings && ok(m.ServiceBindings) {
			return
		}
	}
}

// serviceConnect opens a service connect stream for name and returns it
// with the hub's reply.
func serviceConnect(t *testing.T, sess tunnel.Session, name string) (tunnel.Stream, tunnel.Reply) {
	t.Helper()
	st, err := sess.OpenStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetDeadline(time.Now().Add(15 * time.Second))
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceConnect}); err != nil {
		t.Fatal(err)
	}
	if err := siteproto.WriteServiceConnect(st, &siteproto.ServiceConnectRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		t.Fatalf("service connect %s: reply: %v", name, err)
	}
	return st, rep
}

// echoTarget serves the hub's tcp streams to port on sess with an echo.
func echoTarget(t *testing.T, sess tunnel.Session, port uint16) {
	go func() {
		for {
			st, err := sess.AcceptStream(context.Background())
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				h, err := tunnel.ReadHeader(st)
				if err != nil || h.Service != tunnel.ServiceTCP || h.Port != port {
					_ = tunnel.WriteReply(st, tunnel.Reply{Reason: "port not allowed"})
					return
				}
				_ = tunnel.WriteReply(st, tunnel.Reply{OK: true})
				_, _ = io.Copy(st, st)
				_ = st.CloseWrite()
			}()
		}
	}()
}

// TestServiceConnectStreams: the hub's accept loop on node sessions
// carries a bound consumer's service connect stream to the target's port,
// bytes intact both ways, and refuses (and audits) every other stream an
// agent opens: other stream kinds, a service connect without the
// capability, for an unknown service, or from a node that is not bound.
func TestServiceConnectStreams(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	target, consumer, stranger := joinNode(t, c, "a"), joinNode(t, c, "b"), joinNode(t, c, "c")
	tSess := dialAs(t, target, tunnel.TransportQUIC)
	connectWith(t, tSess, "a", control.CapTCP)
	echoTarget(t, tSess, 5432)
	bSess := dialAs(t, consumer, tunnel.TransportTCP)
	bCtrl := connectWith(t, bSess, "b", control.CapTCP, siteproto.CapServiceConnect)
	// The first bindings (none yet) arrive on connect.
	waitBindings(t, bCtrl, func(bs []siteproto.ServiceBinding) bool { return len(bs) == 0 })
	cSess := dialAs(t, stranger, tunnel.TransportQUIC)
	connectWith(t, cSess, "c", control.CapTCP, siteproto.CapServiceConnect)

	if _, err := c.ExposeService(ctx, apitype.ServiceExposeRequest{Name: "db", Target: "a", Port: 5432}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConnectService(ctx, "db", apitype.ServiceConnectRequest{Consumer: "b", LocalPort: 15432}); err != nil {
		t.Fatal(err)
	}
	waitBindings(t, bCtrl, func(bs []siteproto.ServiceBinding) bool {
		return len(bs) == 1 && bs[0].Name == "db" && bs[0].Listen == "127.0.0.1:15432"
	})

	t.Run("bound consumer reaches the target", func(t *testing.T) {
		st, rep := serviceConnect(t, bSess, "db")
		defer st.Close()
		if !rep.OK {
			t.Fatalf("refused: %s", rep.Reason)
		}
		payload := make([]byte, 1<<20)
		_, _ = rand.Read(payload)
		go func() {
			_, _ = st.Write(payload)
			_ = st.CloseWrite()
		}()
		got, err := io.ReadAll(st)
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("echo: %d of %d bytes, equal %v, err %v", len(got), len(payload), bytes.Equal(got, payload), err)
		}
		waitAudit(t, c, "the carried stream", func(e apitype.AuditEvent) bool {
			return e.Kind == "service_connect" && e.Result == "ok" && e.Node == "b" && e.BytesToNode == int64(len(payload))
		})
	})

	for _, tc := range []struct {
		name, service, reason string
		sess                  tunnel.Session
	}{
		{"unbound node", "db", "not a consumer of service db", cSess},
		{"unknown service", "nope", `no service named "nope"`, bSess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, rep := serviceConnect(t, tc.sess, tc.service)
			st.Close()
			if rep.OK || !strings.Contains(rep.Reason, tc.reason) {
				t.Fatalf("reply %+v, want a refusal saying %q", rep, tc.reason)
			}
		})
	}

	t.Run("without the capability", func(t *testing.T) {
		// a never announced service-connect: even a bound service's name
		// gets it nothing.
		st, rep := serviceConnect(t, tSess, "db")
		st.Close()
		if rep.OK || !strings.Contains(rep.Reason, "agents may not open streams") {
			t.Fatalf("reply %+v", rep)
		}
	})

	t.Run("other stream kinds", func(t *testing.T) {
		for _, h := range []tunnel.Header{
			{Service: tunnel.ServiceSSH}, {Service: tunnel.ServiceTCP, Port: 5432}, {Service: tunnel.ServiceRoute},
		} {
			st, err := bSess.OpenStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = st.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tunnel.WriteHeader(st, h); err != nil {
				t.Fatal(err)
			}
			rep, err := tunnel.ReadReply(st)
			st.Close()
			if err != nil || rep.OK || !strings.Contains(rep.Reason, "agents may not open streams") {
				t.Fatalf("stream %s: %+v %v", h, rep, err)
			}
		}
	})

	waitAudit(t, c, "the unbound node's refusal", func(e apitype.AuditEvent) bool {
		return e.Kind == "service_connect" && e.Result == "refused" && e.Node == "c"
	})

	// Disconnecting pushes an empty list: the agent closes its listener.
	if _, err := c.DisconnectService(ctx, "db", "b"); err != nil {
		t.Fatal(err)
	}
	waitBindings(t, bCtrl, func(bs []siteproto.ServiceBinding) bool { return len(bs) == 0 })
	st, rep := serviceConnect(t, bSess, "db")
	st.Close()
	if rep.OK {
		t.Fatal("a disconnected consumer still reaches the service")
	}
}

// TestServicePolicy: exposing and connecting need the role permission
// (the door's AuthorizeService), not just a role that reaches the nodes;
// refusals are audited; a consumer's local port is not bound twice.
func TestServicePolicy(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()
	joinNode(t, c, "a")
	joinNode(t, c, "b")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pki.EncodeCerts(s.ca.Certificate()), 0o644); err != nil {
		t.Fatal(err)
	}
	client := func(role string, services ...string) *apiclient.Client {
		if _, err := c.PutRole(ctx, role, apitype.RolePutRequest{
			Nodes: "*", Logins: []string{"root"}, Services: services,
		}); err != nil {
			t.Fatal(err)
		}
		tok, err := c.CreateAPIToken(ctx, apitype.APITokenCreateRequest{Role: role})
		if err != nil {
			t.Fatal(err)
		}
		cl, err := apiclient.NewTokenClient(hubAddr(t, s), caFile, tok.Token)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	plain, links, owner := client("plain"), client("links", roles.ServiceConnect), client("owner", roles.ServiceExpose)
	if _, err := c.PutRole(ctx, "bad", apitype.RolePutRequest{
		Nodes: "*", Logins: []string{"root"}, Services: []string{"forward"},
	}); err == nil {
		t.Fatal("a role with an unknown service permission was stored")
	}

	expose := apitype.ServiceExposeRequest{Name: "db", Target: "a", Port: 5432}
	for name, cl := range map[string]*apiclient.Client{"plain": plain, "links": links} {
		if _, err := cl.ExposeService(ctx, expose); err == nil ||
			!strings.Contains(err.Error(), "service permission") && !strings.Contains(err.Error(), "may not expose") {
			t.Fatalf("%s exposed a service: %v", name, err)
		}
	}
	if _, err := owner.ExposeService(ctx, expose); err != nil {
		t.Fatalf("a role with expose: %v", err)
	}
	if _, err := owner.ExposeService(ctx, expose); err == nil {
		t.Fatal("a second service of the same name was created")
	}
	bind := apitype.ServiceConnectRequest{Consumer: "b", LocalPort: 15432}
	for name, cl := range map[string]*apiclient.Client{"plain": plain, "owner": owner} {
		if _, err := cl.ConnectService(ctx, "db", bind); err == nil {
			t.Fatalf("%s bound a consumer without the connect permission", name)
		}
	}
	if _, err := links.ConnectService(ctx, "db", bind); err != nil {
		t.Fatalf("a role with connect: %v", err)
	}
	if _, err := owner.ExposeService(
		ctx, apitype.ServiceExposeRequest{Name: "cache", Target: "a", Port: 6379},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := links.ConnectService(ctx, "cache", bind); err == nil ||
		!strings.Contains(err.Error(), "already listens on local port 15432") {
		t.Fatalf("a consumer's local port bound twice: %v", err)
	}
	if list, err := plain.ListServices(ctx); err != nil || len(list) != 2 {
		t.Fatalf("list as a role reaching both nodes: %+v %v", list, err)
	}
	waitAudit(t, c, "the refused expose", func(e apitype.AuditEvent) bool {
		return e.Kind == "service_expose" && e.Result == "refused" && strings.Contains(e.Detail, "apitoken:")
	})
}

// TestServiceConnectResumeIDs: on a consumer's session that keeps streams
// and its service connects (control.CapResume, CapResumeConnect), a
// service connect carries a resume Open frame after
// its header, and the hub refuses one whose ID another of the node's
// streams holds: a reused ID never reaches someone else's stream.
func TestServiceConnectResumeIDs(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	target, consumer := joinNode(t, c, "a"), joinNode(t, c, "b")
	tSess := dialAs(t, target, tunnel.TransportTCP)
	connectWith(t, tSess, "a", control.CapTCP)
	echoTarget(t, tSess, 5432)
	bSess := dialAs(t, consumer, tunnel.TransportTCP)
	bCtrl := connectWith(t, bSess, "b", control.CapTCP, siteproto.CapServiceConnect, control.CapResume,
		control.CapResumeConnect)
	if _, err := c.ExposeService(ctx, apitype.ServiceExposeRequest{Name: "db", Target: "a", Port: 5432}); err != nil {
		t.Fatal(err)
	}
	req := apitype.ServiceConnectRequest{Consumer: "b", LocalPort: 15433}
	if _, err := c.ConnectService(ctx, "db", req); err != nil {
		t.Fatal(err)
	}
	waitBindings(t, bCtrl, func(bs []siteproto.ServiceBinding) bool { return len(bs) == 1 })
	id := resume.NewID()
	open := func() (tunnel.Stream, tunnel.Reply) {
		t.Helper()
		st, err := bSess.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		_ = st.SetDeadline(time.Now().Add(15 * time.Second))
		if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceConnect}); err != nil {
			t.Fatal(err)
		}
		if err := resume.WriteOpen(st, id); err != nil {
			t.Fatal(err)
		}
		if err := siteproto.WriteServiceConnect(st, &siteproto.ServiceConnectRequest{Name: "db"}); err != nil {
			t.Fatal(err)
		}
		rep, err := tunnel.ReadReply(st)
		if err != nil {
			t.Fatalf("service connect: reply: %v", err)
		}
		return st, rep
	}
	st, rep := open()
	if !rep.OK {
		t.Fatalf("the first stream of id %v refused: %s", id, rep.Reason)
	}
	// The hub speaks resume frames on it from the answer on.
	rs := resume.New(id, st, resume.Config{})
	defer rs.Abort("test over")
	echo(t, rs, "framed both ways")
	if _, rep := open(); rep.OK || !strings.Contains(rep.Reason, "already in use") {
		t.Fatalf("a second stream with the same id: %+v, want it refused", rep)
	}
}

// TestServiceConnectResumeStreamsOnly: an agent that keeps the hub's
// streams (control.CapResume) but announced nothing of its service
// connects (an agent of the version before CapResumeConnect) sends them
// without an Open frame, and the hub carries them as before.
func TestServiceConnectResumeStreamsOnly(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	target, consumer := joinNode(t, c, "a"), joinNode(t, c, "b")
	tSess := dialAs(t, target, tunnel.TransportTCP)
	connectWith(t, tSess, "a", control.CapTCP)
	echoTarget(t, tSess, 5432)
	bSess := dialAs(t, consumer, tunnel.TransportTCP)
	bCtrl := connectWith(t, bSess, "b", control.CapTCP, siteproto.CapServiceConnect, control.CapResume)
	if _, err := c.ExposeService(ctx, apitype.ServiceExposeRequest{Name: "db", Target: "a", Port: 5432}); err != nil {
		t.Fatal(err)
	}
	req := apitype.ServiceConnectRequest{Consumer: "b", LocalPort: 15434}
	if _, err := c.ConnectService(ctx, "db", req); err != nil {
		t.Fatal(err)
	}
	waitBindings(t, bCtrl, func(bs []siteproto.ServiceBinding) bool { return len(bs) == 1 })
	st, err := bSess.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(15 * time.Second))
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceConnect}); err != nil {
		t.Fatal(err)
	}
	if err := siteproto.WriteServiceConnect(st, &siteproto.ServiceConnectRequest{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	if rep, err := tunnel.ReadReply(st); err != nil || !rep.OK {
		t.Fatalf("service connect without an Open frame: %+v, %v; want carried", rep, err)
	}
	echo(t, st, "plain both ways")
}
