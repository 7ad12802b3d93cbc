package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// echoServer is a TCP echo server on loopback (the service a node
// exposes); it stops at the test's end.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().(*net.TCPAddr).Port
}

// echoThrough sends n random bytes to addr, half-closes, reads the echo,
// and returns the time it took; the echo must be intact (SHA-256).
func echoThrough(t *testing.T, addr string, n int) (time.Duration, error) {
	t.Helper()
	payload := make([]byte, n)
	_, _ = rand.Read(payload)
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	h := sha256.New()
	got, err := io.Copy(h, c)
	if werr := <-errc; werr != nil {
		return 0, fmt.Errorf("write: %w", werr)
	}
	if err != nil {
		return 0, fmt.Errorf("read the echo: %w", err)
	}
	want := sha256.Sum256(payload)
	if got != int64(n) || !bytes.Equal(h.Sum(nil), want[:]) {
		return 0, fmt.Errorf("echo of %d bytes came back as %d bytes with another hash", n, got)
	}
	return time.Since(start), nil
}

type serviceJSON struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Port     int    `json:"port"`
	Local    bool   `json:"local"`
	Bindings []struct {
		Consumer  string `json:"consumer"`
		LocalPort int    `json:"local_port"`
	} `json:"bindings"`
}

// TestServiceTunnelSingleHub: a node's allow-listed port exposed under a
// name is reached from another node's loopback listener through the hub,
// bytes intact both ways (a few MiB, hashed); the hub counts the bytes per
// service; a consumer's listener closes when it is disconnected; a port
// the target does not allow is refused by its agent. Throughput through
// the tunnel is measured against the same copy direct on loopback.
func TestServiceTunnelSingleHub(t *testing.T) {
	h := startHub(t)
	echo := echoServer(t)
	startAgent(t, h.token(), "a", "--allow-port", strconv.Itoa(echo), "--transport", "quic")
	startAgent(t, h.token(), "b", "--transport", "tcp")
	h.waitOnline("a", "quic")
	h.waitOnline("b", "tcp")

	h.cli("service", "expose", "a:"+strconv.Itoa(echo), "--name", "echo")
	h.cli("service", "expose", "a:1", "--name", "closed") // not in a's allow-list
	ports := testenv.FreePorts(t, 2)
	local, closedLocal := ports[0], ports[1]
	h.cli("service", "connect", "echo", "--from", "b", "--local-port", strconv.Itoa(local))
	h.cli("service", "connect", "closed", "--from", "b", "--local-port", strconv.Itoa(closedLocal))
	addr := "127.0.0.1:" + strconv.Itoa(local)

	var list []serviceJSON
	if err := json.Unmarshal([]byte(h.cli("service", "list", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[1].Name != "echo" || list[1].Target != "a" || !list[1].Local || len(list[1].Bindings) != 1 ||
		list[1].Bindings[0].Consumer != "b" || list[1].Bindings[0].LocalPort != local {
		t.Fatalf("service list: %+v", list)
	}

	// The listener opens once the hub's push reaches b's agent.
	testenv.WaitFor(t, "b's listener for echo to carry bytes", 30*time.Second, func() bool {
		_, err := echoThrough(t, addr, 1024)
		return err == nil
	})
	const size = 8 << 20
	through, err := echoThrough(t, addr, size)
	if err != nil {
		t.Fatalf("through the tunnel: %v", err)
	}
	direct, err := echoThrough(t, "127.0.0.1:"+strconv.Itoa(echo), size)
	if err != nil {
		t.Fatalf("direct: %v", err)
	}
	mbps := func(d time.Duration) float64 { return 2 * size / d.Seconds() / 1e6 } // both directions
	t.Logf("throughput (8 MiB echoed, both directions): tunnel %.0f MB/s (%s), direct loopback %.0f MB/s (%s)",
		mbps(through), through.Round(time.Millisecond), mbps(direct), direct.Round(time.Millisecond))

	testenv.WaitFor(t, "the hub's byte counter for echo", 10*time.Second, func() bool {
		v, ok := metricValue(h.metrics(t), `tether_service_bytes_total{direction="to_target",service="echo"}`)
		return ok && v >= size
	})

	// The agent of a refuses a port it does not allow: the consumer's
	// connection closes without a byte.
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(closedLocal), 5*time.Second)
	if err != nil {
		t.Fatalf("the closed service's listener: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("a refused port gave %d bytes, %v", n, err)
	}
	c.Close()

	h.cli("service", "disconnect", "echo", "--from", "b")
	testenv.WaitFor(t, "b's listener to close", 30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	h.cli("service", "delete", "echo")
	var events []struct {
		Kind, Result, Node string
		BytesToNode        int64 `json:"bytes_to_node"`
	}
	if err := json.Unmarshal([]byte(h.cli("audit", "-o", "json")), &events); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range events {
		seen[e.Kind+"/"+e.Result] = true
		if e.Kind == "service_connect" && e.Result == "ok" && e.BytesToNode == size {
			seen["carried"] = true
		}
	}
	for _, want := range []string{"service_expose/ok", "service_connect_add/ok", "service_connect/ok",
		"service_connect/refused",
		"service_connect_remove/ok", "service_delete/ok", "carried"} {
		if !seen[want] {
			t.Errorf("no %s audit event", want)
		}
	}
}

// TestServiceTunnelTree: root → region → berlin, munich. A service created
// at the root from n1.munich to n1.berlin reaches every site (sent down
// as desired state); a few MiB go through n1.munich's loopback listener
// intact (SHA-256); the bytes turn at the region, the nearest common hub:
// its counter shows them, the root's shows none; every hop audits the
// stream (the consumer's hub, the region, berlin). Throughput through the
// three hubs is measured against the same copy direct on loopback.
func TestServiceTunnelTree(t *testing.T) {
	ctx := t.Context()
	echo := echoServer(t)
	tr := testenv.StartTree(t, testenv.TreeConfig{Bin: binDir, AgentsPerSite: 1, NoLinks: true,
		HubArgs:   []string{"--site-status-interval", "1s"},
		AgentArgs: []string{"--allow-port", strconv.Itoa(echo)}})
	if err := tr.WaitTree(ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	root, region, berlin, munich := tr.Root, tr.Region, tr.Sites["berlin"], tr.Sites["munich"]
	treeCLI(t, root, "service", "expose", fmt.Sprintf("n1.berlin.region:%d", echo), "--name", "db")
	local := testenv.FreePort(t)
	treeCLI(t, root, "service", "connect", "db", "--from", "n1.munich.region", "--local-port", strconv.Itoa(local))

	// Every hub below holds the service under the root's names.
	for _, h := range []*testenv.TreeHub{region, berlin, munich} {
		testenv.WaitFor(t, "hub "+h.Name+" to hold service db", 60*time.Second, func() bool {
			var list []serviceJSON
			out, err := h.Tether(ctx, "service", "list", "-o", "json")
			return err == nil && json.Unmarshal([]byte(out), &list) == nil && len(list) == 1 &&
				list[0].Name == "db" && list[0].Target == "n1.berlin.region" && !list[0].Local
		})
	}
	addr := "127.0.0.1:" + strconv.Itoa(local)
	testenv.WaitFor(t, "n1.munich's listener for db to carry bytes", 60*time.Second, func() bool {
		_, err := echoThrough(t, addr, 1024)
		return err == nil
	})
	rootBefore, regionBefore := metricsOf(t, root), metricsOf(t, region)
	const size = 8 << 20
	through, err := echoThrough(t, addr, size)
	if err != nil {
		t.Fatalf("through the tree: %v", err)
	}
	direct, err := echoThrough(t, "127.0.0.1:"+strconv.Itoa(echo), size)
	if err != nil {
		t.Fatalf("direct: %v", err)
	}
	mbps := func(d time.Duration) float64 { return 2 * size / d.Seconds() / 1e6 }
	t.Logf("throughput munich → region → berlin (8 MiB echoed, both directions): tunnel %.0f MB/s (%s), "+
		"direct loopback %.0f MB/s (%s)",
		mbps(through), through.Round(time.Millisecond), mbps(direct), direct.Round(time.Millisecond))

	testenv.WaitFor(t, "the region to count the service's bytes", 20*time.Second, func() bool {
		return metricsOf(t, region)["tether_service_bytes_total"]-regionBefore["tether_service_bytes_total"] >= 2*size
	})
	if d := metricsOf(t, root)["tether_service_bytes_total"] - rootBefore["tether_service_bytes_total"]; d != 0 {
		t.Errorf("the root carried %.0f service bytes between two sites of one region", d)
	}
	for _, hop := range []struct {
		h    *testenv.TreeHub
		kind string
	}{{munich, "service_connect"}, {region, "service_route"}, {berlin, "service_route"}} {
		testenv.WaitFor(t, hop.h.Name+"'s audit of the stream", 20*time.Second, func() bool {
			var events []struct {
				Kind, Result string
				BytesToNode  int64 `json:"bytes_to_node"`
			}
			out, err := hop.h.Tether(ctx, "audit", "-o", "json")
			if err != nil || json.Unmarshal([]byte(out), &events) != nil {
				return false
			}
			for _, e := range events {
				if e.Kind == hop.kind && e.Result == "ok" && e.BytesToNode == size {
					return true
				}
			}
			return false
		})
	}
	// A site cannot change what the root created.
	if out, err := munich.Tether(
		ctx, "service", "connect", "db", "--from", "n1", "--local-port", strconv.Itoa(testenv.FreePort(t)),
	); err == nil {
		t.Fatalf("a site changed a service of the root: %s", out)
	}
}
