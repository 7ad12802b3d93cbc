package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	_ "modernc.org/sqlite" // the store's SQLite driver, to fill a hub's database

	"github.com/tether-dev/tether/internal/testenv"
)

// The web console in a real headless Chromium (Debian's chromium, driven by
// chromedp) against a real hub with real agents.

// browserTimeout bounds each console test's browser work.
const browserTimeout = 90 * time.Second

// chromiumPath finds Debian's chromium (or another Chromium) or skips.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium found (chromium, chromium-browser, google-chrome): install Debian's chromium (make deps " +
		"does) to run the console's browser tests")
	return ""
}

// browser starts a headless Chromium with its own profile and returns a
// context for chromedp actions, bounded by browserTimeout.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.UserDataDir(t.TempDir()),
		// The hub's certificate is signed by its own CA, which this
		// throw-away profile does not hold.
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.NoSandbox, // tests may run as root
		chromedp.WindowSize(1280, 860),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, browserTimeout)
	t.Cleanup(func() { cancelT(); cancelB(); cancelA() })
	// The page's console and uncaught exceptions go to the test log.
	chromedp.ListenTarget(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value))
			}
			t.Logf("browser console.%s: %s", ev.Type, strings.Join(parts, " "))
		case *runtime.EventExceptionThrown:
			t.Logf("browser exception: %s", ev.ExceptionDetails.Error())
		}
	})
	if err := chromedp.Run(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// artifacts is where screenshots go: $TETHER_ARTIFACTS_DIR if set, else a
// temporary directory of the test.
func artifacts(t *testing.T) string {
	dir := os.Getenv("TETHER_ARTIFACTS_DIR")
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

func must(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitJS polls a JavaScript condition in the page until it is true.
func waitJS(t *testing.T, ctx context.Context, what, expr string, timeout time.Duration) {
	t.Helper()
	err := testenv.Poll(ctx, timeout, what, func() bool {
		var ok bool
		return chromedp.Run(ctx, chromedp.Evaluate(expr, &ok)) == nil && ok
	})
	if err != nil {
		var body string
		_ = chromedp.Run(ctx, chromedp.Evaluate(`document.body.innerText + `+
			`(window.tetherTerminalText ? '\n--- terminal:\n' + window.tetherTerminalText() : '')`, &body))
		t.Fatalf("%v\npage text:\n%s", err, body)
	}
}

func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	var v T
	if err := chromedp.Run(
		ctx, chromedp.Evaluate(expr, &v,
			func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
	); err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// consoleFleet is a hub with three agents: dev-1 and dev-2 (env=dev, site
// berlin) and prod-1 (env=prod, site paris); role dev-ops selects env=dev.
type consoleFleet struct {
	h      *hub
	agents map[string]*proc
}

func startConsoleFleet(t *testing.T) *consoleFleet {
	t.Helper()
	// Heartbeats every second: a silent agent shows stale after 2 s, long
	// before the hub gives its session up (14.5 s).
	h := startHubIn(t, "", 0, "--keepalive", "1s", "--dead-peer-timeout", "15s")
	dev := h.token("--uses", "2", "--label", "env=dev", "--label", "site=berlin")
	prod := h.token("--uses", "1", "--label", "env=prod", "--label", "site=paris")
	f := &consoleFleet{h: h, agents: map[string]*proc{}}
	for _, a := range []struct{ join, name string }{{dev, "dev-1"}, {dev, "dev-2"}, {prod, "prod-1"}} {
		f.agents[a.name], _ = startAgent(t, a.join, a.name, "--ssh", "embedded", "--labels-file", "/nonexistent")
	}
	for _, n := range []string{"dev-1", "dev-2", "prod-1"} {
		h.waitOnline(n, "")
	}
	h.cli("role", "create", "dev-ops", "--nodes", "env=dev", "--logins", "*")
	return f
}

// signInLink logs operator in (`tether login` with key) and returns a
// one-time console link from `tether ui --no-browser` with that identity.
func (f *consoleFleet) signInLink(t *testing.T, operator, key string) (link string, identity []string) {
	t.Helper()
	out := t.TempDir()
	if _, errOut, code := tetherAs(
		t, "login", "--data-dir", f.h.dataDir, "--user", operator, "--key", key, "--out-dir", out,
	); code != 0 {
		t.Fatalf("tether login as %s: exit %d: %s", operator, code, errOut)
	}
	identity = []string{"--hub", f.h.apiAddr(), "--identity", filepath.Join(out, "admin")}
	stdout, errOut, code := tetherAs(t, append([]string{"ui", "--no-browser"}, identity...)...)
	link = strings.TrimSpace(stdout)
	if code != 0 || !strings.HasPrefix(link, "https://"+f.h.apiAddr()+"/ui/signin?code=") {
		t.Fatalf("tether ui --no-browser as %s: exit %d: %q %s", operator, code, stdout, errOut)
	}
	return link, identity
}

// TestConsoleAdmin: an operator holding the admin role and dev-ops signs in
// with a one-time link (reused: refused), sees the fleet, filters it,
// watches a node go offline and another stale live, runs a job and follows its log, reruns
// its failed node and cancels another job, opens a
// terminal (a command, Ctrl-C, a resize), searches the audit log, and
// signs out; a state-changing request without the CSRF token is refused,
// and the session cookie is HttpOnly, Secure and SameSite=Strict.
func TestConsoleAdmin(t *testing.T) {
	chromiumPath(t)
	f := startConsoleFleet(t)
	h := f.h
	h.cli("operator", "add", "alice", "--key", opPub, "--role", "admin", "--role", "dev-ops")
	link, _ := f.signInLink(t, "alice", opKey)
	ctx := browser(t)
	shots := artifacts(t)
	base := "https://" + h.apiAddr()

	// item 1: sign in; the cookie's flags.
	must(t, ctx, "open the sign-in link", chromedp.Navigate(link))
	waitJS(t, ctx, "fleet table with dev-1", `!!document.querySelector('#fleet-table tr[data-node="dev-1"]')`,
		20*time.Second)
	if path := evalJS[string](t, ctx, `location.pathname + location.search`); path != "/ui/" {
		t.Fatalf("after sign-in the browser is at %q, want /ui/ (the code gone from the address bar)", path)
	}
	var cookies []*network.Cookie
	must(t, ctx, "read cookies", chromedp.ActionFunc(func(ctx context.Context) error {
		var err error
		cookies, err = network.GetCookies().WithURLs([]string{base + "/ui/"}).Do(ctx)
		return err
	}))
	if len(cookies) != 1 || cookies[0].Name != "__Host-tether_console" || !cookies[0].HTTPOnly || !cookies[0].Secure ||
		cookies[0].SameSite != network.CookieSameSiteStrict || cookies[0].Path != "/" ||
		cookies[0].Expires-float64(time.Now().Unix()) < 7*3600 {
		t.Fatalf("session cookie: %+v", cookies)
	}
	if js := evalJS[string](t, ctx, `document.cookie`); strings.Contains(js, "tether_console") {
		t.Fatalf("the session cookie is readable from JavaScript: %q", js)
	}
	waitJS(t, ctx, "who", `document.getElementById('who').textContent === 'alice (admin)'`, 5*time.Second)
	waitJS(t, ctx, "three nodes online",
		`document.querySelectorAll('#fleet-table tr[data-state="online"]').length === 3`, 10*time.Second)
	screenshot(t, ctx, shots, "1-fleet")

	t.Run("item1_reused_link_refused", func(t *testing.T) {
		must(t, ctx, "open the link again", chromedp.Navigate(link))
		waitJS(t, ctx, "refusal page", `document.body.innerText.includes('already used')`, 10*time.Second)
		screenshot(t, ctx, shots, "2-reused-link")
		must(t, ctx, "back to the console", chromedp.Navigate(base+"/ui/"))
		waitJS(t, ctx, "fleet table", `!!document.querySelector('#fleet-table tr[data-node="dev-1"]')`, 10*time.Second)
	})

	t.Run("item2_filter_and_search", func(t *testing.T) {
		must(t, ctx, "filter by label", chromedp.SendKeys("#label-filter", "site=paris\r"))
		waitJS(t, ctx, "only prod-1",
			`(() => { const r = [...document.querySelectorAll('#fleet-table tbody tr')].map(r => r.dataset.node); `+
				`return r.join() === 'prod-1' })()`, 10*time.Second)
		screenshot(t, ctx, shots, "3-fleet-filtered")
		must(t, ctx, "clear the label filter, search",
			chromedp.Evaluate(`(() => { const l = document.querySelector('#label-filter');
			l.value = ''; l.dispatchEvent(new Event('change')) })()`, nil), chromedp.SendKeys("#search", "dev-"))
		waitJS(t, ctx, "dev-1 and dev-2",
			`(() => { const r = [...document.querySelectorAll('#fleet-table tbody tr')].map(r => r.dataset.node); `+
				`return r.join() === 'dev-1,dev-2' && document.querySelector('#count-total b').textContent === '2' })()`,
			10*time.Second)
	})

	t.Run("item2_node_goes_offline_live", func(t *testing.T) {
		// A marker a reload would lose: the row must change without one.
		must(t, ctx, "mark the page", chromedp.Evaluate(`window.__noReload = true`, nil))
		f.agents["dev-2"].Kill()
		waitJS(t, ctx, "dev-2 offline without a reload",
			`window.__noReload === true && `+
				`document.querySelector('#fleet-table tr[data-node="dev-2"]')?.dataset.state === 'offline' && `+
				`document.querySelector('#count-offline b').textContent === '1'`, 20*time.Second)
		screenshot(t, ctx, shots, "4-fleet-dev2-offline")
		// An agent that falls silent (stopped) turns stale, then back.
		must(t, ctx, "clear the search",
			chromedp.Evaluate(`(() => { const s = document.querySelector('#search'); s.value = ''; `+
				`s.dispatchEvent(new Event('input')) })()`, nil))
		pid := f.agents["prod-1"].PID()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		waitJS(t, ctx, "prod-1 stale without a reload",
			`window.__noReload === true && `+
				`document.querySelector('#fleet-table tr[data-node="prod-1"]')?.dataset.state === 'stale' && `+
				`document.querySelector('#count-stale b').textContent === '1'`, 12*time.Second)
		screenshot(t, ctx, shots, "4b-fleet-prod1-stale")
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitJS(t, ctx, "prod-1 online again",
			`document.querySelector('#fleet-table tr[data-node="prod-1"]')?.dataset.state === 'online'`, 30*time.Second)
	})

	t.Run("item3_run_job_follow_log", func(t *testing.T) {
		must(t, ctx, "jobs page", chromedp.Navigate(base+"/ui/jobs"), chromedp.WaitVisible("#job-run"),
			chromedp.SendKeys("#job-selector", "site=berlin"),
			chromedp.SendKeys("#job-command", "echo from-$(hostname)-start; sleep 1; echo job-$((6*7))-done"),
			chromedp.Click("#job-run"))
		waitJS(t, ctx, "the job's log followed to its end",
			`document.querySelector('#job-log')?.textContent.includes('[dev-1] job-42-done')`, 30*time.Second)
		waitJS(t, ctx, "dev-1 ok, dev-2 skipped (offline)",
			`document.querySelector('#job-nodes tr[data-node="dev-1"]')?.dataset.state === 'ok' && `+
				`document.querySelector('#job-nodes tr[data-node="dev-2"]')?.dataset.state === 'skipped'`, 15*time.Second)
		screenshot(t, ctx, shots, "5-job")
		// Rerun the failed: a new job of dev-2 alone (still offline: skipped).
		first := evalJS[string](t, ctx, `location.pathname`)
		must(t, ctx, "rerun failed", chromedp.Click("#job-rerun-failed"))
		waitJS(t, ctx, "the rerun's page: dev-2 only", `location.pathname !== '`+first+`' && (() => {
			const rows = [...document.querySelectorAll('#job-nodes tr[data-node]')].map(r => r.dataset.node);
			return rows.join() === 'dev-2' })()`, 15*time.Second)
		// Cancel a running job.
		must(t, ctx, "a long job", chromedp.Navigate(base+"/ui/jobs"), chromedp.WaitVisible("#job-run"),
			chromedp.SendKeys("#job-selector", "env=dev"), chromedp.SendKeys("#job-command", "echo long-start; sleep 60"),
			chromedp.Click("#job-run"))
		waitJS(t, ctx, "running on dev-1",
			`document.querySelector('#job-log')?.textContent.includes('long-start') && `+
				`!document.querySelector('#job-cancel').disabled`, 20*time.Second)
		must(t, ctx, "cancel", chromedp.Click("#job-cancel"))
		waitJS(t, ctx, "cancelled", `document.querySelector('h1 .state')?.textContent === 'cancelled' && `+
			`document.querySelector('#job-nodes tr[data-node="dev-1"]')?.dataset.state === 'cancelled'`, 20*time.Second)
	})

	t.Run("item6_terminal", func(t *testing.T) {
		must(t, ctx, "node page", chromedp.Navigate(base+"/ui/nodes/dev-1"), chromedp.WaitVisible("#open-terminal"),
			chromedp.SetValue("#login", loginUser), chromedp.Click("#open-terminal"))
		waitJS(t, ctx, "terminal connected", `document.querySelector('#terminal')?.dataset.connected === 'true'`,
			15*time.Second)
		typeIn := func(s string) {
			must(t, ctx, "type "+s, chromedp.SendKeys("#terminal textarea", s))
		}
		typeIn("echo term-$((6*7))\r")
		waitJS(t, ctx, "command output in the terminal", `window.tetherTerminalText().includes('term-42')`, 15*time.Second)
		// Ctrl-C interrupts a running command (the pty turns it into SIGINT).
		typeIn("echo sl''eeping; sleep 60; echo not-$((1+1))-interrupted\r")
		waitJS(t, ctx, "the sleep running", `window.tetherTerminalText().includes('\nsleeping')`, 10*time.Second)
		// Ctrl-C, as xterm.js sends it (byte 3); the shell prompts again.
		// One that lands before the sleep holds the terminal interrupts
		// nothing (as at a real keyboard): then it is pressed again, never
		// at a prompt already back.
		prompt := `(() => { const after = window.tetherTerminalText().split('\nsleeping')[1] || '';
			return after.includes('^C') && /[#$]$/.test(after.trimEnd()) })()`
		for i := 0; ; i++ {
			must(t, ctx, "Ctrl-C", chromedp.Evaluate(`window.tetherTerminal._core.handler('\x03')`, nil))
			if testenv.Poll(ctx, 2*time.Second, "a prompt after ^C", func() bool {
				var ok bool
				return chromedp.Run(ctx, chromedp.Evaluate(prompt, &ok)) == nil && ok
			}) == nil {
				break
			}
			if i == 4 {
				waitJS(t, ctx, "a prompt after ^C", prompt, time.Second)
			}
		}
		typeIn("echo after-$((40+2))-ctrlc\r")
		waitJS(t, ctx, "the shell answers after Ctrl-C",
			`window.tetherTerminalText().includes('after-42-ctrlc') && `+
				`!window.tetherTerminalText().includes('not-2-interrupted')`, 10*time.Second)
		// A resize reaches the node's pty.
		must(t, ctx, "resize", chromedp.Evaluate(`window.tetherTerminal.resize(91, 27)`, nil))
		typeIn("stty size\r")
		waitJS(t, ctx, "the pty has the new size", `window.tetherTerminalText().includes('27 91')`, 10*time.Second)
		screenshot(t, ctx, shots, "6-terminal")
	})

	t.Run("item5_audit_search", func(t *testing.T) {
		// Leaving the node page closes the terminal; its audit row follows.
		must(t, ctx, "audit page", chromedp.Navigate(base+"/ui/audit"), chromedp.WaitVisible("#audit-search"))
		waitJS(t, ctx, "audit table", `!!document.querySelector('#audit .audit-table')`, 10*time.Second)
		must(t, ctx, "search", chromedp.SendKeys("#audit-kind", "console_terminal"),
			chromedp.SendKeys("#audit-node", "dev-1"))
		waitJS(t, ctx, "the terminal's audit row: start, end, bytes", `(() => {
			document.querySelector('#audit-search').click();
			const rows = [...document.querySelectorAll('#audit .audit-table tr[data-kind]')];
			return rows.length > 0 && rows.every(r => r.dataset.kind === 'console_terminal') &&
				rows.some(r => r.innerText.includes('alice') && r.innerText.includes('dev-1') && /\d+ \/ \d+/.test(r.innerText));
		})()`, 15*time.Second)
		screenshot(t, ctx, shots, "7-audit")
	})

	t.Run("item1_csrf_refused", func(t *testing.T) {
		status := evalJS[float64](t, ctx,
			`fetch('/ui/api/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'},
			body: JSON.stringify({selector: '*', command: 'touch /tmp/csrf'})}).then(r => r.status)`)
		if status != 403 {
			t.Fatalf("a POST without the CSRF token answered %v, want 403", status)
		}
		wrong := evalJS[float64](t, ctx,
			`fetch('/ui/api/v1/jobs', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': 'guess'},
			body: JSON.stringify({selector: '*', command: 'true'})}).then(r => r.status)`)
		if wrong != 403 {
			t.Fatalf("a POST with a wrong CSRF token answered %v, want 403", wrong)
		}
		csp := evalJS[string](t, ctx, `fetch('/ui/').then(r => r.headers.get('content-security-policy'))`)
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") ||
			!strings.Contains(csp, "frame-ancestors 'none'") {
			t.Fatalf("Content-Security-Policy %q", csp)
		}
	})

	t.Run("item1_sign_out", func(t *testing.T) {
		must(t, ctx, "sign out", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible("#fleet-table"),
			chromedp.Click("#signout"))
		waitJS(t, ctx, "signed out", `document.querySelector('main h1')?.textContent === 'Signed out'`, 10*time.Second)
		if st := evalJS[float64](t, ctx, `fetch('/ui/api/me').then(r => r.status)`); st != 401 {
			t.Fatalf("after sign-out /ui/api/me answers %v, want 401", st)
		}
		screenshot(t, ctx, shots, "8-signed-out")
	})
}

// TestConsoleOutsideRole: an operator whose role selects env=dev sees
// neither prod-1 in the fleet nor its page, and its terminal is refused; the
// API refuses them prod-1 too; jobs and audit need the admin role.
func TestConsoleOutsideRole(t *testing.T) {
	chromiumPath(t)
	f := startConsoleFleet(t)
	h := f.h
	bobKey := filepath.Join(t.TempDir(), "bob")
	testenv.NewKeyFile(t, bobKey)
	h.cli("operator", "add", "bob", "--key", bobKey+".pub", "--role", "dev-ops")
	link, identity := f.signInLink(t, "bob", bobKey)
	ctx := browser(t)
	shots := artifacts(t)
	base := "https://" + h.apiAddr()

	must(t, ctx, "sign in", chromedp.Navigate(link))
	waitJS(t, ctx, "bob's fleet",
		`(() => { const r = [...document.querySelectorAll('#fleet-table tbody tr')].map(r => r.dataset.node); `+
			`return r.join() === 'dev-1,dev-2' })()`, 20*time.Second)
	if total := evalJS[string](
		t, ctx, `document.querySelector('#count-total').innerText`,
	); !strings.HasPrefix(total, "2") {
		t.Fatalf("bob's count: %q, want 2 nodes", total)
	}
	screenshot(t, ctx, shots, "1-fleet-bob")

	must(t, ctx, "prod-1's page", chromedp.Navigate(base+"/ui/nodes/prod-1"))
	waitJS(t, ctx, "refused",
		`document.querySelector('main .error')?.textContent.includes('no node named "prod-1"')`, 10*time.Second)
	screenshot(t, ctx, shots, "2-prod1-refused")
	if st := evalJS[float64](t, ctx, `fetch('/ui/api/fleet?q=prod').then(r => r.json()).then(p => p.matched)`); st != 0 {
		t.Fatalf("bob's fleet search for prod matched %v nodes", st)
	}
	// The terminal to prod-1, asked directly with the right CSRF token.
	msg := evalJS[string](t, ctx, `fetch('/ui/api/me').then(r => r.json()).then(me => new Promise(res => {
		const ws = new WebSocket('wss://' + location.host + '/ui/api/terminal?node=prod-1&login=root');
		ws.onopen = () => ws.send(JSON.stringify({csrf: me.csrf, cols: 80, rows: 24}));
		ws.onmessage = ev => res(typeof ev.data === 'string' ? ev.data : 'output: a shell opened');
		ws.onclose = () => res('closed without a word');
	}))`)
	if !strings.Contains(msg, `"error"`) || !strings.Contains(msg, "do not select node") {
		t.Fatalf("bob's terminal to prod-1: %s", msg)
	}
	// Where bob may go, the terminal works.
	must(t, ctx, "dev-1's page", chromedp.Navigate(base+"/ui/nodes/dev-1"), chromedp.WaitVisible("#open-terminal"),
		chromedp.SetValue("#login", loginUser), chromedp.Click("#open-terminal"))
	waitJS(t, ctx, "terminal connected", `document.querySelector('#terminal')?.dataset.connected === 'true'`,
		15*time.Second)
	must(t, ctx, "type", chromedp.SendKeys("#terminal textarea", "echo bob-$((6*7))\r"))
	waitJS(t, ctx, "bob's command output", `window.tetherTerminalText().includes('bob-42')`, 15*time.Second)

	// Jobs and the audit log need the admin role, in the console as in the API.
	if st := evalJS[float64](t, ctx, `fetch('/ui/api/v1/jobs').then(r => r.status)`); st != 403 {
		t.Fatalf("bob's job list answered %v, want 403", st)
	}
	if st := evalJS[float64](t, ctx, `fetch('/ui/api/v1/audit').then(r => r.status)`); st != 403 {
		t.Fatalf("bob's audit log answered %v, want 403", st)
	}
	names, _ := listedNames(t, identity...)
	if strings.Join(names, ",") != "dev-1,dev-2" {
		t.Fatalf("the API lists bob %v, want dev-1 dev-2", names)
	}

	// Removing bob ends his open terminal within the re-check interval,
	// and his console session at its next request.
	h.cli("operator", "rm", "bob")
	waitJS(t, ctx, "the terminal closed: access withdrawn",
		`document.querySelector('#terminal-status')?.textContent.includes('access withdrawn')`, 15*time.Second)
	screenshot(t, ctx, shots, "3-terminal-withdrawn")
	if st := evalJS[float64](t, ctx, `fetch('/ui/api/me').then(r => r.status)`); st != 401 {
		t.Fatalf("after `tether operator rm bob` his session answers %v, want 401", st)
	}
}

// TestConsoleUpgrades (item 4): an admin follows a rollout that needs
// confirmation in the console: per-batch progress and each node's step,
// pause and resume, and the Confirm button of each node awaiting
// confirmation; the rollout finishes and the confirmations are audited
// with the console operator's name. A bad bundle's rollout shows each
// node's failure reason and the halt; a node's page its upgrade history.
func TestConsoleUpgrades(t *testing.T) {
	chromiumPath(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	h := otaHub(t, reg)
	startUpFleet(t, h, "cu", 2)
	dir := t.TempDir()
	p := writeScript(t, dir, "install.sh", "echo ok >> "+filepath.Join(dir, "ran")+"\n")
	if _, err := reg.PushBundle(
		context.Background(), reg.Ref("patches/cu:1"), "1", map[string]string{"install.sh": p},
	); err != nil {
		t.Fatal(err)
	}
	h.cli("upgrade", "create", "cu-1", "--artifact", reg.Ref("patches/cu:1"), "--nodes", "cu-00,cu-01",
		"--batch", "1", "--require-confirmation")
	h.cli("operator", "add", "alice", "--key", opPub, "--role", "admin")
	f := &consoleFleet{h: h}
	link, _ := f.signInLink(t, "alice", opKey)
	ctx := browser(t)
	shots := artifacts(t)
	base := "https://" + h.apiAddr()

	must(t, ctx, "sign in", chromedp.Navigate(link))
	waitJS(t, ctx, "fleet", `!!document.querySelector('#fleet-table tr[data-node="cu-00"]')`, 20*time.Second)
	must(t, ctx, "upgrades page", chromedp.Navigate(base+"/ui/upgrades"))
	waitJS(t, ctx, "cu-1 listed", `!!document.querySelector('#upgrades-table tr[data-upgrade="cu-1"]')`, 10*time.Second)
	screenshot(t, ctx, shots, "1-upgrades")
	must(t, ctx, "open cu-1", chromedp.Click(`#upgrades-table tr[data-upgrade="cu-1"] a`))
	waitJS(t, ctx, "cu-00 awaiting confirmation in batch 0, cu-01 waiting in batch 1",
		`!!document.querySelector('.batch[data-batch="0"] `+
			`tr[data-node="cu-00"][data-step="awaiting_confirmation"] button.confirm') &&
		 !!document.querySelector('.batch[data-batch="1"] tr[data-node="cu-01"]')`, 60*time.Second)
	screenshot(t, ctx, shots, "2-rollout-awaiting")

	must(t, ctx, "pause", chromedp.Click("#rollout-pause"))
	waitJS(t, ctx, "paused", `document.querySelector('h1 .state')?.textContent === 'paused' && `+
		`!document.querySelector('#rollout-resume').disabled`, 10*time.Second)
	must(t, ctx, "resume", chromedp.Click("#rollout-resume"))
	waitJS(t, ctx, "running again", `document.querySelector('h1 .state')?.textContent === 'running'`, 10*time.Second)

	for _, node := range []string{"cu-00", "cu-01"} {
		sel := `tr[data-node="` + node + `"]`
		waitJS(t, ctx, node+" awaiting confirmation", `!!document.querySelector('`+sel+` button.confirm')`, 60*time.Second)
		must(t, ctx, "confirm "+node, chromedp.Click(sel+` button.confirm`))
		waitJS(t, ctx, node+" succeeded, confirmed by alice", `(() => { const r = document.querySelector('`+sel+`');
			return r?.dataset.step === 'succeeded' && r.innerText.includes('alice') })()`, 90*time.Second)
	}
	waitJS(t, ctx, "the rollout done", `document.querySelector('h1 .state')?.textContent === 'done'`, 30*time.Second)
	screenshot(t, ctx, shots, "3-rollout-done")
	n := evalJS[float64](t, ctx, `fetch('/ui/api/v1/audit?kind=upgrade_confirm').then(r => r.json()).then(l => `+
		`l.filter(e => e.result === 'ok' && (e.operator || '').includes('alice')).length)`)
	if n < 2 {
		t.Fatalf("%v confirmations by alice audited, want 2", n)
	}
	// A bad bundle: each node's failure reason and the rollout's halt.
	bad := writeScript(t, dir, "bad.sh", "echo \"broken on purpose\" >&2\nexit 3\n")
	if _, err := reg.PushBundle(
		context.Background(), reg.Ref("patches/cu:2"), "2", map[string]string{"install.sh": bad},
	); err != nil {
		t.Fatal(err)
	}
	h.cli("upgrade", "create", "cu-2", "--artifact", reg.Ref("patches/cu:2"), "--nodes", "cu-00,cu-01")
	must(t, ctx, "cu-2's page", chromedp.Navigate(base+"/ui/upgrades/cu-2"))
	waitJS(t, ctx, "failure reasons shown",
		`(() => { const rows = [...document.querySelectorAll('#rollout tr[data-node]')];
		return rows.length === 2 && rows.every(r => r.dataset.step === 'failed' && `+
			`r.innerText.includes('install.sh exited with status 3')) })()`, 60*time.Second)
	waitJS(t, ctx, "the rollout halted with its reason",
		`document.querySelector('h1 .state')?.textContent === 'halted' && `+
			`!!document.querySelector('#rollout-reason')?.textContent`, 30*time.Second)
	screenshot(t, ctx, shots, "4-rollout-failed")
	// The node page shows its upgrade history.
	must(t, ctx, "cu-00's page", chromedp.Navigate(base+"/ui/nodes/cu-00"))
	waitJS(t, ctx, "upgrade history", `(() => { const t = document.querySelector('#node-upgrades')?.innerText || '';
		return t.includes('cu-1') && t.includes('succeeded') && t.includes('cu-2') && t.includes('failed') `+
		`})()`, 15*time.Second)
	screenshot(t, ctx, shots, "5-node-upgrade-history")
}

// TestConsoleScale measures the fleet view in Chromium against a real hub
// holding 10k and 100k nodes (rows written into its store while it is
// stopped): the page load from opening the sign-in link to the first page
// of the table drawn, and a label filter and a name search from the input
// to the table redrawn. Set TETHER_CONSOLE_SCALE=1 (bench/RESULTS.md).
func TestConsoleScale(t *testing.T) {
	if os.Getenv("TETHER_CONSOLE_SCALE") == "" {
		t.Skip("set TETHER_CONSOLE_SCALE=1 to measure the console at 10k and 100k nodes")
	}
	chromiumPath(t)
	for _, n := range []int{10_000, 100_000} {
		t.Run(fmt.Sprintf("%dk", n/1000), func(t *testing.T) {
			h := startHub(t)
			h.cli("operator", "add", "alice", "--key", opPub, "--role", "admin")
			h.p.Stop(syscall.SIGTERM, stopWait)
			testenv.FillNodes(t, filepath.Join(h.dataDir, "tether.db"), n)
			h.start()
			f := &consoleFleet{h: h}
			link, _ := f.signInLink(t, "alice", opKey)
			ctx := browser(t)
			must(t, ctx, "open the link", chromedp.Navigate(link))
			waitJS(t, ctx, "the first page", `document.querySelectorAll('#fleet-table tbody tr').length === 50`, 60*time.Second)
			load := evalJS[float64](t, ctx, `window.tetherFleetRendered`)
			// A second load: the hub's node list is cached now.
			must(t, ctx, "reload", chromedp.Reload())
			waitJS(t, ctx, "the first page again", `document.querySelectorAll('#fleet-table tbody tr').length === 50`,
				60*time.Second)
			warm := evalJS[float64](t, ctx, `window.tetherFleetRendered`)
			timed := func(setup, done string) float64 {
				return evalJS[float64](t, ctx, `(() => { const t0 = performance.now(); `+setup+`;
					return new Promise(res => { const check = () => (window.tetherFleetRendered > t0 && `+
					`(`+done+`)) ? res(window.tetherFleetRendered - t0) : setTimeout(check, 2); check(); }); })()`)
			}
			filter := timed(`const l = document.querySelector('#label-filter'); l.value = 'site=s42,env=dev'; `+
				`l.dispatchEvent(new Event('change'))`,
				`[...document.querySelectorAll('#fleet-table tbody tr')].every(r => r.innerText.includes('site=s42'))`)
			search := timed(`const l = document.querySelector('#label-filter'); l.value = ''; `+
				`l.dispatchEvent(new Event('change'));
				const s = document.querySelector('#search'); s.value = 'node-0012'; s.dispatchEvent(new Event('input'))`,
				`document.querySelector('#fleet-table tbody tr')?.dataset.node.startsWith('node-0012')`)
			// The search box waits 200 ms after the last keystroke.
			t.Logf("console at %d nodes: page load %.0f ms (first, store read), %.0f ms (cached); label filter %.0f "+
				"ms; search %.0f ms (+ the 200 ms typing pause)",
				n, load, warm, filter, search-200)
		})
	}
}
