package upgradeproto

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

func testAgentArtifact(t testing.TB, version string) (index, manifest []byte) {
	t.Helper()
	bin := OCIDescriptor{MediaType: MediaTypeAgentBinary, Digest: DigestOf([]byte("binary " + version)), Size: 13}
	m := OCIManifest{SchemaVersion: 2, MediaType: MediaTypeOCIManifest, ArtifactType: ArtifactTypeAgent,
		Config: OCIDescriptor{MediaType: MediaTypeOCIEmpty, Digest: DigestOf([]byte("{}")), Size: 2},
		Layers: []OCIDescriptor{bin}, Annotations: map[string]string{AnnotationVersion: version}}
	manifest, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	ix := OCIIndex{SchemaVersion: 2, MediaType: MediaTypeOCIIndex, ArtifactType: ArtifactTypeAgent,
		Manifests: []OCIDescriptor{
			{MediaType: MediaTypeOCIManifest, Digest: DigestOf(manifest), Size: int64(len(manifest)),
				Platform: &OCIPlatform{OS: "linux", Architecture: "amd64"}},
		},
		Annotations: map[string]string{AnnotationVersion: version}}
	index, err = json.Marshal(ix)
	if err != nil {
		t.Fatal(err)
	}
	return index, manifest
}

func testBundleManifest(t testing.TB, files ...string) []byte {
	t.Helper()
	m := OCIManifest{SchemaVersion: 2, MediaType: MediaTypeOCIManifest, ArtifactType: ArtifactTypeBundle,
		Config:      OCIDescriptor{MediaType: MediaTypeOCIEmpty, Digest: DigestOf([]byte("{}")), Size: 2},
		Annotations: map[string]string{AnnotationVersion: "42"}}
	for _, f := range files {
		m.Layers = append(
			m.Layers,
			OCIDescriptor{MediaType: MediaTypeBundleFile, Digest: DigestOf([]byte(f)), Size: int64(len(f)),
				Annotations: map[string]string{AnnotationTitle: f}},
		)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUpgradeOfferVerify(t *testing.T) {
	index, manifest := testAgentArtifact(t, "v1.4.0")
	bundle := testBundleManifest(t, BundleInstall, BundleHealth, "payload.deb")
	agent := Offer{
		Name:     "edge-1.4",
		Kind:     KindAgent,
		Version:  "v1.4.0",
		Digest:   DigestOf(index),
		Index:    index,
		Manifest: manifest,
	}
	cases := []struct {
		name   string
		change func(o *Offer)
		want   string // substring of the error; "" = valid
	}{
		{"agent", func(*Offer) {}, ""},
		{"bundle", func(o *Offer) {
			*o = Offer{Name: "os-patch-42", Kind: KindBundle, Version: "42", Digest: DigestOf(bundle), Manifest: bundle}
		}, ""},
		{"no digest", func(o *Offer) { o.Digest = "" }, "without a digest"},
		{
			"index tampered",
			func(o *Offer) { o.Index = append([]byte(nil), o.Index...); o.Index[len(o.Index)-2] = ' ' },
			"digest mismatch",
		},
		{"other manifest", func(o *Offer) { _, o.Manifest = testAgentArtifact(t, "v9") }, "does not list the manifest"},
		{"version lie", func(o *Offer) { o.Version = "v2" }, "artifact says"},
		{
			"kind lie",
			func(o *Offer) { o.Kind = KindBundle; o.Index = nil; o.Digest = DigestOf(o.Manifest) },
			"artifact is of kind agent",
		},
		{"bad name", func(o *Offer) { o.Name = "../etc" }, "name"},
		{"negative timeout", func(o *Offer) { o.HealthTimeoutSeconds = -1 }, "health timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := agent
			tc.change(&o)
			m, err := o.Verify()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if len(m.Files()) == 0 {
					t.Fatal("no files")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseArtifactManifestRejects(t *testing.T) {
	cases := map[string][]byte{
		"no install":     testBundleManifest(t, "payload.deb"),
		"path in title":  testBundleManifest(t, BundleInstall, "../x"),
		"dot file":       testBundleManifest(t, BundleInstall, ".bashrc"),
		"duplicate file": testBundleManifest(t, BundleInstall, BundleInstall),
		"not json":       []byte("{"),
		"trailing":       append(testBundleManifest(t, BundleInstall), []byte(" {}")...),
		"docker v2": []byte(
			`{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","layers":[]}`,
		),
		"no version": []byte(`{"schemaVersion":2,"artifactType":"application/vnd.tether.bundle.v1","layers":[]}`),
	}
	for name, b := range cases {
		if _, err := ParseArtifactManifest(b); !errors.Is(err, wirecheck.ErrBadMessage) {
			t.Errorf("%s: err = %v, want wirecheck.ErrBadMessage", name, err)
		}
	}
}

func TestUpgradeStateMachine(t *testing.T) {
	s := NodeState{Name: "edge-1.4", Kind: KindAgent, Digest: DigestOf(nil), ToVersion: "v1.4.0", Step: StepPending}
	at := time.Unix(1700000000, 0)
	steps := []Step{
		StepAwaitingConfirmation, StepDownloading, StepVerifying, StepInstalling, StepHealthCheck, StepRolledBack,
	}
	for _, step := range steps {
		if err := s.Move(step, "", at); err != nil {
			t.Fatalf("move to %s: %v", step, err)
		}
	}
	if !s.Step.Terminal() || len(s.History) != 6 {
		t.Fatalf("state %+v", s)
	}
	if err := s.Move(StepSucceeded, "", at); !errors.Is(err, ErrMove) {
		t.Fatalf("move out of a terminal step: %v", err)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for from := range upgradeMoves {
		for _, to := range upgradeMoves[from] {
			if !to.Valid() {
				t.Errorf("%s -> unknown %s", from, to)
			}
		}
	}
	if CanMove(StepPending, StepInstalling) {
		t.Error("pending must not skip verification")
	}
}

// FuzzUpgradeOffer decodes an offer as the node does and verifies it:
// never a panic, and a verified offer's files are safe to place by name.
func FuzzUpgradeOffer(f *testing.F) {
	index, manifest := testAgentArtifact(f, "v1.4.0")
	good, _ := json.Marshal(
		Offer{
			Name:     "edge-1.4",
			Kind:     KindAgent,
			Version:  "v1.4.0",
			Digest:   DigestOf(index),
			Index:    index,
			Manifest: manifest,
		},
	)
	bundle := testBundleManifest(f, BundleInstall, "p.deb")
	goodBundle, _ := json.Marshal(
		Offer{Name: "b", Kind: KindBundle, Version: "42", Digest: DigestOf(bundle), Manifest: bundle},
	)
	for _, s := range [][]byte{
		good, goodBundle, []byte(`{}`), []byte(`{"name":"x","kind":"agent","digest":"sha256:00"}`), nil,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var o Offer
		if err := json.Unmarshal(body, &o); err != nil {
			return
		}
		m, err := o.Verify()
		if err != nil {
			return
		}
		if DigestOf(o.Manifest) != o.Digest && o.Kind == KindBundle {
			t.Fatal("verified a bundle whose manifest is not the pinned digest")
		}
		for _, file := range m.Files() {
			if !validFileName(file.Name) || !ValidDigest(file.Digest) {
				t.Fatalf("verified file %+v", file)
			}
		}
	})
}

// FuzzArtifactDocuments decodes manifests and indexes as hub and node do.
func FuzzArtifactDocuments(f *testing.F) {
	index, manifest := testAgentArtifact(f, "v1")
	f.Add(index)
	f.Add(manifest)
	f.Add(testBundleManifest(f, BundleInstall, BundleRollback))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := ParseArtifactManifest(b); err == nil {
			for _, file := range m.Files() {
				if !validFileName(file.Name) {
					t.Fatalf("file name %q", file.Name)
				}
			}
		}
		if ix, err := ParseArtifactIndex(b); err == nil {
			if _, err := ix.ForPlatform("linux", "amd64"); err != nil && len(ix.Manifests) == 0 {
				t.Fatal("empty index parsed")
			}
		}
	})
}

// FuzzNodeUpgradeState decodes a node's state file or report record.
func FuzzNodeUpgradeState(f *testing.F) {
	f.Add(
		[]byte(
			`{"name":"edge-1.4","kind":"agent","digest":"sha256:` + strings.Repeat(
				"a",
				64,
			) + `","to_version":"v1","step":"pending"}`,
		),
	)
	f.Add([]byte(`{"name":"edge-1.4","step":"nope"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s NodeState
		if json.Unmarshal(b, &s) != nil || s.Validate() != nil {
			return
		}
		if !s.Step.Valid() || !ValidName(s.Name) {
			t.Fatalf("validated %+v", s)
		}
	})
}

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"v1.4.0", "v1.4.0", 0}, {"v1.4.0", "v1.10.0", -1}, {"1.4.1", "v1.4.0", 1}, {"v1.4.0-rc1", "v1.4.0", -1},
		{"v1.4", "v1.4.0", 0}, {"dev", "v1.0.0", 0}, {"1.0", "1.0.0-rc.1", 1}, {"v2.0.0+build5", "v1.9.9", 1},
		{"e6a0b55-dirty", "v1.0.0", 0}, {"6461132", "v1.0.0", 0}, {"v2", "v1.9", 1},
	} {
		if got, _ := CompareVersions(c.a, c.b); got != c.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestCompareVersionsNotVersions(t *testing.T) {
	for _, pair := range [][2]string{
		{"dev", "v1"}, {"v1", "e6a0b55-dirty"}, {"", "v1"}, {"v1..2", "v1"}, {"6461132", "9.9.9"},
		{"9.9.9-bench", "6461132-dirty"}, {"2", "v1"},
	} {
		if _, ok := CompareVersions(pair[0], pair[1]); ok {
			t.Errorf("CompareVersions(%q, %q) ordered a non-version", pair[0], pair[1])
		}
	}
}
