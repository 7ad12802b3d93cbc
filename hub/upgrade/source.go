package upgrade

import (
	"context"
	"errors"
	"fmt"

	"github.com/tether-dev/tether/hub/artifacts"
)

// RegistrySource is where upgrades' artifacts come from: registries,
// through hub/artifacts (verified, TLS always on).
type RegistrySource struct{ Client *artifacts.Client }

// Resolve implements Source.
func (a RegistrySource) Resolve(ctx context.Context, ref string) (Artifact, error) {
	p, err := a.Client.Resolve(ctx, ref)
	return Artifact(p), err
}

// Fetch fills the blob store; a blob that does not hash to its digest is
// the controller's ErrDigestMismatch too.
func (a RegistrySource) Fetch(ctx context.Context, art Artifact, platforms []string) error {
	err := a.Client.Fetch(ctx, artifacts.Pinned(art), platforms)
	if errors.Is(err, artifacts.ErrDigestMismatch) {
		return fmt.Errorf("%w", &mismatch{err})
	}
	return err
}

// mismatch carries the artifacts error's text ("digest mismatch (want …,
// got …)") under the controller's sentinel.
type mismatch struct{ err error }

func (m *mismatch) Error() string   { return m.err.Error() }
func (m *mismatch) Unwrap() []error { return []error{m.err, ErrDigestMismatch} }
