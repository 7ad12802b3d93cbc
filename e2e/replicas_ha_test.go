package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

// High availability of hub replicas sharing one store: live sessions follow
// access changes made on another replica, the singletons' leadership moves
// when its holder dies, a dead replica's agents and jobs are taken over.

// haStores are the shared stores the HA tests run on: a throwaway
// PostgreSQL server of the test's own (so a test may restart it), and a
// SQLite file several hubs on one machine share.
var haStores = []struct {
	name string
	make func(t *testing.T) (db string, srv *pgtest.Server)
}{
	{"postgres", func(t *testing.T) (string, *pgtest.Server) {
		srv := pgtest.Own(t)
		dsn, err := srv.CreateDB("ha")
		if err != nil {
			t.Fatal(err)
		}
		return dsn, srv
	}},
	{"sqlite", func(t *testing.T) (string, *pgtest.Server) {
		return "sqlite:" + filepath.Join(t.TempDir(), "shared.db"), nil
	}},
}

// haLeaderTTL is the replicas' --leader-ttl in these tests: leadership
// moves within 4/3 of it after the leader dies.
const haLeaderTTL = 3 * time.Second

// haReplicas is n `tether hub` replicas on one store, with one identity.
type haReplicas struct {
	t    *testing.T
	hubs []*hub
}

