package bulkonboard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/validate"
)

// Defaults for zero Config fields.
const (
	DefaultParallel    = 10
	DefaultHostTimeout = 10 * time.Minute
	DefaultRemotePath  = "/usr/local/bin/tether-edge"
	DefaultUser        = "root"
)

// Status is how one host ended.
type Status string

const (
	// StatusOnboarded: the host was onboarded by this run.
	StatusOnboarded Status = "onboarded"
	// StatusAlready: the host was onboarded before (an earlier run); it
	// was left as it is.
	StatusAlready Status = "already-onboarded"
	// StatusFailed: a step failed; Result.Step and Result.Error say which
	// and why. Running again finishes it.
	StatusFailed Status = "failed"
)

// Steps a host goes through, named in a failed Result.
const (
	StepConnect = "connect"
	StepCopy    = "copy-agent"
	StepOnboard = "onboard"
)

// Config is one bulk run.
type Config struct {
	// Hosts are the machines, from ParseInventory.
	Hosts []Host
	// User is the SSH login for hosts whose line names none. "" means
	// DefaultUser.
	User string
	// SSH is the admin's own SSH identity and known_hosts.
	SSH SSHConfig
	// Credential is the onboarding credential (`tether onboarding create`).
	// It reaches each host on the SSH channel's stdin, into a 0600 file
	// removed when the onboarding ends; it never appears on a command line.
	Credential []byte
	// Hub (HOST[:PORT]) and CAPin (the hub CA's sha256 fingerprint) are
	// passed to `tether-edge onboard` (--hub, --ca-pin). Required: the
	// credential carries neither, and a host must never guess its hub.
	Hub, CAPin string
	// Agent is the tether-edge binary copied to hosts that have none.
	// Nil means hosts without tether-edge fail (StepCopy).
	Agent []byte
	// RemotePath is where the agent is looked for when it is not on the
	// host's PATH, and copied to. "" means DefaultRemotePath.
	RemotePath string
	// Parallel bounds the hosts in flight. Zero means DefaultParallel.
	Parallel int
	// HostTimeout bounds one host, connect to onboarded. Zero means
	// DefaultHostTimeout.
	HostTimeout time.Duration
	// OnResult, if set, is called once per host as it finishes, never
	// concurrently (a progress display).
	OnResult func(Result)
	// Logger receives per-host events. Nil discards.
	Logger *slog.Logger
}

// Result is one host's outcome.
type Result struct {
	// Host is the host as the inventory names it ([USER@]HOST[:PORT]).
	Host string `json:"host"`
	// Line is its inventory line.
	Line int `json:"line"`
	// Status is onboarded, already-onboarded or failed.
	Status Status `json:"status"`
	// Step is the step that failed (connect, copy-agent, onboard).
	Step string `json:"step,omitempty"`
	// Node is the node's name on the hub, when the onboarding said it.
	Node string `json:"node,omitempty"`
	// CopiedAgent says that tether-edge was copied to the host.
	CopiedAgent bool `json:"copied_agent"`
	// Error says why it failed and what to do.
	Error string `json:"error,omitempty"`
	// Seconds is how long the host took.
	Seconds float64 `json:"seconds"`
	// Err is the error itself (errors.Is against this package's
	// sentinels).
	Err error `json:"-"`
}

