package harness

import "context"

// Kill9 ends the hub with SIGKILL, as a crash or the OOM killer would: no
// shutdown, no goodbye to its agents. It returns once the process is gone.
func (h *Hub) Kill9() { h.Proc.Kill() }

// Start starts the hub again after Kill9 or Stop, with the same data dir,
// addresses and flags, and returns once it serves.
func (h *Hub) Start(ctx context.Context) error { return h.start(ctx) }
