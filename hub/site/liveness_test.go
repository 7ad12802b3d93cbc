package site

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// liveSession is a site session whose Heard mark the test moves, and
// whose route streams are one end of a pipe the test holds the other of.
type liveSession struct {
	*idleSession
	heard   atomic.Uint64
	streams chan net.Conn // the site's ends of the opened streams
}

func newLiveSession() *liveSession {
	return &liveSession{idleSession: newIdleSession(), streams: make(chan net.Conn, 4)}
}

func (s *liveSession) Heard() uint64 { return s.heard.Load() }

func (s *liveSession) OpenStream(ctx context.Context) (tunnel.Stream, error) {
	select {
	case <-s.done:
		return nil, tunnel.ErrSessionClosed
	default:
	}
	a, b := net.Pipe()
	go func() { <-s.done; a.Close(); b.Close() }() // a session's streams end with it
	s.streams <- b
	return pipeStream{a}, nil
}

type pipeStream struct{ net.Conn }

func (pipeStream) CloseWrite() error { return nil }

// connectLive admits berlin with the given hello capabilities over a
// liveSession and connects it; the returned function ends the session.
func (f *fixture) connectLive(t *testing.T, caps ...string) (*liveSession, *siteproto.Welcome, func()) {
	t.Helper()
	h := siteHello(below)
	w, err := f.c.AdmitHello(context.Background(), store.Node{ID: "s1", Name: "berlin"},
		&control.Hello{Name: "berlin", Capabilities: append([]string{siteproto.CapSite}, caps...), Site: h})
	if err != nil {
		t.Fatal(err)
	}
	sess := newLiveSession()
	conn := nodeconn.NewConn("s1", "berlin", sess, nil)
	done := f.c.Connected(context.Background(), conn, h, w)
	t.Cleanup(func() { sess.Close(); done() })
	return sess, w, func() { sess.Close(); done() }
}

// newLiveFixture is a fixture whose sites heartbeat every 100ms and are
// dead after 300ms of silence.
func newLiveFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, nil)
	c, err := NewChildren(context.Background(), ChildrenConfig{Store: f.st, HubID: self, StaleAfter: 30 * time.Second,
		Heartbeat: 100 * time.Millisecond, DeadPeer: 300 * time.Millisecond, Now: f.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	return f
}

// TestAdmitSiteLiveness: a site that announces CapSiteLiveness is told its
// heartbeat and dead-peer time in the welcome; one that does not (an
// earlier version) gets neither, and its parent keeps the nodes' rule.
func TestAdmitSiteLiveness(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		caps                 []string
		wantEvery, wantAfter int
	}{
		{"a site with site liveness", []string{siteproto.CapSiteLiveness}, 100, 300},
		{"a site of an earlier version", nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLiveFixture(t)
			_, w, _ := f.connectLive(t, tc.caps...)
			if w.HeartbeatMillis != tc.wantEvery || w.DeadPeerMillis != tc.wantAfter {
				t.Fatalf("welcome liveness %d/%d ms, want %d/%d", w.HeartbeatMillis, w.DeadPeerMillis, tc.wantEvery,
					tc.wantAfter)
			}
			if err := w.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSiteDeadPeer: a parent closes the session of a site it hears
// nothing from for DeadPeer, and records the site down since then; a site
// heard all along, or one of an earlier version (no site liveness), keeps
// its session.
func TestSiteDeadPeer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		caps     []string
		beats    bool // the session's Heard mark moves every 50ms
		wantDead bool
	}{
		{"heard all along", []string{siteproto.CapSiteLiveness}, true, false},
		{"falls silent", []string{siteproto.CapSiteLiveness}, false, true},
		{"earlier version, silent", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLiveFixture(t)
			sess, _, _ := f.connectLive(t, tc.caps...)
			start := time.Now()
			f.clock.add(time.Minute) // the loss is recorded at this hub's clock
			deadline := time.After(time.Second)
			beat := time.NewTicker(50 * time.Millisecond)
			defer beat.Stop()
		loop:
			for {
				select {
				case <-sess.Done():
					break loop
				case <-deadline:
					break loop
				case <-beat.C:
					if tc.beats {
						sess.heard.Add(1)
					}
				}
			}
			c, _ := f.c.Get("berlin")
			select {
			case <-sess.Done():
				took := time.Since(start)
				if !tc.wantDead {
					t.Fatalf("session closed after %s", took)
				}
				if took < 300*time.Millisecond || took > 600*time.Millisecond {
					t.Errorf("closed after %s of silence, want 300ms and a tick or two", took)
				}
				if c.Connected || !c.Since.Equal(f.clock.now()) {
					t.Fatalf("after the close: connected %v since %s, want down since %s", c.Connected, c.Since,
						f.clock.now())
				}
			default:
				if tc.wantDead {
					t.Fatal("a silent site's session is still open after a second")
				}
				if !c.Connected {
					t.Fatalf("site shown down: %+v", c)
				}
			}
		})
	}
}

