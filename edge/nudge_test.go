package edge

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// probedSession is a QUIC session as nudge sees it: a Heard mark the test
// moves and the probes its dead-peer rule asks for.
type probedSession struct {
	tunnel.Session // only the methods below are called
	heard          atomic.Uint64
	probes         chan tunnel.Probe
	pingAfter      atomic.Int64
}

func (s *probedSession) Heard() uint64               { return s.heard.Load() }
func (s *probedSession) Transport() tunnel.Transport { return tunnel.TransportQUIC }
func (s *probedSession) Close() error                { return nil }
func (s *probedSession) Probes(pingAfter time.Duration) <-chan tunnel.Probe {
	s.pingAfter.Store(int64(pingAfter))
	return s.probes
}

// TestNudge: nudge starts the session's probes after the keepalive it was
// given, sends a heartbeat for every probe the session asks for, says
// hub-silent in the status from the first one (since the silence began,
// not since it was noticed), and connected again, since the session was
// welcomed, once the hub is heard.
func TestNudge(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []Status
	)
	a := &Agent{
		cfg: Config{OnStatus: func(st Status) {
			mu.Lock()
			seen = append(seen, st)
			mu.Unlock()
		}},
		log:   slog.New(slog.DiscardHandler),
		state: StateHandshaking,
	}
	last := func() Status {
		mu.Lock()
		defer mu.Unlock()
		return seen[len(seen)-1]
	}
	tun := &probedSession{probes: make(chan tunnel.Probe)}
	agentEnd, hubEnd := net.Pipe()
	defer hubEnd.Close()
	s := &session{a: a, tun: tun, hub: "hub:7443", log: a.log,
		conn: uplink.NewControlConn(pipeStream{agentEnd}, hubPeer, a.log)}
	a.setState(StateConnected, transition{hub: s.hub, transport: "quic"})
	welcomed := last().Since

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.nudge(ctx, 25*time.Second)
	}()
	defer func() { cancel(); <-done }()

	heartbeats := make(chan *control.Message, 4)
	go func() {
		for {
			m, err := control.Read(hubEnd)
			if err != nil {
				return
			}
			heartbeats <- m
		}
	}()
	for i := range 3 {
		silent := time.Duration(30+5*i) * time.Second
		tun.probes <- tunnel.Probe{Silent: silent, Heard: 7}
		select {
		case m := <-heartbeats:
			if m.Type != control.TypeHeartbeat {
				t.Fatalf("probe %d: the hub read a %s, want a heartbeat", i, m.Type)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("probe %d: no heartbeat", i)
		}
	}
	if got := time.Duration(tun.pingAfter.Load()); got != 25*time.Second {
		t.Errorf("probes started after a keepalive of %v, want 25s", got)
	}
	st := last()
	if st.State != "hub-silent" || st.Transport != "quic" || st.Hub != "hub:7443" {
		t.Fatalf("status after the probes %+v, want hub-silent on quic to hub:7443", st)
	}
	if ago := time.Since(st.Since); ago < 29*time.Second || ago > 31*time.Second {
		t.Errorf("hub-silent since %v ago, want since the silence began 30s ago", ago.Round(time.Second))
	}

	tun.heard.Store(8) // the hub answers
	deadline := time.Now().Add(10 * time.Second)
	for last().State != "connected" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := last(); st.State != "connected" || !st.Since.Equal(welcomed) {
		t.Errorf("status once the hub answered %+v, want connected since the welcome (%v)", st, welcomed)
	}
	if n := len(heartbeats); n != 0 {
		t.Errorf("%d heartbeats nobody asked for", n)
	}
}
