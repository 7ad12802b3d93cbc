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
// direct loopback TCP, a socat relay and frp (tcp, tcp over QUIC, stcp with
// a visitor) (the references), an OpenSSH bastion's direct-tcpip, tether's bastion to a node's tcp service (the
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
	// measure returns the best MB/s of runs pushes and the bytes they moved.
	measure := func(dial func() (net.Conn, error)) (float64, int64, error) {
		best, total := 0.0, int64(0)
		for range runs {
			c, err := dial()
			if err != nil {
				return 0, 0, err
			}
			v, n, err := pushFor(c, d)
			if err != nil {
				return 0, 0, err
			}
			best, total = max(best, v), total+n
		}
		return best, total, nil
	}

	direct, _, err := measure(func() (net.Conn, error) { return net.Dial("tcp", sinkAddr) })
	if err != nil {
		return fmt.Errorf("P2 direct: %w", err)
	}
	b.report.Add(harness.Row{ID: "P2", What: "single TCP stream, direct loopback (reference)", Value: mbs(direct),
		Ref: mbs(direct), Ratio: "1.00×"})

	socat := 0.0
	if _, err := exec.LookPath("socat"); err != nil {
		b.report.Note("P2: socat is not installed (apt-get install socat; `make bench` does it): no socat reference")
	} else {
		port, err := harness.FreePort()
		if err != nil {
			return err
		}
		p, err := s.env.Start("socat", "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", port),
			"TCP:"+sinkAddr)
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
		if socat, _, err = measure(func() (net.Conn, error) { return net.Dial("tcp", addr) }); err != nil {
			return fmt.Errorf("P2 socat: %w", err)
		}
		b.report.Add(harness.Row{ID: "P2", What: "single TCP stream, socat relay (reference; socat defaults)",
			Value: mbs(socat), Ref: mbs(direct), Ratio: harness.Ratio(socat, direct)})
	}
	ref, refName := socat, "socat"
	if ref == 0 {
		ref, refName = direct, "direct"
	}

	// frp, the usual open-source reverse-tunnel, in the same run: its
	// figures are what the tether rows are held to.
	frp := map[string]float64{}
	frpCPU := relayCPU{}
	if frps, frpc, ok := frpBinaries(b.bin); b.sz.name == "tiny" {
		// make test runs tiny on a clean clone, where frp is not built
		// (a minute of compiling); bench/deps.sh builds it for the others.
		b.report.Note("P2: no frp references at size tiny (`make bench` and `make bench-quick` build frp %s and "+
			"compare)", frpVersion)
	} else if !ok {
		b.report.Note("P2: frp %s is not installed (bench/deps.sh builds frps and frpc into .tools/bin, "+
			"about a minute): no frp references; "+
			"issue 18 measured frp tcp 476-547, frp QUIC 281-363, frp stcp 370-399 MB/s here", frpVersion)
	} else {
		for _, m := range frpModes {
			f, err := startFRP(ctx, s.env, frps, frpc, m, sk.port())
			if err != nil {
				return fmt.Errorf("P2 frp %s: %w", m.name, err)
			}
			cpu0, err := procCPU(f.frps)
			if err != nil {
				f.Close()
				return err
			}
			v, n, err := measure(func() (net.Conn, error) { return net.Dial("tcp", f.addr) })
			cpu1, cerr := procCPU(f.frps)
			f.Close()
			if err != nil {
				return fmt.Errorf("P2 frp %s: %w", m.name, err)
			}
			if cerr == nil {
				frpCPU.add(m.name, cpu1-cpu0, n)
			}
			frp[m.name] = v
			b.report.Add(harness.Row{ID: "P2",
				What: "single TCP stream, " + m.what + " (reference, frp " + frpVersion + ")", Value: mbs(v),
				Ref: mbs(ref) + " " + refName, Ratio: harness.Ratio(v, ref),
				Comment: fmt.Sprintf("frps %.2f CPU-s/GiB", frpCPU.perGiB(m.name))})
		}
	}

	// Through SSH bastions: a Go SSH client (aes128-gcm) opens direct-tcpip
	// (what `ssh -L` and `ssh -W` do). The OpenSSH bastion's CPU is measured
	// over the whole connection: its listener and the processes it forks for
	// the connection, once they exited.
	relay := s.relayPID("openssh")
	cpu0, err := procCPU(relay)
	if err != nil {
		return err
	}
	c, err := s.goSSH(ctx, "openssh")
	if err != nil {
		return fmt.Errorf("P2 OpenSSH bastion: %w", err)
	}
	osshV, osshN, err := measure(func() (net.Conn, error) { return c.Dial("tcp", sinkAddr) })
	c.Close()
	if err == nil {
		err = waitChildrenGone(ctx, relay)
	}
	if err != nil {
		return fmt.Errorf("P2 OpenSSH bastion: %w", err)
	}
	cpu1, err := procCPU(relay)
	if err != nil {
		return err
	}
	cpu := relayCPU{}
	cpu.add("openssh", cpu1-cpu0, osshN)
	b.report.Add(harness.Row{ID: "P2", What: "single TCP stream, SSH direct-tcpip via OpenSSH bastion (reference)",
		Value: mbs(osshV), Ref: mbs(ref) + " " + refName, Ratio: harness.Ratio(osshV, ref),
		Comment: fmt.Sprintf("sshd %.2f CPU-s/GiB", cpu.perGiB("openssh"))})

	// Through the tether bastion, each transport through the default hub
	// (resumable streams) and through the hub with --resume-window 0 (plain
	// streams): one push per path a round, interleaved, the hub's and the
	// agent's CPU measured around each (channel open included). The default
	// hub's own rows take its pushes of the first `runs` rounds, as before;
	// the comparison may add rounds.
	if err := s.startPlain(ctx, b); err != nil {
		return fmt.Errorf("P2: %w", err)
	}
	clients := map[string]*gossh.Client{}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for _, t := range transports {
		for _, path := range []string{t, plainPath(t)} {
			if clients[path], err = s.goSSH(ctx, path); err != nil {
				return fmt.Errorf("P2 tether %s: %w", pathName(path), err)
			}
		}
	}
	cmp := newResumeCmp("P2")
	best, agentCPU := map[string]float64{}, relayCPU{}
	for r := range max(runs, resumeRounds(b.sz)) {
		for _, t := range transports {
			for _, path := range resumeOrder(t, r) {
				target := net.JoinHostPort("n-"+t, strconv.Itoa(sk.port()))
				v, n, hc, ac, err := s.pushVia(ctx, clients[path], path, target, d, r == 0)
				if err != nil {
					return fmt.Errorf("P2 tether %s: %w", pathName(path), err)
				}
				cmp.record(path, v, hc, ac, n)
				if r < runs && path == t {
					best[t] = max(best[t], v)
					cpu.add(t, hc, n)
					agentCPU.add(t, ac, n)
				}
			}
		}
		cmp.endRound()
	}
	for _, path := range transports {
		v := best[path]
		b.report.Add(p2Row("SSH direct-tcpip via tether bastion to the node's tcp service, "+pathName(path), path, v,
			ref, refName, osshV))
		for _, fr := range p2FRPTargets(path) {
			if fv, ok := frp[fr.mode]; ok {
				b.report.Add(harness.Row{ID: "P2",
					What:  fmt.Sprintf("ssh -L via tether bastion, %s, vs %s", pathName(path), fr.what),
					Value: mbs(v), Ref: mbs(fv) + " frp " + fr.mode, Ratio: harness.Ratio(v, fv),
					Target: fmt.Sprintf("≥ %.1f× frp %s", fr.factor, fr.mode), Met: harness.YesNo(v >= fr.factor*fv)})
			}
		}
		row := cpuRow("P2", fmt.Sprintf("ssh -L relay CPU per GiB: the tether hub, %s agent", pathName(path)),
			cpu.perGiB(path), cpu.perGiB("openssh"))
		row.Comment = fmt.Sprintf("agent %.2f CPU-s/GiB", agentCPU.perGiB(path))
		b.report.Add(row)
	}
	for _, row := range cmp.rows("single TCP stream, ssh -L via tether bastion") {
		b.report.Add(row)
	}
	for _, row := range cmp.cpuRows("ssh -L (all runs)") {
		b.report.Add(row)
	}
	for _, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		r, err := newTunnelRelay(ctx, tr, sinkAddr)
		if err != nil {
			return fmt.Errorf("P2 tunnel relay %v: %w", tr, err)
		}
		v, _, err := measure(func() (net.Conn, error) { return net.Dial("tcp", r.addr()) })
		r.Close()
		if err != nil {
			return fmt.Errorf("P2 tunnel relay %v: %w", tr, err)
		}
		b.report.Add(p2Row("tunnel alone (hub and agent relays in one process, no SSH), "+pathName(tr.String()),
			tr.String(), v, ref, refName, 0))
	}
	return nil
}