// Run onboards every host, at most cfg.Parallel at a time, and returns one
// Result per host in inventory order. Hosts fail independently; the error
// is only for a Config that cannot work at all (no key, no known_hosts).
// Every remote step is idempotent, so running again with the same
// inventory finishes the hosts that failed and leaves the others as they
// are.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if len(cfg.Hosts) == 0 {
		return nil, errors.New("bulkonboard: no hosts")
	}
	if len(bytes.TrimSpace(cfg.Credential)) == 0 {
		return nil, errors.New("bulkonboard: empty onboarding credential (from `tether onboarding create`)")
	}
	if cfg.Hub == "" || cfg.CAPin == "" {
		return nil, errors.New(
			"bulkonboard: the hub address and the hub CA's pin are both required " +
				"(tether onboarding create -o json shows the pin as ca_pin)",
		)
	}
	if cfg.User == "" {
		cfg.User = DefaultUser
	}
	if err := validate.Login(cfg.User); err != nil {
		return nil, fmt.Errorf("bulkonboard: SSH user: %w", err)
	}
	if cfg.RemotePath == "" {
		cfg.RemotePath = DefaultRemotePath
	}
	if !path.IsAbs(cfg.RemotePath) || path.Clean(cfg.RemotePath) != cfg.RemotePath {
		return nil, fmt.Errorf("bulkonboard: remote agent path %q: want an absolute, clean path", cfg.RemotePath)
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.HostTimeout <= 0 {
		cfg.HostTimeout = DefaultHostTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := newDialer(cfg.SSH)
	if err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, dialer: d}
	if cfg.Agent != nil {
		sum := sha256.Sum256(cfg.Agent)
		r.agentSum = hex.EncodeToString(sum[:])
	}

	results := make([]Result, len(cfg.Hosts))
	var mu sync.Mutex // serialises OnResult
	var wg sync.WaitGroup
	sem := make(chan struct{}, cfg.Parallel)
	for i, h := range cfg.Hosts {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			results[i] = failed(h, time.Now(), StepConnect, fmt.Errorf("not started: %w", ctx.Err()))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res := r.host(ctx, h)
			results[i] = res
			if cfg.OnResult != nil {
				mu.Lock()
				cfg.OnResult(res)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return results, nil
}

type run struct {
	cfg      Config
	dialer   *dialer
	agentSum string
}

func failed(h Host, start time.Time, step string, err error) Result {
	return Result{Host: h.String(), Line: h.Line, Status: StatusFailed, Step: step, Error: err.Error(), Err: err,
		Seconds: time.Since(start).Seconds()}
}

// host takes one machine from connect to onboarded.
func (r *run) host(ctx context.Context, h Host) Result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.HostTimeout)
	defer cancel()
	log := r.cfg.Logger.With("host", h.String())
	user := h.User
	if user == "" {
		user = r.cfg.User
	}
	c, err := r.dialer.dial(ctx, h, user)
	if err != nil {
		log.Debug("connect failed", "err", err)
		return failed(h, start, StepConnect, err)
	}
	defer c.Close()
	// A cancelled run or a host past its time ends its SSH connection,
	// which ends every session on it.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	res := Result{Host: h.String(), Line: h.Line}
	edge, err := r.findAgent(c)
	if err == nil && edge == "" {
		if r.cfg.Agent == nil {
			err = fmt.Errorf(
				"tether-edge is neither on the host's PATH nor at %s, and no local tether-edge to copy was given",
				r.cfg.RemotePath,
			)
		} else if err = r.copyAgent(c); err == nil {
			edge, res.CopiedAgent = r.cfg.RemotePath, true
			log.Debug("copied tether-edge", "path", edge)
		}
	}
	if err != nil {
		return failed(h, start, StepCopy, ctxErr(ctx, err))
	}

	node, already, err := r.onboard(c, h, edge)
	if err != nil {
		f := failed(h, start, StepOnboard, ctxErr(ctx, err))
		f.CopiedAgent = res.CopiedAgent
		return f
	}
	res.Status, res.Node = StatusOnboarded, node
	if already {
		res.Status = StatusAlready
	}
	res.Seconds = time.Since(start).Seconds()
	log.Debug("done", "status", res.Status, "node", node)
	return res
}

// ctxErr names the deadline when the host ran out of time (the closed
// connection is what the step itself saw).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// runRemote runs a shell command line on the host with stdin, and returns its
// stdout and stderr.
func runRemote(c *ssh.Client, line string, stdin io.Reader) (stdout, stderr []byte, err error) {
	s, err := c.NewSession()
	if err != nil {
		return nil, nil, fmt.Errorf("open SSH session: %w", err)
	}
	defer s.Close()
	var o, e bytes.Buffer
	s.Stdin, s.Stdout, s.Stderr = stdin, &o, &e
	err = s.Run(line)
	return o.Bytes(), e.Bytes(), err
}

// findAgent returns the host's tether-edge: the one on its PATH, else
// RemotePath if executable, else "".
func (r *run) findAgent(c *ssh.Client) (string, error) {
	out, errOut, err := runRemote(
		c,
		"command -v tether-edge 2>/dev/null || { test -x "+shellQuote(
			r.cfg.RemotePath,
		)+" && echo "+shellQuote(
			r.cfg.RemotePath,
		)+"; } || true",
		nil,
	)
	if err != nil {
		return "", fmt.Errorf("look for tether-edge: %w: %s", err, lastLine(errOut))
	}
	return strings.TrimSpace(string(out)), nil
}

