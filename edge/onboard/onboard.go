// Package onboard turns a machine already in the field into a Tether node:
// `tether-edge onboard`. It checks the machine's prerequisites, takes the
// hub's address, proxy and an onboarding credential (from a form or from
// flags, through one code path), collects hardware and OS facts, verifies
// the hub's CA by its fingerprint, and exchanges credential + facts + a CSR
// for a node identity and cloud-init user-data. It then writes that
// user-data for the next boot, or applies it now and waits for the agent to
// connect.
//
// The node key is made here and persisted before the hub is asked: a
// re-run after any failure sends the same key, which the hub recognises as
// the same machine, so a retry finishes the job instead of duplicating it.
package onboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// Mode is what happens with the user-data.
type Mode string

// Modes.
const (
	ModeApply     Mode = "apply"      // apply now and wait for the agent to connect
	ModeWriteOnly Mode = "write-only" // write the NoCloud seed for the next boot
)

// Config is one onboarding's inputs. Interactive runs start from the same
// values (flags, environment) and let the person change them.
type Config struct {
	Hub        string
	Proxy      Proxy
	Credential string
	CAPin      string // "sha256:HEX" or HEX; required without a Prompter
	Name       string
	Site       string
	Labels     map[string]string
	Mode       Mode
	// AskMode has the form ask for the mode (Mode preselected); false
	// when the command line chose it.
	AskMode bool
	Force   bool

	Machine      Machine
	CloudInitDir string        // NoCloud seed dir for ModeWriteOnly
	Exe          string        // this binary, for the supervised agent
	Timeout      time.Duration // wait for the agent to connect (ModeApply)
	Attempts     int           // tries of each network step
	Backoff      time.Duration // first wait between tries

	// Prompter asks the person; nil is non-interactive (every input from
	// Config, every failed validation an error).
	Prompter Prompter
	// Out gets the tables and progress lines for people.
	Out io.Writer
}

// Result is what onboarding did, for -o json and the summary.
type Result struct {
	Checks        []Check  `json:"checks"`
	Facts         []Fact   `json:"facts"`
	Hub           string   `json:"hub"`
	Proxy         Proxy    `json:"proxy"`
	CAFingerprint string   `json:"ca_fingerprint,omitempty"`
	KeyReused     bool     `json:"key_reused"`
	NodeID        string   `json:"node_id,omitempty"`
	Name          string   `json:"name,omitempty"`
	Existing      bool     `json:"existing"`
	Profile       string   `json:"profile,omitempty"`
	MatchedBy     string   `json:"matched_by,omitempty"`
	Mode          Mode     `json:"mode"`
	UserData      string   `json:"user_data_path,omitempty"`
	MetaData      string   `json:"meta_data_path,omitempty"`
	Written       []string `json:"written,omitempty"`
	Ran           []string `json:"ran,omitempty"`
	Skipped       []string `json:"skipped,omitempty"`
	Supervised    bool     `json:"supervised"`
	AgentPID      int      `json:"agent_pid,omitempty"`
	AgentState    string   `json:"agent_state,omitempty"`
	Error         string   `json:"error,omitempty"`
}

// Prompter is the interactive side: each input is shown with its current
// value as the default and asked again until check accepts it.
type Prompter interface {
	// Input asks for one value; check (nil: any) validates it, and its
	// error is shown before asking again.
	Input(f Field) (string, error)
	// Confirm asks a yes/no question; the default is no.
	Confirm(title, description string) (bool, error)
	// Choose asks for one of options (value, label pairs); def first.
	Choose(title string, options [][2]string, def string) (string, error)
}

// Field is one input.
type Field struct {
	Title       string
	Description string
	Value       string
	Secret      bool
	// Syntax checks the value's form as it is typed (nil: any); Check
	// then validates it, possibly over the network, after it is entered.
	Syntax func(string) error
	Check  func(string) error
}

// input gets one value: from the person when interactive, else the
// configured value, validated the same way.
func (c *Config) input(f Field) (string, error) {
	if c.Prompter != nil {
		return c.Prompter.Input(f)
	}
	if f.Syntax != nil {
		if err := f.Syntax(f.Value); err != nil {
			return "", err
		}
	}
	if f.Check != nil {
		if err := f.Check(f.Value); err != nil {
			return "", err
		}
	}
	return f.Value, nil
}

func (c *Config) say(format string, args ...any) {
	if c.Out != nil {
		fmt.Fprintf(c.Out, format+"\n", args...)
	}
}

