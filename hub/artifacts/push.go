package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"
)

// AgentBinary is one platform's tether-edge executable to publish.
type AgentBinary struct {
	Platform string // "os/arch", GOOS/GOARCH names: linux/amd64
	Path     string
}

// BundleFile is one file of a bundle to publish: Name is its name on the
// node (upgradeproto.BundleInstall, BundleHealth, BundleRollback or payload).
type BundleFile struct {
	Name string
	Path string
}

// Pushed is what a push published.
type Pushed struct {
	Reference string `json:"reference"` // oci://… with the tag
	Digest    string `json:"digest"`    // what an upgrade pins: the index's (agent) or the manifest's (bundle)
	Pinned    string `json:"pinned"`    // the reference by digest
	MediaType string `json:"media_type"`
	Size      int64  `json:"size"`
}

// PushAgent publishes an agent artifact under ref (which must name a tag):
// per platform a manifest with the binary as its one layer, and an index of
// them, tagged. The documents are checked with the same parsers the hub
// and the nodes use before anything is pushed. The binaries are pushed as
// given (tests publish broken agents to exercise the nodes' checks and
// rollback); `tether artifact push agent` checks each with
// CheckAgentBinary first.
func (c *Client) PushAgent(ctx context.Context, ref, version string, bins []AgentBinary) (Pushed, error) {
	r, repo, err := c.pushTarget(ref)
	if err != nil {
		return Pushed{}, err
	}
	if len(bins) == 0 {
		return Pushed{}, fmt.Errorf("artifacts: an agent artifact needs at least one --binary OS/ARCH=PATH")
	}
	created := time.Now().UTC().Format(time.RFC3339)
	type packed struct {
		layer    ocispec.Descriptor
		path     string
		store    *memory.Store
		manifest ocispec.Descriptor
		platform ocispec.Platform
	}
	var all []packed
	seen := map[string]bool{}
	for _, b := range bins {
		goos, goarch, ok := strings.Cut(b.Platform, "/")
		if !ok || goos == "" || goarch == "" || strings.Contains(goarch, "/") {
			return Pushed{}, fmt.Errorf("artifacts: platform %q: want OS/ARCH such as linux/amd64", b.Platform)
		}
		if seen[b.Platform] {
			return Pushed{}, fmt.Errorf("artifacts: platform %s given twice", b.Platform)
		}
		seen[b.Platform] = true
		layer, err := describeFile(b.Path, upgradeproto.MediaTypeAgentBinary, upgradeproto.AgentBinaryName)
		if err != nil {
			return Pushed{}, err
		}
		st, mdesc, err := packManifest(ctx, upgradeproto.ArtifactTypeAgent, version, created, []ocispec.Descriptor{layer})
		if err != nil {
			return Pushed{}, err
		}
		all = append(all, packed{layer: layer, path: b.Path, store: st, manifest: mdesc,
			platform: ocispec.Platform{OS: goos, Architecture: goarch}})
	}
	sort.Slice(all, func(i, j int) bool {
		return all[i].platform.OS+"/"+all[i].platform.Architecture < all[j].platform.OS+"/"+all[j].platform.Architecture
	})
	ix := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		ArtifactType: upgradeproto.ArtifactTypeAgent,
		Annotations:  map[string]string{upgradeproto.AnnotationVersion: version, ocispec.AnnotationCreated: created}}
	for i := range all {
		d := all[i].manifest
		d.Platform = &all[i].platform
		d.ArtifactType = upgradeproto.ArtifactTypeAgent
		d.Annotations = nil
		ix.Manifests = append(ix.Manifests, d)
	}
	ixBytes, err := json.Marshal(ix)
	if err != nil {
		return Pushed{}, err
	}
	if _, err := upgradeproto.ParseArtifactIndex(ixBytes); err != nil {
		return Pushed{}, fmt.Errorf("artifacts: the index would not be accepted: %w", err)
	}
	for _, p := range all {
		if err := c.pushFile(ctx, repo, r, p.layer, p.path); err != nil {
			return Pushed{}, err
		}
		if err := c.copyManifest(ctx, p.store, repo, r, p.manifest); err != nil {
			return Pushed{}, err
		}
	}
	desc, err := oras.TagBytes(ctx, repo, ocispec.MediaTypeImageIndex, ixBytes, r.Tag)
	if err != nil {
		return Pushed{}, c.classify(err, r, "push index")
	}
	return pushed(r, desc), nil
}

// PushBundle publishes a bundle under ref (which must name a tag): one
// manifest whose layers are the files, titled by name; upgradeproto.BundleInstall
// must be among them.
func (c *Client) PushBundle(ctx context.Context, ref, version string, files []BundleFile) (Pushed, error) {
	r, repo, err := c.pushTarget(ref)
	if err != nil {
		return Pushed{}, err
	}
	var layers []ocispec.Descriptor
	for _, f := range files {
		l, err := describeFile(f.Path, upgradeproto.MediaTypeBundleFile, f.Name)
		if err != nil {
			return Pushed{}, err
		}
		layers = append(layers, l)
	}
	st, mdesc, err := packManifest(ctx, upgradeproto.ArtifactTypeBundle, version,
		time.Now().UTC().Format(time.RFC3339), layers)
	if err != nil {
		return Pushed{}, err
	}
	for i, l := range layers {
		if err := c.pushFile(ctx, repo, r, l, files[i].Path); err != nil {
			return Pushed{}, err
		}
	}
	if err := c.copyManifest(ctx, st, repo, r, mdesc); err != nil {
		return Pushed{}, err
	}
	if err := repo.Tag(ctx, mdesc, r.Tag); err != nil {
		return Pushed{}, c.classify(err, r, "tag")
	}
	return pushed(r, mdesc), nil
}