// TestUnreachableSinceWhileStale: a site whose session is up but which
// fell silent is unreachable since this hub judged it stale, not since its
// last status (which may be long before the site failed).
func TestUnreachableSinceWhileStale(t *testing.T) {
	f := newFixture(t, nil)
	conn, _ := f.connect(t)
	if _, err := f.c.Dispatch(context.Background(), conn, status(1, 3)); err != nil {
		t.Fatal(err)
	}
	lastStatus := f.clock.now()
	f.clock.add(45 * time.Second)
	c, _ := f.c.Get("berlin")
	var ue *UnreachableError
	if err := c.Unreachable(); !c.Connected || !errors.As(err, &ue) {
		t.Fatalf("connected %v, Unreachable = %v; want a connected, unreachable site", c.Connected, err)
	}
	if want := lastStatus.Add(30 * time.Second); !ue.Since.Equal(want) {
		t.Fatalf("unreachable since %s, want %s (stale from then; its last status was at %s)", ue.Since, want,
			lastStatus)
	}
}

// readRoute reads the route stream the parent opened on the site's end.
func readRoute(t *testing.T, sess *liveSession) (net.Conn, *siteproto.RouteRequest) {
	t.Helper()
	var st net.Conn
	select {
	case st = <-sess.streams:
	case <-time.After(5 * time.Second):
		t.Fatal("no route stream opened")
	}
	if h, err := tunnel.ReadHeader(st); err != nil || h.Service != tunnel.ServiceRoute {
		t.Fatalf("header %v, %v", h, err)
	}
	req, err := siteproto.ReadRouteRequest(st)
	if err != nil {
		t.Fatal(err)
	}
	return st, req
}

var testReq = &siteproto.RouteRequest{Target: "n1", Service: uint8(tunnel.ServiceSSH), Purpose: siteproto.PurposeJump,
	Origin: self}

// TestOpenRouteSiteDown: a route to a site that is down fails at once,
// saying since when; one waiting for the answer of a site that falls
// silent fails as soon as the parent closes its session, with the time it
// did so; one waiting for the answer of a live site gives up at the
// deadline with an error saying which site did not answer.
func TestOpenRouteSiteDown(t *testing.T) {
	t.Run("already down", func(t *testing.T) {
		f := newLiveFixture(t)
		_, _, disconnect := f.connectLive(t, siteproto.CapSiteLiveness)
		disconnect()
		down := f.clock.now()
		f.clock.add(time.Minute)
		start := time.Now()
		_, err := NewRoutes(f.c, f.st, self).OpenRoute(context.Background(), "berlin", testReq)
		var ue *access.SiteUnreachableError
		if !errors.As(err, &ue) || !ue.Since.Equal(down) || !errors.Is(err, access.ErrOffline) {
			t.Fatalf("OpenRoute = %v, want unreachable since %s", err, down)
		}
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Fatalf("took %s", took)
		}
	})
	t.Run("falls silent while the route waits", func(t *testing.T) {
		f := newLiveFixture(t)
		sess, _, _ := f.connectLive(t, siteproto.CapSiteLiveness)
		f.clock.add(time.Minute)
		errc := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := NewRoutes(f.c, f.st, self).OpenRoute(context.Background(), "berlin", testReq)
			errc <- err
		}()
		_, req := readRoute(t, sess)
		if req.WaitMillis != int(routeOpenTimeout/time.Millisecond) {
			t.Errorf("route request waits %d ms, want %s", req.WaitMillis, routeOpenTimeout)
		}
		err := <-errc
		var ue *access.SiteUnreachableError
		if !errors.As(err, &ue) || ue.Site != "berlin" || !ue.Since.Equal(f.clock.now()) {
			t.Fatalf("OpenRoute = %v, want site berlin unreachable since %s", err, f.clock.now())
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("failed after %s; the site's session was closed after 300ms", took)
		}
	})
	t.Run("live but slow", func(t *testing.T) {
		f := newLiveFixture(t)
		sess, _, _ := f.connectLive(t, siteproto.CapSiteLiveness)
		stop := make(chan struct{})
		defer close(stop)
		go func() { // the site is heard, but never answers
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
					sess.heard.Add(1)
				}
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := NewRoutes(f.c, f.st, self).OpenRoute(ctx, "berlin", testReq)
			errc <- err
		}()
		_, req := readRoute(t, sess)
		if req.WaitMillis <= 0 || req.WaitMillis > 500 {
			t.Errorf("route request waits %d ms, want the caller's 500 ms or less", req.WaitMillis)
		}
		err := <-errc
		var na *noAnswerError
		if !errors.As(err, &na) || errors.Is(err, access.ErrOffline) ||
			!strings.Contains(err.Error(), "site berlin did not answer within") {
			t.Fatalf("OpenRoute = %v, want site berlin did not answer", err)
		}
	})
}

