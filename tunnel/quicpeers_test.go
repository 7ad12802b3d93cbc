package tunnel

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// heal ends a blackhole: datagrams flow again.
func (p *udpProxy) heal() { p.holed.Store(false) }

// TestQUICPokeAfterRestart: a hub killed outright and restarted on the same
// address pokes the agents of its previous run's QUIC sessions, and an
// agent whose session it held closes it at once, long before its next
// keepalive (10 s here): without the poke it waited for that keepalive,
// and then for a heartbeat large enough to draw a stateless reset. A poke
// with another session's token, a busy hint or junk change nothing.
func TestQUICPokeAfterRestart(t *testing.T) {
	cfg := &Config{KeepAliveInterval: 10 * time.Second, IdleTimeout: 30 * time.Second}
	peers := filepath.Join(t.TempDir(), "quic_peers")
	listen := func(addr string) *Listener {
		l, err := Listen(t.Context(), addr, ListenConfig{TunnelTLS: tunnelServerTLS(), Config: cfg, PeersFile: peers})
		if err != nil {
			t.Fatalf("Listen %s: %v", addr, err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	l1 := listen("127.0.0.1:0")
	// The kill: the proxy drops what the dying hub sends (its
	// CONNECTION_CLOSE), as a hub killed by SIGKILL sends nothing.
	p := newUDPProxy(t, l1.udp.LocalAddr().String())
	agent, _ := dialAccept(t, l1, p.addr(), TransportQUIC, cfg, func(d *Dialer) { d.AckLiveness = true })
	other, _ := dialAccept(t, l1, l1.udp.LocalAddr().String(), TransportQUIC, cfg)
	dialed := time.Now()

	// The file names both sessions at once (peersWriteEvery), so that a
	// hub killed right after its agents connected pokes them too.
	var entries []peerEntry
	deadline := time.Now().Add(5 * time.Second)
	for len(entries) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		b, err := os.ReadFile(peers)
		if err == nil {
			entries, _ = decodePeers(b)
		}
	}
	if len(entries) != 2 {
		t.Fatalf("peers file names %d sessions after 5 s, want 2", len(entries))
	}
	if took := time.Since(dialed); took > 700*time.Millisecond {
		t.Errorf("the peers file named both sessions %v after they came, want within 0.7 s", took)
	}

	// What is not this session's poke leaves it alone.
	agentSocket := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: agent.LocalAddr().(*net.UDPAddr).Port}
	stranger, err := net.DialUDP("udp", nil, agentSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	for _, junk := range [][]byte{
		quicPokeRecord(other.(*quicSession).pokeToken()),
		quicPokeRecord([pokeTokenLen]byte{1}),
		quicBusyRecord(3),
		append(quicPokeMagic[:], make([]byte, pokeTokenLen)...),
		[]byte("TPOK"),
	} {
		if _, err := stranger.Write(junk); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case <-agent.Done():
		t.Fatalf("a poke that is not its own ended the session: %v", context.Cause(agent.(*quicSession).conn.Context()))
	default:
	}

	p.blackhole()
	addr := l1.Addr().String()
	_ = l1.Close()
	// The proxy drops the hub's last words as it reads them: let it read
	// them all before it forwards again.
	time.Sleep(300 * time.Millisecond)
	select {
	case <-agent.Done():
		t.Fatalf("the dying hub's close reached the agent: %v", context.Cause(agent.(*quicSession).conn.Context()))
	default:
	}
	p.heal()
	l2 := listen(addr)
	restarted := time.Now()
	accepted := make(chan Session, 1)
	go func() { // the hub serves: pokes go
		if s, err := l2.Accept(t.Context()); err == nil {
			accepted <- s
		}
	}()
	waitClosed(t, agent.Done(), 3*time.Second, "the agent's session after its hub restarted")
	t.Logf("the agent's session ended %v after the restart", time.Since(restarted).Round(time.Millisecond))
	endedByPoke(t, agent)
	// The agent is back: it is poked no more (its other session of the
	// last run, with the same key, neither).
	d := &Dialer{TLSConfig: clientTLS(true), Config: cfg, Transport: TransportQUIC}
	again, err := d.Dial(t.Context(), p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	select {
	case s := <-accepted:
		defer s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the hub accepted no session from the returning agent")
	}
	l2.peers.mu.Lock()
	left := len(l2.peers.pending)
	l2.peers.mu.Unlock()
	if left != 0 {
		t.Errorf("%d agents still to poke after they came back", left)
	}
}

// TestPeersFile: what a hub writes down it reads back after a restart, as
// long as the file says the hub ran less than an idle timeout ago; a file
// that is damaged, of another kind, or stale pokes nobody.
func TestPeersFile(t *testing.T) {
	entries := []peerEntry{
		{Key: [16]byte{1}, Token: [pokeTokenLen]byte{2}, Addr: netip.MustParseAddrPort("192.0.2.7:51000")},
		{Key: [16]byte{3}, Token: [pokeTokenLen]byte{4}, Addr: netip.MustParseAddrPort("[2001:db8::9]:443")},
	}
	good := encodePeers(entries)
	got, err := decodePeers(good)
	if err != nil || len(got) != 2 || got[0] != entries[0] || got[1] != entries[1] {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, entries)
	}
	flipped := append([]byte(nil), good...)
	flipped[20] ^= 1
	for name, b := range map[string][]byte{
		"empty":        {},
		"other magic":  append([]byte("TQPEERS\x02"), good[8:]...),
		"truncated":    good[:len(good)-7],
		"flipped byte": flipped,
		"no port": encodePeers([]peerEntry{
			{Key: [16]byte{1}, Addr: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.7"), 0)},
		}),
	} {
		if _, err := decodePeers(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}

	dir := t.TempDir()
	log := orDiscard(nil)
	for _, tc := range []struct {
		name    string
		content []byte
		age     time.Duration
		want    int
	}{
		{"fresh", good, time.Second, 2},
		{"older than the idle timeout", good, time.Minute, 0},
		{"damaged", flipped, time.Second, 0},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		if err := os.WriteFile(path, tc.content, 0o600); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-tc.age)
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
		if p := openQUICPeers(path, 30*time.Second, log); len(p.pending) != tc.want {
			t.Errorf("%s: %d agents to poke, want %d", tc.name, len(p.pending), tc.want)
		}
	}
	if p := openQUICPeers(filepath.Join(dir, "none"), time.Minute, log); len(p.pending) != 0 {
		t.Errorf("no file: %d agents to poke", len(p.pending))
	}
}

// TestQUICPokeFromAnotherHub: a hub that was not the session's (a replica
// that found the session's replica dead) pokes its agent with the target
// the session's hub recorded, from its own socket, once it serves; the
// agent ends the session at once. An agent connected to the poking hub
// already is not poked.
func TestQUICPokeFromAnotherHub(t *testing.T) {
	cfg := &Config{KeepAliveInterval: 10 * time.Second, IdleTimeout: 30 * time.Second}
	listen := func() *Listener {
		l, err := Listen(t.Context(), "127.0.0.1:0", ListenConfig{TunnelTLS: tunnelServerTLS(), Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	l1, l2 := listen(), listen()
	agent, held := dialAccept(t, l1, l1.udp.LocalAddr().String(), TransportQUIC, cfg,
		func(d *Dialer) { d.AckLiveness = true })
	target, ok := PokeTargetOf(held)
	if !ok {
		t.Fatal("no poke target for an accepted QUIC session")
	}
	if _, ok := PokeTargetOf(agent); ok {
		t.Error("a poke target for the dialing side's session")
	}
	if back, err := ParsePokeTarget(target.String()); err != nil || back != target {
		t.Fatalf("ParsePokeTarget(%q) = %+v, %v; want %+v", target.String(), back, err, target)
	}
	if n := l2.Poke([]PokeTarget{target}); n != 1 {
		t.Fatalf("Poke took %d targets, want 1", n)
	}
	time.Sleep(300 * time.Millisecond) // l2 does not serve yet: no poke goes
	select {
	case <-agent.Done():
		t.Fatal("a hub that does not serve yet poked")
	default:
	}
	accepted := make(chan Session, 1)
	go func() {
		if s, err := l2.Accept(t.Context()); err == nil {
			accepted <- s
		}
	}()
	start := time.Now()
	waitClosed(t, agent.Done(), 3*time.Second, "the agent's session after another hub poked it")
	t.Logf("poked after %v", time.Since(start).Round(time.Millisecond))
	endedByPoke(t, agent)
	d := &Dialer{TLSConfig: clientTLS(true), Config: cfg, Transport: TransportQUIC}
	again, err := d.Dial(t.Context(), l2.udp.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	select {
	case s := <-accepted:
		defer s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the poking hub accepted no session from the agent")
	}
	if n := l2.Poke([]PokeTarget{target}); n != 0 {
		t.Errorf("Poke took %d targets of an agent connected to it, want 0", n)
	}
}

// TestParsePokeTarget: only what String writes is read.
func TestParsePokeTarget(t *testing.T) {
	good := PokeTarget{Key: [16]byte{1}, Token: [pokeTokenLen]byte{2},
		Addr: netip.MustParseAddrPort("[2001:db8::9]:4433")}
	if back, err := ParsePokeTarget(good.String()); err != nil || back != good {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	s := good.String()
	for _, bad := range []string{
		"", "@", s[:len(s)-5], strings.Replace(s, "@", "", 1), strings.Replace(s, ".", "", 1),
		strings.Replace(s, "01", "zz", 1), strings.Replace(s, ":4433", ":0", 1),
		PokeTarget{Key: [16]byte{1}, Addr: good.Addr}.String(), "x" + s,
	} {
		if _, err := ParsePokeTarget(bad); err == nil {
			t.Errorf("ParsePokeTarget(%q) accepted", bad)
		}
	}
}

func FuzzParsePokeTarget(f *testing.F) {
	f.Add(PokeTarget{Key: [16]byte{1}, Token: [pokeTokenLen]byte{2},
		Addr: netip.MustParseAddrPort("192.0.2.7:41000")}.String())
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePokeTarget(s)
		if err != nil {
			return
		}
		if back, err := ParsePokeTarget(p.String()); err != nil || back != p {
			t.Fatalf("%q: round trip %+v, %v", s, back, err)
		}
	})
}

// endedByPoke checks that the agent's session ended by its own close for a
// hub that no longer holds it (a poke), not by a timeout or the peer.
func endedByPoke(t *testing.T, agent Session) {
	t.Helper()
	var app *quic.ApplicationError
	if err := context.Cause(agent.(*quicSession).conn.Context()); !errors.As(err, &app) ||
		app.ErrorCode != quicCodeHubRestarted || app.Remote {
		t.Errorf("the session ended with %v, want this side's close for a hub that lost it", err)
	}
}
