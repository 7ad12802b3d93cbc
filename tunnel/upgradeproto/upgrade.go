// Package upgradeproto is the upgrade contract: the verbs the hub runs over
// SSH on a node (the node-side updater, `tether-edge upgrade …`), the
// documents they take and print, the per-node state machine, and the
// Tether OCI artifacts both ends read. It is not the tunnel: the hub's
// upgrade drive (provisioners/upgrade) calls the verbs and the agent's
// updater (edge/upgrade) answers them; both import this package, which
// imports nothing of either. A node also reports its states on the control
// stream (TypeState), which package control carries.
//
// The hub pins an artifact by digest when an upgrade is created, fetches
// its blobs once, and drives each node over SSH (as it runs jobs), calling
// the agent executable the node announced in Hello.Upgrade:
//
//	EXE upgrade offer  --state-dir DIR                 stdin: Offer (JSON)
//	                                                   stdout: NodeState (JSON)
//	(the hub uploads each file of the manifest to IncomingDir(DIR, NAME)/<hex digest>)
//	EXE upgrade apply  --state-dir DIR NAME [--confirmed-by WHO]
//	                                                   stdout: NodeState (JSON);
//	                                                   a bundle's script output on stderr
//	EXE upgrade status --state-dir DIR [NAME]          stdout: []NodeState (JSON)
//	EXE upgrade cancel --state-dir DIR NAME            stdout: NodeState (JSON)
//
// The node trusts nothing the hub says about the files: apply checks that
// the manifest hashes to the pinned digest (through the index for agent
// artifacts) and that every received file hashes to its layer's digest
// before anything runs or is switched in. The node persists its
// NodeState (atomic writes) and reports every change on the control
// stream (TypeState) to a hub whose welcome lists HubCapUpgrades;
// `tether-edge confirm` on the node moves a waiting upgrade on by itself.
package upgradeproto

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// Kind is what an upgrade replaces.
type Kind string

const (
	// KindAgent replaces the tether-edge agent itself (one binary per
	// OS/architecture in a multi-arch index).
	KindAgent Kind = "agent"
	// KindBundle installs software on the node: an install script plus
	// payload files, with optional health and rollback scripts.
	KindBundle Kind = "bundle"
)

// Step is a node's place in the per-node upgrade state machine.
type Step string

// The steps, in order. Failed and RolledBack carry a reason. Skipped and
// Cancelled are the hub's own: a node already at the target, a node the
// rollout never reached before it was cancelled.
const (
	StepPending              Step = "pending"
	StepAwaitingConfirmation Step = "awaiting_confirmation"
	StepDownloading          Step = "downloading"
	StepVerifying            Step = "verifying"
	StepInstalling           Step = "installing"
	StepHealthCheck          Step = "health_check"
	StepSucceeded            Step = "succeeded"
	StepFailed               Step = "failed"
	StepRolledBack           Step = "rolled_back"
	StepSkipped              Step = "skipped"
	StepCancelled            Step = "cancelled"
)

// upgradeMoves is the state machine: the steps each step may move to.
var upgradeMoves = map[Step][]Step{
	StepPending:              {StepAwaitingConfirmation, StepDownloading, StepFailed, StepSkipped, StepCancelled},
	StepAwaitingConfirmation: {StepDownloading, StepFailed, StepCancelled},
	StepDownloading:          {StepVerifying, StepFailed, StepCancelled},
	StepVerifying:            {StepInstalling, StepFailed, StepCancelled},
	StepInstalling:           {StepHealthCheck, StepSucceeded, StepFailed, StepRolledBack},
	StepHealthCheck:          {StepSucceeded, StepFailed, StepRolledBack},
	StepSucceeded:            nil,
	StepFailed:               nil,
	StepRolledBack:           nil,
	StepSkipped:              nil,
	StepCancelled:            nil,
}

// Valid reports whether s is a known step.
func (s Step) Valid() bool {
	_, ok := upgradeMoves[s]
	return ok
}

