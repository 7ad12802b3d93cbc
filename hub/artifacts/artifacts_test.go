package artifacts_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// hubClient is a client as the hub has one: trusting the registry's CA,
// with its own blob store.
func hubClient(t *testing.T, reg *testenv.Registry, authFile string) (*artifacts.Client, *blobs.Store) {
	t.Helper()
	blobs, err := blobs.New(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if authFile == "" {
		authFile = writeFile(t, t.TempDir(), "config.json", "{}")
	}
	c, err := artifacts.New(artifacts.Config{CAFile: reg.CAFile, AuthFile: authFile, Blobs: blobs, Log: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c, blobs
}

func pushBundle(t *testing.T, reg *testenv.Registry, ref, version, install string) artifacts.Pushed {
	t.Helper()
	dir := t.TempDir()
	p, err := reg.PushBundle(context.Background(), ref, version, map[string]string{
		upgradeproto.BundleInstall: writeFile(t, dir, "i.sh", install),
		"payload.txt":              writeFile(t, dir, "payload.txt", "payload of "+version),
	})
	if err != nil {
		t.Fatalf("push bundle: %v", err)
	}
	return p
}

func blobContent(t *testing.T, b *blobs.Store, digest string) string {
	t.Helper()
	f, _, err := b.Open(upgradeproto.DigestHex(digest))
	if err != nil {
		t.Fatalf("blob %s: %v", digest, err)
	}
	defer f.Close()
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestResolveAgentByTagAndDigest(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	dir := t.TempDir()
	pushed, err := reg.PushAgent(ctx, reg.Ref("tether/edge:v1.4.0"), "v1.4.0", map[string]string{
		"linux/amd64": writeFile(t, dir, "amd64", "amd64 agent"),
		"linux/arm64": writeFile(t, dir, "arm64", "arm64 agent"),
	})
	if err != nil {
		t.Fatalf("push agent: %v", err)
	}
	c, blobs := hubClient(t, reg, "")
	for _, ref := range []string{reg.Ref("tether/edge:v1.4.0"), pushed.Pinned} {
		p, err := c.Resolve(ctx, ref)
		if err != nil {
			t.Fatalf("resolve %s: %v", ref, err)
		}
		if p.Digest != pushed.Digest || p.Kind != upgradeproto.KindAgent || p.Version != "v1.4.0" || p.Reference != ref {
			t.Fatalf("resolve %s: got %+v, want digest %s agent v1.4.0", ref, p, pushed.Digest)
		}
		if got := strings.Join(p.Platforms(), ","); got != "linux/amd64,linux/arm64" {
			t.Fatalf("platforms %q", got)
		}
		ix, m, files, err := p.ForPlatform("linux", "arm64")
		if err != nil {
			t.Fatal(err)
		}
		// What the hub hands a node must pass the node's own check.
		offer := upgradeproto.Offer{Name: "edge-1.4", Kind: p.Kind, Version: p.Version, Digest: p.Digest, Index: ix,
			Manifest: m}
		if _, err := offer.Verify(); err != nil {
			t.Fatalf("offer from the pinned artifact: %v", err)
		}
		if len(files) != 1 || files[0].Name != upgradeproto.AgentBinaryName {
			t.Fatalf("files %+v", files)
		}
		if err := c.Fetch(ctx, p, []string{"linux/arm64"}); err != nil {
			t.Fatal(err)
		}
		if got := blobContent(t, blobs, files[0].Digest); got != "arm64 agent" {
			t.Fatalf("fetched %q", got)
		}
		if _, _, _, err := p.ForPlatform("linux", "riscv64"); !errors.Is(err, artifacts.ErrNotFound) {
			t.Fatalf("missing platform: %v", err)
		}
	}
	// Only arm64 was asked for.
	p, _ := c.Resolve(ctx, pushed.Pinned)
	_, _, amd, _ := p.ForPlatform("linux", "amd64")
	if blobs.Has(upgradeproto.DigestHex(amd[0].Digest)) {
		t.Fatal("fetched a platform nobody asked for")
	}
}

func TestResolveBundleAndNotFound(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	pushed := pushBundle(t, reg, reg.Ref("patches/openssl:42"), "42", "#!/bin/sh\necho install\n")
	c, _ := hubClient(t, reg, "")
	p, err := c.Resolve(ctx, reg.Ref("patches/openssl:42"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != upgradeproto.KindBundle || p.Digest != pushed.Digest || p.Version != "42" || p.Index != nil {
		t.Fatalf("got %+v", p)
	}
	_, m, files, err := p.ForPlatform("linux", "amd64")
	if err != nil || upgradeproto.DigestOf(m) != p.Digest || len(files) != 2 {
		t.Fatalf("ForPlatform: %v %d files", err, len(files))
	}
	for _, ref := range []string{reg.Ref("patches/openssl:43"), reg.Ref("patches/nothing:1"),
		reg.Ref("patches/openssl@sha256:" + strings.Repeat("0", 64))} {
		if _, err := c.Resolve(ctx, ref); !errors.Is(err, artifacts.ErrNotFound) {
			t.Errorf("resolve %s: %v, want ErrNotFound", ref, err)
		}
	}
}

// A tag moved after the upgrade was created changes nothing: everything is
// fetched by the pinned digest.
func TestFetchAfterTagMoved(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ref := reg.Ref("patches/app:stable")
	pushBundle(t, reg, ref, "1", "echo one\n")
	c, blobs := hubClient(t, reg, "")
	p, err := c.Resolve(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	moved := pushBundle(t, reg, ref, "2", "echo two\n")
	if err := reg.MoveTag(ctx, ref, moved.Digest); err != nil {
		t.Fatal(err)
	}
	if err := c.Fetch(ctx, p, nil); err != nil {
		t.Fatal(err)
	}
	_, _, files, _ := p.ForPlatform("", "")
	for _, f := range files {
		if f.Name == upgradeproto.BundleInstall {
			if got := blobContent(t, blobs, f.Digest); got != "echo one\n" {
				t.Fatalf("install.sh after the tag moved: %q, want the pinned one", got)
			}
		}
	}
	if again, _ := c.Resolve(ctx, ref); again.Digest != moved.Digest {
		t.Fatalf("the tag did not move (%s); the test proves nothing", again.Digest)
	}
}

func TestFetchTamperedBlob(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ref := reg.Ref("patches/app:1")
	pushBundle(t, reg, ref, "1", "echo install\n")
	c, blobs := hubClient(t, reg, "")
	p, err := c.Resolve(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	_, _, files, _ := p.ForPlatform("", "")
	var install upgradeproto.File
	for _, f := range files {
		if f.Name == upgradeproto.BundleInstall {
			install = f
		}
	}
	if err := reg.TamperBlob(install.Digest); err != nil {
		t.Fatal(err)
	}
	err = c.Fetch(ctx, p, nil)
	if !errors.Is(err, artifacts.ErrDigestMismatch) ||
		!strings.Contains(err.Error(), "digest mismatch (want "+install.Digest+", got sha256:") {
		t.Fatalf("fetch of a tampered blob: %v, want digest mismatch (want %s, got …)", err, install.Digest)
	}
	if blobs.Has(upgradeproto.DigestHex(install.Digest)) {
		t.Fatal("the tampered blob was stored")
	}
	ents, _ := os.ReadDir(blobDir(t, blobs))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".upload-") {
			t.Fatalf("a temporary file of the tampered blob is left: %s", e.Name())
		}
	}
}

// blobDir finds the blob store's directory through a stored blob.
func blobDir(t *testing.T, b *blobs.Store) string {
	t.Helper()
	d, err := b.PutBytes([]byte("probe"))
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := b.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return filepath.Dir(f.Name())
}

// The hub pulls each blob once, however many nodes it serves.
func TestFetchOnce(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ref := reg.Ref("patches/app:1")
	pushBundle(t, reg, ref, "1", "echo install\n")
	c, _ := hubClient(t, reg, "")
	p, err := c.Resolve(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	_, _, files, _ := p.ForPlatform("", "")
	var want int64
	for _, f := range files {
		want += f.Size
	}
	before := reg.BlobBytesServed()
	for range 5 {
		if err := c.Fetch(ctx, p, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := reg.BlobBytesServed() - before; got != want {
		t.Fatalf("registry served %d blob bytes for 5 fetches, want %d (one artifact)", got, want)
	}
	if c.BytesFetched() < want {
		t.Fatalf("client counted %d bytes, less than the %d blob bytes", c.BytesFetched(), want)
	}
}

func TestCredentials(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{User: "ci", Password: "s3cret"})
	ref := reg.Ref("patches/app:1")
	pushBundle(t, reg, ref, "1", "echo install\n") // reg.Client has the right credentials
	wrong := filepath.Join(t.TempDir(), "config.json")
	if err := testenv.WriteDockerConfig(wrong, reg.Host, "ci", "wrong"); err != nil {
		t.Fatal(err)
	}
	for name, file := range map[string]string{"wrong password": wrong, "no credentials": ""} {
		c, _ := hubClient(t, reg, file)
		_, err := c.Resolve(ctx, ref)
		if !errors.Is(err, artifacts.ErrUnauthorized) || !strings.Contains(err.Error(), "--registry-auth") {
			t.Errorf("%s: %v, want ErrUnauthorized naming --registry-auth", name, err)
		}
	}
	c, _ := hubClient(t, reg, reg.AuthFile)
	if _, err := c.Resolve(ctx, ref); err != nil {
		t.Fatalf("right credentials: %v", err)
	}
}

func TestUntrustedRegistryCertificate(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ref := reg.Ref("patches/app:1")
	pushBundle(t, reg, ref, "1", "echo install\n")
	// The system roots only: the test CA is unknown.
	c, err := artifacts.New(artifacts.Config{AuthFile: writeFile(t, t.TempDir(), "config.json", "{}")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Resolve(ctx, ref)
	if !errors.Is(err, artifacts.ErrTLS) || !strings.Contains(err.Error(), "--registry-ca") {
		t.Fatalf("resolve against an untrusted certificate: %v, want ErrTLS naming --registry-ca", err)
	}
	// A CA file that is not one is refused at start.
	if _, err := artifacts.New(artifacts.Config{
		CAFile: writeFile(t, t.TempDir(), "ca.pem", "not a certificate"),
	}); err == nil {
		t.Fatal("a CA file without a certificate was accepted")
	}
	if _, err := artifacts.New(artifacts.Config{AuthFile: filepath.Join(t.TempDir(), "missing.json")}); err == nil {
		t.Fatal("a missing --registry-auth file was accepted")
	}
}

// Push refuses what the hub and nodes would refuse, before any byte goes.
func TestPushRefusesInvalid(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	dir := t.TempDir()
	f := writeFile(t, dir, "x", "x")
	cases := map[string]func() error{
		"bundle without install.sh": func() error {
			_, err := reg.PushBundle(ctx, reg.Ref("b/x:1"), "1", map[string]string{"payload": f})
			return err
		},
		"bad file name": func() error {
			_, err := reg.PushBundle(ctx, reg.Ref("b/x:1"), "1", map[string]string{upgradeproto.BundleInstall: f, "../evil": f})
			return err
		},
		"no version": func() error {
			_, err := reg.PushBundle(ctx, reg.Ref("b/x:1"), "", map[string]string{upgradeproto.BundleInstall: f})
			return err
		},
		"push by digest": func() error {
			_, err := reg.PushBundle(ctx, reg.Ref("b/x@sha256:"+strings.Repeat("a", 64)), "1",
				map[string]string{upgradeproto.BundleInstall: f})
			return err
		},
		"bad platform": func() error {
			_, err := reg.PushAgent(ctx, reg.Ref("a/x:1"), "1", map[string]string{"linux": f})
			return err
		},
		"no binary": func() error {
			_, err := reg.PushAgent(ctx, reg.Ref("a/x:1"), "1", nil)
			return err
		},
	}
	for name, push := range cases {
		if err := push(); err == nil {
			t.Errorf("%s: pushed", name)
		}
	}
	if n := reg.Requests(); n != 0 {
		t.Errorf("the registry got %d requests for refused pushes", n)
	}
}

// Rollouts that fetch the same artifact at the same time still cost the
// registry one copy.
func TestFetchConcurrentOnce(t *testing.T) {
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ref := reg.Ref("patches/app:1")
	pushBundle(t, reg, ref, "1", strings.Repeat("x", 1<<20))
	c, _ := hubClient(t, reg, "")
	p, err := c.Resolve(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	_, _, files, _ := p.ForPlatform("", "")
	var want int64
	for _, f := range files {
		want += f.Size
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- c.Fetch(ctx, p, nil) }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := reg.BlobBytesServed(); got != want {
		t.Fatalf("8 concurrent fetches: registry served %d blob bytes, want %d", got, want)
	}
}
