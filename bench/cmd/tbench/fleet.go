package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
)

// fleetFile is where fleet keeps the enrolled fleet (sim.Fleet's file,
// which agentsim child processes read too).
func (b *bench) fleetFile() string { return filepath.Join(b.cache, "fleet.gob") }

// fleet returns a hub data dir and at least n nodes enrolled on it. Both are
// kept in b.cache between runs: enrolling 100k nodes through the join
// endpoint takes minutes, and every scenario of every run reuses them. The
// cache is rebuilt when it is unreadable or its certificates are about to
// expire.
func (b *bench) fleet(ctx context.Context, env *harness.Env, n int) (string, *sim.Fleet, error) {
	dataDir := filepath.Join(b.cache, "hub")
	path := b.fleetFile()
	f, err := sim.LoadFleet(path)
	if err == nil && !fleetUsable(f) {
		b.log.Info("fleet cache is stale; enrolling again", "dir", b.cache)
		err = fmt.Errorf("stale")
	}
	if err != nil {
		if rerr := os.RemoveAll(b.cache); rerr != nil {
			return "", nil, rerr
		}
		f = &sim.Fleet{}
	}
	if len(f.Members) >= n {
		return dataDir, f, nil
	}
	if err := os.MkdirAll(b.cache, 0o700); err != nil {
		return "", nil, err
	}
	// Node certificates for a long-lived cache: the hub's default (24h)
	// would expire between runs.
	hub, err := env.StartHub(ctx, dataDir, "--node-cert-ttl", "720h")
	if err != nil {
		return "", nil, err
	}
	defer hub.Stop(30 * time.Second)
	missing := n - len(f.Members)
	join, err := hub.Token(ctx, missing, "bench=fleet")
	if err != nil {
		return "", nil, err
	}
	start := time.Now()
	b.log.Info("enrolling simulated nodes through the join endpoint (once; cached)", "count", missing, "cache", b.cache)
	more, err := sim.Enroll(ctx, sim.EnrollOptions{JoinString: join, Prefix: "sim", From: len(f.Members),
		Count: missing, Parallel: 16,
		Progress: func(done int) {
			if done%10000 == 0 {
				b.log.Info("enrolled", "done", done, "of", missing, "per_second", int(float64(done)/time.Since(start).Seconds()))
			}
		}})
	if err != nil {
		return "", nil, err
	}
	f.Append(more)
	b.log.Info("enrolled", "count", missing, "took", time.Since(start).Round(time.Second),
		"per_second", int(float64(missing)/time.Since(start).Seconds()))
	if err := f.Save(path); err != nil {
		return "", nil, err
	}
	return dataDir, f, nil
}

// fleetUsable reports whether the cached certificates last another day.
func fleetUsable(f *sim.Fleet) bool {
	if len(f.Members) == 0 || len(f.Members[0].Chain) == 0 {
		return false
	}
	c, err := x509.ParseCertificate(f.Members[0].Chain[0])
	return err == nil && time.Until(c.NotAfter) > 24*time.Hour
}
