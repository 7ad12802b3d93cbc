package service

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

type oneService struct{ sv store.Service }

func (o oneService) GetService(_ context.Context, name string) (store.Service, error) {
	if name != o.sv.Name {
		return store.Service{}, store.ErrNotFound
	}
	return o.sv, nil
}

// tcpPair is two ends of a loopback TCP connection: streams with a real
// half-close.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// echoStream is a stream whose far end echoes.
func echoStream(t *testing.T, wg *sync.WaitGroup) tunnel.Stream {
	near, far := tcpPair(t)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(far, far)
		_ = far.CloseWrite()
	}()
	return near
}

// TestRelayRoutes: at a region hub (suffix "region" under the root), a
// route from child berlin for a consumer below it reaches the target down
// in munich or up the uplink; a route from a child without consumers, and
// one that would turn back into its own child, are refused without
// dialing anything.
func TestRelayRoutes(t *testing.T) {
	for _, tc := range []struct {
		name, target, child string
		want                string // "down", "up", or a refusal's text
	}{
		{"down to a sibling site", "n3.munich.region", "berlin", "down"},
		{"up to the parent", "n3.paris.other", "berlin", "up"},
		{"no consumer below the child", "n3.munich.region", "munich", "no consumer below site munich"},
		{"back into the child", "n7.berlin.region", "berlin", "below site berlin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			defer wg.Wait()
			sv := svc(tc.target, 5432, bind("m2.berlin.region", 15432))
			var went string
			r, err := New(Config{Store: oneService{sv}, HubID: region,
				Suffixes: func(o string) (string, bool) { return "region", o == root },
				DialDown: func(
					_ context.Context, target string, port uint16, req *siteproto.RouteRequest,
				) (tunnel.Stream, string, error) {
					if target != strings.TrimSuffix(tc.target, ".region") || port != 5432 || req.ServiceName != "db" {
						return nil, "", errors.New("dialed the wrong thing")
					}
					went = "down"
					return echoStream(t, &wg), "site munich", nil
				},
				OpenUp: func(_ context.Context, req *siteproto.RouteRequest) (tunnel.Stream, error) {
					if req.Target != tc.target || req.Origin != root {
						return nil, errors.New("sent up the wrong request")
					}
					went = "up"
					return echoStream(t, &wg), nil
				},
				Audit: func(store.AuditEvent) {}, Metrics: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			in, out := tcpPair(t)
			req := &siteproto.RouteRequest{
				Target:      tc.target,
				Service:     2,
				Port:        5432,
				Purpose:     siteproto.PurposeService,
				Origin:      root,
				ServiceName: "db",
			}
			done := make(chan struct{})
			go func() { defer close(done); r.ServeRoute(context.Background(), out, tc.child, req, "test") }()
			rep, err := tunnel.ReadReply(in)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "down" && tc.want != "up" {
				<-done
				if rep.OK || !strings.Contains(rep.Reason, tc.want) || went != "" {
					t.Fatalf("reply %+v (went %q), want a refusal saying %q", rep, went, tc.want)
				}
				return
			}
			if !rep.OK || went != tc.want {
				t.Fatalf("reply %+v, went %q; want ok, %s", rep, went, tc.want)
			}
			_, _ = in.Write([]byte("ping"))
			_ = in.CloseWrite()
			b, err := io.ReadAll(in)
			<-done
			if err != nil || string(b) != "ping" {
				t.Fatalf("echo %q %v", b, err)
			}
		})
	}
}