// frpTarget is one of issue 18's throughput targets of a tether path
// against an frp reference.
type frpTarget struct {
	mode, what string
	factor     float64
}

// p2FRPTargets: TCP agents ≥ 1.5× frp stcp and ≥ 1.0× frp tcp, QUIC agents
// ≥ 1.0× frp over QUIC.
func p2FRPTargets(path string) []frpTarget {
	if path == "quic" {
		return []frpTarget{{"quic", "frp tcp over QUIC", 1.0}}
	}
	return []frpTarget{{"stcp", "frp stcp (both legs encrypted)", 1.5}, {"tcp", "frp tcp (plaintext public side)", 1.0}}
}

func p2Row(what, transport string, v, ref float64, refName string, ossh float64) harness.Row {
	row := harness.Row{ID: "P2", What: "single TCP stream, " + what, Value: mbs(v), Ref: mbs(ref) + " " + refName,
		Ratio: harness.Ratio(v, ref)}
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

// pushVia pushes one TCP stream for d through c (an SSH client connected
// to path's hub) to target, and returns MB/s, the bytes moved, and the
// CPU that path's hub and agent spent on it (the channel open included).
func (s *jumpSetup) pushVia(ctx context.Context, c *gossh.Client, path, target string, d time.Duration,
	profile bool) (v float64, n int64, hubCPU, agentCPU time.Duration, err error) {
	hub, agent := s.relayPID(path), s.agentPID(path)
	hub0, err := procCPU(hub)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	agent0, err := procCPU(agent)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	wait := func() {}
	if profile {
		wait = profileHub(ctx, s.hubOf(path), "p2-ssh-L-"+path, d)
	}
	conn, err := c.Dial("tcp", target)
	if err == nil {
		v, n, err = pushFor(conn, d)
	}
	wait()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	hub1, err := procCPU(hub)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	agent1, err := procCPU(agent)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	return v, n, hub1 - hub0, agent1 - agent0, nil
}

func mbs(v float64) string {
	return fmt.Sprintf("%.0f MB/s (%.2f Gbit/s)", v, v*8/1000)
}

// goSSH connects a Go SSH client (aes128-gcm) to path's hub's bastion as
// the operator, or to the OpenSSH bastion as the local login.
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
	user, addr := harness.Login(), s.bastion.Addr
	if path != "openssh" {
		user, addr = "bench", s.hubOf(path).SSH
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
