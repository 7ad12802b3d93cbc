// Package onboard is the hub's side of onboarding machines already in the
// field: which OS profile fits a machine (Match), and the cloud-init
// user-data rendered from the profile's template (Render) that installs
// the agent with the node identity the hub just issued.
//
// The user-data carries no secret: the machine made its key itself and
// keeps it (the onboarding CLI writes StateDir/node.key); what is rendered
// is the certificate, the CAs, the agent's config, its labels, its unit
// and the commands that start it, in the shape onboardproto.UserData documents
// (write_files and runcmd only), so that cloud-init and the onboarding CLI
// apply it alike.
package onboard

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// Where the rendered files go on the machine. StateDir is the state dir
// the packaged unit runs `tether-edge run --state-dir` with; the files in
// it are the layout the agent reads (the same join writes): node.crt,
// ca.crt, node_ca.crt, node.json (written last: without it the agent is
// "not joined"), and node.key, which only the onboarding CLI writes.
const (
	StateDir   = "/var/lib/tether-edge"
	UnitPath   = "/etc/systemd/system/tether-edge.service"
	LabelsPath = "/etc/tether/labels" // the agent's default labels file
)

// ErrNoProfile is wrapped by Match when no profile fits.
var ErrNoProfile = errors.New("no OS profile fits this machine")

// How a profile matched (OnboardResponse.MatchedBy).
const (
	MatchedByVersion = "version"
	MatchedByFamily  = "family"
)

// Match picks the profile for a machine running distro (os-release ID) at
// version (VERSION_ID) whose ID_LIKE is idLike: the profile with that
// distro and version; else one whose family is the machine's distro or
// one of the ID_LIKE words (a profile of the machine's own distro first,
// its newest version first; then by name). The error lists the profiles that exist.
func Match(profiles []store.OSProfile, distro, version, idLike string) (store.OSProfile, string, error) {
	for _, p := range profiles {
		if p.Distro == distro && p.Version == version && distro != "" {
			return p, MatchedByVersion, nil
		}
	}
	family := strings.Fields(idLike)
	var fits []store.OSProfile
	for _, p := range profiles {
		if p.Family != "" && (p.Family == distro || slices.Contains(family, p.Family)) {
			fits = append(fits, p)
		}
	}
	slices.SortStableFunc(fits, func(a, b store.OSProfile) int {
		if (a.Distro == distro) != (b.Distro == distro) {
			if a.Distro == distro {
				return -1
			}
			return 1
		}
		if a.Distro == distro && b.Distro == distro {
			if c := compareVersions(b.Version, a.Version); c != 0 {
				return c // the newest release of the machine's own distro
			}
		}
		return strings.Compare(a.Name, b.Name)
	})
	if len(fits) > 0 {
		return fits[0], MatchedByFamily, nil
	}
	have := make([]string, 0, len(profiles))
	for _, p := range profiles {
		s := fmt.Sprintf("%s (%s %s", p.Name, p.Distro, p.Version)
		if p.Family != "" {
			s += ", family " + p.Family
		}
		have = append(have, s+")")
	}
	list := "none exist"
	if len(have) > 0 {
		list = "the hub has: " + strings.Join(have, "; ")
	}
	return store.OSProfile{}, "", fmt.Errorf("%w: %q version %q (ID_LIKE %q) matches no profile by distro and "+
		"version, nor by family; %s. Add one with `tether osprofile add NAME --distro %s --version %s`",
		ErrNoProfile, distro, version, idLike, list, orDash(distro), orDash(version))
}

// compareVersions compares dotted versions part by part, numerically where
// both parts are numbers ("9" < "10", "22.04" < "24.04").
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		na, errA := strconv.Atoi(pa[i])
		nb, errB := strconv.Atoi(pb[i])
		var c int
		if errA == nil && errB == nil {
			c = na - nb
		} else {
			c = strings.Compare(pa[i], pb[i])
		}
		if c != 0 {
			return c
		}
	}
	return len(pa) - len(pb)
}

func orDash(s string) string {
	if s == "" {
		return "DISTRO"
	}
	return s
}

// Data is what a profile's template is rendered with. Every field is
// documented in docs/onboarding.md ("Cloud-init templates").
type Data struct {
	NodeID string   // the node's ID
	Name   string   // the node's name
	Hubs   []string // hub addresses the agent dials
	// Profile is the OS profile's name; MatchedBy how it matched.
	Profile   string
	MatchedBy string
	// The agent's files, rendered by the hub.
	StateDir   string            // StateDir
	Cert       string            // PEM chain, leaf first (StateDir/node.crt)
	CA         string            // PEM, the hub's CA (StateDir/ca.crt)
	NodeCA     string            // PEM, the root node certificates chain to (StateDir/node_ca.crt)
	NodeConfig string            // JSON, the agent's node.json (StateDir/node.json)
	Labels     map[string]string // the node's labels on the hub
	// LabelsFile holds the labels asked for on site, KEY=VALUE lines (LabelsPath): the node's own
	// word, reported back, never selected on.
	LabelsFile string
	LabelsPath string // LabelsPath
	Unit       string // the agent's systemd unit (packaging.EdgeUnit)
	UnitPath   string // UnitPath
	// What the machine reported.
	Facts   control.Facts
	Machine onboardproto.MachineFacts
}

