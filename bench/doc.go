// Package bench holds Tether's benchmark suite: the scenarios P1-P7 that
// measure Tether side by side with OpenSSH, socat and Ansible in the same
// run (cmd/tbench), the failure scenario F1 (time to notice and to recover
// from link cuts and killed hubs), the agent simulator (internal/sim,
// cmd/agentsim) and a profiling build of the hub (cmd/hubprof). See
// README.md; `make bench` runs every P scenario and appends to RESULTS.md.
//
// The tests in this package run every scenario at a tiny size so the suite
// cannot rot; they measure nothing.
package bench
