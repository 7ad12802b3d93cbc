package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// frpVersion is the frp release P2 compares against (bench/deps.sh builds
// it from the Go module proxy into .tools/bin).
const frpVersion = "v0.70.1"

// frpMode is one way of reaching the sink through frp.
type frpMode struct {
	name string
	what string
	// quic: frpc reaches frps over QUIC instead of TLS+yamux on TCP.
	quic bool
	// stcp: a second frpc (the visitor) listens on loopback and reaches
	// the proxy through frps over its own encrypted tunnel, so no
	// plaintext leg crosses the network: what tether's bastion does.
	stcp bool
}

var frpModes = []frpMode{
	{name: "tcp", what: "frp tcp proxy (TLS+yamux tunnel; plaintext public side)"},
	{name: "quic", what: "frp tcp proxy over QUIC (plaintext public side)", quic: true},
	{name: "stcp", what: "frp stcp with a visitor (both legs encrypted, like tether)", stcp: true},
}

// frpBinaries finds frps and frpc: $TETHER_FRP_DIR, the repository's
// .tools/bin next to -bin, then PATH. ok is false when either is missing.
func frpBinaries(bin string) (frps, frpc string, ok bool) {
	for _, dir := range []string{os.Getenv("TETHER_FRP_DIR"), filepath.Join(filepath.Dir(bin), ".tools", "bin")} {
		if dir == "" {
			continue
		}
		s, c := filepath.Join(dir, "frps"), filepath.Join(dir, "frpc")
		if fileExists(s) && fileExists(c) {
			return s, c, true
		}
	}
	s, err1 := exec.LookPath("frps")
	c, err2 := exec.LookPath("frpc")
	return s, c, err1 == nil && err2 == nil
}

// frpPath is a running frp set-up in front of the sink: connect to addr.
type frpPath struct {
	addr  string
	procs []*harness.Proc
	frps  int // the relay's pid, for its CPU
}

func (f *frpPath) Close() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		f.procs[i].Stop(2 * time.Second)
	}
}

// startFRP runs frps, frpc exposing the sink, and for stcp the visitor,
// with a shared token, and waits until a connection reaches the sink.
func startFRP(ctx context.Context, env *harness.Env, frps, frpc string, m frpMode, sinkPort int) (*frpPath, error) {
	ports := make([]int, 4)
	for i := range ports {
		p, err := harness.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	bind, quicBind, public, visitor := ports[0], ports[1], ports[2], ports[3]
	dir := env.Path("frp-" + m.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	const token, secret = "tether-bench-token", "tether-bench-secret"
	write := func(name, body string) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, []byte(body), 0o600)
	}
	serverCfg, err := write("frps.toml", fmt.Sprintf(`bindAddr = "127.0.0.1"
bindPort = %d
quicBindPort = %d
auth.token = %q
log.level = "warn"
`, bind, quicBind, token))
	if err != nil {
		return nil, err
	}
	client := func(body string) string {
		port, proto := bind, "tcp"
		if m.quic {
			port, proto = quicBind, "quic"
		}
		// frp encrypts its tunnel with TLS by default (transport.tls.enable);
		// said here so the reference cannot silently run in plaintext.
		return fmt.Sprintf(`serverAddr = "127.0.0.1"
serverPort = %d
auth.token = %q
transport.protocol = %q
transport.tls.enable = true
loginFailExit = false
log.level = "warn"
`, port, token, proto) + body
	}
	proxy := fmt.Sprintf(`
[[proxies]]
name = "sink"
type = "tcp"
localIP = "127.0.0.1"
localPort = %d
remotePort = %d
`, sinkPort, public)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(public))
	if m.stcp {
		proxy = fmt.Sprintf(`
[[proxies]]
name = "sink"
type = "stcp"
secretKey = %q
localIP = "127.0.0.1"
localPort = %d
`, secret, sinkPort)
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(visitor))
	}
	clientCfg, err := write("frpc.toml", client(proxy))
	if err != nil {
		return nil, err
	}
	f := &frpPath{addr: addr}
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	p, err := env.Start("frps-"+m.name, frps, "-c", serverCfg)
	if err != nil {
		return nil, err
	}
	f.procs, f.frps = append(f.procs, p), p.Cmd.Process.Pid
	// frpc retries a refused login only after a long backoff: start it once
	// frps listens.
	bindAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(bind))
	if err := harness.WaitFor(ctx, 30*time.Second, "frps to listen", func() bool {
		c, err := net.DialTimeout("tcp", bindAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		return nil, err
	}
	if p, err = env.Start("frpc-"+m.name, frpc, "-c", clientCfg); err != nil {
		return nil, err
	}
	f.procs = append(f.procs, p)
	if m.stcp {
		visitorCfg, err := write("visitor.toml", client(fmt.Sprintf(`
[[visitors]]
name = "sink-visitor"
type = "stcp"
serverName = "sink"
secretKey = %q
bindAddr = "127.0.0.1"
bindPort = %d
`, secret, visitor)))
		if err != nil {
			return nil, err
		}
		if p, err = env.Start("frpc-visitor-"+m.name, frpc, "-c", visitorCfg); err != nil {
			return nil, err
		}
		f.procs = append(f.procs, p)
	}
	// Ready when a short push reaches the sink and its answer comes back.
	err = harness.WaitFor(ctx, 30*time.Second, "frp "+m.name+" to relay to the sink", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		_, _, err = pushFor(c, 10*time.Millisecond)
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w; frps: %s; frpc: %s", err, f.procs[0].Tail(300), f.procs[1].Tail(300))
	}
	ok = true
	return f, nil
}
