package e2e

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// cutCopy streams 2×half pseudo-random bytes into w while reading r (the
// echo of what was written, through the path under test) into a SHA-256;
// after the first half has come back it calls cut (which takes the link
// down and up again) while the second half is being written. It returns
// an error unless the echo is the same bytes, in order.
func cutCopy(w io.WriteCloser, r io.Reader, half int64, cut func()) error {
	want := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{42}), 2*half), want)
	var echoed atomic.Int64
	got := sha256.New()
	readErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Read(buf)
			got.Write(buf[:n])
			echoed.Add(int64(n))
			if err == io.EOF {
				readErr <- nil
				return
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	if _, err := io.CopyN(w, src, half); err != nil {
		return fmt.Errorf("write the first half: %w", err)
	}
	for echoed.Load() < half {
		select {
		case err := <-readErr:
			return fmt.Errorf("the echo ended after %d of %d bytes: %v", echoed.Load(), half, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var wg sync.WaitGroup
	wg.Go(cut)
	_, werr := io.Copy(w, src)
	if werr == nil {
		werr = w.Close()
	}
	wg.Wait()
	if werr != nil {
		return fmt.Errorf("write the second half (the link was cut meanwhile): %w", werr)
	}
	select {
	case err := <-readErr:
		if err != nil {
			return fmt.Errorf("read the echo after %d bytes: %w", echoed.Load(), err)
		}
	case <-time.After(60 * time.Second):
		return fmt.Errorf("the echo stalled at %d of %d bytes", echoed.Load(), 2*half)
	}
	if n := echoed.Load(); n != 2*half || string(got.Sum(nil)) != string(want.Sum(nil)) {
		return fmt.Errorf("the echo is %d bytes of %d and differs from what was sent", n, 2*half)
	}
	return nil
}

// halfCloser closes a TCP connection's writing half.
type halfCloser struct{ *net.TCPConn }

func (h halfCloser) Close() error { return h.CloseWrite() }

// TestResumeServiceTunnelAcrossCut: a service tunnel's TCP connection,
// from a consumer node's local listener through the hub to an echo on the
// provider node, survives a 4 s cut of the nodes' link that ends their
// tunnel sessions: 16 MiB echoed intact (SHA-256), half of it written
// during and after the cut, for a consumer on QUIC and one on TCP; the hub
// re-attached streams after the cut.
func TestResumeServiceTunnelAcrossCut(t *testing.T) {
	link, hubPort := newLink(t)
	h := startHubArgs(t, hubPort, append([]string{"--advertise", link.Addr()}, resumeTuning...)...)
	echo := echoServer(t)
	join := h.token("--uses", "3")
	startAgent(t, join, "svc-echo", append([]string{"--allow-port", strconv.Itoa(echo), "--transport", "tcp"},
		resumeTuning...)...)
	consumers := []struct{ name, transport string }{{"svc-quic", "quic"}, {"svc-tcp", "tcp"}}
	for _, c := range consumers {
		startAgent(t, join, c.name, append([]string{"--transport", c.transport}, resumeTuning...)...)
	}
	h.waitOnline("svc-echo", "tcp")
	for _, c := range consumers {
		h.waitOnline(c.name, c.transport)
	}
	h.cli("service", "expose", "svc-echo:"+strconv.Itoa(echo), "--name", "echo")
	ports := testenv.FreePorts(t, len(consumers))
	for i, c := range consumers {
		h.cli("service", "connect", "echo", "--from", c.name, "--local-port", strconv.Itoa(ports[i]))
	}
	for i, c := range consumers {
		t.Run(c.transport, func(t *testing.T) {
			// The sessions an earlier cut ended are back, and settled.
			for _, n := range append([]string{"svc-echo"}, consumers[0].name, consumers[1].name) {
				waitSteady(t, h, n)
			}
			addr := "127.0.0.1:" + strconv.Itoa(ports[i])
			var conn net.Conn
			waitFor(t, c.name+"'s service listener", 30*time.Second, func() bool {
				var err error
				conn, err = net.DialTimeout("tcp", addr, time.Second)
				return err == nil
			})
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(90 * time.Second))
			before := (&resumeFixture{h: h}).resumed(t)
			start := time.Now()
			err := cutCopy(halfCloser{conn.(*net.TCPConn)}, conn, 8<<20, func() {
				if err := link.Flap(4 * time.Second); err != nil {
					t.Error(err)
				}
			})
			if err != nil {
				t.Fatalf("service connection across the cut: %v", err)
			}
			resumed := (&resumeFixture{h: h}).resumed(t) - before
			t.Logf("%s: 16 MiB echoed across a 4 s cut in %s; streams resumed %v", c.name,
				time.Since(start).Round(100*time.Millisecond), resumed)
			if resumed < 1 {
				t.Fatal("the connection survived, but no stream was resumed: the cut did not end the sessions")
			}
		})
	}
}

// TestResumeJumpThroughSiteAcrossUplinkCut: `ssh -J` from the root through
// a site hub to a node below it carries 16 MiB through `cat` on the node,
// echoed intact (SHA-256), while the site's uplink is cut for 4 s, long
// enough that the root drops the site's session: the stream the root
// routes through the site is held by both and re-attached when the site
// is back. Two sites, one whose uplink is on QUIC and one on TCP, behind
// the same cut link.
func TestResumeJumpThroughSiteAcrossUplinkCut(t *testing.T) {
	link, port := newLink(t)
	root := startHubIn(t, "", port, append([]string{"--advertise", link.Addr()}, resumeTuning...)...)
	transports := []string{"quic", "tcp"}
	for _, tr := range transports {
		join := strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "10m"))
		site := startHubIn(t, "", 0, append([]string{"--parent", join, "--site", "s" + tr,
			"--parent-transport", tr}, resumeTuning...)...)
		startAgent(t, site.token(), "n-"+tr, "--ssh", "embedded")
	}
	root.cli("role", "create", "sites", "--nodes", "site in (squic,stcp)", "--logins", loginUser)
	root.cli("operator", "add", "alice", "--key", opPub, "--role", "sites")
	waitForState(t, "the nodes online at the root", 60*time.Second, root.nodes, func(ns map[string]nodeJSON) bool {
		return ns["n-quic.squic"].Online && ns["n-tcp.stcp"].Online
	})
	dir := t.TempDir()
	if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir",
		root.dataDir, "--user", "alice", "--key", opKey, "--out-dir", dir); code != 0 {
		t.Fatalf("tether login: exit %d: %s", code, errOut)
	}
	alice := newSSHClient(t, root)
	jumpArgs := func(node string, command ...string) []string {
		return append([]string{"-F", alice.cfg, "-o", "CertificateFile=" + filepath.Join(dir, "alice-cert.pub"),
			"-J", "alice@" + root.sshAddr(), loginUser + "@" + node}, command...)
	}
	for _, tr := range transports {
		waitFor(t, "alice reaches n-"+tr+".s"+tr, 60*time.Second, func() bool {
			_, _, code := runCmd(t, 30*time.Second, "ssh", jumpArgs("n-"+tr+".s"+tr, "true")...)
			return code == 0
		})
	}

	before := (&resumeFixture{h: root}).resumed(t)
	// One cut for both copies: each starts its second half as the link
	// goes down (the first copy to get there takes it down; both wait for
	// it to be back).
	var cutOnce sync.Once
	cutDone := make(chan struct{})
	cut := func() {
		cutOnce.Do(func() {
			defer close(cutDone)
			if err := link.Flap(4 * time.Second); err != nil {
				t.Error(err)
			}
		})
		<-cutDone
	}
	start := time.Now()
	errs := make([]error, len(transports))
	var wg sync.WaitGroup
	for i, tr := range transports {
		wg.Go(func() {
			cmd := exec.Command("ssh", jumpArgs("n-"+tr+".s"+tr, "cat")...)
			in, err := cmd.StdinPipe()
			if err != nil {
				errs[i] = err
				cut()
				return
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				errs[i] = err
				cut()
				return
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				errs[i] = err
				cut()
				return
			}
			timer := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() })
			defer timer.Stop()
			err = cutCopy(in, out, 8<<20, cut)
			if werr := cmd.Wait(); err == nil && werr != nil {
				err = werr
			}
			if err != nil {
				errs[i] = fmt.Errorf("%w (ssh: %s)", err, strings.TrimSpace(stderr.String()))
			}
		})
	}
	wg.Wait()
	for i, tr := range transports {
		if errs[i] != nil {
			t.Errorf("jump to n-%s.s%s across the site's uplink cut: %v", tr, tr, errs[i])
		}
	}
	resumed := (&resumeFixture{h: root}).resumed(t) - before
	t.Logf("16 MiB through each site across a 4 s uplink cut in %s; streams resumed at the root %v",
		time.Since(start).Round(100*time.Millisecond), resumed)
	if resumed < float64(len(transports)) {
		t.Fatalf("the root resumed %v streams, want at least %d: the cut did not end the sites' sessions",
			resumed, len(transports))
	}
}
