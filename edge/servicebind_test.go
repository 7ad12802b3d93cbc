package edge

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// fakeHub answers service connect streams: it accepts the ones for
// services in allow (echoing their bytes back) and refuses the rest. Its
// streams are TCP connections, which behave as tunnel streams do
// (CloseWrite is a half-close).
type fakeHub struct {
	t     *testing.T
	ln    net.Listener
	allow map[string]bool
	wg    sync.WaitGroup

	mu   sync.Mutex
	seen []string // services asked for, in order
}

func newFakeHub(t *testing.T, allow ...string) *fakeHub {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHub{t: t, ln: ln, allow: map[string]bool{}}
	for _, a := range allow {
		h.allow[a] = true
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				h.serve(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); h.wg.Wait() })
	return h
}

func (h *fakeHub) serve(c *net.TCPConn) {
	defer c.Close()
	hd, err := tunnel.ReadHeader(c)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return // the binder gave up (its session ended) before sending
	}
	if err != nil || hd.Service != tunnel.ServiceConnect {
		h.t.Errorf("fake hub: header %v %v", hd, err)
		return
	}
	req, err := siteproto.ReadServiceConnect(c)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return
	}
	if err != nil {
		h.t.Errorf("fake hub: request: %v", err)
		return
	}
	h.mu.Lock()
	h.seen = append(h.seen, req.Name)
	h.mu.Unlock()
	if !h.allow[req.Name] {
		_ = tunnel.WriteReply(c, tunnel.Reply{Reason: "not a consumer of " + req.Name})
		return
	}
	_ = tunnel.WriteReply(c, tunnel.Reply{OK: true})
	_, _ = io.Copy(c, c)
	_ = c.CloseWrite()
}

func (h *fakeHub) open(ctx context.Context) (tunnel.Stream, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", h.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func dialOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestServiceBinderLifecycle: listeners open for the bindings pushed,
// close when a binding goes or moves, refuse non-loopback addresses, and
// all close when the session ends; Wait returns once everything has.
func TestServiceBinderLifecycle(t *testing.T) {
	hub := newFakeHub(t, "db")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newServiceBinder(ctx, hub.open, nil, nil, slog.New(slog.DiscardHandler))
	a1, a2, a3 := freePort(t), freePort(t), freePort(t)

	b.apply([]siteproto.ServiceBinding{{Name: "db", Listen: a1}, {Name: "cache", Listen: a2},
		{Name: "evil", Listen: "0.0.0.0:" + strings.Split(a3, ":")[1]}})
	got := b.Listening()
	if got["db"] != a1 || got["cache"] != a2 || len(got) != 2 {
		t.Fatalf("listening %v after the first bindings (a non-loopback one must be refused)", got)
	}
	if !dialOK(a1) || !dialOK(a2) {
		t.Fatal("a bound listener does not accept")
	}

	// cache goes, db moves to a3.
	b.apply([]siteproto.ServiceBinding{{Name: "db", Listen: a3}})
	if got := b.Listening(); got["db"] != a3 || len(got) != 1 {
		t.Fatalf("listening %v, want db on %s only", got, a3)
	}
	if dialOK(a1) || dialOK(a2) {
		t.Fatal("a removed binding's listener still accepts")
	}

	cancel()
	b.Wait()
	if got := b.Listening(); len(got) != 0 {
		t.Fatalf("listening %v after the session ended", got)
	}
	if dialOK(a3) {
		t.Fatal("a listener outlived its session")
	}
	// Bindings pushed after the end open nothing.
	b.apply([]siteproto.ServiceBinding{{Name: "db", Listen: a3}})
	if got := b.Listening(); len(got) != 0 {
		t.Fatalf("listening %v after the session ended", got)
	}
}

// TestServiceBinderCarries: a connection to a listener is carried over a
// service connect stream intact both ways, half-close included; one the
// hub refuses is closed without a byte.
func TestServiceBinderCarries(t *testing.T) {
	hub := newFakeHub(t, "db")
	ctx, cancel := context.WithCancel(context.Background())
	b := newServiceBinder(ctx, hub.open, nil, nil, slog.New(slog.DiscardHandler))
	defer func() { cancel(); b.Wait() }()
	dbAddr, otherAddr := freePort(t), freePort(t)
	b.apply([]siteproto.ServiceBinding{{Name: "db", Listen: dbAddr}, {Name: "other", Listen: otherAddr}})

	payload := make([]byte, 3<<20)
	_, _ = rand.Read(payload)
	c, err := net.Dial("tcp", dbAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	echo, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(echo, payload) {
		t.Fatalf("echo of %d bytes differs (got %d bytes)", len(payload), len(echo))
	}

	o, err := net.Dial("tcp", otherAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	_ = o.SetDeadline(time.Now().Add(30 * time.Second))
	if n, err := o.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("a refused connection read %d bytes, err %v; want it closed", n, err)
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if strings.Join(hub.seen, ",") != "db,other" {
		t.Fatalf("hub saw requests for %v", hub.seen)
	}
}
