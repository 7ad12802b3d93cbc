package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// scpAcrossCuts copies a file of random bytes (made from /dev/urandom)
// with scp through the hub to each agent's node while the agent's link is
// cut len(scpCuts) times, the k-th cut once a k/(cuts+1) share of the file
// has arrived. Per transport: whether the copy completed, the bytes lost
// (not arrived, or the whole file when it arrived different), the seconds
// lost (wall time less the same copy without cuts, measured just before,
// less the cuts themselves) and whether the SHA-256 sums are equal.
func (f *f1) scpAcrossCuts(ctx context.Context, s *linkSetup) error {
	size := int64(f.sz.scpMiB) << 20
	src := s.e.Path("scp-src")
	sum, err := randomFile(src, size)
	if err != nil {
		return err
	}
	defer os.Remove(src)
	var total time.Duration
	for _, c := range f.sz.scpCuts {
		total += c
	}
	what := fmt.Sprintf("%d MiB scp across %d link cuts of %s–%s", f.sz.scpMiB, len(f.sz.scpCuts),
		label(f.sz.scpCuts[0]), label(f.sz.scpCuts[len(f.sz.scpCuts)-1]))
	for _, t := range transports {
		node := s.agents[t].name
		if err := f.waitJump(ctx, s.e, s.hub.SSH, node); err != nil {
			return fmt.Errorf("before the copy to %s: %w%s", node, err, agentLogs(s.agents))
		}
		dst := s.e.Path("scp-dst-" + t)
		limit := 10*time.Minute + total
		ref, err := f.scp(ctx, s, src, dst, node, limit)
		os.Remove(dst)
		if err != nil {
			return fmt.Errorf("the copy to %s without cuts: %w", node, err)
		}
		res := f.scpCut(ctx, s, src, dst, node, size, limit)
		os.Remove(dst)
		row := harness.Row{ID: "F1", What: fmt.Sprintf("%s, %s agent: bytes lost, seconds lost, SHA-256 equal", what,
			trName(t)), Target: "0 bytes lost, SHA-256 equal"}
		switch {
		case res.err != nil:
			when := fmt.Sprintf("at cut %d of %d", res.cutsDone, len(f.sz.scpCuts))
			if res.cutsDone == 0 {
				when = "before the first cut"
			}
			row.Value = fmt.Sprintf("failed %s, after %s: %d of %d bytes arrived", when, fmtSecs(res.wall),
				res.arrived, size)
			f.b.report.Note("F1 scp across cuts, %s agent: %v", trName(t), res.err)
		default:
			equal := res.sum == sum
			lost := int64(0)
			if !equal {
				lost = size
			}
			row.Value = fmt.Sprintf("%d B lost, %s lost, SHA-256 equal: %s", lost,
				fmtSecs(res.wall-ref-total), harness.YesNo(equal))
			row.Met = harness.YesNo(equal)
		}
		if row.Met == "" {
			row.Met = "no"
		}
		row.Ref = fmt.Sprintf("%s without cuts", fmtSecs(ref))
		f.b.report.Add(row)
	}
	return nil
}

// randomFile writes size bytes from /dev/urandom to path and returns their
// SHA-256.
func randomFile(path string, size int64) ([32]byte, error) {
	var sum [32]byte
	r, err := os.Open("/dev/urandom")
	if err != nil {
		return sum, err
	}
	defer r.Close()
	w, err := os.Create(path)
	if err != nil {
		return sum, err
	}
	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(w, h), r, size)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	copy(sum[:], h.Sum(nil))
	return sum, err
}

func fileSum(path string) ([32]byte, error) {
	var sum [32]byte
	r, err := os.Open(path)
	if err != nil {
		return sum, err
	}
	defer r.Close()
	h := sha256.New()
	_, err = io.Copy(h, r)
	copy(sum[:], h.Sum(nil))
	return sum, err
}

// scpResult is how a copy across cuts ended.
type scpResult struct {
	wall     time.Duration
	cutsDone int
	arrived  int64
	sum      [32]byte
	err      error
}

// scpCmd starts `scp -J bench@HUB src LOGIN@node:dst`.
func (f *f1) scpCmd(s *linkSetup, src, dst, node string) (*exec.Cmd, *bytes.Buffer, chan error, error) {
	cmd := exec.Command("scp", "-q", "-F", s.e.sshConfig, "-J", "bench@"+s.hub.SSH, src,
		harness.Login()+"@"+node+":"+dst)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, &out, done, nil
}

// scp copies src to node:dst without cuts and returns the wall time.
func (f *f1) scp(ctx context.Context, s *linkSetup, src, dst, node string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	cmd, out, done, err := f.scpCmd(s, src, dst, node)
	if err != nil {
		return 0, err
	}
	select {
	case err = <-done:
	case <-time.After(limit):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		err = fmt.Errorf("still copying after %s", limit)
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		err = ctx.Err()
	}
	if err != nil {
		return 0, fmt.Errorf("scp: %w: %s", err, sshReason(out.String()))
	}
	return time.Since(start), nil
}

// scpCut copies src to node:dst while cutting the link at each share of
// the file arrived.
func (f *f1) scpCut(ctx context.Context, s *linkSetup, src, dst, node string, size int64,
	limit time.Duration) scpResult {
	start := time.Now()
	var res scpResult
	cmd, out, done, err := f.scpCmd(s, src, dst, node)
	if err != nil {
		res.err = err
		return res
	}
	arrived := func() int64 {
		st, err := os.Stat(dst)
		if err != nil {
			return 0
		}
		return st.Size()
	}
	kill := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	cuts := f.sz.scpCuts
	var exitErr error
	exited := false
loop:
	for {
		if res.cutsDone < len(cuts) && arrived() >= size*int64(res.cutsDone+1)/int64(len(cuts)+1) {
			if err := s.link.Down(); err != nil {
				kill()
				res.err = err
				return res
			}
			select {
			case exitErr = <-done:
				exited = true
			case <-time.After(cuts[res.cutsDone]):
			}
			if err := s.link.Up(); err != nil && !exited {
				kill()
				res.err = err
				return res
			}
			res.cutsDone++
			if exited {
				break loop
			}
		}
		select {
		case exitErr = <-done:
			exited = true
			break loop
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			kill()
			res.err = ctx.Err()
			return res
		}
		if time.Since(start) > limit {
			kill()
			res.err = fmt.Errorf("still copying after %s", limit)
			res.arrived, res.wall = arrived(), time.Since(start)
			return res
		}
	}
	res.wall, res.arrived = time.Since(start), arrived()
	switch {
	case exitErr != nil:
		res.err = fmt.Errorf("scp: %w: %s", exitErr, sshReason(out.String()))
	case res.cutsDone < len(cuts):
		res.err = fmt.Errorf("the copy finished before cut %d of %d: the file is too small for this machine",
			res.cutsDone+1, len(cuts))
	default:
		res.sum, res.err = fileSum(dst)
	}
	return res
}
