package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type siteJSON struct {
	Name          string     `json:"name"`
	Path          string     `json:"path"`
	Health        string     `json:"health"`
	Connected     bool       `json:"connected"`
	LastHeartbeat time.Time  `json:"last_heartbeat"`
	Stale         bool       `json:"stale"`
	StaleSeconds  int64      `json:"stale_seconds"`
	NodesOnline   int        `json:"nodes_online"`
	NodesTotal    int        `json:"nodes_total"`
	Sites         []siteJSON `json:"sites"`
}

func (h *hub) sites() map[string]siteJSON {
	h.t.Helper()
	var list []siteJSON
	if err := json.Unmarshal([]byte(h.cli("sites", "-o", "json")), &list); err != nil {
		h.t.Fatal(err)
	}
	m := map[string]siteJSON{}
	for _, s := range list {
		m[s.Name] = s
	}
	return m
}

// TestSiteJoin: a hub joins a root hub as a site with a site token, over
// QUIC and over TCP; the root lists it healthy with its node count, stale
// (with how long) once it is killed, and healthy again after a restart
// that needs no token (the one on its command line is spent); a site
// restarts and takes joins while the root is down, and both come back by
// themselves when it is up again. A node
// token is refused as --parent with an error that says which token to use.
func TestSiteJoin(t *testing.T) {
	root := startHubIn(t, "", 0, append([]string{"--site-status-interval", "1s"}, quickDeadPeer...)...)

	nodeJoin := root.token()
	_, errOut, code := runCmd(t, 60*time.Second, filepath.Join(binDir, "tether"), "hub",
		"--data-dir", filepath.Join(t.TempDir(), "bad"), "--listen", "127.0.0.1:0", "--ssh-listen", "127.0.0.1:0",
		"--parent", nodeJoin, "--site", "bad")
	if code == 0 || !strings.Contains(errOut,
		"this is a node token; a site hub joins with a site token (`tether site token create` on the parent)") {
		t.Fatalf("a node token as --parent: exit %d: %s", code, errOut)
	}
	if _, ok := root.sites()["bad"]; ok {
		t.Fatal("a node token made a site")
	}
	// A site named like the root's node suffix would have its host CA
	// trusted for every NODE.tether by `tether config ssh`: refused, and
	// the site token is not spent.
	suffixJoin := strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "10m"))
	_, errOut, code = runCmd(t, 60*time.Second, filepath.Join(binDir, "tether"), "hub",
		"--data-dir", filepath.Join(t.TempDir(), "suffix"), "--listen", "127.0.0.1:0", "--ssh-listen", "127.0.0.1:0",
		"--parent", suffixJoin, "--site", "tether")
	if code == 0 || !strings.Contains(errOut, `invalid site name "tether": it is this hub's node suffix`) {
		t.Fatalf("a site named tether: exit %d: %s", code, errOut)
	}
	if _, ok := root.sites()["tether"]; ok {
		t.Fatal("a site named like the node suffix joined")
	}
	var toks []struct {
		Kind     string `json:"kind"`
		UsesLeft int    `json:"uses_left"`
	}
	if err := json.Unmarshal([]byte(root.cli("token", "list", "-o", "json")), &toks); err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if tok.Kind == "site" && tok.UsesLeft != 1 {
			t.Fatalf("the refused site join spent its token: %+v", toks)
		}
	}

	// The sites live to the end of the test (no subtests): the root's
	// restart below needs them.
	sites := map[string]*hub{}
	for _, tc := range []struct{ name, transport string }{{"berlin", "quic"}, {"munich", "tcp"}} {
		t.Logf("site %s over %s", tc.name, tc.transport)
		join := strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "10m"))
		site := startHubIn(t, "", 0, append([]string{"--parent", join, "--site", tc.name,
			"--site-status-interval", "1s", "--parent-transport", tc.transport}, quickDeadPeer...)...)
		sites[tc.name] = site
		startAgent(t, site.token(), "n1", "--ssh", "embedded")
		startAgent(t, site.token(), "n2", "--ssh", "embedded")
		waitForState(t, tc.name+" healthy at the root with 2 of 2 nodes online", 60*time.Second,
			func() siteJSON { return root.sites()[tc.name] },
			func(s siteJSON) bool {
				return s.Health == "healthy" && s.Connected && !s.Stale && s.NodesOnline == 2 && s.NodesTotal == 2 &&
					s.Path == tc.name
			})
		if n := root.nodes()[tc.name]; !n.Online || n.Transport != tc.transport {
			t.Fatalf("the site's uplink at the root: %+v, want online over %s", n, tc.transport)
		}

		site.p.Kill()
		s := waitForState(t, tc.name+" stale at the root", 30*time.Second, func() siteJSON { return root.sites()[tc.name] },
			func(s siteJSON) bool { return s.Stale && s.Health == "stale" && !s.Connected && s.StaleSeconds >= 3 })
		if s.NodesTotal != 2 {
			t.Fatalf("a stale site keeps its last counts: %+v", s)
		}
		table := root.cli("sites")
		if !strings.Contains(table, tc.name) || !strings.Contains(table, "stale for ") ||
			!strings.Contains(table, "unreachable since") {
			t.Fatalf("tether sites:\n%s", table)
		}

		site.start() // the same command line: its join string is spent
		waitForState(t, tc.name+" healthy again", 60*time.Second, func() siteJSON { return root.sites()[tc.name] },
			func(s siteJSON) bool { return s.Health == "healthy" && s.Connected && !s.Stale })
		if strings.Contains(site.p.Log(), "join refused") {
			t.Fatalf("the restarted site joined again:\n%s", site.p.Tail(2000))
		}
	}

	// The root down: a site restarts without it (nothing of its own waits
	// on the uplink) and takes a new node; with the root back, both sites
	// come back by themselves, and their statuses are above the Seq the
	// root kept, so they count.
	root.p.Stop(syscall.SIGTERM, stopWait)
	berlin := sites["berlin"]
	berlin.p.Stop(syscall.SIGTERM, stopWait)
	berlin.start()
	startAgent(t, berlin.token(), "n3", "--ssh", "embedded")
	berlin.waitOnline("n3", "")
	root.start()
	for name, total := range map[string]int{"berlin": 3, "munich": 2} {
		waitForState(t, name+" healthy after the root restarted", 60*time.Second,
			func() siteJSON { return root.sites()[name] },
			func(s siteJSON) bool {
				return s.Health == "healthy" && s.Connected && !s.Stale && s.NodesTotal == total
			})
	}
}
