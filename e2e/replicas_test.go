package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

// replicaJSON is one row of `tether replicas -o json`.
type replicaJSON struct {
	ID     string   `json:"id"`
	Self   bool     `json:"self"`
	Health string   `json:"health"`
	API    string   `json:"api"`
	SSH    string   `json:"ssh"`
	Links  []string `json:"links"`
	Agents []string `json:"agents"`
}

func (h *hub) replicas() map[string]replicaJSON {
	h.t.Helper()
	var list []replicaJSON
	if err := json.Unmarshal([]byte(h.cli("replicas", "-o", "json")), &list); err != nil {
		h.t.Fatal(err)
	}
	m := map[string]replicaJSON{}
	for _, r := range list {
		m[r.ID] = r
	}
	return m
}

// identityFiles are what every replica must present alike.
var replicaIdentityFiles = []string{"ca/ca.crt", "ca/ca.key", "ca/intermediate.crt", "ca/intermediate.key",
	"ca/ssh_host_ca", "ca/ssh_user_ca", "ssh_host_ed25519_key", "quic_reset.key"}

func readIdentity(t *testing.T, dataDir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, f := range replicaIdentityFiles {
		b, err := os.ReadFile(filepath.Join(dataDir, f))
		if err != nil {
			t.Fatal(err)
		}
		out[f] = b
	}
	return out
}

func sameIdentity(t *testing.T, what string, a, b map[string][]byte) {
	t.Helper()
	for f, v := range a {
		if !bytes.Equal(v, b[f]) {
			t.Fatalf("%s: %s differs", what, f)
		}
	}
}

