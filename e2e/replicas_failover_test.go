package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/internal/testenv/pgtest"
	"github.com/tether-dev/tether/pki"
)

// What a replica's death costs, on replicas started as the docs' recipe
// starts them (no --advertise): the agents it held are online on another
// replica within failoverBound, and a jump entering a live replica for a
// node it held fails at once with the reason until the node is back.

// failoverBound is how soon a dead replica's agents must be online on
// another one.
const failoverBound = 10 * time.Second

// startPlainReplicas starts replicas on db with nothing but their own
// listeners, IDs ids, as docs/replicas.md does on one machine.
func startPlainReplicas(t *testing.T, db string, ids ...string) []*hub {
	t.Helper()
	var hubs []*hub
	for _, id := range ids {
		hubs = append(hubs, startPlainReplica(t, db, id))
	}
	return hubs
}

func startPlainReplica(t *testing.T, db, id string) *hub {
	t.Helper()
	h := &hub{t: t, dataDir: filepath.Join(t.TempDir(), id), apiPort: freePort(t), sshPort: freePort(t),
		extraArgs: []string{"--store", db, "--replica-id", id, "--peer-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}}
	h.start()
	waitFor(t, id+" to serve its peers", 30*time.Second, func() bool {
		return h.p.LogCount("replica serving peers") > 0
	})
	return h
}

// joinAddrs are the hub addresses a join string names.
func joinAddrs(t *testing.T, join string) []string {
	t.Helper()
	js, err := pki.ParseJoinString(join)
	if err != nil {
		t.Fatalf("join string %q: %v", join, err)
	}
	return js.Addrs
}

var logTimeRE = regexp.MustCompile(`^time=(\S+) `)

// loggedAt is the time of the first line of log text with msg about node
// (ok false if there is none yet).
func loggedAt(text, msg, node string) (time.Time, bool) {
	re := regexp.MustCompile(`msg="` + regexp.QuoteMeta(msg) + `".* node=` + regexp.QuoteMeta(node) + `( |$)`)
	for _, line := range strings.Split(text, "\n") {
		if !re.MatchString(line) {
			continue
		}
		if m := logTimeRE.FindStringSubmatch(line); m != nil {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				return at, true
			}
		}
	}
	return time.Time{}, false
}

// agentLostAt is when an agent's log says it lost its hub.
func agentLostAt(p *proc) (time.Time, bool) {
	for _, line := range strings.Split(p.Log(), "\n") {
		if !strings.Contains(line, `msg="hub connection lost; retrying"`) {
			continue
		}
		if m := logTimeRE.FindStringSubmatch(line); m != nil {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				return at, true
			}
		}
	}
	return time.Time{}, false
}