func pushed(r Reference, d ocispec.Descriptor) Pushed {
	return Pushed{Reference: r.String(), Digest: d.Digest.String(), Pinned: r.Pinned(d.Digest.String()).String(),
		MediaType: d.MediaType, Size: d.Size}
}

func (c *Client) pushTarget(ref string) (Reference, *remote.Repository, error) {
	r, err := ParseReference(ref)
	if err != nil {
		return Reference{}, nil, err
	}
	if r.Tag == "" {
		return Reference{}, nil, fmt.Errorf("%w %q: a push needs a :TAG to publish under, not a digest", ErrBadReference, ref)
	}
	repo, err := c.repository(r)
	return r, repo, err
}

// packManifest packs an artifact manifest with oras-go into a memory store
// (the layers stay descriptors) and checks it with the parser the hub and
// the nodes use, so nothing invalid reaches the registry.
func packManifest(
	ctx context.Context, artifactType, version, created string, layers []ocispec.Descriptor,
) (*memory.Store, ocispec.Descriptor, error) {
	st := memory.New()
	desc, err := oras.PackManifest(ctx, st, oras.PackManifestVersion1_1, artifactType, oras.PackManifestOptions{
		Layers:              layers,
		ManifestAnnotations: map[string]string{upgradeproto.AnnotationVersion: version, ocispec.AnnotationCreated: created},
	})
	if err != nil {
		return nil, ocispec.Descriptor{}, fmt.Errorf("artifacts: pack manifest: %w", err)
	}
	b, err := content.FetchAll(ctx, st, desc)
	if err != nil {
		return nil, ocispec.Descriptor{}, fmt.Errorf("artifacts: pack manifest: %w", err)
	}
	if _, err := upgradeproto.ParseArtifactManifest(b); err != nil {
		return nil, ocispec.Descriptor{}, fmt.Errorf("artifacts: the manifest would not be accepted: %w", err)
	}
	return st, desc, nil
}

// copyManifest pushes a packed manifest and its config from the memory
// store (the layers are pushed from their files before).
func (c *Client) copyManifest(
	ctx context.Context, st *memory.Store, repo *remote.Repository, r Reference, m ocispec.Descriptor,
) error {
	b, err := content.FetchAll(ctx, st, m)
	if err != nil {
		return err
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return err
	}
	cfg, err := content.FetchAll(ctx, st, man.Config)
	if err != nil {
		return err
	}
	for _, x := range []struct {
		d ocispec.Descriptor
		b []byte
	}{{man.Config, cfg}, {m, b}} {
		ok, err := repo.Exists(ctx, x.d)
		if err != nil {
			return c.classify(err, r, "push")
		}
		if !ok {
			if err := repo.Push(ctx, x.d, strings.NewReader(string(x.b))); err != nil {
				return c.classify(err, r, "push")
			}
		}
	}
	return nil
}

// describeFile hashes a file into a layer descriptor titled name.
func describeFile(path, mediaType, name string) (ocispec.Descriptor, error) {
	f, err := os.Open(path)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("artifacts: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("artifacts: %w", err)
	}
	if !st.Mode().IsRegular() {
		return ocispec.Descriptor{}, fmt.Errorf("artifacts: %s is not a regular file", path)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("artifacts: read %s: %w", path, err)
	}
	if n > upgradeproto.MaxArtifactFile {
		return ocispec.Descriptor{}, fmt.Errorf("artifacts: %s: %d bytes, more than the %d a node accepts", path, n,
			int64(upgradeproto.MaxArtifactFile))
	}
	return ocispec.Descriptor{
		MediaType: mediaType, Digest: digest.Digest("sha256:" + hex.EncodeToString(h.Sum(nil))), Size: n,
		Annotations: map[string]string{ocispec.AnnotationTitle: name},
	}, nil
}

// pushFile uploads a layer from its file unless the repository has it.
func (c *Client) pushFile(
	ctx context.Context, repo *remote.Repository, r Reference, d ocispec.Descriptor, path string,
) error {
	ok, err := repo.Exists(ctx, d)
	if err != nil {
		return c.classify(err, r, "push")
	}
	if ok {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("artifacts: %w", err)
	}
	defer f.Close()
	if err := repo.Push(ctx, d, f); err != nil {
		return c.classify(err, r, "push "+path+" to")
	}
	return nil
}

// Tag points ref's tag at the artifact with digest d in the same
// repository (a release promoted, or a tag moved).
func (c *Client) Tag(ctx context.Context, ref, d string) error {
	r, repo, err := c.pushTarget(ref)
	if err != nil {
		return err
	}
	if !upgradeproto.ValidDigest(d) {
		return fmt.Errorf("%w: digest %.80q is not sha256:<64 hex>", ErrBadReference, d)
	}
	desc, err := repo.Resolve(ctx, d)
	if err != nil {
		return c.classify(err, r, "resolve "+d+" in")
	}
	if err := repo.Tag(ctx, desc, r.Tag); err != nil {
		return c.classify(err, r, "tag")
	}
	return nil
}
