package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// debianPython is Debian's interpreter, which python3-paramiko installs
// into (a pyenv or venv python3 earlier in PATH would not see it).
const debianPython = "/usr/bin/python3"

// clientFleet is a hub with two nodes that serve SFTP: one with the agent's
// embedded SSH server (pkg/sftp) and one with a local sshd (OpenSSH's
// internal-sftp), its host key pinned by hand.
type clientFleet struct {
	h     *hub
	ssh   *sshClient
	nodes map[string]gossh.PublicKey // node name -> plain host key
}

func startClientFleet(t *testing.T) *clientFleet {
	t.Helper()
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--ttl", "10m", "--uses", "2")
	sd := startSSHD(t)
	_, embState := startAgent(t, join, "emb", "--ssh", "embedded")
	startAgent(t, join, "sshd", "--ssh", fmt.Sprintf("127.0.0.1:%d", sd.port))
	h.waitOnline("emb", "")
	h.waitOnline("sshd", "")
	f := &clientFleet{h: h, ssh: newSSHClient(t, h), nodes: map[string]gossh.PublicKey{
		"emb":  readHostPub(t, filepath.Join(embState, "ssh_host_ed25519_key")),
		"sshd": sd.hostPub,
	}}
	f.ssh.trust("sshd.tether", sd.hostPub)
	return f
}

// TestParamikoJump: Debian's paramiko 2.12 (what Ansible's paramiko
// connection, Fabric and Netmiko use), which has neither AES-GCM nor
// chacha20-poly1305, jumps through the bastion and runs SFTP on each kind of
// node: pipelined 3 MiB write and prefetched read, rename, posix-rename,
// symlink/readlink, chmod, utime, truncate. Stock OpenSSH still negotiates
// AES-GCM with the same bastion (TestFleet, "stock OpenSSH negotiates
// AES-GCM"; checked here too, on the same hub).
func TestParamikoJump(t *testing.T) {
	if out, err := exec.Command(debianPython, "-c", "import paramiko").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import paramiko (Debian package python3-paramiko; make deps installs it): %v: %s",
			debianPython, err, bytes.TrimSpace(out))
	}
	script, err := filepath.Abs(filepath.Join("testdata", "paramiko_sftp.py"))
	if err != nil {
		t.Fatal(err)
	}
	f := startClientFleet(t)
	hubKey := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(f.h.hostPublicKey())))
	for _, node := range []string{"emb", "sshd"} {
		t.Run(node, func(t *testing.T) {
			dir := t.TempDir() // the node is this machine
			out, errOut, code := runCmd(t, 2*time.Minute, debianPython, script,
				"--hub", f.h.sshAddr(), "--hub-key", hubKey, "--operator", "alice",
				"--node", node+".tether", "--node-key", strings.TrimSpace(string(gossh.MarshalAuthorizedKey(f.nodes[node]))),
				"--login", loginUser, "--identity", opKey, "--dir", dir)
			if code != 0 || !strings.Contains(out, "ALL OK") {
				t.Fatalf("paramiko through the bastion to %s: exit %d\nstdout:\n%s\nstderr:\n%s", node, code, out, errOut)
			}
			// paramiko's first choice, which the bastion must offer it.
			if !strings.Contains(out, "ok: bastion: SSH-2.0-Tether, cipher aes128-ctr/aes128-ctr") {
				t.Errorf("paramiko did not negotiate aes128-ctr with the bastion:\n%s", out)
			}
			// What the script did, seen on the node's disk; stat first:
			// reading the file would move its access time.
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(dir, "renamed.bin"), &st); err != nil || st.Mode&0o7777 != 0o640 ||
				st.Atim.Sec != 1_000_000_000 || st.Mtim.Sec != 1_234_567_890 {
				t.Errorf("renamed.bin: mode %#o, atime %d, mtime %d, %v; want 0640, 1000000000, 1234567890",
					st.Mode&0o7777, st.Atim.Sec, st.Mtim.Sec, err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "renamed.bin")); err != nil || string(b) != "to" {
				t.Errorf("renamed.bin = %q, %v; want %q", b, err, "to")
			}
			if target, err := os.Readlink(filepath.Join(dir, "link")); err != nil || target != "renamed.bin" {
				t.Errorf("link -> %q, %v; want renamed.bin", target, err)
			}
		})
	}
	t.Run("stock OpenSSH still negotiates AES-GCM", func(t *testing.T) {
		if !cpuHasAESGCM(t) {
			t.Skip("no AES-GCM instructions in /proc/cpuinfo: the bastion keeps x/crypto's cipher list")
		}
		_, errOut, code := runCmd(t, 30*time.Second, "ssh", append(f.ssh.jumpArgs("emb", "-v"), "true")...)
		if code != 0 {
			t.Fatalf("ssh -J: exit %d: %s", code, errOut)
		}
		// -v shows both hops' key exchanges; the first is the bastion's.
		i := strings.Index(errOut, "kex: server->client cipher: ")
		if i < 0 || !strings.HasPrefix(errOut[i:], "kex: server->client cipher: aes128-gcm@openssh.com") {
			t.Fatalf("ssh -v: the bastion's key exchange did not pick aes128-gcm:\n%s", errOut)
		}
	})
}

