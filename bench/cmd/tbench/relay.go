package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/tunnel"
)

// tunnelRelay is the hub-to-agent data path without the SSH hop, in one
// process: a TCP front (the hub side) opens a tunnel stream per connection
// and pipes it with tunnel.Pipe; the agent side accepts the stream, dials
// the target and pipes again. It uses the tunnel package exactly as the hub
// and agent do, with throwaway certificates.
type tunnelRelay struct {
	front  net.Listener
	ln     *tunnel.Listener
	hub    tunnel.Session
	agent  tunnel.Session
	target string
	wg     sync.WaitGroup
}

func newTunnelRelay(ctx context.Context, tr tunnel.Transport, target string) (*tunnelRelay, error) {
	serverTLS, clientTLS, err := throwawayPKI()
	if err != nil {
		return nil, err
	}
	ln, err := tunnel.Listen(ctx, "127.0.0.1:0", tunnel.ListenConfig{TunnelTLS: serverTLS})
	if err != nil {
		return nil, err
	}
	r := &tunnelRelay{ln: ln, target: target}
	d := &tunnel.Dialer{TLSConfig: clientTLS, Transport: tr}
	if r.agent, err = d.Dial(ctx, ln.Addr().String()); err != nil {
		ln.Close()
		return nil, err
	}
	if r.hub, err = ln.Accept(ctx); err != nil {
		r.agent.Close()
		ln.Close()
		return nil, err
	}
	if r.front, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		r.Close()
		return nil, err
	}
	r.wg.Go(r.serveFront)
	r.wg.Go(r.serveAgent)
	return r, nil
}

func (r *tunnelRelay) addr() string { return r.front.Addr().String() }

func (r *tunnelRelay) serveFront() {
	for {
		c, err := r.front.Accept()
		if err != nil {
			return
		}
		r.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			st, err := r.hub.OpenStream(ctx)
			cancel()
			if err != nil {
				c.Close()
				return
			}
			_, _ = st.Write([]byte{1}) // QUIC announces a stream with its first byte
			tunnel.Pipe(c, st, nil)
		})
	}
}

func (r *tunnelRelay) serveAgent() {
	for {
		st, err := r.agent.AcceptStream(context.Background())
		if err != nil {
			return
		}
		r.wg.Go(func() {
			var one [1]byte
			if _, err := st.Read(one[:]); err != nil {
				st.Close()
				return
			}
			c, err := net.Dial("tcp", r.target)
			if err != nil {
				st.Close()
				return
			}
			tunnel.Pipe(st, c, nil)
		})
	}
}

func (r *tunnelRelay) Close() {
	if r.front != nil {
		r.front.Close()
	}
	r.agent.Close()
	r.hub.Close()
	r.ln.Close()
	r.wg.Wait()
}

// throwawayPKI makes a CA, a hub certificate for "hub" and a node client
// certificate, all P-256 as the hub's own CA issues.
func throwawayPKI() (server, client *tls.Config, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage, dns []string) (tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial),
			Subject:   pkix.Name{CommonName: fmt.Sprint("bench-", serial)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, err
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
	}
	hubCert, err := issue(2, x509.ExtKeyUsageServerAuth, []string{"hub"})
	if err != nil {
		return nil, nil, err
	}
	nodeCert, err := issue(3, x509.ExtKeyUsageClientAuth, nil)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	server = &tls.Config{Certificates: []tls.Certificate{hubCert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert}
	client = &tls.Config{Certificates: []tls.Certificate{nodeCert}, RootCAs: pool, ServerName: "hub"}
	return server, client, nil
}

// procCPU is a process's CPU time (user+system) plus that of its children
// that have exited and been waited for. For a forking server such as sshd
// (listener, then a process or two per connection) that is the CPU every
// connection cost once its processes are gone; for the hub, one process,
// it is the process's own.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read CPU of pid %d: %w", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("read CPU of pid %d: malformed /proc stat", pid)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 15 {
		return 0, fmt.Errorf("read CPU of pid %d: short /proc stat", pid)
	}
	var ticks int64
	for _, k := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read CPU of pid %d: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ
}

// waitChildrenGone waits (bounded) until pid has no child processes, so
// that the CPU of a connection's processes is in its counters.
func waitChildrenGone(ctx context.Context, pid int) error {
	return harness.WaitFor(ctx, 10*time.Second, fmt.Sprintf("the connection processes of pid %d to exit", pid),
		func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
			return err == nil && len(strings.TrimSpace(string(b))) == 0
		})
}

// cpuPerGiB is CPU seconds per GiB moved.
func cpuPerGiB(cpu time.Duration, bytes int64) float64 {
	if bytes <= 0 {
		return 0
	}
	return cpu.Seconds() / (float64(bytes) / (1 << 30))
}

// relayCPU accumulates, per path, the relay process's CPU and the bytes
// it moved.
type relayCPU map[string]*cpuTally

type cpuTally struct {
	cpu   time.Duration
	bytes int64
}

func (r relayCPU) add(path string, cpu time.Duration, bytes int64) {
	e := r[path]
	if e == nil {
		e = &cpuTally{}
		r[path] = e
	}
	e.cpu += cpu
	e.bytes += bytes
}

func (r relayCPU) perGiB(path string) float64 {
	if e := r[path]; e != nil {
		return cpuPerGiB(e.cpu, e.bytes)
	}
	return 0
}

// cpuRow is the row comparing a relay's CPU per GiB with the OpenSSH
// bastion's sshd (lower is better).
func cpuRow(id, what string, v, ref float64) harness.Row {
	row := harness.Row{ID: id, What: what, Value: fmt.Sprintf("%.2f CPU-s/GiB", v),
		Ref: fmt.Sprintf("%.2f CPU-s/GiB OpenSSH bastion sshd (all its processes)", ref), Target: "≤ 1.0× sshd"}
	if ref > 0 {
		row.Ratio = harness.Ratio(v, ref)
		row.Met = harness.YesNo(v <= ref)
	}
	return row
}

// profileHub, when TBENCH_PROFILE_DIR is set and the hub serves
// net/http/pprof (TBENCH_HUB=bin/hubprof, which writes the address it
// bound to DATA_DIR/hubprof.addr; else TBENCH_HUB_PPROF names it, default
// 127.0.0.1:6060), records a CPU profile of hub for d into
// TBENCH_PROFILE_DIR/NAME.pb.gz. The returned wait blocks until the
// profile is written; it does nothing when profiling is off.
func profileHub(ctx context.Context, hub *harness.Hub, name string, d time.Duration) (wait func()) {
	dir := os.Getenv("TBENCH_PROFILE_DIR")
	if dir == "" || os.Getenv("TBENCH_HUB") == "" {
		return func() {}
	}
	addr := envOr("TBENCH_HUB_PPROF", "127.0.0.1:6060")
	if b, err := os.ReadFile(filepath.Join(hub.DataDir, "hubprof.addr")); err == nil {
		addr = strings.TrimSpace(string(b))
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), nil)
		if err != nil {
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Fprintf(os.Stderr, "tbench: profile %s: %v\n", name, err)
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name+".pb.gz"), b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "tbench: profile %s: %v\n", name, err)
		}
	}()
	return func() { <-done }
}
