package hub

import (
	"context"
	"errors"
	"fmt"

	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/hub/upgrade"
)

// artifactSource is where upgrades' artifacts come from: registries,
// through hub/artifacts (verified, TLS always on).
type artifactSource struct{ c *artifacts.Client }

func (a artifactSource) Resolve(ctx context.Context, ref string) (upgrade.Artifact, error) {
	p, err := a.c.Resolve(ctx, ref)
	return upgrade.Artifact(p), err
}

// Fetch fills the blob store; a blob that does not hash to its digest is
// the controller's ErrDigestMismatch too.
func (a artifactSource) Fetch(ctx context.Context, art upgrade.Artifact, platforms []string) error {
	err := a.c.Fetch(ctx, artifacts.Pinned(art), platforms)
	if errors.Is(err, artifacts.ErrDigestMismatch) {
		return fmt.Errorf("%w", &mismatch{err})
	}
	return err
}

// mismatch carries the artifacts error's text ("digest mismatch (want …,
// got …)") under the controller's sentinel.
type mismatch struct{ err error }

func (m *mismatch) Error() string   { return m.err.Error() }
func (m *mismatch) Unwrap() []error { return []error{m.err, upgrade.ErrDigestMismatch} }
