package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// runP3 measures `ssh -J hub node true` wall time (median of N) and the
// latency of opening a stream to the node's sshd inside an established
// bastion connection (a direct-tcpip channel open: the hub opens a tunnel
// stream, the agent dials sshd, and answers), against OpenSSH -J through a
// stock OpenSSH bastion.
func runP3(ctx context.Context, b *bench) error {
	s, err := b.jump(ctx)
	if err != nil {
		return err
	}
	paths := []string{"openssh", "quic", "tcp"}
	walls := map[string][]time.Duration{}
	for range b.sz.p3Runs {
		for _, path := range paths {
			d, err := s.sshTrue(ctx, path)
			if err != nil {
				return err
			}
			walls[path] = append(walls[path], d)
		}
	}
	opens := map[string][]time.Duration{}
	for _, path := range paths {
		ds, err := s.streamOpens(ctx, path, b.sz.p3Opens)
		if err != nil {
			return err
		}
		opens[path] = ds
	}
	refWall, refOpen := median(walls["openssh"]), median(opens["openssh"])
	b.report.Add(harness.Row{ID: "P3",
		What:  fmt.Sprintf("ssh -J node true, OpenSSH bastion (reference, median of %d)", b.sz.p3Runs),
		Value: ms(refWall), Ref: ms(refWall), Ratio: "1.00×"})
	for _, path := range []string{"quic", "tcp"} {
		v := median(walls[path])
		b.report.Add(harness.Row{ID: "P3",
			What:  fmt.Sprintf("ssh -J node true, %s (median of %d)", pathName(path), b.sz.p3Runs),
			Value: ms(v), Ref: ms(refWall), Ratio: harness.Ratio(v.Seconds(), refWall.Seconds()),
			Target: "≤ 1.0×", Met: harness.YesNo(v <= refWall)})
	}
	b.report.Add(harness.Row{ID: "P3",
		What: fmt.Sprintf("stream open (direct-tcpip to node sshd), OpenSSH bastion (reference, median of %d; p99 "+
			"%s)", len(opens["openssh"]), ms(quantile(opens["openssh"], 0.99))),
		Value: ms(refOpen), Ref: ms(refOpen), Ratio: "1.00×"})
	for _, path := range []string{"quic", "tcp"} {
		v := median(opens[path])
		b.report.Add(harness.Row{ID: "P3",
			What: fmt.Sprintf("stream open (direct-tcpip to node sshd), %s (median of %d; p99 %s)", pathName(path),
				len(opens[path]), ms(quantile(opens[path], 0.99))),
			Value: ms(v), Ref: ms(refOpen), Ratio: harness.Ratio(v.Seconds(), refOpen.Seconds()),
			Target: "≤ 1.0×", Met: harness.YesNo(v <= refOpen)})
	}
	return nil
}

// sshTrue times one `ssh -J ... true`.
func (s *jumpSetup) sshTrue(ctx context.Context, path string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(s.jumpArgs(path), "true")...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("P3 ssh -J true through %s: %w: %s", pathName(path), err, out)
	}
	return time.Since(start), nil
}

// streamOpens connects once to the bastion (hub or OpenSSH) with a Go SSH
// client and times n direct-tcpip opens to the node's sshd, each closed
// again after its first bytes (the sshd banner) arrived.
func (s *jumpSetup) streamOpens(ctx context.Context, path string, n int) ([]time.Duration, error) {
	target := "n-" + path + ":22"
	if path == "openssh" {
		target = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.node.Port))
	}
	c, err := s.goSSH(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("P3: %w", err)
	}
	defer c.Close()
	var ds []time.Duration
	buf := make([]byte, 64)
	for range n {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		start := time.Now()
		conn, err := c.Dial("tcp", target)
		if err != nil {
			return nil, fmt.Errorf("P3 open stream through %s: %w", pathName(path), err)
		}
		ds = append(ds, time.Since(start))
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Read(buf) // the banner: the stream really reaches sshd
		conn.Close()
	}
	return ds, nil
}

func median(ds []time.Duration) time.Duration { return quantile(ds, 0.5) }

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	c := slices.Clone(ds)
	slices.Sort(c)
	return c[min(len(c)-1, int(q*float64(len(c))))]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}