// startReplicas starts n replicas sharing one SQLite file (several hubs on
// one machine share it safely). Replica i advertises itself first and then
// the others, so a join string made on replica i sends agents to i and,
// when i is gone, to the next.
func startHAReplicas(t *testing.T, db string, n int, extra ...string) *haReplicas {
	t.Helper()
	dir := t.TempDir()
	rs := &haReplicas{t: t}
	ports := make([]int, n)
	for i := range ports {
		ports[i] = freePort(t)
	}
	for i := range n {
		args := []string{"--store", db, "--leader-ttl", haLeaderTTL.String(),
			"--peer-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}
		for k := range n {
			args = append(args, "--advertise", fmt.Sprintf("127.0.0.1:%d", ports[(i+k)%n]))
		}
		h := &hub{t: t, dataDir: filepath.Join(dir, fmt.Sprintf("replica-%c", 'a'+i)), apiPort: ports[i],
			sshPort:   freePort(t),
			extraArgs: append(args, extra...)}
		h.start()
		// hub.json is written before the replica joins its peers.
		waitFor(t, filepath.Base(h.dataDir)+" to serve its peers", 30*time.Second, func() bool {
			return h.p.LogCount("replica serving peers") > 0
		})
		rs.hubs = append(rs.hubs, h)
	}
	return rs
}

// leaders returns the replicas whose logs say they lead now.
func (rs *haReplicas) leaders() []*hub {
	var out []*hub
	for _, h := range rs.hubs {
		if !h.p.Exited() && h.p.LogCount("leading the fleet's singletons") > h.p.LogCount("no longer leading") {
			out = append(out, h)
		}
	}
	return out
}

// waitLeader waits until exactly one live replica other than not leads.
func (rs *haReplicas) waitLeader(timeout time.Duration, not *hub) *hub {
	rs.t.Helper()
	var l *hub
	waitFor(rs.t, "one replica to lead", timeout, func() bool {
		ls := rs.leaders()
		if len(ls) != 1 || ls[0] == not {
			return false
		}
		l = ls[0]
		return true
	})
	return l
}

// TestReplicasRevocationCutsSessionElsewhere: an operator added at replica
// A jumps through replica C to a node whose tunnel C holds; revoking the
// key they jumped with at replica A ends that session within a second, and
// the jump's audit row (written by C) says why.
func TestReplicasRevocationCutsSessionElsewhere(t *testing.T) {
	for _, st := range haStores {
		t.Run(st.name, func(t *testing.T) {
			db, _ := st.make(t)
			testRevocationCutsSessionElsewhere(t, startHAReplicas(t, db, 3))
		})
	}
}

func testRevocationCutsSessionElsewhere(t *testing.T, rs *haReplicas) {
	a, c := rs.hubs[0], rs.hubs[2]
	dir := t.TempDir()
	a.cli("role", "create", "lab", "--nodes", "site=lab", "--logins", loginUser)
	keys := []*testenv.Key{testenv.NewKeyFile(t, filepath.Join(dir, "k0")),
		testenv.NewKeyFile(t, filepath.Join(dir, "k1"))}
	authorized := append(gossh.MarshalAuthorizedKey(keys[0].Pub()), gossh.MarshalAuthorizedKey(keys[1].Pub())...)
	sd := testenv.StartSSHD(t, testenv.SSHDConfig{Dir: filepath.Join(dir, "sshd"), AuthorizedKeys: authorized})
	startAgent(t, c.token("--label", "site=lab"), "ha1", "--ssh", sd.Addr)
	waitFor(t, "ha1 connected to replica C", 30*time.Second, func() bool { return c.connects("ha1") > 0 })
	a.cli("operator", "add", "hop", "--key", keys[0].Path+".pub", "--key", keys[1].Path+".pub", "--role", "lab")

	cl := newSSHClientAs(t, c, "hop", keys[0].Path)
	cl.trust("ha1.tether", sd.HostKey.Pub())
	// The operator added at A reaches C's door through the change feed;
	// until then C refuses the login, and ssh exits without "started".
	var s *proc
	waitFor(t, "hop's jump through replica C", 30*time.Second, func() bool {
		if s != nil && !s.Exited() {
			return strings.Contains(s.Log(), "started")
		}
		s = start(t, "ssh-loop", "ssh",
			append(cl.jumpArgs("ha1", "-T"),
				"echo started; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo finished")...)
		return false
	})
	waitFor(t, "hop's loop to start", 30*time.Second, func() bool { return strings.Contains(s.Log(), "started") })

	begin := time.Now()
	a.cli("operator", "key", "rm", "hop", gossh.FingerprintSHA256(keys[0].Pub()))
	entered := time.Now()
	waitFor(t, "the jump held at C to end after the revocation at A", 10*time.Second, s.Exited)
	took := time.Since(entered)
	t.Logf("revocation at A -> session at C cut: %s after the command returned (%s after it started)",
		took.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	if strings.Contains(s.Log(), "finished") {
		t.Fatalf("the loop ran to its end: %s", s.Log())
	}
	if took > time.Second {
		t.Errorf("the session at replica C ended %s after the revocation at replica A; want within 1s", took)
	}
	// The audit row comes from C, whichever replica is asked.
	waitFor(t, "the withdrawn jump's audit row", 10*time.Second, func() bool {
		for _, e := range a.audit("--operator", "hop") {
			if e.Kind == "jump" && e.Result == "ended: access withdrawn" && e.Node == "ha1" &&
				strings.Contains(e.Detail, "was revoked") {
				return true
			}
		}
		return false
	})
	// The other key still jumps through C.
	other := newSSHClientAs(t, c, "hop", keys[1].Path)
	other.trust("ha1.tether", sd.HostKey.Pub())
	if out, errOut, code := other.run(30*time.Second, "ha1", "echo other-key"); code != 0 ||
		strings.TrimSpace(out) != "other-key" {
		t.Fatalf("jump with the operator's remaining key: exit %d %q %q", code, out, errOut)
	}

	// A node revoked at A loses its tunnel held at C: the agent is told
	// and stops.
	agent, _ := startAgent(t, c.token(), "ha2", "--ssh", "embedded")
	waitFor(t, "ha2 connected to replica C", 30*time.Second, func() bool { return c.connects("ha2") > 0 })
	a.cli("nodes", "revoke", "ha2")
	revoked := time.Now()
	waitFor(t, "the agent of the node revoked at A to stop", 20*time.Second, agent.Exited)
	t.Logf("node revoked at A -> its tunnel at C closed and the agent stopped %s later",
		time.Since(revoked).Round(time.Millisecond))
	if !strings.Contains(agent.Log(), "revoked") {
		t.Fatalf("agent log does not say it was revoked:\n%s", agent.Tail(2000))
	}

	// Admin certificates revoked at A are refused at C; C's own local
	// admin identity is made anew, so the CLI on C's machine works on.
	stale := filepath.Join(t.TempDir(), "stale")
	if err := os.CopyFS(stale, os.DirFS(c.dataDir)); err != nil {
		t.Fatal(err)
	}
	a.cli("ca", "revoke-admin")
	waitFor(t, "C to refuse an admin certificate issued before the revocation at A", 10*time.Second, func() bool {
		_, _, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "nodes", "--data-dir", stale)
		return code != 0
	})
	waitFor(t, "C's CLI to work after the admin revocation at A", 30*time.Second, func() bool {
		_, _, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "nodes", "--data-dir", c.dataDir)
		return code == 0
	})
}

