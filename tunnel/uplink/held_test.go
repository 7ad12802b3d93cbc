package uplink

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
)

// TestHeldKeep: streams are held only on a session whose hub keeps them,
// for the window it names.
func TestHeldKeep(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    *control.Welcome
		want time.Duration // 0: not held
	}{
		{"no welcome", nil, 0},
		{"hub without resumable streams", &control.Welcome{ResumeWindowSeconds: 60}, 0},
		{"window 0", &control.Welcome{Capabilities: []string{control.HubCapResume}}, 0},
		{"resumable", &control.Welcome{Capabilities: []string{control.HubCapSSHEvents, control.HubCapResume},
			ResumeWindowSeconds: 30}, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHeld(1 << 20)
			cfg := h.Keep(tc.w, nil, slog.New(slog.DiscardHandler))
			switch {
			case tc.want == 0 && cfg != nil:
				t.Fatalf("Keep = %+v, want nil", cfg)
			case tc.want != 0 && (cfg == nil || cfg.Window != tc.want || cfg.Budget == nil):
				t.Fatalf("Keep = %+v, want a window of %v and the held budget", cfg, tc.want)
			}
		})
	}
}

// TestHeldStreamsOutliveSessions: a stream the hub opened (Accept) and one
// the uplink opened (Open) are held once answered, carried on beyond the
// session they came on, and re-attached over the next one (Resume), bytes
// written during the gap included, on both transports; a hub that no
// longer knows a stream ends it with its reason; stopping the uplink ends
// every held stream with the reason it gives, and waits for what carries
// them.
func TestHeldStreamsOutliveSessions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport tunnel.Transport
		opened    bool // the uplink opened the stream
		forgotten bool // the hub drops its streams while the uplink is away
	}{
		{"hub's stream quic", tunnel.TransportQUIC, false, false},
		{"hub's stream tcp", tunnel.TransportTCP, false, false},
		{"uplink's stream quic", tunnel.TransportQUIC, true, false},
		{"uplink's stream tcp", tunnel.TransportTCP, true, false},
		{"forgotten by the hub", tunnel.TransportTCP, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := heldListener(t)
			held := NewHeld(16 << 20)
			stop := held.Run(context.Background(), "the test's uplink stops")
			stopped := false
			defer func() {
				if !stopped {
					stop()
				}
			}()
			cfg := *held.Keep(&control.Welcome{Capabilities: []string{control.HubCapResume}, ResumeWindowSeconds: 30},
				nil, slog.New(slog.DiscardHandler))
			hubSet := resume.NewSet()
			up, hub := heldDial(t, ln, tc.transport)

			var hubSide tunnel.Stream
			if tc.opened {
				hubSide = uplinkOpens(t, held, cfg, up, hub, hubSet)
			} else {
				hubSide = hubOpens(t, held, cfg, up, hub, hubSet)
			}
			defer hubSide.Close()
			heldEcho(t, hubSide, "before the reconnect")

			// The link dies: both ends of the session go, the stream stays.
			_ = up.Close()
			_ = hub.Close()
			if _, err := hubSide.Write([]byte("during the gap")); err != nil {
				t.Fatalf("write during the gap: %v", err)
			}
			if tc.forgotten {
				hubSet.CloseAll("the hub restarted")
			}
			up2, hub2 := heldDial(t, ln, tc.transport)
			serveResumes(t, hub2, hubSet)
			streams := held.Streams()
			if len(streams) != 1 {
				t.Fatalf("held %d streams, want 1", len(streams))
			}
			held.Resume(context.Background(), up2, streams, slog.New(slog.DiscardHandler))
			if tc.forgotten {
				select {
				case <-streams[0].Done():
				case <-time.After(10 * time.Second):
					t.Fatal("a stream the hub no longer knows did not end")
				}
				var ended *resume.EndedError
				err := streams[0].Err()
				if !errors.As(err, &ended) || !strings.Contains(ended.Reason, "hub restarted") {
					t.Fatalf("end of a stream the hub forgot: %v, want the hub's reason", err)
				}
				return
			}
			_ = hubSide.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, len("during the gap"))
			if _, err := io.ReadFull(hubSide, got); err != nil || string(got) != "during the gap" {
				t.Fatalf("echo of what was written during the gap: %q, %v", got, err)
			}
			heldEcho(t, hubSide, "after the reconnect")

			stop()
			stopped = true
			_ = hubSide.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err := hubSide.Read(make([]byte, 1))
			var ended *resume.EndedError
			if !errors.As(err, &ended) || !strings.Contains(ended.Reason, "the test's uplink stops") {
				t.Fatalf("read after the uplink stopped: %v, want its reason", err)
			}
		})
	}
}

// echoHeld carries st as the uplink's side does: an echo, on a goroutine
// of held.
func echoHeld(held *Held, st tunnel.Stream) {
	held.Go(func(ctx context.Context) {
		stop := context.AfterFunc(ctx, func() { st.Close() })
		defer stop()
		defer st.Close()
		_, _ = io.Copy(st, st)
	})
}