// startReplicas starts n hub replicas on one store at once (they race to
// create the identity) and waits until each serves. extra are more `tether
// hub` flags, the same for each.
func startReplicas(t *testing.T, db string, n int, extra ...string) []*hub {
	t.Helper()
	hubs := make([]*hub, n)
	for i := range hubs {
		h := &hub{t: t, dataDir: filepath.Join(t.TempDir(), "hub"), apiPort: freePort(t), sshPort: freePort(t),
			extraArgs: append([]string{"--store", db, "--replica-id", fmt.Sprintf("r%d", i+1), "--replica-lease", "3s",
				"--peer-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, extra...)}
		hubs[i] = h
		h.p = start(t, fmt.Sprintf("hub-r%d", i+1), filepath.Join(binDir, "tether"), append([]string{"hub"},
			testenv.HubArgs(h.dataDir, h.apiAddr(), h.sshAddr(), "debug", h.extraArgs...)...)...)
	}
	for _, h := range hubs {
		if err := testenv.WaitHub(context.Background(), h.p, h.dataDir, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return hubs
}

// TestReplicas runs three hub replicas on one store with an agent on
// each: they present one identity; a stock OpenSSH jump entering at any
// replica reaches the nodes held by the others (forwarded over peer
// links); a job through a replica that holds none of its nodes completes;
// `tether replicas` shows replicas, links and agents; a replica restart
// keeps every identity (known_hosts and join strings made before it still
// work).
func TestReplicas(t *testing.T) {
	testReplicas(t, filepath.Join(t.TempDir(), "shared.db"))
}

// TestReplicasPostgres is TestReplicas on a shared PostgreSQL database.
func TestReplicasPostgres(t *testing.T) {
	dsn, err := pgtest.Own(t).CreateDB("replicas")
	if err != nil {
		t.Fatal(err)
	}
	testReplicas(t, dsn)
}

func testReplicas(t *testing.T, db string) {
	hubs := startReplicas(t, db, 3)
	ids := []string{"r1", "r2", "r3"}

	first := readIdentity(t, hubs[0].dataDir)
	for i, h := range hubs[1:] {
		sameIdentity(t, fmt.Sprintf("replica r%d vs r1", i+2), first, readIdentity(t, h.dataDir))
	}

	hubs[0].cli("operator", "add", "alice", "--key", opPub)
	// r2 and r3 restart once: the first restart of a replica that must
	// rotate nothing (and they load the operator at start, whether or not
	// the change feed brought it already).
	for _, h := range hubs[1:] {
		h.p.Stop(syscall.SIGTERM, stopWait)
		h.start()
		sameIdentity(t, "a replica after its restart", first, readIdentity(t, h.dataDir))
	}
	joins := make([]string, 3)
	nodes := []string{"n1", "n2", "n3"}
	for i, h := range hubs {
		// Each replica's join string names that replica first (and the
		// others after it): agent i lands on it.
		joins[i] = h.token("--ttl", "10m", "--uses", "3")
		startAgent(t, joins[i], nodes[i], "--ssh", "embedded")
	}
	for _, n := range nodes {
		hubs[0].waitOnline(n, "") // held elsewhere, shown online through presence
	}
	waitForState(t, "each replica holding its agent", 30*time.Second, hubs[1].replicas,
		func(m map[string]replicaJSON) bool {
			for i, id := range ids {
				r := m[id]
				if r.Health != "ok" || len(r.Agents) != 1 || r.Agents[0] != nodes[i] {
					return false
				}
			}
			return len(m) == 3
		})

	// Every replica's own `tether config ssh` (its bastion address, the
	// shared host CA): entering at each, reach the nodes held elsewhere.
	clients := make([]*sshClient, 3)
	for i, h := range hubs {
		clients[i] = newSSHClient(t, h)
	}
	t.Run("jump through every replica", func(t *testing.T) {
		for i := range hubs {
			for j, n := range nodes {
				if i == j {
					continue
				}
				out, errOut, code := clients[i].run(time.Minute, n, "echo", "via-"+ids[i])
				if code != 0 || strings.TrimSpace(out) != "via-"+ids[i] {
					t.Errorf("ssh -J %s to %s (held by %s): exit %d, out %q, err %s", ids[i], n, ids[j], code, out, errOut)
				}
			}
		}
		m := hubs[0].replicas()
		if r := m["r1"]; !r.Self || len(r.Links) != 2 {
			t.Errorf("r1 after jumping to both peers' nodes: %+v, want self with links to r2 and r3", r)
		}
		body := hubs[0].metrics(t)
		if !strings.Contains(body, `tether_peer_streams_total{direction="out",result="ok"}`) ||
			!strings.Contains(body, `tether_peer_links{direction="out"} 2`) {
			t.Errorf("r1's peer metrics lack its forwarded streams or links:\n%s", grepLines(body, "tether_peer_"))
		}
	})

	t.Run("job through a replica holding none of its nodes", func(t *testing.T) {
		j, code := hubs[0].runJSON(2*time.Minute, "--nodes", "n2,n3", "--", "echo", "job-ok")
		if code != 0 || j.State != "succeeded" || j.node("n2").State != "ok" || j.node("n3").State != "ok" {
			t.Fatalf("job via r1 on n2 (r2) and n3 (r3): exit %d, %+v", code, j)
		}
	})

	t.Run("restart keeps the identity", func(t *testing.T) {
		h := hubs[1]
		h.p.Stop(syscall.SIGTERM, stopWait)
		h.start()
		sameIdentity(t, "r2 after its restart", first, readIdentity(t, h.dataDir))
		// n2's agent is back, on r2 or, if r2 was not yet, on the next
		// replica its join string names.
		hubs[0].waitOnline("n2", "")
		// known_hosts written before the restart still verifies r2's
		// bastion and the nodes behind it.
		if out, errOut, code := clients[1].run(time.Minute, "n3", "echo", "again"); code != 0 ||
			strings.TrimSpace(out) != "again" {
			t.Fatalf("ssh -J r2 (restarted) to n3: exit %d, out %q, err %s", code, out, errOut)
		}
		// A join string made before the restart, and one made after, pin
		// the same CA.
		startAgent(t, joins[1], "n4", "--ssh", "embedded")
		startAgent(t, h.token("--ttl", "10m"), "n5", "--ssh", "embedded")
		hubs[0].waitOnline("n4", "")
		hubs[0].waitOnline("n5", "")
		if out, errOut, code := clients[0].run(time.Minute, "n5", "echo", "n5-ok"); code != 0 ||
			strings.TrimSpace(out) != "n5-ok" {
			t.Fatalf("ssh -J r1 to n5 (on restarted r2): exit %d, out %q, err %s", code, out, errOut)
		}
	})

	t.Run("a killed replica's leases end and its agent moves", func(t *testing.T) { testReplicaKilled(t, hubs, clients) })
}

// TestReplicasShowOwnAddresses: replicas behind one address (the same
// --advertise on each, as behind a load balancer) each show their own API
// and SSH listeners in `tether replicas`, not the address they share.
func TestReplicasShowOwnAddresses(t *testing.T) {
	shared := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	hubs := startReplicas(t, filepath.Join(t.TempDir(), "shared.db"), 2, "--advertise", shared)
	m := waitForState(t, "both replicas listed", 30*time.Second, hubs[1].replicas, func(m map[string]replicaJSON) bool {
		return len(m) == 2
	})
	for i, h := range hubs {
		id := fmt.Sprintf("r%d", i+1)
		if r := m[id]; r.API != h.apiAddr() || r.SSH != h.sshAddr() {
			t.Errorf("replica %s shows API %s, SSH %s; want its own %s and %s (the shared --advertise is %s)",
				id, r.API, r.SSH, h.apiAddr(), h.sshAddr(), shared)
		}
	}
}

// A replica killed outright: a jump to its node entering elsewhere fails
// at once with the reason (never hangs) until the node's agent, whose join
// string names every replica, has reconnected to another one; the others
// show the dead one expired once its lease ends, and the jump works again.
func testReplicaKilled(t *testing.T, hubs []*hub, clients []*sshClient) {
	hubs[2].p.Stop(syscall.SIGKILL, stopWait)
	killed := time.Now()
	began := time.Now()
	out, errOut, code := clients[0].run(time.Minute, "n3", "echo", "moved")
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("ssh -J r1 to n3 right after its replica died took %s, want at once", took)
	}
	if code != 0 && !strings.Contains(errOut, "which stopped answering") && !strings.Contains(errOut, "offline") {
		t.Errorf("ssh -J r1 to n3 right after its replica died: exit %d, stderr %s; want the reason", code, errOut)
	} else if code == 0 && strings.TrimSpace(out) != "moved" {
		t.Errorf("ssh -J r1 to n3 right after its replica died: out %q", out)
	}
	// A QUIC agent hears nothing of a killed hub: it gives it up at its
	// dead-peer timeout.
	waitForState(t, "r3 expired and n3 held by another replica", 90*time.Second, func() map[string]replicaJSON {
		return hubs[0].replicas()
	}, func(m map[string]replicaJSON) bool {
		return m["r3"].Health == "expired" &&
			(slices.Contains(m["r1"].Agents, "n3") || slices.Contains(m["r2"].Agents, "n3"))
	})
	t.Logf("n3 held by another replica %s after kill -9 of r3", time.Since(killed).Round(time.Second))
	if out, errOut, code := clients[0].run(time.Minute, "n3", "echo", "moved"); code != 0 ||
		strings.TrimSpace(out) != "moved" {
		t.Fatalf("ssh -J r1 to n3 (its replica killed, its agent moved): exit %d, out %q, err %s", code, out, errOut)
	}
	// The other replicas keep serving each other's nodes.
	if out, errOut, code := clients[1].run(time.Minute, "n1", "echo", "still"); code != 0 ||
		strings.TrimSpace(out) != "still" {
		t.Fatalf("ssh -J r2 to n1 after r3 died: exit %d, out %q, err %s", code, out, errOut)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
