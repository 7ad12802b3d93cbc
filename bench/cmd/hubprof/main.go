// Command hubprof is `tether hub` (the same hub.Server) with net/http/pprof
// on -pprof, for profiling the hub under the bench scenarios:
//
//	hubprof --data-dir D --listen 127.0.0.1:7443 --ssh-listen 127.0.0.1:2222 --pprof 127.0.0.1:6060
//	go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=20
//
// tbench uses it instead of bin/tether for the hub when TBENCH_HUB is set to
// its path. Several benches may share a machine, so --pprof 127.0.0.1:0 takes
// any free port; the address actually bound is written to
// DATA_DIR/hubprof.addr, where tbench's P4 finds it to fetch the heap,
// goroutine and CPU profiles of the idle hub.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // the point of this command
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/tether-dev/tether/hub"
	"github.com/tether-dev/tether/tunnel"
)

func main() {
	var cfg hub.Config
	tc := tunnel.DefaultConfig()
	flag.StringVar(&cfg.DataDir, "data-dir", "", "hub state directory")
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:7443", "tunnel + API address")
	flag.StringVar(&cfg.SSHListen, "ssh-listen", "127.0.0.1:2222", "bastion address")
	flag.DurationVar(&cfg.NodeCertTTL, "node-cert-ttl", 0, "node certificate lifetime")
	flag.DurationVar(&tc.KeepAliveInterval, "keepalive", tc.KeepAliveInterval, "tunnel keepalive interval")
	flag.DurationVar(&tc.IdleTimeout, "dead-peer-timeout", tc.IdleTimeout, "dead peer timeout")
	flag.DurationVar(&cfg.ResumeWindow, "resume-window", time.Minute, "as tether hub's (0 turns resuming off)")
	level := flag.String("log-level", "warn", "debug, info, warn, error")
	pprof := flag.String("pprof", envOr("HUBPROF_PPROF", "127.0.0.1:0"),
		"net/http/pprof address (port 0: any; the bound address is written to DATA_DIR/hubprof.addr)")
	contention := flag.Bool("contention", false, "enable the mutex and block profiles")
	flag.Parse()
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "hubprof:", err)
		os.Exit(2)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	cfg.Tunnel = tc
	if cfg.ResumeWindow == 0 {
		cfg.ResumeWindow = -1 // the flag's 0 turns resuming off; the Config's 0 is the default
	}
	// Mutex and block profiling only when asked: they cost CPU on every
	// contended lock, which the idle-CPU figure must not include.
	if *contention {
		runtime.SetMutexProfileFraction(100)
		runtime.SetBlockProfileRate(int(time.Millisecond))
	}
	ln, err := net.Listen("tcp", *pprof)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hubprof: pprof listener:", err)
		os.Exit(1)
	}
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err == nil {
			_ = os.WriteFile(filepath.Join(cfg.DataDir, "hubprof.addr"), []byte(ln.Addr().String()), 0o600)
		}
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := hub.New(ctx, cfg)
	if err == nil {
		err = s.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hubprof:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