//go:embed default.yaml.tmpl
var defaultTemplate string

// DefaultTemplate is the template of profiles that name none.
func DefaultTemplate() string { return defaultTemplate }

// funcs are the template functions besides text/template's own:
// b64 (base64 of a string, for `encoding: b64`), quote (a YAML/JSON
// double-quoted string), indent N (every line but the first indented
// by N spaces, for block scalars) and nodeenv (nodeEnv; bound to the
// node's data when rendering).
var funcs = template.FuncMap{
	"b64":   func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"quote": strconv.Quote,
	"indent": func(n int, s string) string {
		return strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", n))
	},
	"nodeenv": func() string { return "" },
}

// nodeEnv is what {{nodeenv}} renders: the first items of a runcmd argv
// list that run the rest with the node's name and ID in its environment,
// as jobs and missions see them:
//
//	runcmd:
//	  - [{{nodeenv}}, /usr/local/sbin/site-setup]
//
// renders [env, "TETHER_NODE=n7", "TETHER_NODE_ID=…", /usr/local/sbin/site-setup].
// runcmd entries are argv lists, run without a shell by cloud-init and by
// tether-edge onboard --apply alike, so env(1) in the entry is the one way
// both give a command an environment.
func nodeEnv(d Data) string {
	return "env, " + strconv.Quote("TETHER_NODE="+d.Name) + ", " + strconv.Quote("TETHER_NODE_ID="+d.NodeID)
}

// Parse parses a template ("" is the default).
func Parse(text string) (*template.Template, error) {
	if text == "" {
		text = defaultTemplate
	}
	t, err := template.New("cloud-init").Funcs(funcs).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("onboard: template: %w", err)
	}
	return t, nil
}

// Render renders text ("" is the default template) with d and checks the
// result is user-data of the allowed shape (onboardproto.ParseUserData).
func Render(text string, d Data) (string, error) {
	t, err := Parse(text)
	if err != nil {
		return "", err
	}
	t.Funcs(template.FuncMap{"nodeenv": func() string { return nodeEnv(d) }})
	var out bytes.Buffer
	if err := t.Execute(&limitWriter{w: &out, left: onboardproto.MaxUserData}, d); err != nil {
		return "", fmt.Errorf("onboard: render template: %w", err)
	}
	if _, err := onboardproto.ParseUserData(out.String()); err != nil {
		return "", fmt.Errorf("onboard: rendered template is not valid onboarding user-data: %w", err)
	}
	return out.String(), nil
}

// limitWriter fails once more than left bytes are written, so that a
// template looping without end stops at the size user-data may have.
type limitWriter struct {
	w    *bytes.Buffer
	left int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if len(p) > l.left {
		return 0, fmt.Errorf("output larger than %d bytes", onboardproto.MaxUserData)
	}
	l.left -= len(p)
	return l.w.Write(p)
}

// Validate checks a template before it is stored: it parses, renders with
// SampleData, and the result is user-data of the allowed shape.
func Validate(text string) error {
	_, err := Render(text, SampleData())
	return err
}

// SampleData is data of the right shape to try a template with.
func SampleData() Data {
	labels := map[string]string{"site": "berlin"}
	return Data{
		NodeID: "0123456789abcdef", Name: "sample-node", Hubs: []string{"hub.example:7443"},
		Profile: "sample", MatchedBy: MatchedByVersion,
		StateDir: StateDir, Cert: samplePEM, CA: samplePEM, NodeCA: samplePEM,
		NodeConfig: `{"node_id":"0123456789abcdef","name":"sample-node","hubs":["hub.example:7443"],"joined_at":"` +
			time.Unix(0, 0).UTC().Format(time.RFC3339) + `"}`,
		Labels: labels, LabelsFile: LabelsFile(labels), LabelsPath: LabelsPath,
		Unit: "[Unit]\nDescription=sample\n", UnitPath: UnitPath,
		Facts: control.Facts{Hostname: "sample", OSID: "debian", OSVersion: "12", Arch: "amd64"},
		Machine: onboardproto.MachineFacts{UUID: "00000000-0000-0000-0000-000000000000",
			UUIDSource: "/sys/class/dmi/id/product_uuid", OSIDLike: "debian"},
	}
}

const samplePEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

// LabelsFile renders labels as the agent's labels file: KEY=VALUE lines,
// sorted.
func LabelsFile(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("# Set by the Tether hub at onboarding.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, labels[k])
	}
	return b.String()
}