// TestReplicaDeathFailover: two replicas on PostgreSQL, a QUIC and a TCP
// agent and a node behind a real sshd, all joined with a join string made
// on replica A (which names B too) and connected to A, every agent at the
// default keepalive and dead-peer timeout. kill -9 of A: both agents are
// online on B within failoverBound (a killed hub resets a TCP agent's
// connection; B finds A dead by its peer link and pokes the QUIC agent,
// which would otherwise hear nothing until its dead-peer timeout, 50 s);
// a stock ssh jump entering B
// for the node A held, whose agent is stopped so it cannot come back yet,
// fails at once saying so; once the agent runs again the same jump works.
func TestReplicaDeathFailover(t *testing.T) {
	hubs := startPlainReplicas(t, pgtest.DSN(t), "a", "b")
	a, b := hubs[0], hubs[1]
	join := a.token("--uses", "3", "--ttl", "10m")
	if got, want := joinAddrs(t, join), []string{a.apiAddr(), b.apiAddr()}; !slices.Equal(got, want) {
		t.Fatalf("a join string made on replica a names %v, want every replica, a's first: %v", got, want)
	}

	dir := t.TempDir()
	pub, err := os.ReadFile(opPub)
	if err != nil {
		t.Fatal(err)
	}
	sd := testenv.StartSSHD(t, testenv.SSHDConfig{Dir: filepath.Join(dir, "sshd"), AuthorizedKeys: pub})
	// The agents' own reconnect backoff (the harness caps it at 2s).
	agents := map[string]*proc{}
	defaultBackoff := []string{"--backoff-max", "30s"}
	agents["fq"], _ = startAgent(t, join, "fq", slices.Concat([]string{"--ssh", "embedded", "--transport", "quic"},
		defaultBackoff)...)
	agents["ft"], _ = startAgent(t, join, "ft",
		slices.Concat([]string{"--ssh", "embedded", "--transport", "tcp"}, defaultBackoff)...)
	agents["fs"], _ = startAgent(t, join, "fs", slices.Concat([]string{"--ssh", sd.Addr, "--transport", "tcp"},
		defaultBackoff)...)
	for n := range agents {
		waitFor(t, n+" connected to replica a", time.Minute, func() bool { return a.connects(n) > 0 })
	}
	a.cli("operator", "add", "alice", "--key", opPub)
	cl := newSSHClient(t, b)
	cl.trust("fs.tether", sd.HostKey.Pub())
	// Through b to the node a holds: the peer link to a is up, as on any
	// replica set in use (the operator added on a reaches b's door through
	// the change feed).
	waitFor(t, "a jump through replica b to fs", 30*time.Second, func() bool {
		out, _, code := cl.run(30*time.Second, "fs", "echo", "warm")
		return code == 0 && strings.TrimSpace(out) == "warm"
	})

	stopped := agents["fs"]
	if err := syscall.Kill(stopped.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(stopped.PID(), syscall.SIGCONT)
		}
	}()
	type jump struct {
		errOut string
		code   int
		took   time.Duration
	}
	jumped := make(chan jump, 1)
	killed := time.Now()
	a.p.Stop(syscall.SIGKILL, time.Minute)
	go func() {
		began := time.Now()
		_, errOut, code := runCmd(t, time.Minute, "ssh", append(cl.jumpArgs("fs"), "true")...)
		jumped <- jump{errOut, code, time.Since(began)}
	}()

	// Both agents, on b: timed by b's log and the agents' own.
	back := map[string]time.Duration{}
	waitFor(t, "fq and ft online on replica b", time.Minute, func() bool {
		for _, n := range []string{"fq", "ft"} {
			if at, ok := loggedAt(b.p.Log(), "node connected", n); ok {
				back[n] = at.Sub(killed)
			}
		}
		return len(back) == 2
	})
	for _, n := range []string{"fq", "ft"} {
		lost, _ := agentLostAt(agents[n])
		t.Logf("%s (%s) online on replica b %s after kill -9 of a (it noticed %s after the kill)", n,
			map[string]string{"fq": "quic", "ft": "tcp"}[n], back[n].Round(time.Millisecond),
			lost.Sub(killed).Round(time.Millisecond))
		if back[n] > failoverBound {
			t.Errorf("%s was online on replica b %s after the kill, want within %s", n, back[n], failoverBound)
		}
	}
	if !strings.Contains(b.p.Log(), "replica unreachable: asking its QUIC agents to reconnect now") {
		t.Error("replica b's log does not say it poked a's QUIC agents")
	}

	j := <-jumped
	t.Logf("jump through b to fs (held by the dead a, its agent stopped): exit %d after %s: %s", j.code,
		j.took.Round(time.Millisecond), strings.TrimSpace(j.errOut))
	want := "node fs was connected to replica a, which stopped answering at "
	if j.code == 0 || !strings.Contains(j.errOut, want) || !strings.Contains(j.errOut, "not reconnected here yet") {
		t.Errorf("jump through b to fs before its agent is back: exit %d, stderr %q; want refused with %q",
			j.code, j.errOut, want)
	}
	if j.took > 3*time.Second {
		t.Errorf("the jump to fs failed after %s, want at once", j.took)
	}

	if err := syscall.Kill(stopped.PID(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	waitFor(t, "fs online on replica b", time.Minute, func() bool { return b.connects("fs") > 0 })
	if out, errOut, code := cl.run(time.Minute, "fs", "echo", "back"); code != 0 || strings.TrimSpace(out) != "back" {
		t.Fatalf("jump through b to fs after its agent came back: exit %d, out %q, err %s", code, out, errOut)
	}
}

// TestReplicaAddedLaterIsLearned: a node that joined while one replica ran
// learns of a replica started later from its hub's welcome, keeps it in
// node.json, and fails over to it when the first one dies.
func TestReplicaAddedLaterIsLearned(t *testing.T) {
	db := pgtest.DSN(t)
	a := startPlainReplica(t, db, "a")
	join := a.token()
	if got := joinAddrs(t, join); !slices.Equal(got, []string{a.apiAddr()}) {
		t.Fatalf("join string of a lone replica names %v, want %s", got, a.apiAddr())
	}
	_, stateDir := startAgent(t, join, "late", "--ssh", "embedded", "--transport", "tcp")
	waitFor(t, "late connected to replica a", time.Minute, func() bool { return a.connects("late") > 0 })

	b := startPlainReplica(t, db, "b")
	// A reconnect brings a welcome from a, which names b now.
	a.p.Stop(syscall.SIGTERM, stopWait)
	a.start()
	a.waitConnected("late", 0) // the new process's log
	waitFor(t, "node.json to list replica b", 30*time.Second, func() bool {
		cfg, err := os.ReadFile(filepath.Join(stateDir, "node.json"))
		return err == nil && strings.Contains(string(cfg), `"`+b.apiAddr()+`"`)
	})

	killed := time.Now()
	a.p.Stop(syscall.SIGKILL, time.Minute)
	waitFor(t, "late online on replica b", time.Minute, func() bool { return b.connects("late") > 0 })
	at, _ := loggedAt(b.p.Log(), "node connected", "late")
	t.Logf("late online on the replica it learned of %s after kill -9 of a", at.Sub(killed).Round(time.Millisecond))
	if took := at.Sub(killed); took > failoverBound {
		t.Errorf("late was online on replica b %s after the kill, want within %s", took, failoverBound)
	}
}

// TestReplicaFrozenFailover: replica a's machine falls silent (SIGSTOP: its
// sockets stay open, nothing answers, nothing is reset). Replica b finds
// it dead by its peer link (silent for 5 s, then a 2 s dial unanswered)
// and pokes a's QUIC agent, at the default keepalive and dead-peer
// timeout, which is online on b within failoverBound: without the poke it
// would wait out its dead-peer timeout (45–50 s).
func TestReplicaFrozenFailover(t *testing.T) {
	hubs := startPlainReplicas(t, pgtest.DSN(t), "a", "b")
	a, b := hubs[0], hubs[1]
	join := a.token()
	agent, _ := startAgent(t, join, "fz", "--ssh", "embedded", "--transport", "quic", "--backoff-max", "30s")
	waitFor(t, "fz connected to replica a", time.Minute, func() bool { return a.connects("fz") > 0 })
	waitFor(t, "b's peer link to a", 30*time.Second, func() bool {
		return regexp.MustCompile(`msg="peer link up" .*peer=a `).MatchString(b.p.Log())
	})
	if err := syscall.Kill(a.p.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(a.p.PID(), syscall.SIGCONT) })
	waitFor(t, "fz online on replica b", time.Minute, func() bool { return b.connects("fz") > 0 })
	at, _ := loggedAt(b.p.Log(), "node connected", "fz")
	lost, _ := agentLostAt(agent)
	t.Logf("fz (quic) online on replica b %s after a froze (it dropped its session %s after)",
		at.Sub(frozen).Round(time.Millisecond), lost.Sub(frozen).Round(time.Millisecond))
	if took := at.Sub(frozen); took > failoverBound {
		t.Errorf("fz was online on replica b %s after a froze, want within %s", took, failoverBound)
	}
}
