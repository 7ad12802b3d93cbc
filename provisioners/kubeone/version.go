package kubeone

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Release is a KubeOne release as `kubeone version` reports it.
type Release struct {
	// Binary is the executable asked (absolute).
	Binary string
	// GitVersion is what the binary says it is: "1.8.1" for a release
	// binary, "v1.8.1-3-gabc" for one built from a git checkout, "dev"
	// for a build without a version.
	GitVersion string
	// Major, Minor and Patch are GitVersion's numbers; Known is false when
	// GitVersion names no release (a dev build).
	Major, Minor, Patch int
	Known               bool
}

func (r Release) String() string {
	return fmt.Sprintf("kubeone %s (%s)", r.GitVersion, r.Binary)
}

// MinRelease is the oldest KubeOne release the hub runs: its manifests
// authenticate with an SSH certificate (sshCertFile, KubeOne 1.8 and
// later) and pin the bastion's host key (bastionHostPublicKey, 1.6).
const MinRelease = "1.8"

// kubernetesMinors is, per KubeOne release, the Kubernetes minors it
// installs: its own validation's constraints (pkg/apis/kubeone/validation,
// lowerVersionConstraint/upperVersionConstraint, later
// MinimumSupportedVersion/MaximumSupportedVersion), which refuse any
// other version at apply. An entry holds from its patch release on.
var kubernetesMinors = []struct{ minor, fromPatch, lo, hi int }{
	{8, 0, 27, 29}, {8, 1, 27, 30},
	{9, 0, 29, 31},
	{10, 0, 30, 32},
	{11, 0, 30, 33},
	{12, 0, 32, 34},
	{13, 0, 33, 35},
	{14, 0, 34, 36},
}

// KubernetesMinors returns the Kubernetes minors the release installs,
// 1.lo to 1.hi; ok is false for a release the table does not know (older
// than MinRelease, newer than this hub, or a dev build).
func (r Release) KubernetesMinors() (lo, hi int, ok bool) {
	if !r.Known || r.Major != 1 {
		return 0, 0, false
	}
	for _, e := range kubernetesMinors {
		if e.minor == r.Minor && e.fromPatch <= r.Patch {
			lo, hi, ok = e.lo, e.hi, true
		}
	}
	return lo, hi, ok
}

// TooOld reports whether the release predates MinRelease.
func (r Release) TooOld() bool {
	return r.Known && (r.Major < 1 || r.Major == 1 && r.Minor < 8)
}

// KnownKubernetesMinors is the union of what the releases the hub knows
// install: the most a version can be checked against when the hub's own
// kubeone cannot be asked.
func KnownKubernetesMinors() (lo, hi int) {
	lo, hi = kubernetesMinors[0].lo, kubernetesMinors[0].hi
	for _, e := range kubernetesMinors {
		lo, hi = min(lo, e.lo), max(hi, e.hi)
	}
	return lo, hi
}

// ReleasesFor names the releases the hub knows that install Kubernetes
// 1.minor, e.g. "1.12 to 1.14" (or "" if none does); a release whose
// range grew in a patch release is named from that patch on ("1.8.1").
func ReleasesFor(minor int) string {
	var rel []string
	seen := map[int]bool{}
	for _, e := range kubernetesMinors {
		if seen[e.minor] || e.lo > minor || minor > e.hi {
			continue
		}
		seen[e.minor] = true
		if e.fromPatch > 0 {
			rel = append(rel, fmt.Sprintf("1.%d.%d", e.minor, e.fromPatch))
		} else {
			rel = append(rel, fmt.Sprintf("1.%d", e.minor))
		}
	}
	switch len(rel) {
	case 0:
		return ""
	case 1:
		return rel[0]
	}
	return rel[0] + " to " + rel[len(rel)-1]
}

// versionTimeout bounds `kubeone version`.
const versionTimeout = 10 * time.Second

// versionOutput is the JSON `kubeone version` prints: k8s.io/apimachinery
// version.Info of KubeOne and of the machine-controller it deploys.
type versionOutput struct {
	KubeOne *struct {
		Major      string `json:"major"`
		Minor      string `json:"minor"`
		GitVersion string `json:"gitVersion"`
	} `json:"kubeone"`
}

var releaseVersion = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)`)

// Version runs `kubeone version` and returns the release it reports.
// Errors wrap ErrNoBinary when there is no executable to ask.
func (r *Runner) Version(ctx context.Context) (Release, error) {
	bin, err := r.Binary()
	if err != nil {
		return Release{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "version")
	var out, errOut bytes.Buffer
	cmd.Env, cmd.Stdout, cmd.Stderr = r.cfg.Env, &limitWriter{b: &out, n: 64 << 10}, &limitWriter{b: &errOut, n: 4 << 10}
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return Release{}, fmt.Errorf("kubeone: %s version: %w: %s", bin, err, strings.TrimSpace(errOut.String()))
	}
	return ParseVersion(bin, out.Bytes())
}

// ParseVersion reads what `kubeone version` printed.
func ParseVersion(bin string, out []byte) (Release, error) {
	var v versionOutput
	if err := json.Unmarshal(out, &v); err != nil || v.KubeOne == nil {
		return Release{}, fmt.Errorf("kubeone: %s version printed no KubeOne version JSON (is it KubeOne?): %.200q", bin, out)
	}
	rel := Release{Binary: bin, GitVersion: v.KubeOne.GitVersion}
	if m := releaseVersion.FindStringSubmatch(v.KubeOne.GitVersion); m != nil {
		rel.Major, _ = strconv.Atoi(m[1])
		rel.Minor, _ = strconv.Atoi(m[2])
		rel.Patch, _ = strconv.Atoi(m[3])
		rel.Known = true
		return rel, nil
	}
	// A version the semver parser took, but not X.Y.Z: KubeOne still
	// filled major and minor.
	major, err1 := strconv.Atoi(v.KubeOne.Major)
	minor, err2 := strconv.Atoi(v.KubeOne.Minor)
	if errors.Join(err1, err2) == nil {
		rel.Major, rel.Minor, rel.Known = major, minor, true
	}
	return rel, nil
}

// limitWriter keeps the first n bytes written and drops the rest.
type limitWriter struct {
	b *bytes.Buffer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
