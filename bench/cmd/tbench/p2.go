package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/tunnel"
)

// runP2 pushes one TCP stream for a few seconds into a Go sink through:
// direct loopback TCP and a socat relay (the references), an OpenSSH
// bastion's direct-tcpip, tether's bastion to a node's tcp service (the
// product path: operator SSH to the hub, tunnel to the agent, TCP to the
// sink), and the tunnel alone (hub and agent relays in one process, no SSH).
func runP2(ctx context.Context, b *bench) error {
	s, err := b.jump(ctx)
	if err != nil {
		return err
	}
	sk := s.sink
	sinkAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sk.port()))
	d := time.Duration(b.sz.p2Secs * float64(time.Second))
	const runs = 2
	measure := func(dial func() (net.Conn, error)) (float64, error) {
		best := 0.0
		for range runs {
			c, err := dial()
			if err != nil {
				return 0, err
			}
			v, err := pushFor(c, d)
			if err != nil {
				return 0, err
			}
			best = max(best, v)
		}
		return best, nil
	}

	direct, err := measure(func() (net.Conn, error) { return net.Dial("tcp", sinkAddr) })
	if err != nil {
		return fmt.Errorf("P2 direct: %w", err)
	}
	b.report.Add(harness.Row{ID: "P2", What: "single TCP stream, direct loopback (reference)", Value: mbs(direct), Ref: mbs(direct), Ratio: "1.00×"})

	socat := 0.0
	if _, err := exec.LookPath("socat"); err != nil {
		b.report.Note("P2: socat is not installed (apt-get install socat; `make bench` does it): no socat reference")
	} else {
		port, err := harness.FreePort()
		if err != nil {
			return err
		}
		p, err := s.env.Start("socat", "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", port), "TCP:"+sinkAddr)
		if err != nil {
			return err
		}
		defer p.Stop(time.Second)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := harness.WaitFor(ctx, 5*time.Second, "socat to listen", func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		}); err != nil {
			return err
		}
		if socat, err = measure(func() (net.Conn, error) { return net.Dial("tcp", addr) }); err != nil {
			return fmt.Errorf("P2 socat: %w", err)
		}
		b.report.Add(harness.Row{ID: "P2", What: "single TCP stream, socat relay (reference; socat defaults)", Value: mbs(socat), Ref: mbs(direct), Ratio: harness.Ratio(socat, direct)})
	}
	ref, refName := socat, "socat"
	if ref == 0 {
		ref, refName = direct, "direct"
	}

	// Through SSH bastions: a Go SSH client (aes128-gcm) opens direct-tcpip.
	viaSSH := func(path string) (float64, error) {
		c, err := s.goSSH(ctx, path)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		target := sinkAddr
		if path != "openssh" {
			target = net.JoinHostPort("n-"+path, strconv.Itoa(sk.port()))
		}
		return measure(func() (net.Conn, error) { return c.Dial("tcp", target) })
	}
	osshV, err := viaSSH("openssh")
	if err != nil {
		return fmt.Errorf("P2 OpenSSH bastion: %w", err)
	}
	b.report.Add(harness.Row{ID: "P2", What: "single TCP stream, SSH direct-tcpip via OpenSSH bastion (reference)", Value: mbs(osshV), Ref: mbs(ref) + " " + refName, Ratio: harness.Ratio(osshV, ref)})
	for _, path := range transports {
		v, err := viaSSH(path)
		if err != nil {
			return fmt.Errorf("P2 tether %s: %w", path, err)
		}
		b.report.Add(p2Row("SSH direct-tcpip via tether bastion to the node's tcp service, "+pathName(path), path, v, ref, refName, osshV))
	}
	for _, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		r, err := newTunnelRelay(ctx, tr, sinkAddr)
		if err != nil {
			return fmt.Errorf("P2 tunnel relay %v: %w", tr, err)
		}
		v, err := measure(func() (net.Conn, error) { return net.Dial("tcp", r.addr()) })
		r.Close()
		if err != nil {
			return fmt.Errorf("P2 tunnel relay %v: %w", tr, err)
		}
		b.report.Add(p2Row("tunnel alone (hub and agent relays in one process, no SSH), "+pathName(tr.String()), tr.String(), v, ref, refName, 0))
	}
	return nil
}

func p2Row(what, transport string, v, ref float64, refName string, ossh float64) harness.Row {
	row := harness.Row{ID: "P2", What: "single TCP stream, " + what, Value: mbs(v), Ref: mbs(ref) + " " + refName, Ratio: harness.Ratio(v, ref)}
	if ossh > 0 {
		row.Comment = fmt.Sprintf("%s of the OpenSSH bastion", harness.Ratio(v, ossh))
	}
	if transport == "quic" {
		row.Target, row.Met = "≥ 1 Gbit/s (125 MB/s)", harness.YesNo(v >= 125)
	} else {
		row.Target, row.Met = "≥ 0.60× socat", harness.YesNo(v >= 0.6*ref)
	}
	return row
}

func mbs(v float64) string {
	return fmt.Sprintf("%.0f MB/s (%.2f Gbit/s)", v, v*8/1000)
}

// goSSH connects a Go SSH client (aes128-gcm) to the hub's bastion as the
// operator, or to the OpenSSH bastion as the local login.
func (s *jumpSetup) goSSH(ctx context.Context, path string) (*gossh.Client, error) {
	keyPath, _ := s.env.OperatorKey(ctx)
	pem, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	signer, err := gossh.ParsePrivateKey(pem)
	if err != nil {
		return nil, err
	}
	user, addr := "bench", s.hub.SSH
	if path == "openssh" {
		user, addr = harness.Login(), s.bastion.Addr
	}
	cfg := &gossh.ClientConfig{User: user, Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), // throwaway loopback bench
		Timeout:         10 * time.Second,
		Config:          gossh.Config{Ciphers: []string{"aes128-gcm@openssh.com"}}}
	c, err := gossh.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", pathName(path), err)
	}
	return c, nil
}