// hubOpens opens a stream from the hub, as the hub does to an agent or a
// site: header, Open frame, reply; the uplink holds its side and echoes.
func hubOpens(t *testing.T, held *Held, cfg resume.Config, up, hub tunnel.Session,
	hubSet *resume.Set) tunnel.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hs, err := hub.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := resume.NewID()
	if err := tunnel.WriteHeader(hs, tunnel.Header{Service: tunnel.ServiceTCP, Port: 7}); err != nil {
		t.Fatal(err)
	}
	if err := resume.WriteOpen(hs, id); err != nil {
		t.Fatal(err)
	}
	us, err := up.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tunnel.ReadHeader(us); err != nil {
		t.Fatal(err)
	}
	p, err := held.Accept(us, cfg)
	if err != nil || p.ID() != id {
		t.Fatalf("Accept: %v, id %v, want %v", err, p.ID(), id)
	}
	if err := tunnel.WriteReply(p, tunnel.Reply{OK: true}); err != nil {
		t.Fatal(err)
	}
	kept, err := resume.Answered(p)
	if err != nil {
		t.Fatal(err)
	}
	echoHeld(held, kept)
	if rep, err := tunnel.ReadReply(hs); err != nil || !rep.OK {
		t.Fatalf("reply: %+v, %v", rep, err)
	}
	rs := resume.New(id, hs, cfg)
	if err := hubSet.Add(rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

// uplinkOpens opens a stream from the uplink, as an agent's service
// connect does: header, Open frame, the hub's reply; the uplink holds its
// side and echoes.
func uplinkOpens(t *testing.T, held *Held, cfg resume.Config, up, hub tunnel.Session,
	hubSet *resume.Set) tunnel.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	us, err := up.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tunnel.WriteHeader(us, tunnel.Header{Service: tunnel.ServiceConnect}); err != nil {
		t.Fatal(err)
	}
	p, err := held.Open(us, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := hub.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tunnel.ReadHeader(hs); err != nil {
		t.Fatal(err)
	}
	id, err := resume.ReadOpen(hs)
	if err != nil || id != p.ID() {
		t.Fatalf("ReadOpen: %v, id %v, want %v", err, id, p.ID())
	}
	if err := tunnel.WriteReply(hs, tunnel.Reply{OK: true}); err != nil {
		t.Fatal(err)
	}
	rs := resume.New(id, hs, cfg)
	if err := hubSet.Add(rs); err != nil {
		t.Fatal(err)
	}
	if rep, err := tunnel.ReadReply(p); err != nil || !rep.OK {
		t.Fatalf("reply: %+v, %v", rep, err)
	}
	kept, err := resume.Answered(p)
	if err != nil {
		t.Fatal(err)
	}
	echoHeld(held, kept)
	return rs
}

// serveResumes accepts the hub's side of resume streams on sess into set
// until the test ends.
func serveResumes(t *testing.T, sess tunnel.Session, set *resume.Set) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() {
		for {
			st, err := sess.AcceptStream(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				if h, err := tunnel.ReadHeader(st); err != nil || h.Service != tunnel.ServiceResume {
					st.Close()
					return
				}
				_ = set.Accept(ctx, st)
			})
		}
	})
	t.Cleanup(func() { cancel(); _ = sess.Close(); wg.Wait() })
}

func heldEcho(t *testing.T, st tunnel.Stream, msg string) {
	t.Helper()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	defer st.SetDeadline(time.Time{})
	if _, err := st.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(st, got); err != nil || string(got) != msg {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

// heldCerts is a throwaway CA with a hub and an uplink certificate, for
// real tunnel sessions on 127.0.0.1.
var heldCerts = sync.OnceValue(func() (c struct {
	pool        *x509.CertPool
	hub, uplink tls.Certificate
}) {
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "held test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		panic(err)
	}
	issue := func(serial int64, usage x509.ExtKeyUsage, ips []net.IP) tls.Certificate {
		key := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "held test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			panic(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	c.pool = x509.NewCertPool()
	c.pool.AddCert(ca)
	c.hub = issue(2, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	c.uplink = issue(3, x509.ExtKeyUsageClientAuth, nil)
	return c
})

func heldListener(t *testing.T) *tunnel.Listener {
	t.Helper()
	c := heldCerts()
	l, err := tunnel.Listen(t.Context(), "127.0.0.1:0", tunnel.ListenConfig{TunnelTLS: &tls.Config{
		Certificates: []tls.Certificate{c.hub}, ClientCAs: c.pool, ClientAuth: tls.RequireAndVerifyClientCert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// heldDial connects an uplink session to l over tr and accepts it as the
// hub's.
func heldDial(t *testing.T, l *tunnel.Listener, tr tunnel.Transport) (up, hub tunnel.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := heldCerts()
	d := &tunnel.Dialer{Transport: tr, TLSConfig: &tls.Config{RootCAs: c.pool, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{c.uplink}}}
	up, err := d.Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	if hub, err = l.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hub.Close() })
	return up, hub
}
