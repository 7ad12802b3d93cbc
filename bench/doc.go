// Package bench holds Tether's benchmark suite: the scenarios P1-P7 that
// measure Tether side by side with OpenSSH, socat and Ansible in the same
// run (cmd/tbench), the agent simulator (internal/sim, cmd/agentsim) and a
// profiling build of the hub (cmd/hubprof). See README.md; `make bench`
// runs everything and appends to RESULTS.md.
//
// The test in this package runs every scenario at a tiny size so the suite
// cannot rot; it measures nothing.
package bench
