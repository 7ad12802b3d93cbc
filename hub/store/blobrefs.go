package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// JobBlobDigests returns the blob digests (hex) every stored job's spec
// uploads: the blob store's garbage collection keeps them, so a rerun of
// any job finds its files.
func (s *DB) JobBlobDigests(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT spec FROM jobs`)
	if err != nil {
		return nil, fmt.Errorf("store: job blob digests: %w", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	out := []string{}
	for rows.Next() {
		var raw string
		if err := rows.Scan(&raw); err != nil {
			return nil, fmt.Errorf("store: job blob digests: %w", err)
		}
		var spec struct {
			Uploads []Upload `json:"uploads"`
		}
		// A spec that does not decode is a store corruption; failing keeps
		// every blob rather than guessing.
		if err := json.Unmarshal([]byte(raw), &spec); err != nil {
			return nil, fmt.Errorf("store: job blob digests: a job spec does not decode: %w", err)
		}
		for _, u := range spec.Uploads {
			if u.SHA256 != "" && !seen[u.SHA256] {
				seen[u.SHA256] = true
				out = append(out, u.SHA256)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: job blob digests: %w", err)
	}
	return out, nil
}
