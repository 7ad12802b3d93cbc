package main

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

func runtimeCPUs() int { return runtime.NumCPU() }

func selfPID() int { return os.Getpid() }

// nofileHard is this process's hard limit on open files.
func nofileHard() uint64 {
	var l syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	return l.Max
}

// jumpSetup is a hub with an operator, a node sshd, a stock OpenSSH bastion,
// and one real tether-edge per transport (nodes n-quic and n-tcp) relaying
// ssh streams to the node sshd.
type jumpSetup struct {
	env       *harness.Env
	hub       *harness.Hub
	node      *harness.SSHD
	bastion   *harness.SSHD
	sshConfig string
	stockSSH  string                   // sshConfig without the cipher pin (stockPath)
	agents    map[string]*harness.Proc // transport -> agent
	sink      *sink                    // P2's receiver; the agents allow its port
	plain     *plainHub                // P1's and P2's hub with --resume-window 0 (startPlain)
}

// jump returns the jump setup P1-P3 share (started on first use, stopped
// when tbench ends).
func (b *bench) jump(ctx context.Context) (*jumpSetup, error) {
	if b.shared != nil {
		return b.shared, nil
	}
	s, err := newJumpSetup(ctx, b)
	if err != nil {
		return nil, err
	}
	b.shared = s
	return s, nil
}

var transports = []string{"quic", "tcp"}

// newJumpSetup starts everything, with a sink for P2 whose port the agents
// allow.
func newJumpSetup(ctx context.Context, b *bench) (*jumpSetup, error) {
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return nil, err
	}
	env.Keep = b.keep
	s := &jumpSetup{env: env, agents: map[string]*harness.Proc{}}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	if s.sink, err = newSink(); err != nil {
		return nil, err
	}
	if s.node, err = env.StartSSHD(ctx, "node-sshd"); err != nil {
		return nil, err
	}
	if s.bastion, err = env.StartSSHD(ctx, "bastion-sshd"); err != nil {
		return nil, err
	}
	if s.sshConfig, err = env.SSHConfig(ctx); err != nil {
		return nil, err
	}
	if s.stockSSH, err = env.StockSSHConfig(ctx); err != nil {
		return nil, err
	}
	key, _ := env.OperatorKey(ctx)
	if s.hub, s.agents, err = startTetherHub(ctx, env, b.bin, key, s.node.Addr, s.sink.port()); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

func (s *jumpSetup) Close() {
	if s.plain != nil {
		s.plain.env.Close()
	}
	s.env.Close()
	if s.sink != nil {
		s.sink.Close()
	}
}

// jumpArgs are the ssh arguments that reach the node sshd as login through
// path "openssh" (the stock bastion) or a tether transport, with the
// cipher pinned, or as OpenSSH negotiates by itself for a path named with
// stockPath.
func (s *jumpSetup) jumpArgs(path string) []string {
	login := harness.Login()
	config := s.sshConfig
	if p, ok := strings.CutSuffix(path, stockSuffix); ok {
		path, config = p, s.stockSSH
	}
	if path == "openssh" {
		return []string{"-F", config, "-J", login + "@" + s.bastion.Addr, "-p", strconv.Itoa(s.node.Port),
			login + "@127.0.0.1"}
	}
	hub := s.hubOf(path)
	path, _ = strings.CutSuffix(path, plainSuffix)
	return []string{"-F", config, "-J", "bench@" + hub.SSH, login + "@n-" + path}
}

// stockSuffix names a path's run with an unconfigured ssh client (no
// cipher pin): stockPath("tcp") is the TLS agent reached that way.
const stockSuffix = "-stock"

func stockPath(path string) string { return path + stockSuffix }

// pathName labels a path in the tables.
func pathName(path string) string {
	if p, ok := strings.CutSuffix(path, stockSuffix); ok {
		return pathName(p) + ", stock ssh ciphers"
	}
	if p, ok := strings.CutSuffix(path, plainSuffix); ok {
		return pathName(p) + ", plain streams (--resume-window 0)"
	}
	switch path {
	case "openssh":
		return "OpenSSH bastion"
	case "quic":
		return "tether QUIC"
	case "tcp":
		return "tether TLS+yamux"
	}
	return path
}

func mbps(bytes int64, d time.Duration) float64 {
	return float64(bytes) / 1e6 / d.Seconds()
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