// TestSSHFSJump mounts a node's directory with sshfs through the bastion
// (sshfs runs ssh -J ... -s sftp) and works on it as on a local disk.
func TestSSHFSJump(t *testing.T) {
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Skip("sshfs not installed (Debian package sshfs; make deps installs it)")
	}
	if err := fuseUsable(); err != nil {
		t.Skipf("FUSE cannot mount here, so sshfs cannot: %v", err)
	}
	f := startClientFleet(t)
	for _, node := range []string{"emb", "sshd"} {
		t.Run(node, func(t *testing.T) {
			remote := t.TempDir() // the node is this machine
			mnt := t.TempDir()
			// -f keeps sshfs under the test's control; unmounting ends it.
			p := start(t, "sshfs-"+node, "sshfs", "-f", "-F", f.ssh.cfg, "-o", "ProxyJump=alice@"+f.h.sshAddr(),
				loginUser+"@"+node+".tether:"+remote, mnt)
			t.Cleanup(func() {
				if _, errOut, code := runCmd(t, 30*time.Second, "fusermount3", "-u", mnt); code != 0 && !p.Exited() {
					t.Errorf("fusermount3 -u %s: exit %d: %s", mnt, code, errOut)
				}
			})
			waitFor(t, "sshfs mount of "+node, 30*time.Second, func() bool {
				if p.Exited() {
					t.Fatalf("sshfs exited: %v\n%s", p.Err(), p.Tail(4000))
				}
				return isMountPoint(mnt)
			})
			data := make([]byte, 3<<20)
			rand.Read(data)
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s on the sshfs mount: %v\nsshfs log:\n%s", what, err, p.Tail(4000))
				}
			}
			must("write", os.WriteFile(filepath.Join(mnt, "data.bin"), data, 0o600))
			got, err := os.ReadFile(filepath.Join(remote, "data.bin"))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("node's copy of data.bin: %d bytes, %v; want the 3 MiB written", len(got), err)
			}
			got, err = os.ReadFile(filepath.Join(mnt, "data.bin"))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("reading data.bin back through sshfs: %d bytes, %v", len(got), err)
			}
			must("rename", os.Rename(filepath.Join(mnt, "data.bin"), filepath.Join(mnt, "renamed.bin")))
			must("write", os.WriteFile(filepath.Join(mnt, "other.bin"), []byte("replacement"), 0o600))
			// Over an existing file: sshfs uses posix-rename@openssh.com.
			must("rename over a file", os.Rename(filepath.Join(mnt, "other.bin"), filepath.Join(mnt, "renamed.bin")))
			must("symlink", os.Symlink("renamed.bin", filepath.Join(mnt, "link")))
			must("chmod", os.Chmod(filepath.Join(mnt, "renamed.bin"), 0o640))
			must("truncate", os.Truncate(filepath.Join(mnt, "renamed.bin"), 7))
			// Last: truncating sets the modification time.
			mtime := time.Unix(1_234_567_890, 0)
			must("chtimes", os.Chtimes(filepath.Join(mnt, "renamed.bin"), mtime, mtime))

			if b, err := os.ReadFile(filepath.Join(remote, "renamed.bin")); err != nil || string(b) != "replace" {
				t.Errorf("node's renamed.bin = %q, %v; want %q", b, err, "replace")
			}
			if fi, err := os.Stat(filepath.Join(remote, "renamed.bin")); err != nil {
				t.Error(err)
			} else if fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
				t.Errorf("node's renamed.bin: mode %v, mtime %s; want 0640, %s", fi.Mode().Perm(), fi.ModTime(), mtime)
			}
			if target, err := os.Readlink(filepath.Join(remote, "link")); err != nil || target != "renamed.bin" {
				t.Errorf("node's link -> %q, %v; want renamed.bin", target, err)
			}
			if _, err := os.Stat(filepath.Join(remote, "other.bin")); !os.IsNotExist(err) {
				t.Errorf("other.bin still on the node after the rename: %v", err)
			}
			entries, err := os.ReadDir(mnt)
			must("readdir", err)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if strings.Join(names, ",") != "link,renamed.bin" {
				t.Errorf("mount lists %v, want [link renamed.bin]", names)
			}
		})
	}
}

// fuseUsable says why FUSE cannot mount here, if it cannot: no /dev/fuse
// (a container without the device), no fuse file system in the kernel, or
// no fusermount3 (Debian package fuse3).
func fuseUsable() error {
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/fuse: %w", err)
	}
	syscall.Close(fd)
	fs, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	if !strings.Contains(string(fs), "\tfuse\n") {
		return fmt.Errorf("the kernel has no fuse file system (/proc/filesystems)")
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		return fmt.Errorf("fusermount3 not found: %w", err)
	}
	return nil
}

// isMountPoint reports whether dir is on another device than its parent.
func isMountPoint(dir string) bool {
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) != nil || syscall.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}