// Terminal reports whether s ends the node's upgrade.
func (s Step) Terminal() bool {
	m, ok := upgradeMoves[s]
	return ok && len(m) == 0
}

// CanMove reports whether the state machine allows from -> to.
func CanMove(from, to Step) bool {
	for _, s := range upgradeMoves[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Media types and annotations of Tether's OCI artifacts.
const (
	MediaTypeOCIManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeOCIIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeOCIEmpty    = "application/vnd.oci.empty.v1+json"

	// ArtifactTypeAgent marks an agent artifact: an index whose manifests
	// (one per platform) each carry one MediaTypeAgentBinary layer.
	ArtifactTypeAgent = "application/vnd.tether.agent.v1"
	// ArtifactTypeBundle marks a bundle: one manifest whose layers are
	// files (MediaTypeBundleFile) named by AnnotationTitle, among them
	// BundleInstall and optionally BundleHealth and BundleRollback.
	ArtifactTypeBundle = "application/vnd.tether.bundle.v1"

	MediaTypeAgentBinary = "application/vnd.tether.agent.binary.v1"
	MediaTypeBundleFile  = "application/vnd.tether.bundle.file.v1"

	// AnnotationVersion (on a manifest or index) is the artifact's version:
	// the agent's version string for agent artifacts.
	AnnotationVersion = "dev.tether.version"
	// AnnotationTitle names a layer's file.
	AnnotationTitle = "org.opencontainers.image.title"
)

// The bundle files the node gives a meaning to; every other file is payload,
// placed beside them.
const (
	BundleInstall  = "install.sh"
	BundleHealth   = "health.sh"
	BundleRollback = "rollback.sh"
)

// Bounds of what the node accepts.
const (
	MaxArtifactManifest = 256 << 10 // bytes of a manifest or index
	MaxArtifactFiles    = 64        // layers of a bundle
	MaxArtifactFile     = 4 << 30   // bytes of one file
	maxUpgradeHistory   = 32
	maxReason           = 1024
)

// OCIPlatform is a descriptor's platform in an index.
type OCIPlatform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

// OCIDescriptor is the part of an OCI descriptor Tether reads.
type OCIDescriptor struct {
	MediaType    string            `json:"mediaType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	ArtifactType string            `json:"artifactType,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	Platform     *OCIPlatform      `json:"platform,omitempty"`
}

// OCIManifest is the part of an OCI image manifest Tether reads.
type OCIManifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        OCIDescriptor     `json:"config"`
	Layers        []OCIDescriptor   `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// OCIIndex is the part of an OCI image index Tether reads.
type OCIIndex struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Manifests     []OCIDescriptor   `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// DigestOf is the OCI digest ("sha256:" + lowercase hex) of b.
func DigestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// ValidDigest reports whether d is "sha256:" and 64 lowercase hex digits.
func ValidDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// DigestHex is d's hex part (d must be valid): the file name under which
// blobs are stored and uploaded.
func DigestHex(d string) string { return strings.TrimPrefix(d, "sha256:") }

// File is one file of an artifact, as its manifest names it.
type File struct {
	Name   string `json:"name"` // AnnotationTitle; the agent binary is "tether-edge"
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// AgentBinaryName is the file name of an agent artifact's binary layer.
const AgentBinaryName = "tether-edge"

// Version is the artifact's AnnotationVersion.
func (m *OCIManifest) Version() string { return m.Annotations[AnnotationVersion] }

// Kind is the upgrade kind the manifest's artifact type stands for.
func (m *OCIManifest) Kind() Kind {
	if m.ArtifactType == ArtifactTypeAgent {
		return KindAgent
	}
	return KindBundle
}

// Files are the manifest's layers as files: for an agent artifact its one
// binary named AgentBinaryName, for a bundle each layer by its title.
func (m *OCIManifest) Files() []File {
	out := make([]File, 0, len(m.Layers))
	for _, l := range m.Layers {
		name := l.Annotations[AnnotationTitle]
		if m.ArtifactType == ArtifactTypeAgent {
			name = AgentBinaryName
		}
		out = append(out, File{Name: name, Digest: l.Digest, Size: l.Size})
	}
	return out
}

func decodeStrict(b []byte, v any) error {
	if len(b) > MaxArtifactManifest {
		return fmt.Errorf("%w: %d bytes, max %d", wirecheck.ErrBadMessage, len(b), MaxArtifactManifest)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", wirecheck.ErrBadMessage, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the JSON document", wirecheck.ErrBadMessage)
	}
	return nil
}

// validFileName: a plain file name (no directories, no dot files) a bundle
// may place in its directory.
func validFileName(s string) bool {
	if s == "" || len(s) > 128 || strings.HasPrefix(s, ".") || path.Base(s) != s {
		return false
	}
	for _, c := range s {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !letter && c != '.' && c != '-' && c != '_' && c != '+' {
			return false
		}
	}
	return true
}

func checkDescriptor(what string, d OCIDescriptor) error {
	if !ValidDigest(d.Digest) {
		return fmt.Errorf("%w: %s digest %.80q is not sha256:<64 hex>", wirecheck.ErrBadMessage, what, d.Digest)
	}
	if d.Size < 0 || d.Size > MaxArtifactFile {
		return fmt.Errorf("%w: %s size %d outside 0..%d", wirecheck.ErrBadMessage, what, d.Size, int64(MaxArtifactFile))
	}
	if err := wirecheck.String(what+" media type", d.MediaType, wirecheck.MaxShort); err != nil {
		return err
	}
	for k, v := range d.Annotations {
		if err := wirecheck.String(what+" annotation", k+v, wirecheck.MaxShort); err != nil {
			return err
		}
	}
	return nil
}

func checkVersion(v string) error {
	if v == "" {
		return fmt.Errorf(
			"%w: the artifact has no %s annotation (push it with `tether artifact push`)",
			wirecheck.ErrBadMessage,
			AnnotationVersion,
		)
	}
	if len(v) > 64 || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return fmt.Errorf("%w: version %.64q is not a short printable word", wirecheck.ErrBadMessage, v)
	}
	return nil
}

// ParseArtifactManifest decodes and checks a Tether artifact manifest: an
// OCI image manifest of ArtifactTypeAgent (exactly one binary layer) or
// ArtifactTypeBundle (uniquely named files, BundleInstall among them),
// with a version annotation.
func ParseArtifactManifest(b []byte) (*OCIManifest, error) {
	var m OCIManifest
	if err := decodeStrict(b, &m); err != nil {
		return nil, fmt.Errorf("artifact manifest: %w", err)
	}
	if m.SchemaVersion != 2 || (m.MediaType != "" && m.MediaType != MediaTypeOCIManifest) {
		return nil, fmt.Errorf(
			"artifact manifest: %w: not an OCI image manifest (schemaVersion %d, mediaType %.80q)",
			wirecheck.ErrBadMessage,
			m.SchemaVersion,
			m.MediaType,
		)
	}
	if err := checkVersion(m.Version()); err != nil {
		return nil, fmt.Errorf("artifact manifest: %w", err)
	}
	switch m.ArtifactType {
	case ArtifactTypeAgent:
		if len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypeAgentBinary {
			return nil, fmt.Errorf(
				"artifact manifest: %w: an agent artifact has exactly one %s layer",
				wirecheck.ErrBadMessage,
				MediaTypeAgentBinary,
			)
		}
	case ArtifactTypeBundle:
		if len(m.Layers) == 0 || len(m.Layers) > MaxArtifactFiles {
			return nil, fmt.Errorf(
				"artifact manifest: %w: a bundle has 1..%d files, not %d",
				wirecheck.ErrBadMessage,
				MaxArtifactFiles,
				len(m.Layers),
			)
		}
		seen := map[string]bool{}
		for _, l := range m.Layers {
			name := l.Annotations[AnnotationTitle]
			if l.MediaType != MediaTypeBundleFile || !validFileName(name) {
				return nil, fmt.Errorf(
					"artifact manifest: %w: bundle layer %.80q: want media type %s and a plain file name as %s",
					wirecheck.ErrBadMessage,
					name,
					MediaTypeBundleFile,
					AnnotationTitle,
				)
			}
			if seen[name] {
				return nil, fmt.Errorf("artifact manifest: %w: bundle file %q twice", wirecheck.ErrBadMessage, name)
			}
			seen[name] = true
		}
		if !seen[BundleInstall] {
			return nil, fmt.Errorf(
				"artifact manifest: %w: a bundle needs an %s",
				wirecheck.ErrBadMessage,
				BundleInstall,
			)
		}
	default:
		return nil, fmt.Errorf(
			"artifact manifest: %w: artifact type %.80q is neither %s nor %s",
			wirecheck.ErrBadMessage,
			m.ArtifactType,
			ArtifactTypeAgent,
			ArtifactTypeBundle,
		)
	}
	for i, l := range m.Layers {
		if err := checkDescriptor(fmt.Sprintf("layer %d", i), l); err != nil {
			return nil, fmt.Errorf("artifact manifest: %w", err)
		}
	}
	return &m, nil
}

// ParseArtifactIndex decodes and checks an agent artifact's index: an OCI
// image index of ArtifactTypeAgent whose manifests each name a platform.
func ParseArtifactIndex(b []byte) (*OCIIndex, error) {
	var ix OCIIndex
	if err := decodeStrict(b, &ix); err != nil {
		return nil, fmt.Errorf("artifact index: %w", err)
	}
	if ix.SchemaVersion != 2 || (ix.MediaType != "" && ix.MediaType != MediaTypeOCIIndex) {
		return nil, fmt.Errorf(
			"artifact index: %w: not an OCI image index (schemaVersion %d, mediaType %.80q)",
			wirecheck.ErrBadMessage,
			ix.SchemaVersion,
			ix.MediaType,
		)
	}
	if ix.ArtifactType != ArtifactTypeAgent {
		return nil, fmt.Errorf(
			"artifact index: %w: artifact type %.80q, want %s",
			wirecheck.ErrBadMessage,
			ix.ArtifactType,
			ArtifactTypeAgent,
		)
	}
	if len(ix.Manifests) == 0 || len(ix.Manifests) > MaxArtifactFiles {
		return nil, fmt.Errorf(
			"artifact index: %w: 1..%d manifests, not %d",
			wirecheck.ErrBadMessage,
			MaxArtifactFiles,
			len(ix.Manifests),
		)
	}
	seen := map[OCIPlatform]bool{}
	for i, d := range ix.Manifests {
		if err := checkDescriptor(fmt.Sprintf("manifest %d", i), d); err != nil {
			return nil, fmt.Errorf("artifact index: %w", err)
		}
		if d.Platform == nil || d.Platform.OS == "" || d.Platform.Architecture == "" {
			return nil, fmt.Errorf("artifact index: %w: manifest %d names no platform", wirecheck.ErrBadMessage, i)
		}
		if seen[*d.Platform] {
			return nil, fmt.Errorf(
				"artifact index: %w: platform %s/%s twice",
				wirecheck.ErrBadMessage,
				d.Platform.OS,
				d.Platform.Architecture,
			)
		}
		seen[*d.Platform] = true
	}
	return &ix, nil
}

// ForPlatform is the manifest descriptor for os/arch (GOOS/GOARCH names).
func (ix *OCIIndex) ForPlatform(goos, goarch string) (OCIDescriptor, error) {
	for _, d := range ix.Manifests {
		if d.Platform != nil && d.Platform.OS == goos && d.Platform.Architecture == goarch {
			return d, nil
		}
	}
	return OCIDescriptor{}, fmt.Errorf("artifact index has no agent for %s/%s", goos, goarch)
}

// Offer is what the hub hands a node for one upgrade.
type Offer struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Version is the target version (the manifest's AnnotationVersion);
	// FromVersion what the hub believes the node runs now.
	Version     string `json:"version"`
	FromVersion string `json:"from_version,omitempty"`
	// Digest is the digest pinned at creation: of Index for an agent
	// artifact, of Manifest for a bundle.
	Digest string `json:"digest"`
	// Index is the agent artifact's index; Manifest the manifest for the
	// node's platform (agent) or the bundle's manifest.
	Index    []byte `json:"index,omitempty"`
	Manifest []byte `json:"manifest"`
	// RequireConfirmation: the node waits in awaiting_confirmation until a
	// person confirms (on the hub, or with `tether-edge confirm`).
	RequireConfirmation bool `json:"require_confirmation,omitempty"`
	// AllowDowngrade lets an agent upgrade go to an older version.
	AllowDowngrade bool `json:"allow_downgrade,omitempty"`
	// HealthTimeoutSeconds bounds the health check: for an agent, the new
	// version must reconnect to the hub within it.
	HealthTimeoutSeconds int `json:"health_timeout_seconds,omitempty"`
}

// DefaultHealthTimeout is the health check's bound when an offer names none.
const DefaultHealthTimeout = 60 * time.Second

// ValidName reports whether s can name an upgrade: a lowercase DNS
// label with dots allowed (edge-1.4, os-patch-42), safe as a file name.
func ValidName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '.' || s[0] == '-' || strings.Contains(s, "..") {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Verify checks the offer's shape and that its documents hash to the
// pinned digest, and returns the manifest to install: the one thing a
// node may believe about the files it will receive.
func (o *Offer) Verify() (*OCIManifest, error) {
	if !ValidName(o.Name) {
		return nil, fmt.Errorf(
			"upgrade offer: %w: name %.80q is not a lowercase name of at most 63 characters",
			wirecheck.ErrBadMessage,
			o.Name,
		)
	}
	if o.Kind != KindAgent && o.Kind != KindBundle {
		return nil, fmt.Errorf(
			"upgrade offer: %w: kind %.32q is neither agent nor bundle",
			wirecheck.ErrBadMessage,
			o.Kind,
		)
	}
	if !ValidDigest(o.Digest) {
		return nil, fmt.Errorf(
			"upgrade offer: %w: no pinned digest (an upgrade without a digest is refused)",
			wirecheck.ErrBadMessage,
		)
	}
	if err := wirecheck.String("from_version", o.FromVersion, 64); err != nil {
		return nil, err
	}
	if o.HealthTimeoutSeconds < 0 || o.HealthTimeoutSeconds > 24*3600 {
		return nil, fmt.Errorf(
			"upgrade offer: %w: health timeout %ds outside 0..86400",
			wirecheck.ErrBadMessage,
			o.HealthTimeoutSeconds,
		)
	}
	manifestDigest := o.Digest
	if o.Kind == KindAgent {
		if got := DigestOf(o.Index); got != o.Digest {
			return nil, fmt.Errorf("upgrade offer: digest mismatch (want %s, got %s) for the index", o.Digest, got)
		}
		ix, err := ParseArtifactIndex(o.Index)
		if err != nil {
			return nil, fmt.Errorf("upgrade offer: %w", err)
		}
		found := false
		for _, d := range ix.Manifests {
			found = found || d.Digest == DigestOf(o.Manifest)
		}
		if !found {
			return nil, fmt.Errorf(
				"upgrade offer: digest mismatch (the index does not list the manifest %s)",
				DigestOf(o.Manifest),
			)
		}
		manifestDigest = DigestOf(o.Manifest)
	} else if len(o.Index) != 0 {
		return nil, fmt.Errorf("upgrade offer: %w: a bundle has no index", wirecheck.ErrBadMessage)
	}
	if got := DigestOf(o.Manifest); got != manifestDigest {
		return nil, fmt.Errorf("upgrade offer: digest mismatch (want %s, got %s) for the manifest", manifestDigest, got)
	}
	m, err := ParseArtifactManifest(o.Manifest)
	if err != nil {
		return nil, fmt.Errorf("upgrade offer: %w", err)
	}
	if m.Kind() != o.Kind {
		return nil, fmt.Errorf(
			"upgrade offer: %w: a %s upgrade, but the artifact is of kind %s",
			wirecheck.ErrBadMessage,
			o.Kind,
			m.Kind(),
		)
	}
	if m.Version() != o.Version {
		return nil, fmt.Errorf(
			"upgrade offer: %w: version %.64q, but the artifact says %.64q",
			wirecheck.ErrBadMessage,
			o.Version,
			m.Version(),
		)
	}
	return m, nil
}

// IncomingDir is where the hub uploads an upgrade's files on the
// node, each named by its digest's hex.
func IncomingDir(stateDir, name string) string {
	return path.Join(stateDir, "upgrades", name, "incoming")
}

// Transition is one move of a node's state machine.
type Transition struct {
	Step   Step      `json:"step"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// NodeState is a node's record of one upgrade: persisted on the node,
// reported to the hub, kept by the hub per node.
type NodeState struct {
	Name        string `json:"name"`
	Kind        Kind   `json:"kind"`
	Digest      string `json:"digest"`
	FromVersion string `json:"from_version,omitempty"`
	ToVersion   string `json:"to_version"`
	Step        Step   `json:"step"`
	// Reason says why the step is failed or rolled_back ("digest mismatch
	// (want …, got …)", "new version did not reconnect within 60s").
	Reason string `json:"reason,omitempty"`
	// ConfirmedBy is who said yes: an operator on the hub, or
	// "root@HOST (on the node)".
	ConfirmedBy string       `json:"confirmed_by,omitempty"`
	History     []Transition `json:"history,omitempty"`
	UpdatedAt   time.Time    `json:"updated_at"`
}

// ErrMove is returned for a move the state machine does not allow.
var ErrMove = fmt.Errorf("%w: upgrade step move not allowed", wirecheck.ErrBadMessage)

// Move takes the state machine one step, keeping the step's time and
// reason in History (the oldest entries beyond a bound are dropped).
func (s *NodeState) Move(to Step, reason string, at time.Time) error {
	if !CanMove(s.Step, to) {
		return fmt.Errorf("%w: %s -> %s", ErrMove, s.Step, to)
	}
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	s.Step, s.Reason, s.UpdatedAt = to, reason, at.UTC()
	s.History = append(s.History, Transition{Step: to, At: at.UTC(), Reason: reason})
	if n := len(s.History); n > maxUpgradeHistory {
		s.History = append(s.History[:0:0], s.History[n-maxUpgradeHistory:]...)
	}
	return nil
}

// Validate checks a state's shape and bounds, as decoded from the node's
// disk or a report.
func (s *NodeState) Validate() error {
	if !ValidName(s.Name) {
		return fmt.Errorf("%w: upgrade name %.80q", wirecheck.ErrBadMessage, s.Name)
	}
	if s.Kind != KindAgent && s.Kind != KindBundle {
		return fmt.Errorf("%w: upgrade kind %.32q", wirecheck.ErrBadMessage, s.Kind)
	}
	if !ValidDigest(s.Digest) {
		return fmt.Errorf("%w: upgrade %s: digest %.80q", wirecheck.ErrBadMessage, s.Name, s.Digest)
	}
	if !s.Step.Valid() {
		return fmt.Errorf("%w: upgrade %s: unknown step %.32q", wirecheck.ErrBadMessage, s.Name, s.Step)
	}
	fields := map[string]string{"from_version": s.FromVersion, "to_version": s.ToVersion, "confirmed_by": s.ConfirmedBy}
	for field, v := range fields {
		if err := wirecheck.String(field, v, wirecheck.MaxShort); err != nil {
			return err
		}
	}
	if err := wirecheck.String("reason", s.Reason, maxReason); err != nil {
		return err
	}
	if len(s.History) > maxUpgradeHistory {
		return fmt.Errorf(
			"%w: upgrade %s: more than %d history entries",
			wirecheck.ErrBadMessage,
			s.Name,
			maxUpgradeHistory,
		)
	}
	for _, h := range s.History {
		if !h.Step.Valid() {
			return fmt.Errorf("%w: upgrade %s: unknown step %.32q in history", wirecheck.ErrBadMessage, s.Name, h.Step)
		}
		if err := wirecheck.String("reason", h.Reason, maxReason); err != nil {
			return err
		}
	}
	return nil
}

// Support is how the hub reaches an agent's node-side updater
// (Hello.Upgrade, with CapUpgrade).
type Support struct {
	// Exe is the absolute path of the tether-edge executable the hub runs
	// over SSH for the upgrade commands (the launcher, which runs the
	// current installed version).
	Exe string `json:"exe"`
	// Previous is the last good version the node would roll back to.
	Previous string `json:"previous,omitempty"`
}

// CapUpgrade: the agent has the node-side updater; Hello.Upgrade says how
// to call it.
const CapUpgrade = "upgrade"

// HubCapUpgrades in Welcome.Capabilities: the hub takes TypeState.
const HubCapUpgrades = "upgrades"

// TypeState (agent -> hub) reports the node's upgrade records: all
// of them after the welcome, then each one when it changes. Sent only to a
// hub whose welcome lists HubCapUpgrades.
const TypeState = "upgrade_state"

const maxUpgradeStates = 64

// Validate checks a hello's upgrade section; nil (an agent without the
// updater) is valid.
func (u *Support) Validate() error {
	if u == nil {
		return nil
	}
	if err := wirecheck.String("upgrade exe", u.Exe, wirecheck.MaxShort); err != nil {
		return err
	}
	if !strings.HasPrefix(u.Exe, "/") || path.Clean(u.Exe) != u.Exe {
		return fmt.Errorf("%w: upgrade exe %q is not a clean absolute path", wirecheck.ErrBadMessage, u.Exe)
	}
	return wirecheck.String("upgrade previous", u.Previous, 64)
}

// ValidateStates checks the records of one upgrade_state message.
func ValidateStates(states []NodeState) error {
	if len(states) == 0 || len(states) > maxUpgradeStates {
		return fmt.Errorf(
			"%w: upgrade_state with %d records (1..%d)",
			wirecheck.ErrBadMessage,
			len(states),
			maxUpgradeStates,
		)
	}
	for i := range states {
		if err := states[i].Validate(); err != nil {
			return err
		}
	}
	return nil
}

// CompareVersions orders semver-like versions ("v1.4.0", "1.4.0-rc1",
// "1.10"): dotted numbers compared numerically, a pre-release ("-…") before
// its release. A version that does not start with a number after an
// optional "v" (a "dev" build, a commit hash) is no version: ok is false.
// Nor is a bare number without a "v" ("6461132"): a short commit hash can be
// all digits, and taking it as major version 6461132 would make every real
// release look like a downgrade. Hub and node both use it, so they agree on what a downgrade is.
func CompareVersions(a, b string) (cmp int, ok bool) {
	pa, prea, oka := parseVersion(a)
	pb, preb, okb := parseVersion(b)
	if !oka || !okb {
		return 0, false
	}
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if x != y {
			if x < y {
				return -1, true
			}
			return 1, true
		}
	}
	switch {
	case prea == preb:
		return 0, true
	case prea == "":
		return 1, true
	case preb == "":
		return -1, true
	case prea < preb:
		return -1, true
	}
	return 1, true
}

func parseVersion(v string) (nums []int, pre string, ok bool) {
	prefixed := strings.HasPrefix(v, "v")
	v = strings.TrimPrefix(v, "v")
	v, _, _ = strings.Cut(v, "+")
	v, pre, _ = strings.Cut(v, "-")
	for _, p := range strings.Split(v, ".") {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return nil, "", false
		}
		nums = append(nums, x)
	}
	if len(nums) == 1 && !prefixed {
		return nil, "", false
	}
	return nums, pre, len(nums) > 0
}
