package api

import "context"

// Replicas is what the node listing knows of hub replicas sharing the
// store (hub/replica serves GET /v1/replicas).
type Replicas interface {
	// Holders maps the ID of each node whose tunnel a live replica holds
	// to that replica; nil on a hub that is not a replica.
	Holders(ctx context.Context) (map[string]string, error)
}