// Run onboards the machine. The result is filled as far as it got, also
// when an error is returned.
func Run(ctx context.Context, c Config) (*Result, error) {
	res := &Result{Mode: c.Mode}
	err := run(ctx, &c, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func run(ctx context.Context, c *Config, res *Result) error {
	if c.Mode == "" {
		c.Mode = ModeApply
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	m := c.Machine
	if m.FreeBytes == nil {
		m.FreeBytes = statfsFree
	}
	if c.Prompter == nil && c.CAPin == "" {
		return errors.New("onboard: --ca-pin sha256:… is required with --non-interactive (the hub's CA is never trusted " +
			"unseen; `tether onboarding create -o json` prints it as ca_pin)")
	}
	pin := ""
	if c.CAPin != "" {
		var err error
		if pin, err = ParsePin(c.CAPin); err != nil {
			return err
		}
	}

	// 1. Prerequisites that need no hub.
	facts := GatherFacts(m.Root)
	res.Facts = facts.Shown
	res.Checks = LocalChecks(m, facts, c.Force)
	WriteChecks(c.Out, res.Checks)
	if Failed(res.Checks) {
		return ErrPrerequisites
	}
	fmt.Fprintln(c.Out)
	WriteFacts(c.Out, res.Facts) // what the hub will be told, before anything is sent
	fmt.Fprintln(c.Out)

	// 2. Inputs, each validated before the next: proxy and hub (reached
	// through the proxy: the CA fetch), the CA, then name, site, labels.
	proxyText, err := c.input(Field{Title: "HTTPS proxy", Value: c.Proxy.HTTPS,
		Description: "from the environment (HTTPS_PROXY); empty for a direct connection",
		Syntax:      func(v string) error { p := c.Proxy; p.HTTPS = v; return p.validate() }})
	if err != nil {
		return err
	}
	c.Proxy.HTTPS = proxyText
	res.Proxy = c.Proxy
	hub := &Hub{Proxy: c.Proxy, Attempts: c.Attempts, Backoff: c.Backoff,
		OnRetry: func(step string, n int, err error, wait time.Duration) {
			c.say("%s: try %d failed (%v); again in %s", step, n, err, wait.Round(100*time.Millisecond))
		}}
	var ca *CAResult
	if _, err := c.input(Field{Title: "Hub address", Value: c.Hub,
		Description: "HOST[:PORT] of the hub's TLS port (default port 7443); reached through " + c.Proxy.String(),
		Syntax:      func(v string) error { _, err := NormalizeHub(v); return err },
		Check: func(v string) error {
			a, err := NormalizeHub(v)
			if err != nil {
				return err
			}
			hub.Addr = a
			if ca, err = hub.FetchCA(ctx); err != nil {
				return fmt.Errorf("hub %s not reachable through %s: %w", a, c.Proxy, err)
			}
			return nil
		}}); err != nil {
		return err
	}
	res.Hub = hub.Addr
	res.CAFingerprint = ca.Fingerprint
	skew := SkewCheck(ca.HubTime, time.Now())
	res.Checks = append(res.Checks, skew)
	WriteChecks(c.Out, []Check{skew})
	if skew.Status == Fail {
		return ErrPrerequisites
	}
	if err := c.trustCA(ca, pin); err != nil {
		return err
	}
	hub.Pin = ca.Fingerprint

	name, err := c.input(Field{Title: "Node name", Value: c.Name,
		Description: "empty: the hub derives it from the hostname (" + edge.DefaultName() + ")",
		Syntax: func(v string) error {
			if v == "" {
				return nil
			}
			return pki.ValidateName(v)
		}})
	if err != nil {
		return err
	}
	site, err := c.input(Field{Title: "Site", Value: c.Site,
		Description: "optional; reported as the label site=… (the node's own word)",
		Syntax: func(v string) error {
			if v == "" {
				return nil
			}
			return validate.Labels(map[string]string{"site": v})
		}})
	if err != nil {
		return err
	}
	labelText, err := c.input(Field{Title: "Labels", Value: FormatLabels(c.Labels),
		Description: "optional KEY=VALUE,… this machine reports (its labels file); " +
			"roles select on the credential's labels only",
		Syntax: func(v string) error { _, err := ParseLabels(v); return err }})
	if err != nil {
		return err
	}
	labels, _ := ParseLabels(labelText)
	if site != "" {
		if labels == nil {
			labels = map[string]string{}
		}
		labels["site"] = site
	}
	if c.Prompter != nil && c.AskMode {
		mode, err := c.Prompter.Choose("Apply the node's cloud-init", [][2]string{
			{string(ModeApply), "now: write its files, start the agent and wait until it is connected"},
			{string(ModeWriteOnly), "at the next boot: write it to " + c.CloudInitDir},
		}, string(c.Mode))
		if err != nil {
			return err
		}
		c.Mode = Mode(mode)
		res.Mode = c.Mode
	}

	// 3. The key, persisted before the hub hears of it; a re-run reuses it.
	key, reused, err := edge.PendingKey(m.StateDir)
	if err != nil {
		return err
	}
	res.KeyReused = reused
	prog, _ := readProgress(m.StateDir)
	if prog.Started.IsZero() {
		prog.Started = time.Now().UTC()
	}
	prog.Hub, prog.Fingerprint, prog.Done = hub.Addr, ca.Fingerprint, false
	if err := writeProgress(m.StateDir, prog); err != nil {
		return err
	}
	csrName := name
	if csrName == "" {
		csrName = edge.DefaultName()
	}
	csr, err := pki.NewCSR(key, csrName)
	if err != nil {
		return err
	}
	req := &onboardproto.Request{Name: name, Labels: labels, CSR: csr, Facts: facts.Facts,
		Machine: facts.Machine, AgentVersion: edge.Version}

	// 4. The credential, accepted or refused by the hub with its reason.
	var resp *onboardproto.Response
	for {
		cred, err := c.input(Field{Title: "Onboarding credential", Value: c.Credential, Secret: true,
			Description: "ID.SECRET from `tether onboarding create` (the hub's admin)",
			Syntax:      checkCredential})
		if err != nil {
			return err
		}
		req.Credential = cred
		if err := req.Validate(); err != nil {
			return err
		}
		resp, err = hub.Onboard(ctx, req)
		var refused *RefusedError
		if c.Prompter != nil && errors.As(err, &refused) && refused.Credential() {
			c.say("the hub refused the credential: %s", refused.Reason)
			c.Credential = ""
			continue
		}
		if errors.As(err, &refused) && refused.MachineKey() {
			// The hub cannot know where this machine keeps its key.
			return fmt.Errorf("%w; this machine's node key is %s: if it is the old machine reinstalled "+
				"and its old node key was kept, put that back there and onboard again",
				err, edge.KeyPath(m.StateDir))
		}
		if err != nil {
			return err
		}
		break
	}
	res.NodeID, res.Name, res.Existing, res.Profile, res.MatchedBy =
		resp.NodeID, resp.Name, resp.Existing, resp.Profile, resp.MatchedBy
	if resp.Existing {
		c.say("the hub knows this machine already: node %s (%s), nothing new created", resp.Name, resp.NodeID)
	} else {
		c.say("node %s (%s) created; OS profile %s (matched by %s)", resp.Name, resp.NodeID, resp.Profile, resp.MatchedBy)
	}

	// 5. The identity, verified against the pinned CA, saved where join
	// saves it (the CA too, for the agent).
	if resp.CA != "" {
		cas, err := pki.ParseCerts([]byte(resp.CA))
		if err != nil || pki.Fingerprint(cas[0]) != ca.Fingerprint {
			return fmt.Errorf("onboard: the hub's answer names a CA other than the pinned sha256:%s", ca.Fingerprint)
		}
	}
	hubs := resp.Hubs
	if len(hubs) == 0 {
		hubs = []string{hub.Addr}
	}
	if _, err := edge.AdoptIdentity(m.StateDir, edge.NodeConfig{NodeID: resp.NodeID, Name: resp.Name, Hubs: hubs},
		key, []byte(resp.Cert), []byte(resp.NodeCA), ca.CA); err != nil {
		return fmt.Errorf("onboard: %w", err)
	}
	cc, err := onboardproto.ParseUserData(resp.UserData)
	if err != nil {
		return fmt.Errorf("onboard: the hub's user-data: %w", err)
	}
	meta := resp.MetaData
	if meta == "" {
		meta = fmt.Sprintf("instance-id: tether-%s\nlocal-hostname: %s\n", resp.NodeID, resp.Name)
	}

	// 6. Applying.
	switch c.Mode {
	case ModeWriteOnly:
		res.UserData, res.MetaData, err = WriteSeed(c.CloudInitDir, resp.UserData, meta)
		if err != nil {
			return err
		}
		c.say("cloud-init written to %s: it is applied at the next boot", c.CloudInitDir)
	case ModeApply:
		if err := c.apply(ctx, cc, res); err != nil {
			return err
		}
	default:
		return fmt.Errorf("onboard: mode %q: want apply or write-only", c.Mode)
	}
	prog.Done, prog.NodeID = true, resp.NodeID
	return writeProgress(m.StateDir, prog)
}

// trustCA accepts the fetched CA only if it matches the pin or, without a
// pin, the person confirms its fingerprint.
func (c *Config) trustCA(ca *CAResult, pin string) error {
	if pin != "" {
		if err := CheckPin(ca, pin); err != nil {
			return err
		}
		c.say("hub CA sha256:%s matches --ca-pin", ca.Fingerprint)
		return nil
	}
	ok, err := c.Prompter.Confirm("Trust this hub CA?",
		fmt.Sprintf("subject %s\nsha256:%s\ncompare it with the fingerprint the hub's admin gave you (ca_pin of `tether "+
			"onboarding create -o json`)", ca.CA.Subject, ca.Fingerprint))
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("onboard: the hub CA sha256:%s was not confirmed; nothing was sent", ca.Fingerprint)
	}
	return nil
}

func (c *Config) apply(ctx context.Context, cc *onboardproto.UserData, res *Result) error {
	m := c.Machine
	a := &Applier{Root: m.Root, StateDir: m.StateDir, Systemd: m.HasSystemd(), Exe: c.Exe, Log: c.say}
	var err error
	if res.Written, err = a.WriteFiles(cc); err != nil {
		return err
	}
	if a.Systemd {
		if filepath.Clean(m.StateDir) != AgentStateDir {
			c.say("warning: the unit runs the agent with --state-dir %s, not %s: add --state-dir %s to TETHER_EDGE_ARGS in "+
				"/etc/tether-edge.env", AgentStateDir, m.StateDir, m.StateDir)
		}
		bin, err := a.EnsureBinary(cc)
		if err != nil {
			return err
		}
		if bin != "" {
			c.say("installed this tether-edge as %s, where the unit starts it", bin)
			res.Written = append(res.Written, bin)
		}
	}
	if res.Ran, res.Skipped, err = a.RunCommands(ctx, cc); err != nil {
		return err
	}
	pid := 0
	if !a.Systemd {
		res.Supervised = true
		var started bool
		if pid, started, err = a.Supervise(); err != nil {
			return err
		}
		if !started {
			c.say("the agent started by an earlier run is still running (pid %d)", pid)
		}
		res.AgentPID = pid
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	c.say("waiting up to %s for the agent to connect to the hub…", timeout)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := WaitConnected(wctx, m.StateDir, pid)
	res.AgentState = st.State
	if err != nil {
		return err
	}
	c.say("the agent is connected to %s (%s) as %s", st.Hub, st.Transport, st.Name)
	return nil
}

// checkCredential checks a credential's shape (ID.SECRET) so a typo is
// said at once; the hub decides whether it is accepted.
func checkCredential(v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		return errors.New("no onboarding credential: give --credential @FILE, the value, or TETHER_ONBOARD_CREDENTIAL")
	}
	id, secret, ok := strings.Cut(v, ".")
	if !ok || id == "" || secret == "" || strings.ContainsAny(v, " \t\n") {
		return errors.New("the onboarding credential has the form ID.SECRET (as `tether onboarding create` prints it)")
	}
	return nil
}

// ParseLabels reads KEY=VALUE pairs separated by commas, checked with the
// label rules every part of Tether shares.
func ParseLabels(s string) (map[string]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want KEY=VALUE", kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("label %q given twice", k)
		}
		out[k] = v
	}
	if err := validate.Labels(out); err != nil {
		return nil, err
	}
	return out, nil
}

// FormatLabels is ParseLabels' inverse, keys sorted.
func FormatLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

// progress records an onboarding in the state dir: started (key persisted,
// hub asked) until done. An identity without a finished progress record is
// an onboarding a re-run finishes, not a machine onboarded already.
type progress struct {
	Hub         string    `json:"hub"`
	Fingerprint string    `json:"ca_fingerprint"`
	NodeID      string    `json:"node_id,omitempty"`
	Started     time.Time `json:"started"`
	Done        bool      `json:"done"`
}

const progressFile = "onboard.json"

func readProgress(dir string) (progress, error) {
	var p progress
	b, err := os.ReadFile(filepath.Join(dir, progressFile))
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return progress{}, fmt.Errorf("%s: %w", progressFile, err)
	}
	return p, nil
}

func writeProgress(dir string, p progress) error {
	b, _ := json.MarshalIndent(p, "", "  ")
	return pki.WriteFileAtomic(filepath.Join(dir, progressFile), b, 0o600)
}
