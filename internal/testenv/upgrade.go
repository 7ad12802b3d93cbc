package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"sync"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

var edgeBuilds struct {
	mu   sync.Mutex
	dir  string
	done map[string]string
}

// EdgeVersion builds tether-edge of this checkout with edge.Version set
// to version (the ldflags `make build` uses), once per test process, and
// returns the binary's path. The build cache makes a second version a
// link step. The binaries live in a directory removed only with the
// machine's temporary files: tests copy them where they install them.
func EdgeVersion(t T, version string) string {
	t.Helper()
	edgeBuilds.mu.Lock()
	defer edgeBuilds.mu.Unlock()
	if p, ok := edgeBuilds.done[version]; ok {
		return p
	}
	if edgeBuilds.dir == "" {
		d, err := os.MkdirTemp("", "tether-edge-versions-")
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		edgeBuilds.dir, edgeBuilds.done = d, map[string]string{}
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	out := filepath.Join(edgeBuilds.dir, version, "tether-edge")
	cmd := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-X github.com/tether-dev/tether/edge.Version="+version,
		"-o", out, "./cmd/tether-edge")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: build tether-edge %s: %v\n%s", version, err, b)
	}
	edgeBuilds.done[version] = out
	return out
}

// AgentOffer is the offer of an agent artifact for this platform holding
// binary: an index and a manifest as `tether artifact push agent` makes
// them, the digest pinned on the index.
func AgentOffer(t T, name, version string, binary []byte) upgradeproto.Offer {
	t.Helper()
	m := upgradeproto.OCIManifest{
		SchemaVersion: 2,
		MediaType:     upgradeproto.MediaTypeOCIManifest,
		ArtifactType:  upgradeproto.ArtifactTypeAgent,
		Config: upgradeproto.OCIDescriptor{
			MediaType: upgradeproto.MediaTypeOCIEmpty,
			Digest:    upgradeproto.DigestOf([]byte("{}")),
			Size:      2,
		},
		Layers: []upgradeproto.OCIDescriptor{
			{MediaType: upgradeproto.MediaTypeAgentBinary, Digest: upgradeproto.DigestOf(binary), Size: int64(len(binary)),
				Annotations: map[string]string{upgradeproto.AnnotationTitle: upgradeproto.AgentBinaryName}},
		},
		Annotations: map[string]string{upgradeproto.AnnotationVersion: version},
	}
	manifest := mustJSON(t, m)
	ix := upgradeproto.OCIIndex{
		SchemaVersion: 2,
		MediaType:     upgradeproto.MediaTypeOCIIndex,
		ArtifactType:  upgradeproto.ArtifactTypeAgent,
		Manifests: []upgradeproto.OCIDescriptor{
			{MediaType: upgradeproto.MediaTypeOCIManifest, Digest: upgradeproto.DigestOf(manifest), Size: int64(len(manifest)),
				Platform: &upgradeproto.OCIPlatform{OS: runtime.GOOS, Architecture: runtime.GOARCH}},
		},
		Annotations: map[string]string{upgradeproto.AnnotationVersion: version},
	}
	index := mustJSON(t, ix)
	return upgradeproto.Offer{
		Name:     name,
		Kind:     upgradeproto.KindAgent,
		Version:  version,
		Digest:   upgradeproto.DigestOf(index),
		Index:    index,
		Manifest: manifest,
	}
}

// BundleOffer is the offer of a bundle of files (install.sh among them).
func BundleOffer(t T, name, version string, files map[string][]byte) upgradeproto.Offer {
	t.Helper()
	m := upgradeproto.OCIManifest{
		SchemaVersion: 2,
		MediaType:     upgradeproto.MediaTypeOCIManifest,
		ArtifactType:  upgradeproto.ArtifactTypeBundle,
		Config: upgradeproto.OCIDescriptor{
			MediaType: upgradeproto.MediaTypeOCIEmpty,
			Digest:    upgradeproto.DigestOf([]byte("{}")),
			Size:      2,
		},
		Annotations: map[string]string{upgradeproto.AnnotationVersion: version},
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		m.Layers = append(
			m.Layers,
			upgradeproto.OCIDescriptor{MediaType: upgradeproto.MediaTypeBundleFile, Digest: upgradeproto.DigestOf(files[f]),
				Size: int64(len(files[f])), Annotations: map[string]string{upgradeproto.AnnotationTitle: f}},
		)
	}
	manifest := mustJSON(t, m)
	return upgradeproto.Offer{
		Name:     name,
		Kind:     upgradeproto.KindBundle,
		Version:  version,
		Digest:   upgradeproto.DigestOf(manifest),
		Manifest: manifest,
	}
}

// UploadUpgradeFiles puts files where the hub uploads them on a node:
// UpgradeIncomingDir(stateDir, name)/<hex digest>.
func UploadUpgradeFiles(t T, stateDir, name string, files ...[]byte) {
	t.Helper()
	dir := upgradeproto.IncomingDir(stateDir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, upgradeproto.DigestHex(upgradeproto.DigestOf(f))), f, 0o600); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
}

func mustJSON(t T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("testenv: %v", fmt.Errorf("marshal: %w", err))
	}
	return b
}