// TestReplicasKilledLeaderFailover: agents and a fan-out job are on
// replica A, which leads; kill -9 of A during jumps and the job moves the
// leadership to another replica, the agents reconnect to the next replica
// in their join string within their backoff cap, the job reads
// interrupted (swept by the new leader) and its rerun on another replica
// completes; no audit row of the finished jumps is lost.
func TestReplicasKilledLeaderFailover(t *testing.T) {
	for _, st := range haStores {
		t.Run(st.name, func(t *testing.T) {
			db, _ := st.make(t)
			testKilledLeaderFailover(t, startHAReplicas(t, db, 3))
		})
	}
}

func testKilledLeaderFailover(t *testing.T, rs *haReplicas) {
	n := 100
	if testing.Short() {
		n = 10
	}
	a := rs.hubs[0]
	if l := rs.waitLeader(30*time.Second, nil); l != a {
		// The first replica started first and leads; the others campaign.
		t.Fatalf("replica %s leads, want the first one", l.dataDir)
	}
	join := a.token("--uses", fmt.Sprint(n))
	const backoffMax = 2 * time.Second
	for i := range n {
		startAgent(t, join, fmt.Sprintf("ha%03d", i), "--ssh", "embedded", "--transport", "tcp")
	}
	began := time.Now()
	waitFor(t, fmt.Sprintf("%d agents on replica A", n), 3*time.Minute, func() bool {
		return a.p.LogCount("node connected") >= n
	})
	t.Logf("%d agents on replica A %s after start", n, time.Since(began).Round(time.Millisecond))

	// Jumps through A, finished before the kill: their audit rows must
	// survive it.
	cl := newSSHClient(t, a)
	a.cli("operator", "add", "alice", "--key", opPub)
	for i := range 3 {
		node := fmt.Sprintf("ha%03d", i)
		if out, errOut, code := cl.run(30*time.Second, node, "echo", node); code != 0 || strings.TrimSpace(out) != node {
			t.Fatalf("jump to %s: exit %d %q %q", node, code, out, errOut)
		}
	}
	// Their rows are written as the hub sees each jump end, which may be a
	// moment after ssh exits: wait for them, so that what the kill must
	// not lose was committed.
	jumpRows := func() int {
		n := 0
		for _, e := range a.audit("--operator", "alice") {
			if e.Kind == "jump" && e.Result == "ok" {
				n++
			}
		}
		return n
	}
	waitFor(t, "the three jumps' audit rows", 30*time.Second, func() bool { return jumpRows() == 3 })
	// A jump live at the kill.
	live := start(t, "ssh-live", "ssh", append(cl.jumpArgs("ha003", "-T"), "echo started; sleep 60")...)
	waitFor(t, "the live jump", 30*time.Second, func() bool { return strings.Contains(live.Log(), "started") })

	gate := filepath.Join(t.TempDir(), "gate")
	out, errOut, code := a.run(time.Minute, "--detach", "-l", "*", "--parallel", fmt.Sprint(n), "--",
		fmt.Sprintf(`i=0; while [ ! -f %s ] && [ $i -lt 240 ]; do sleep 0.25; i=$((i+1)); done`, gate))
	if code != 0 {
		t.Fatalf("run: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	waitForState(t, "every run of the fan-out running", 2*time.Minute, func() map[string]int { return a.job(id).Counts },
		func(c map[string]int) bool { return c["running"] == n })
	others := rs.hubs[1:]
	connectedBefore := others[0].p.LogCount("node connected") + others[1].p.LogCount("node connected")

	ls := rs.leaders()
	killed := time.Now()
	a.p.Stop(syscall.SIGKILL, time.Minute)

	// Both clocks run from the kill; one poll watches both.
	var (
		leader        *hub
		moved, back   time.Duration
		othersConnect = func() int { return others[0].p.LogCount("node connected") + others[1].p.LogCount("node connected") }
	)
	waitFor(t, "a new leader and the agents back on the other replicas", 2*time.Minute, func() bool {
		if ls := rs.leaders(); leader == nil && len(ls) == 1 && ls[0] != a {
			leader, moved = ls[0], time.Since(killed)
		}
		if back == 0 && othersConnect() >= connectedBefore+n {
			back = time.Since(killed)
		}
		return leader != nil && back != 0
	})
	if len(ls) == 1 && ls[0] == a {
		t.Logf("leadership moved to %s %s after kill -9 of the leader (lease TTL %s)", filepath.Base(leader.dataDir),
			moved.Round(time.Millisecond), haLeaderTTL)
		if bound := haLeaderTTL + haLeaderTTL/3 + time.Second; moved > bound {
			t.Errorf("leadership moved after %s, want within %s", moved, bound)
		}
	} else {
		// A leader that could not renew in time under load steps down
		// before its lease can expire; the move is then not measured here.
		t.Logf("replica A no longer led at the kill (leaders %d); %s leads", len(ls), filepath.Base(leader.dataDir))
	}
	// The agents' join string names A, then B, then C: B holds them now.
	b := rs.hubs[1]
	t.Logf("%d agents back on the other replicas %s after the kill (backoff cap %s)", n,
		back.Round(time.Millisecond), backoffMax)
	if bound := backoffMax + 5*time.Second; back > bound {
		t.Errorf("agents took %s to come back, want within their backoff cap plus start-up (%s)", back, bound)
	}
	waitFor(t, "the live jump to end with its replica", 30*time.Second, live.Exited)

	j := waitForState(t, "the job interrupted by the new leader", 30*time.Second, func() jobJSON { return leader.job(id) },
		func(j jobJSON) bool { return j.State == "interrupted" })
	t.Logf("job read interrupted %s after the kill: %s", time.Since(killed).Round(time.Millisecond), j.Error)
	if j.Counts["interrupted"] != n {
		t.Fatalf("runs after the kill: %+v, want %d interrupted", j.Counts, n)
	}
	testenv.WriteFile(t, gate, nil, 0o644)
	// Rerun through C, which holds none of the nodes: its runs are
	// forwarded to B.
	c := rs.hubs[2]
	out, errOut, code = runCmd(t, 3*time.Minute, filepath.Join(binDir, "tether"), "jobs", "rerun", id,
		"-o", "json", "--progress", "never", "--data-dir", c.dataDir)
	var rerun jobJSON
	if err := json.Unmarshal([]byte(out), &rerun); err != nil || code != 0 {
		t.Fatalf("rerun on replica %s: exit %d (%v): %s\n%s", filepath.Base(c.dataDir), code, err, errOut, out)
	}
	if rerun.Counts["ok"] != n {
		t.Fatalf("rerun: %+v, not ok: %+v", rerun.Counts, notOK(rerun))
	}

	// Nothing committed before the kill is lost: the three jumps' rows.
	got := map[string]bool{}
	for _, e := range b.audit("--operator", "alice") {
		if e.Kind == "jump" && e.Result == "ok" {
			got[e.Node] = true
		}
	}
	for i := range 3 {
		if node := fmt.Sprintf("ha%03d", i); !got[node] {
			t.Errorf("audit row of the jump to %s lost", node)
		}
	}
}

// TestReplicasSurvivePostgresRestart: the replicas' shared PostgreSQL
// stops and starts again. Meanwhile every replica keeps running, the
// leader steps down before its lease could expire, and each replica says
// what is wrong (the lease, the change feed, the CLI's request); afterwards
// one replica leads again by itself, and access changes cross replicas
// within a second again (the LISTEN connection is made anew).
func TestReplicasSurvivePostgresRestart(t *testing.T) {
	db, srv := haStores[0].make(t)
	rs := startHAReplicas(t, db, 3)
	l := rs.waitLeader(30*time.Second, nil)
	// A job live across the outage: it is no orphan, its replica lives.
	b := rs.hubs[1]
	startAgent(t, b.token(), "pg1", "--ssh", "embedded")
	waitFor(t, "pg1 connected to replica B", 30*time.Second, func() bool { return b.connects("pg1") > 0 })
	gate := filepath.Join(t.TempDir(), "gate")
	out, errOut, code := b.run(time.Minute, "--detach", "--nodes", "pg1", "--",
		fmt.Sprintf(`i=0; while [ ! -f %s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; test -f %s`, gate, gate))
	if code != 0 {
		t.Fatalf("run: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	waitForState(t, "the job running", time.Minute, func() map[string]int { return b.job(id).Counts },
		func(c map[string]int) bool { return c["running"] == 1 })

	srv.StopServer()
	stopped := time.Now()
	waitFor(t, "the leader to step down with the database gone", 10*haLeaderTTL, func() bool {
		return l.p.LogCount("stepping down") > 0
	})
	t.Logf("leader stepped down %s after the database stopped (lease TTL %s)",
		time.Since(stopped).Round(time.Millisecond), haLeaderTTL)
	for _, h := range rs.hubs {
		waitFor(t, filepath.Base(h.dataDir)+" to say the change feed is unreadable", 30*time.Second, func() bool {
			return h.p.LogCount("change feed not readable") > 0
		})
	}
	_, errOut, code = runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "nodes", "--data-dir", rs.hubs[1].dataDir)
	if code == 0 || !strings.Contains(errOut, "failed on the hub") {
		t.Errorf("tether nodes with the database down: exit %d, %q", code, errOut)
	}
	// The step-down cancels the term at once; its controllers return when
	// their store calls give up (a connect to a stopped server can take a
	// few seconds), and only then is "no longer leading" logged.
	waitFor(t, "every replica's singletons to stop with the database down", 10*haLeaderTTL, func() bool {
		return len(rs.leaders()) == 0
	})

	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	l = rs.waitLeader(10*haLeaderTTL, nil)
	t.Logf("%s leads %s after the database came back", filepath.Base(l.dataDir),
		time.Since(started).Round(time.Millisecond))
	for _, h := range rs.hubs {
		if h.p.Exited() {
			t.Fatalf("%s exited during the database restart:\n%s", filepath.Base(h.dataDir), h.p.Tail(3000))
		}
	}
	// The new leader has swept at least once past the grace: the job of
	// live replica B is still running, and finishes ok.
	waitFor(t, "the new leader to sweep past the grace", 10*haLeaderTTL, func() bool {
		return time.Since(started) > 2*haLeaderTTL
	})
	if j := b.job(id); j.State != "running" {
		t.Fatalf("B's job after the database restart: %s (%s), want still running", j.State, j.Error)
	}
	testenv.WriteFile(t, gate, nil, 0o644)
	j := waitForState(t, "B's job to finish", time.Minute, func() jobJSON { return b.job(id) },
		func(j jobJSON) bool { return j.State != "running" })
	if j.State != "succeeded" && j.Counts["ok"] != 1 {
		t.Fatalf("B's job after the database restart: %s %+v %+v", j.State, j.Counts, notOK(j))
	}
	testRevocationCutsSessionElsewhere(t, rs)
}