// TestRouteTimeoutUnderSSHConnectTimeout: the wait for a site's answer
// leaves a stock ssh's common ConnectTimeout of 10 s the time to reach the
// hub and log in, so the operator reads why the route failed.
func TestRouteTimeoutUnderSSHConnectTimeout(t *testing.T) {
	if routeOpenTimeout > 8*time.Second {
		t.Fatalf("routeOpenTimeout %s leaves a 10 s ConnectTimeout under 2 s for the rest of the jump", routeOpenTimeout)
	}
}

func TestAnswerBudget(t *testing.T) {
	for _, tc := range []struct {
		wait int
		want time.Duration
	}{
		{0, 0},
		{7000, 6300 * time.Millisecond},
		{3000, 2500 * time.Millisecond},
		{400, 100 * time.Millisecond},
	} {
		if got := answerBudget(tc.wait); got != tc.want {
			t.Errorf("answerBudget(%d) = %s, want %s", tc.wait, got, tc.want)
		}
	}
}

// slowDoor finds every target and routes it on a route that never answers.
type slowDoor struct{ route access.Route }

func (d slowDoor) Serve(_ context.Context, req *siteproto.RouteRequest) (store.Node, access.Route, error) {
	return store.Node{Name: req.Target}, d.route, nil
}

// ctxRoute waits for its context to end.
type ctxRoute struct{}

func (ctxRoute) Dial(ctx context.Context, _ tunnel.Header) (tunnel.Stream, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (ctxRoute) String() string { return "slow" }

// deadlineRoute reads a stream with the context's deadline, as a local
// route reads the agent's answer: the read's deadline may fire before the
// context's timer.
type deadlineRoute struct{}

func (deadlineRoute) Dial(ctx context.Context, _ tunnel.Header) (tunnel.Stream, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	dl, _ := ctx.Deadline()
	_ = a.SetReadDeadline(dl)
	_, err := a.Read(make([]byte, 1))
	return nil, err
}
func (deadlineRoute) String() string { return "slow" }

// TestServeParentRouteAnswersInTime: a site routing on a stream from its
// parent answers within the wait the parent said, naming the hop that was
// slow, before the parent gives up on the whole route.
func TestServeParentRouteAnswersInTime(t *testing.T) {
	for name, route := range map[string]access.Route{"context": ctxRoute{}, "stream deadline": deadlineRoute{}} {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			defer b.Close()
			req := *testReq
			req.WaitMillis = 1000
			start := time.Now()
			go ServeParentRoute(context.Background(), pipeStream{a}, &req, ParentRouteConfig{Door: slowDoor{route},
				Audit: func(store.AuditEvent) {}, Logger: slog.New(slog.DiscardHandler)})
			_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
			rep, err := tunnel.ReadReply(b)
			took := time.Since(start)
			if err != nil || rep.OK || !strings.Contains(rep.Reason, "node n1 did not answer within 500ms") {
				t.Fatalf("reply %+v, %v; want a refusal naming n1", rep, err)
			}
			if took > 900*time.Millisecond {
				t.Fatalf("answered after %s, the parent waits 1s", took)
			}
		})
	}
}

func TestSiteLiveness(t *testing.T) {
	node := control.Liveness{Every: 20 * time.Second, Deadline: 50 * time.Second}
	for _, tc := range []struct {
		name string
		w    *siteproto.Welcome
		want control.Liveness
	}{
		{"no site section", nil, node},
		{"a parent without site liveness", &siteproto.Welcome{Path: "berlin"}, node},
		{"a parent with", &siteproto.Welcome{Path: "berlin", HeartbeatMillis: 1000, DeadPeerMillis: 3000},
			control.Liveness{Every: time.Second, Deadline: 50 * time.Second}},
	} {
		if got := siteLiveness(node, tc.w); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
