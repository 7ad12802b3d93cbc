package upgrade

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Artifact is an artifact resolved once, at creation (the same fields as
// hub/artifacts.Pinned, so the hub converts one into the other): stored in
// the upgrade, it is all the rollout needs later except the blobs.
type Artifact struct {
	Reference string            `json:"reference"`
	Digest    string            `json:"digest"`
	Kind      upgradeproto.Kind `json:"kind"`
	Version   string            `json:"version"`
	Index     []byte            `json:"index,omitempty"`
	Manifests map[string][]byte `json:"manifests"`
}

// ErrDigestMismatch is a blob (or document) that does not hash to its
// digest: the artifact in the registry is not what was pinned.
var ErrDigestMismatch = errors.New("digest mismatch")

// Source resolves references and fetches blobs from registries
// (hub/artifacts behind an adapter in the hub's wiring).
type Source interface {
	// Resolve pins ref: a tag to its digest once; a digest as given.
	Resolve(ctx context.Context, ref string) (Artifact, error)
	// Fetch puts every layer blob of those platforms ("os/arch"; ignored
	// for bundles) into the hub's blob store, verified; an error wraps
	// ErrDigestMismatch for a blob that does not hash to its digest.
	Fetch(ctx context.Context, a Artifact, platforms []string) error
}

// forPlatform is what a node of goos/goarch gets: the index (agents), the
// manifest and its files.
func (a Artifact) forPlatform(goos, goarch string) (index, manifest []byte, files []upgradeproto.File, err error) {
	switch a.Kind {
	case upgradeproto.KindAgent:
		ix, err := upgradeproto.ParseArtifactIndex(a.Index)
		if err != nil {
			return nil, nil, nil, err
		}
		if _, err := ix.ForPlatform(goos, goarch); err != nil {
			return nil, nil, nil, err
		}
		index, manifest = a.Index, a.Manifests[goos+"/"+goarch]
	case upgradeproto.KindBundle:
		manifest = a.Manifests[""]
	default:
		return nil, nil, nil, fmt.Errorf("artifact kind %q is neither agent nor bundle", a.Kind)
	}
	if manifest == nil {
		return nil, nil, nil, fmt.Errorf("the pinned artifact holds no manifest for %s/%s", goos, goarch)
	}
	m, err := upgradeproto.ParseArtifactManifest(manifest)
	if err != nil {
		return nil, nil, nil, err
	}
	return index, manifest, m.Files(), nil
}

// platforms lists the "os/arch" the artifact has manifests for.
func (a Artifact) platforms() []string {
	var out []string
	for p := range a.Manifests {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// blobDigests are the hex digests of every file of the artifact.
func (a Artifact) blobDigests() []string {
	var out []string
	for _, m := range a.Manifests {
		mm, err := upgradeproto.ParseArtifactManifest(m)
		if err != nil {
			continue
		}
		for _, f := range mm.Files() {
			out = append(out, upgradeproto.DigestHex(f.Digest))
		}
	}
	return out
}

// compareVersions orders two agent versions as the node does: -1, 0, 1,
// and ok=false when either is not a version (a development build).
func compareVersions(a, b string) (int, bool) {
	return upgradeproto.CompareVersions(strings.TrimSpace(a), strings.TrimSpace(b))
}
