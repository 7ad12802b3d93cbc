// Command hubprof is `tether hub` (the same hub.Server) with net/http/pprof
// on -pprof, for profiling the hub under the bench scenarios:
//
//	hubprof --data-dir D --listen 127.0.0.1:7443 --ssh-listen 127.0.0.1:2222 --pprof 127.0.0.1:6060
//	go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=20
//
// tbench uses it instead of bin/tether for the hub when TBENCH_HUB is set to
// its path.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // the point of this command
	"os"
	"os/signal"
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
	level := flag.String("log-level", "warn", "debug, info, warn, error")
	pprof := flag.String("pprof", "127.0.0.1:6060", "net/http/pprof address")
	flag.Parse()
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "hubprof:", err)
		os.Exit(2)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	cfg.Tunnel = tc
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(int(time.Millisecond))
	srv := &http.Server{Addr: *pprof, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ListenAndServe() }()
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
