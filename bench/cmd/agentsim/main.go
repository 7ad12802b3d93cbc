// Command agentsim runs many Tether agents in one process (see bench/internal/sim).
//
//	agentsim enroll -join JOIN -n 1000 -out fleet.gob [-prefix sim] [-parallel 16]
//	agentsim run -fleet fleet.gob [-n N] [-from K] [-transport quic|tcp] [-hub HOST:PORT]
//	             [-ssh embedded -ssh-host-key FILE | -ssh HOST:PORT] [-per-socket 1000]
//	             [-ramp 2000] [-duration 10m] [-keepalive 20s -dead-peer-timeout 60s]
//
// run prints the number of connected agents every few seconds and exits after
// -duration (or on Ctrl-C), closing every session.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // -pprof serves profiles of the simulator
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/tunnel"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: agentsim enroll|run [flags] (-h for flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "enroll":
		err = enroll(ctx, os.Args[2:])
	case "run":
		err = run(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want enroll or run", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentsim:", err)
		os.Exit(1)
	}
}

func enroll(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("enroll", flag.ExitOnError)
	join := fs.String("join", "", "join string of a token with at least -n uses (tether token create --uses N)")
	n := fs.Int("n", 100, "nodes to enroll")
	prefix := fs.String("prefix", "sim", "node name prefix")
	out := fs.String("out", "fleet.gob", "fleet file to write (appended to if it exists)")
	parallel := fs.Int("parallel", 16, "concurrent joins")
	_ = fs.Parse(args)
	if *join == "" {
		return fmt.Errorf("-join is required")
	}
	fleet := &sim.Fleet{}
	if old, err := sim.LoadFleet(*out); err == nil {
		fleet = old
	}
	start := time.Now()
	f, err := sim.Enroll(ctx, sim.EnrollOptions{JoinString: *join, Prefix: *prefix, From: len(fleet.Members),
		Count: *n, Parallel: *parallel,
		Progress: func(done int) {
			fmt.Printf("enrolled %d/%d (%.0f/s)\n", done, *n, float64(done)/time.Since(start).Seconds())
		}})
	if err != nil {
		return err
	}
	fleet.Append(f)
	fmt.Printf("enrolled %d nodes in %v (%.0f/s); fleet has %d\n", *n, time.Since(start).Round(time.Millisecond),
		float64(*n)/time.Since(start).Seconds(), len(fleet.Members))
	return fleet.Save(*out)
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fleetPath := fs.String("fleet", "fleet.gob", "fleet file from enroll")
	n := fs.Int("n", 0, "agents to run (default: the whole fleet)")
	from := fs.Int("from", 0, "first fleet member")
	transport := fs.String("transport", "quic", "quic, tcp or auto")
	hub := fs.String("hub", "", "hub address to dial instead of the one in the identities")
	ssh := fs.String("ssh", "", `ssh service: "embedded" or HOST:PORT of an sshd (default: refuse)`)
	hostKey := fs.String("ssh-host-key", "", "host key file of the embedded SSH servers (shared)")
	perSocket := fs.Int("per-socket", 1000, "QUIC agents per shared UDP socket (0: a socket each)")
	ramp := fs.Int("ramp", 2000, "agents started per second (0: all at once)")
	duration := fs.Duration("duration", 10*time.Minute, "exit after this long")
	every := fs.Duration("report", 5*time.Second, "print the connected count this often")
	pprof := fs.String("pprof", "", "serve net/http/pprof on this address")
	verbose := fs.Bool("v", false, "log agents' warnings")
	keepAlive := fs.Duration("keepalive", 0, "the agents' --keepalive (0: the agent's default)")
	deadPeer := fs.Duration("dead-peer-timeout", 0, "the agents' --dead-peer-timeout (0: the agent's default)")
	_ = fs.Parse(args)
	var tun *tunnel.Config
	if *keepAlive > 0 || *deadPeer > 0 {
		tun = &tunnel.Config{KeepAliveInterval: *keepAlive, IdleTimeout: *deadPeer}
	}
	tr, err := tunnel.ParseTransport(*transport)
	if err != nil {
		return err
	}
	fleet, err := sim.LoadFleet(*fleetPath)
	if err != nil {
		return err
	}
	if *n == 0 {
		*n = len(fleet.Members) - *from
	}
	if *hub != "" {
		fleet.SetHub(*hub)
	}
	if *pprof != "" {
		go func() { _ = http.ListenAndServe(*pprof, nil) }()
	}
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if *ssh == edge.SSHEmbedded && *hostKey == "" {
		return fmt.Errorf("-ssh embedded needs -ssh-host-key")
	}
	defer sim.CollectTighter()()
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	s, err := sim.Start(ctx, sim.Config{Fleet: fleet, From: *from, Count: *n, Transport: tr,
		SSHTarget: *ssh, SSHHostKey: *hostKey, PerSocket: *perSocket, Ramp: *ramp, Tunnel: tun, Logger: log})
	if err != nil {
		return err
	}
	defer s.Stop()
	start := time.Now()
	t := time.NewTicker(*every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Printf("%6.0fs connected %d/%d, failed attempts %d, sessions ended %d; stopping\n",
				time.Since(start).Seconds(), s.Connected(), *n, s.FailedAttempts(), s.Drops())
			return nil
		case <-t.C:
			fmt.Printf("%6.0fs connected %d/%d, failed attempts %d, sessions ended %d\n",
				time.Since(start).Seconds(), s.Connected(), *n, s.FailedAttempts(), s.Drops())
		}
	}
}