// copyAgent writes the agent to a temporary file beside RemotePath, checks
// its SHA-256 on the host, and renames it into place: RemotePath is never
// a partial binary, whatever fails.
func (r *run) copyAgent(c *ssh.Client) error {
	p := shellQuote(r.cfg.RemotePath)
	script := `set -e
d=$(dirname ` + p + `)
mkdir -p "$d"
t="$d/.tether-edge.$$.tmp"
trap 'rm -f "$t"' EXIT
cat >"$t"
if command -v sha256sum >/dev/null 2>&1; then
	s=$(sha256sum "$t")
	[ "${s%% *}" = ` + r.agentSum + ` ] || { echo "checksum mismatch after copying tether-edge" >&2; exit 3; }
fi
chmod 0755 "$t"
mv -f "$t" ` + p
	if _, errOut, err := runRemote(c, script, bytes.NewReader(r.cfg.Agent)); err != nil {
		return fmt.Errorf("copy tether-edge to %s: %w: %s", r.cfg.RemotePath, err, lastLine(errOut))
	}
	return nil
}

// onboard runs `tether-edge onboard --non-interactive --apply -o json`
// with the credential in a private temporary file, and the host's node
// name (--name) when the inventory gives one.
func (r *run) onboard(c *ssh.Client, h Host, edge string) (node string, already bool, err error) {
	args := []string{shellQuote(edge), "onboard", "--non-interactive", "--apply", "-o", "json", "--credential", `"@$c"`,
		"--hub", shellQuote(r.cfg.Hub), "--ca-pin", shellQuote(r.cfg.CAPin)}
	if h.Name != "" {
		args = append(args, "--name", shellQuote(h.Name))
	}
	if len(h.Labels) > 0 {
		kv := make([]string, len(h.Labels))
		for i, l := range h.Labels {
			kv[i] = l.Key + "=" + l.Value
		}
		args = append(args, "--labels", shellQuote(strings.Join(kv, ",")))
	}
	script := `set -e
umask 077
c=$(mktemp "${TMPDIR:-/tmp}/tether-credential.XXXXXX")
trap 'rm -f "$c"' EXIT
cat >"$c"
` + strings.Join(args, " ")
	out, errOut, err := runRemote(c, script, bytes.NewReader(r.cfg.Credential))
	return parseOnboardOutput(out, errOut, err)
}

// onboardOutput is what bulk reads of `tether-edge onboard -o json`.
type onboardOutput struct {
	Name     string `json:"name"`
	Existing bool   `json:"existing"`
	Error    string `json:"error"`
	Checks   []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Detail string `json:"detail"`
	} `json:"checks"`
}

// onboardedCheck is the prerequisite check of tether-edge onboard that
// fails on a machine onboarded already, and the node its detail names.
const onboardedCheck = "not onboarded yet"

var heldNode = regexp.MustCompile(`holds node (\S+) \(`)

// parseOnboardOutput reads how `tether-edge onboard -o json` ended: the
// node's name; already is a machine onboarded before (the command refuses
// to onboard it again, which for a bulk re-run is success).
func parseOnboardOutput(out, errOut []byte, runErr error) (node string, already bool, err error) {
	var o onboardOutput
	if jerr := json.Unmarshal(bytes.TrimSpace(out), &o); jerr != nil {
		if runErr != nil {
			return "", false, fmt.Errorf("tether-edge onboard: %w: %s", runErr, lastLine(errOut))
		}
		return "", false, fmt.Errorf("tether-edge onboard -o json: unreadable output (%w): %q", jerr, lastLine(out))
	}
	if runErr == nil {
		return o.Name, false, nil
	}
	for _, c := range o.Checks {
		if c.Name == onboardedCheck && c.Status == "fail" {
			if m := heldNode.FindStringSubmatch(c.Detail); m != nil {
				return m[1], true, nil
			}
		}
	}
	reason := o.Error
	if reason == "" {
		reason = lastLine(errOut)
	}
	for _, c := range o.Checks {
		if c.Status == "fail" {
			reason += "; check " + c.Name + ": " + c.Detail
		}
	}
	return "", false, fmt.Errorf("tether-edge onboard: %w: %s", runErr, reason)
}

// lastLine is the last non-empty line of a command's output, which is where
// the tools say what went wrong.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	s := strings.TrimSpace(lines[len(lines)-1])
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	if s == "" {
		return "(no output)"
	}
	return s
}

// shellQuote single-quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
